//! Shape buckets (`runner::set_shape_buckets`, on by default only on CUDA):
//! forced on here, the padded prefill chunks, the padded MTP flushes and
//! explicit attention's padded keys give the output of unpadded shapes, on
//! a fresh session and on a session continuing at an offset, for every
//! family with a KV or recurrent stack (which pads nothing).

use crate::common::parity::{greedy, heldout_prompts, run};

use std::path::PathBuf;

use runner::{
    AttentionPath, DepthPolicy, GenerateOptions, LoadOptions, LoadedModel, Session,
    set_attention_path, set_shape_buckets,
};

fn load(name: &str) -> LoadedModel {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name);
    runner::load(&dir, LoadOptions::default(), |_, _| {}).expect("bundled model loads")
}

/// Two greedy requests on one session (the second continues after the
/// first's tokens): plain and MTP at depth 3, chunks of 48 tokens so a
/// prompt spans several padded chunks; returns the generated ids, each with
/// the accepted drafts per position (empty for plain). The output alone
/// cannot show a wrong hidden row handed to the head (speculation is
/// lossless whatever the drafts); the acceptance does.
fn requests(m: &LoadedModel, prompts: &[Vec<u32>], mtp: bool) -> Vec<(Vec<u32>, Vec<usize>)> {
    let opts = GenerateOptions {
        prefill_chunk: 48,
        ..greedy(24, DepthPolicy::Fixed(if mtp { 3 } else { 0 }))
    };
    let mut s = if mtp {
        Session::with_mtp(m.model.as_ref()).expect("the model has an MTP head")
    } else {
        Session::new(m.model.as_ref())
    };
    prompts
        .iter()
        .map(|p| {
            let g = run(&mut s, m, p, &opts);
            let accepted = g.speculation.map(|x| x.accepted_at).unwrap_or_default();
            (g.token_ids, accepted)
        })
        .collect()
}

/// f32 greedy output with buckets and explicit attention (which pads its
/// keys under buckets) equals the output with neither, plain and MTP, on
/// prompts whose lengths fall between buckets (19 to 131 tokens).
#[test]
fn bucketed_shapes_give_the_unbucketed_output() {
    for name in ["tiny-mtp", "tiny-moe-mtp", "tiny-hybrid-mtp"] {
        let m = load(name);
        let held = heldout_prompts(&m);
        let prompts: Vec<Vec<u32>> = [131usize, 19, 70]
            .iter()
            .zip(held.iter().cycle())
            .map(|(&n, p)| p.iter().copied().cycle().take(n).collect())
            .collect();
        for mtp in [false, true] {
            set_shape_buckets(false);
            set_attention_path(AttentionPath::Fused);
            let want = requests(&m, &prompts, mtp);
            set_shape_buckets(true);
            set_attention_path(AttentionPath::Explicit);
            let got = requests(&m, &prompts, mtp);
            set_shape_buckets(false);
            set_attention_path(AttentionPath::Auto);
            assert_eq!(got, want, "{name} mtp={mtp}: bucketed output differs");
            assert!(want.iter().all(|t| t.0.len() == 24), "{name}: {want:?}");
            if mtp {
                assert!(
                    want.iter().any(|t| t.1.iter().sum::<usize>() > 0),
                    "{name}: {want:?}"
                );
            }
        }
    }
}

/// The server's warm-up runs every prefill bucket of the default chunk
/// through the target and the head under buckets, and nothing without them.
#[test]
fn the_warm_up_runs_every_prefill_bucket() {
    let m = load("tiny-mtp");
    let s = Session::with_mtp(m.model.as_ref()).unwrap();
    set_shape_buckets(false);
    assert_eq!(s.warm_up().unwrap(), 0);
    set_shape_buckets(true);
    // 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536 and the default chunk
    // (2048, tiny-mtp's context).
    assert_eq!(m.model.context_length(), 2048);
    let got = s.warm_up().unwrap();
    set_shape_buckets(false);
    assert_eq!(got, 11);
}
