//! Builds, before a speculative session's first round, the kernels that
//! MLX's CUDA backend compiles on first use of a shape.
//!
//! Why: on CUDA the few-rows matmul kernel (`models/skinny.rs`) is compiled
//! through NVRTC once per row count, and other multi-row paths build per
//! shape too. Left to the first request, each new draft depth's first round
//! pays those seconds: a 256-token request at the 8B shape spent more time
//! compiling than decoding, and the auto depth controller read the spikes as
//! the depths' costs. So the first speculative request of a model in this
//! process runs the target (and its MTP head) once over every row count a
//! verify or a draft flush can take, on scratch caches it then drops, and
//! then a few real speculative rounds in a scratch session (greedy at each
//! depth 1–6, and sampled): the acceptance and sampling ops build their
//! kernels on first use too (seconds, in a fresh f32 process). Compiled
//! kernels live for the process: later sessions skip this.

use std::sync::Mutex;
use std::time::Instant;

use mlx_tensor::{Array, ops};

use super::GenerateOptions;
use crate::depth::DepthPolicy;
use crate::drafter::Drafter;
use crate::error::Result;
use crate::models::Model;
use crate::models::sdpa::{UNBUCKETED_ROWS, row_bucket, shape_buckets};
use crate::models::skinny::MAX_ROWS;
use crate::session::{PREFILL_CHUNK, Session};
use crate::tokenizer::Tokenizer;

/// Models (by address) already warmed in this process. A model dropped and
/// another loaded at the same address is skipped: its first rounds are then
/// merely slower, as without this module.
static WARMED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Warms what a request of `model` with `drafter` will run (see [`warm`]).
/// The first request of a speculative session calls it.
pub(super) fn warm_for<'m>(model: &'m dyn Model, drafter: &Drafter<'m>) {
    match drafter {
        Drafter::Mtp(_) => warm(model, || Session::with_mtp(model)),
        Drafter::Model(d) => {
            let draft = d.model();
            warm(model, || Ok(Session::with_draft_model(model, draft)));
        }
        // Proposals need repeats in the text; its verify rows are the
        // target's, warmed by the first MTP or draft-model session.
        Drafter::Ngram(_) => {}
    }
}

/// Warms `model` once per process when the default device is CUDA; `open`
/// gives the scratch session of the real rounds. A failure is logged and
/// otherwise ignored (the real rounds report their own errors).
fn warm<'m>(model: &'m dyn Model, open: impl FnOnce() -> Result<Session<'m>>) {
    if !crate::models::sdpa::on_cuda() {
        return;
    }
    let key = std::ptr::from_ref(model).cast::<()>() as usize;
    {
        let mut warmed = WARMED.lock().unwrap_or_else(|e| e.into_inner());
        if warmed.contains(&key) {
            return;
        }
        warmed.push(key);
    }
    let t0 = Instant::now();
    match run(model).and_then(|()| rounds(open()?)) {
        Ok(()) => tracing::debug!(ms = t0.elapsed().as_secs_f64() * 1e3, "kernels warmed"),
        Err(e) => tracing::warn!(error = %e, "warming the multi-row kernels failed"),
    }
}

/// A few speculative rounds in `session`: greedy at each depth 1–6 and one
/// sampled run, over a short prompt of arbitrary ids (decoded by an empty
/// vocabulary: the text is not wanted).
fn rounds(mut session: Session<'_>) -> Result<()> {
    let vocab = session.model().vocab_size() as u32;
    let prompt: Vec<u32> = (0..12u32).map(|i| (i * 37 + 5) % vocab).collect();
    let tok = Tokenizer::from_tokenizer(
        tokenizers::Tokenizer::new(tokenizers::models::bpe::BPE::default()),
        Vec::new(),
    );
    let cancel = std::sync::atomic::AtomicBool::new(false);
    let mut run = |depth: usize, sampling: sampler::Options| -> Result<()> {
        let opts = GenerateOptions {
            max_tokens: 2 * depth + 2,
            sampling,
            depth: DepthPolicy::Fixed(depth),
            ..GenerateOptions::default()
        };
        session.generate(&tok, &prompt, &opts, &cancel, |_| {})?;
        Ok(())
    };
    for depth in 1..=6 {
        run(depth, sampler::Options::greedy())?;
    }
    run(
        3,
        sampler::Options {
            temperature: 0.8,
            seed: Some(1),
            ..sampler::Options::default()
        },
    )
}

