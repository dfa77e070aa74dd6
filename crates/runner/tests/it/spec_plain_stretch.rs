//! Depth-0 rounds of a speculative session run as the pipelined plain loop:
//! the same greedy tokens as a plain session, one host sync per token, and
//! every token reported to the MTP head, so drafting afterwards still works.

use crate::common::Generate;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use runner::DepthPolicy;
use runner::{GenerateOptions, LoadOptions, LoadedModel, SamplingOptions, Session};

fn bundled() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-mtp")
}

fn greedy(n: usize, depth: DepthPolicy) -> GenerateOptions {
    GenerateOptions {
        max_tokens: n,
        sampling: SamplingOptions::greedy(),
        depth,
        ..GenerateOptions::default()
    }
}

/// Ids of a plain greedy generation.
fn plain(m: &LoadedModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let opts = greedy(n, DepthPolicy::Fixed(0));
    let g = Session::new(m.model.as_ref())
        .run(&m.tokenizer, prompt, &opts)
        .unwrap();
    g.token_ids
}

#[test]
fn depth_zero_is_plain_decoding_with_the_head_kept_fed() {
    let m = runner::load(&bundled(), LoadOptions::default(), |_, _| {}).unwrap();
    let never = AtomicBool::new(false);
    for text in ["def fibonacci(n):\n", "Once upon a time"] {
        let prompt = m.tokenizer.encode(text, true).unwrap();
        // Turn 1 at depth 0 (syncs counted), turn 2 drafting on the same session.
        let mut s = Session::with_mtp(m.model.as_ref()).unwrap();
        let before = mlx_tensor::host_syncs();
        let g1 = s
            .generate(
                &m.tokenizer,
                &prompt,
                &greedy(48, DepthPolicy::Fixed(0)),
                &never,
                |_| {},
            )
            .unwrap();
        let syncs = mlx_tensor::host_syncs() - before;
        assert_eq!(
            g1.token_ids,
            plain(&m, &prompt, 48),
            "{text:?}: depth 0 vs plain"
        );
        let spec = g1.speculation.expect("speculative session");
        assert_eq!(spec.drafted, 0, "{text:?}: depth 0 drafts nothing");
        // Prefill and the end of generation sync a bounded number of times;
        // the decode itself once per token (48 tokens, so 56 leaves 8 for the rest).
        assert!(
            (g1.token_ids.len() as u64..=g1.token_ids.len() as u64 + 8).contains(&syncs),
            "{text:?}: {syncs} host syncs for {} tokens",
            g1.token_ids.len()
        );
        // The head saw every token of the plain stretch: turn 2 drafts and
        // accepts, with the output of a cold plain run over the whole history.
        let mut history = s.committed().to_vec();
        let turn2 = m.tokenizer.encode(" and then", false).unwrap();
        history.extend(&turn2);
        let g2 = s
            .generate(
                &m.tokenizer,
                &turn2,
                &greedy(32, DepthPolicy::Fixed(2)),
                &never,
                |_| {},
            )
            .unwrap();
        assert_eq!(g2.token_ids, plain(&m, &history, 32), "{text:?}: turn 2");
        let spec2 = g2.speculation.expect("speculative session");
        assert!(
            spec2.accepted > 0,
            "{text:?}: turn 2 accepted {} of {} drafts",
            spec2.accepted,
            spec2.drafted
        );
    }
}
