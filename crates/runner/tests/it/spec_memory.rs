//! MLX memory of a long speculative generation on tiny-mtp: resident memory
//! above plain decoding's no more than the MTP head's own KV cache (one
//! layer's, reserved for the whole context), peak within that plus 5% of
//! plain decoding's, growth over the second half no larger than plain
//! decoding's (the KV cache) plus that 5%, and no pinned arrays left behind. Both under
//! the auto depth and at a fixed depth 0, where the MTP head's caches are
//! still filled, 256 pairs per flush, and only the flushes' scratch shows.
//!
//! The model's context is 2048, so the generation is 1,900 tokens from a short
//! prompt (issue 6 names 4,000, which this model cannot hold). Its
//! end-of-sequence ids are replaced by `<|im_end|>` (id 2, absent from its code
//! training text) in a copy of the folder, so the run is not cut short.
// The measured figures are reported on stderr (`-- --nocapture` shows them).
#![allow(clippy::print_stderr)]

use crate::common;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use mlx_tensor::memory;
use runner::DepthPolicy;
use runner::{FinishReason, GenerateOptions, LoadedModel, SamplingOptions, Session};
use serde_json::{Value, json};

const TOKENS: usize = 1900;
/// Allowed excess of speculation over plain decoding, as a fraction of plain's peak.
const MARGIN: f64 = 0.05;

/// tiny-mtp with `<|im_end|>` as its only end-of-sequence token (weights symlinked).
fn without_eos() -> tempfile::TempDir {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-mtp");
    let dir = tempfile::tempdir().unwrap();
    let edits: [(&str, &str, Value); 3] = [
        ("config.json", "eos_token_id", json!(2)),
        ("generation_config.json", "eos_token_id", json!(2)),
        ("tokenizer_config.json", "eos_token", json!("<|im_end|>")),
    ];
    for entry in std::fs::read_dir(&src).unwrap() {
        let name = entry.unwrap().file_name();
        let target = dir.path().join(&name);
        match edits.iter().find(|(f, _, _)| name == *f) {
            Some((f, key, value)) => {
                let text = std::fs::read_to_string(src.join(f)).unwrap();
                let mut v: Value = serde_json::from_str(&text).unwrap();
                v[*key] = value.clone();
                std::fs::write(target, v.to_string()).unwrap();
            }
            None => std::os::unix::fs::symlink(src.join(&name), target).unwrap(),
        }
    }
    dir
}

/// Memory figures of one generation.
#[derive(Debug)]
struct Run {
    /// Peak over the whole generation (the loop resets it at the start).
    peak: usize,
    /// Peak when half the text pieces had been streamed.
    peak_half: usize,
    active_half: usize,
    active_end: usize,
    generated: usize,
}

fn measure(m: &LoadedModel, speculative: Option<DepthPolicy>) -> Run {
    let mut prompt = vec![0];
    prompt.extend(
        m.tokenizer
            .encode("import os\nimport sys\n", false)
            .unwrap(),
    );
    let opts = GenerateOptions {
        max_tokens: TOKENS,
        sampling: SamplingOptions::greedy(),
        depth: speculative.unwrap_or_default(),
        ..GenerateOptions::default()
    };
    assert_eq!(mlx_tensor::live_pins(), 0, "pins before the generation");
    let mut s = if speculative.is_some() {
        Session::with_mtp(m.model.as_ref()).unwrap()
    } else {
        Session::new(m.model.as_ref())
    };
    // (peak, active) each time text is streamed.
    let mut trace: Vec<(usize, usize)> = Vec::new();
    let g = s
        .generate(
            &m.tokenizer,
            &prompt,
            &opts,
            &AtomicBool::new(false),
            |_| {
                trace.push((memory::peak(), memory::active()));
            },
        )
        .unwrap();
    assert_eq!(
        g.finish,
        FinishReason::Length,
        "the run should use its whole budget"
    );
    assert_eq!(g.token_ids.len(), TOKENS);
    assert_eq!(s.offset(), prompt.len() + TOKENS - 1);
    assert_eq!(
        mlx_tensor::live_pins(),
        0,
        "pinned arrays left after the generation (speculative: {speculative:?})"
    );
    if let Some(st) = &g.speculation {
        if speculative != Some(DepthPolicy::Fixed(0)) {
            assert!(st.accepted > 0, "no draft accepted in {} rounds", st.rounds);
        }
        eprintln!(
            "speculation: {} rounds, acceptance {:.3}, mean accepted length {:.3}",
            st.rounds,
            st.acceptance_rate(),
            st.mean_accepted_length()
        );
    }
    assert!(trace.len() > TOKENS / 2, "only {} text pieces", trace.len());
    let (peak_half, active_half) = trace[trace.len() / 2];
    let run = Run {
        peak: g.stats.peak_memory_bytes,
        peak_half,
        active_half,
        active_end: memory::active(),
        generated: g.token_ids.len(),
    };
    drop(s);
    assert_eq!(mlx_tensor::live_pins(), 0);
    run
}