/// The row counts a prefill chunk of at most `cap` rows takes under shape
/// buckets (`sdpa::row_bucket`), ascending.
fn prefill_buckets(cap: usize) -> Vec<usize> {
    let mut rows: Vec<usize> = (UNBUCKETED_ROWS + 1..=cap)
        .map(|r| row_bucket(r, cap))
        .collect();
    rows.dedup();
    rows
}

/// Runs the target (and its MTP head) once over every prefill bucket of the
/// default chunk, on scratch caches, so a server's first prompts of each
/// bucket do not pay MLX's first calls of its shapes (~80 ms a bucket on an
/// H200, docs/gpu.md). A no-op without shape buckets; returns the buckets run.
pub(crate) fn prefill_shapes(model: &dyn Model) -> Result<usize> {
    if !shape_buckets() {
        return Ok(0);
    }
    let cap = PREFILL_CHUNK.min(model.context_length());
    let buckets = prefill_buckets(cap);
    let width = model.config().hidden_size as i32;
    for &rows in &buckets {
        let mut caches = model.new_caches();
        let h = model.forward(&zeros(rows)?, &mut caches)?;
        let last = h.slice_axis(0, rows as i32 - 1, rows as i32)?;
        mlx_tensor::eval([&model.unembed(&last)?])?;
        if let Some(mut head) = model.mtp_head() {
            let hidden = ops::zeros(&[rows as i32, width], h.dtype())?;
            let o = head.forward(&zeros(rows)?, &hidden, 0)?;
            mlx_tensor::eval([&o.hidden])?;
        }
    }
    Ok(buckets.len())
}

fn zeros(n: usize) -> Result<Array> {
    Ok(Array::from_slice(&vec![0u32; n], &[n as i32])?)
}

/// One forward (and unembedding) of every row count `1..=MAX_ROWS` through
/// the target and its MTP head, after a short prefix so attention has keys.
fn run(model: &dyn Model) -> Result<()> {
    let mut caches = model.new_caches();
    let mut outs = vec![model.forward(&zeros(4)?, &mut caches)?];
    for rows in 1..=MAX_ROWS as usize {
        let h = model.forward(&zeros(rows)?, &mut caches)?;
        outs.push(model.unembed(&h)?);
        mlx_tensor::eval(&outs)?;
        outs.clear();
        outs.push(h);
    }
    if let Some(mut head) = model.mtp_head() {
        let width = model.config().hidden_size as i32;
        let dtype = outs[0].dtype();
        let mut position = 0;
        for rows in 1..=MAX_ROWS as usize {
            let hidden = ops::zeros(&[rows as i32, width], dtype)?;
            let o = head.forward(&zeros(rows)?, &hidden, position)?;
            position += rows;
            let last = o.out.slice_axis(0, rows as i32 - 1, rows as i32)?;
            let logits = head.unembed(&last)?;
            mlx_tensor::eval([&logits, &o.hidden])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_buckets_are_the_ladder_up_to_the_chunk() {
        let ladder = [16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048];
        assert_eq!(prefill_buckets(2048), ladder);
        assert_eq!(
            prefill_buckets(1000),
            [16, 32, 64, 128, 256, 384, 512, 768, 1000]
        );
        assert!(prefill_buckets(UNBUCKETED_ROWS).is_empty());
    }

    /// The warm-up is device-agnostic code: on the CPU (where `warm` skips
    /// it) it must run through a hybrid model with an MTP head, whose
    /// recurrent layers and draft cache take every row count in turn, and
    /// its scratch speculative rounds must run too.
    #[test]
    fn the_warm_up_runs_through_target_and_head() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-hybrid-mtp");
        let m = crate::load(&dir, crate::LoadOptions::default(), |_, _| {}).unwrap();
        assert!(m.model.mtp_head().is_some());
        run(m.model.as_ref()).unwrap();
        rounds(Session::with_mtp(m.model.as_ref()).unwrap()).unwrap();
        // On the CPU `warm` does nothing and records nothing.
        warm(m.model.as_ref(), || Session::with_mtp(m.model.as_ref()));
        assert!(WARMED.lock().unwrap().is_empty());
    }
}
