//! A speculative round syncs with the device exactly once: the extra blocking
//! evaluations of a longer generation equal its extra rounds.

use crate::common::Generate;
use std::path::PathBuf;

use runner::DepthPolicy;
use runner::{GenerateOptions, LoadOptions, SamplingOptions, Session};

fn bundled() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-mtp")
}

#[test]
fn one_host_sync_per_round() {
    let m = runner::load(&bundled(), LoadOptions::default(), |_, _| {}).unwrap();
    let prompt = m.tokenizer.encode("def fibonacci(n):\n", true).unwrap();
    // (blocking evaluations, rounds) of one greedy generation of `n` tokens.
    let run = |n: usize, depth: DepthPolicy| {
        let opts = GenerateOptions {
            max_tokens: n,
            sampling: SamplingOptions::greedy(),
            depth,
            ..GenerateOptions::default()
        };
        let mut s = Session::with_mtp(m.model.as_ref()).unwrap();
        let before = mlx_tensor::host_syncs();
        let g = s.run(&m.tokenizer, &prompt, &opts).unwrap();
        let rounds = g.speculation.expect("speculative session").rounds as u64;
        (mlx_tensor::host_syncs() - before, rounds)
    };
    for depth in [
        DepthPolicy::Fixed(3),
        DepthPolicy::Fixed(1),
        DepthPolicy::default(),
    ] {
        let (s1, r1) = run(16, depth);
        let (s2, r2) = run(64, depth);
        assert!(
            r2 > r1,
            "{depth:?}: a longer generation runs more rounds ({r1} vs {r2})"
        );
        assert_eq!(
            s2 - s1,
            r2 - r1,
            "{depth:?}: {} extra syncs for {} extra rounds",
            s2 - s1,
            r2 - r1
        );
    }
}

/// The plain decoder reports where its time went: one entry per generated
/// token (the prompt's last token is re-run as the first step, so every one
/// is read in the loop), each phase measured, and the phases together inside
/// the decode time and the prefill.
#[test]
fn plain_phases_cover_the_plain_tokens() {
    let m = runner::load(&bundled(), LoadOptions::default(), |_, _| {}).unwrap();
    let prompt = m.tokenizer.encode("def fibonacci(n):\n", true).unwrap();
    let opts = GenerateOptions {
        max_tokens: 24,
        sampling: SamplingOptions::greedy(),
        ..GenerateOptions::default()
    };
    let mut s = Session::new(m.model.as_ref());
    let g = s.run(&m.tokenizer, &prompt, &opts).unwrap();
    let p = g.stats.plain;
    assert_eq!(p.tokens, g.stats.generated_tokens, "{p:?}");
    assert!(
        p.build > std::time::Duration::ZERO && p.dispatch > std::time::Duration::ZERO,
        "{p:?}"
    );
    let sum = p.build + p.dispatch + p.wait + p.emit;
    let total = g.stats.prefill_time + g.stats.decode_time;
    assert!(sum <= total, "{sum:?} > {total:?}");
    let ms = p.per_token_ms();
    assert!(ms.iter().all(|v| v.is_finite() && *v >= 0.0), "{ms:?}");
}