#[test]
fn speculation_adds_only_the_heads_cache_and_five_percent_to_peak_memory_and_stays_flat() {
    // MLX's memory figures are per process.
    common::own_process(
        "spec_memory::speculation_adds_only_the_heads_cache_and_five_percent_to_peak_memory_and_stays_flat",
        speculation_adds_only_the_heads_cache_and_five_percent_to_peak_memory_and_stays_flat_alone,
    );
}

fn speculation_adds_only_the_heads_cache_and_five_percent_to_peak_memory_and_stays_flat_alone() {
    let dir = without_eos();
    let m = common::load(dir.path());
    let plain = measure(&m, None);
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let show = |name: &str, r: &Run| {
        eprintln!(
            "{name}: {} tokens, peak {:.2} MiB (at half {:.2}), active at half {:.2} MiB, at end {:.2} MiB",
            r.generated,
            mib(r.peak),
            mib(r.peak_half),
            mib(r.active_half),
            mib(r.active_end)
        );
    };
    show("plain", &plain);
    let margin = (plain.peak as f64 * MARGIN) as usize;
    // The head's KV cache: one layer of keys and values for the context, in
    // f32. It is 3% of this tiny model's peak (a real model's is a fraction
    // of its target's cache), and the transient of a round above it moves
    // by 2 MiB between runs with the timing of MLX's asynchronous
    // evaluation, so the 5% is counted on top of it rather than around it.
    let c: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    let n = |k: &str| c[k].as_u64().unwrap() as usize;
    let head_cache =
        2 * n("max_position_embeddings") * n("num_key_value_heads") * n("head_dim") * 4;
    for depth in [DepthPolicy::default(), DepthPolicy::Fixed(0)] {
        let spec = measure(&m, Some(depth));
        show(&format!("mtp {depth:?}"), &spec);
        let resident = spec.active_end.saturating_sub(plain.active_end);
        assert!(
            resident as f64 <= 1.05 * head_cache as f64,
            "{depth:?}: speculation keeps {resident} B more than plain decoding; \
             the head's cache is {head_cache} B"
        );
        assert!(
            spec.peak <= plain.peak + head_cache + margin,
            "{depth:?}: speculative peak {} B exceeds plain {} B plus the head's cache \
             {head_cache} B by more than {MARGIN}",
            spec.peak,
            plain.peak
        );
        // Flat: over the second half, speculation grows no more than plain
        // decoding (whose growth is the KV cache of the tokens added), within
        // the same margin.
        let growth = |r: &Run| r.peak.saturating_sub(r.peak_half);
        assert!(
            growth(&spec) <= growth(&plain) + margin,
            "{depth:?}: second-half peak growth: speculative {} B vs plain {} B",
            growth(&spec),
            growth(&plain)
        );
        // And the KV cache of 950 tokens is a small part of the peak: a leak
        // of anything per token would show.
        assert!(
            growth(&spec) as f64 <= 0.25 * spec.peak as f64,
            "{depth:?}: peak grew from {} to {} B over the second half",
            spec.peak_half,
            spec.peak
        );
    }
}
