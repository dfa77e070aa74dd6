//! A speculative round syncs with the device exactly once: the extra blocking
//! evaluations of a longer generation equal its extra rounds; with layer-group
//! dispatch forced on too, and with the same output.

use crate::common::Generate;
use std::path::PathBuf;

use runner::DepthPolicy;
use runner::{GenerateOptions, LoadOptions, SamplingOptions, Session};

fn bundled() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-mtp")
}

#[test]
fn one_host_sync_per_round() {
    for dispatch in [false, true] {
        runner::set_layer_dispatch(dispatch);
        let before = runner::layer_dispatches();
        one_sync_per_round(&bundled());
        let made = runner::layer_dispatches() - before;
        runner::set_layer_dispatch(false);
        assert_eq!(made > 0, dispatch, "dispatch {dispatch}: {made} dispatches");
    }
}

/// Layer-group dispatch (`runner::set_layer_dispatch`; by default on CUDA
/// for big layers only) changes when the device starts, never what it computes: f32 greedy
/// output, and the drafts accepted at each position, equal the output
/// without it, for a dense, a hybrid and a mixture-of-experts model.
#[test]
fn layer_dispatch_keeps_the_output() {
    for name in ["tiny-mtp", "tiny-hybrid-mtp", "tiny-moe-mtp"] {
        let dir = bundled().with_file_name(name);
        let m = runner::load(&dir, LoadOptions::default(), |_, _| {}).unwrap();
        let prompt = m.tokenizer.encode("def fibonacci(n):\n", true).unwrap();
        let opts = GenerateOptions {
            max_tokens: 40,
            sampling: SamplingOptions::greedy(),
            depth: DepthPolicy::Fixed(4),
            ..GenerateOptions::default()
        };
        let run = |on: bool| {
            runner::set_layer_dispatch(on);
            let mut s = Session::with_mtp(m.model.as_ref()).unwrap();
            let g = s.run(&m.tokenizer, &prompt, &opts).unwrap();
            runner::set_layer_dispatch(false);
            let accepted = g.speculation.expect("speculative session").accepted_at;
            (g.token_ids, accepted)
        };
        let want = run(false);
        // Groups of one layer: a dispatch after every layer but the last.
        runner::set_layer_dispatch_every(1);
        let got = run(true);
        runner::set_layer_dispatch_every(runner::DEFAULT_LAYER_DISPATCH_EVERY);
        assert_eq!(got, want, "{name}: output with layer dispatch differs");
        assert!(want.1.iter().sum::<usize>() > 0, "{name}: nothing accepted");
    }
}

fn one_sync_per_round(model: &std::path::Path) {
    let m = runner::load(model, LoadOptions::default(), |_, _| {}).unwrap();
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
