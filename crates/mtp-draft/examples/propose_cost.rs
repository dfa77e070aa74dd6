//! Measures what a proposal costs on the host: building the lazy draft graph
//! versus evaluating it, without penalties (no sync until the caller reads
//! the drafts) and with them (the sampler needs each draft on the host).
//!
//! `cargo run -p mtp-draft --example propose_cost` prints one JSON line per
//! configuration. The head is a small lazy stand-in (embedding, one fused
//! projection, a draft KV cache, unembedding); only the session's overhead
//! and its syncs are of interest here, not the head's math.
#![allow(clippy::print_stdout)] // An example's output is its report.

use std::time::Instant;

use kvcache::{Cache, KvCache};
use mlx_tensor::{Array, Dtype, ops, random};
use mtp_draft::{DraftHead, DraftSampling, Drafter, HeadOutput, Result};
use sampler::{History, KeyStream, Options};

const HIDDEN: i32 = 256;
const VOCAB: i32 = 4096;

#[derive(Debug)]
struct LazyHead {
    embed: Array,
    fuse: Array,
    lm_head: Array,
    caches: Vec<Box<dyn Cache>>,
}

impl DraftHead for LazyHead {
    fn forward(&mut self, tokens: &Array, hiddens: &Array, _position: usize) -> Result<HeadOutput> {
        let e = self.embed.take(tokens, 0)?;
        let x = ops::concatenate(&[e, hiddens.clone()], 1)?
            .matmul(&self.fuse)?
            .tanh()?;
        let rows = x.dim(0);
        let kv = x.reshape(&[1, 1, rows, HIDDEN])?;
        self.caches[0].update_and_fetch(&kv, &kv)?;
        Ok(HeadOutput {
            out: x.clone(),
            hidden: x,
        })
    }

    fn unembed(&mut self, out: &Array) -> Result<Array> {
        Ok(out.matmul(&self.lm_head)?)
    }

    fn caches(&self) -> &[Box<dyn Cache>] {
        &self.caches
    }

    fn caches_mut(&mut self) -> &mut [Box<dyn Cache>] {
        &mut self.caches
    }
}

fn head() -> Result<LazyHead> {
    let key = random::key(1)?;
    let (k1, rest) = random::split2(&key)?;
    let (k2, k3) = random::split2(&rest)?;
    let scale = Array::from_f32(0.05)?;
    let normal = |shape: &[i32], k: &Array| -> Result<Array> {
        let a = random::normal(shape, Dtype::Float32, k)?.multiply(&scale)?;
        a.eval()?;
        Ok(a)
    };
    Ok(LazyHead {
        embed: normal(&[VOCAB, HIDDEN], &k1)?,
        fuse: normal(&[2 * HIDDEN, HIDDEN], &k2)?,
        lm_head: normal(&[HIDDEN, VOCAB], &k3)?,
        caches: vec![Box::new(KvCache::new())],
    })
}

fn measure(k: usize, options: &Options, rounds: usize) -> Result<(f64, f64)> {
    let mut drafter = Drafter::new(head()?);
    let mut s = drafter.open();
    let hiddens = random::normal(&[64, HIDDEN], Dtype::Float32, &random::key(2)?)?;
    hiddens.eval()?;
    let prompt: Vec<u32> = (0..32).collect();
    s.committed(
        &Array::from_slice(&prompt, &[32])?,
        &hiddens.slice_axis(0, 0, 32)?,
        0,
    )?;
    let history = History::new(64);
    let mut keys = KeyStream::new(3);
    let (mut pos, mut current) = (32usize, Array::from_slice(&[32u32], &[1])?);
    let (mut build, mut eval) = (0.0, 0.0);
    for _ in 0..rounds {
        let t0 = Instant::now();
        let sampling = DraftSampling {
            options,
            history: &history,
            keys: &mut keys,
        };
        let p = s.propose(&current, k, sampling)?.expect("primed");
        let t1 = Instant::now();
        mlx_tensor::eval([&p.tokens, p.dist.probs()])?;
        let t2 = Instant::now();
        build += (t1 - t0).as_secs_f64();
        eval += (t2 - t1).as_secs_f64();
        // Accept every draft; the last one stands in for the next token.
        let run = ops::concatenate(
            &[current.clone(), p.tokens.slice_axis(0, 0, k as i32 - 1)?],
            0,
        )?;
        s.committed(&run, &hiddens.slice_axis(0, 0, k as i32)?, pos)?;
        pos += k;
        current = p.tokens.slice_axis(0, k as i32 - 1, k as i32)?;
    }
    s.close()?;
    let per = 1e6 / rounds as f64;
    Ok((build * per, eval * per))
}

fn main() -> Result<()> {
    let penalised = Options {
        presence_penalty: 0.5,
        ..Options::greedy()
    };
    for (name, options) in [
        ("greedy", Options::greedy()),
        ("greedy+presence", penalised),
    ] {
        for k in [1usize, 2, 4] {
            measure(k, &options, 20)?; // Warm up.
            let (build, eval) = measure(k, &options, 200)?;
            println!(
                "{{\"options\":\"{name}\",\"k\":{k},\"build_us\":{build:.1},\"eval_us\":{eval:.1},\"total_us\":{:.1}}}",
                build + eval
            );
        }
    }
    Ok(())
}
