//! The `spec-scale` benchmark's side of ours: one model loaded once in one
//! dtype, then plain and MTP decoding per depth over several prompts, the
//! greedy speculative output checked against plain, and time to first token.
//!
//! `cargo run --release -p runner --example scale-bench -- --model DIR --prompts FILE
//! [--shape NAME] [--dtype f32|bf16] [--depths auto,6,5,4,3,2,1] [--tokens N]
//! [--ttft-tokens 1000,600|none] [--profile-depth 3|1,2,3,4|none] [--passes N] [--deadline-s S]
//! [--rows-time 0,1,3]`
//!
//! With `RUST_LOG` set (e.g. `runner::depth=trace`) the runner's logs go to
//! stderr: the auto controller's decisions and rounds.
//!
//! `--prompts` is a JSON array of strings; each prompt is id 0 (`<|endoftext|>`,
//! where training documents start) then the text's tokens, the ids
//! `mlx_lm_scale.py` uses too. One JSON line per result, `"bench":"spec-scale"`:
//! * `kind: "load"`: `load_s`, `weight_bytes` (MLX active memory the weights hold).
//! * `kind: "kernel-unit"` (CUDA only, first), one per kernel and dtype: our
//!   CUDA kernels against the ops they replace on random inputs
//!   (`runner::kernel_checks`: the fused heads in f32 and bf16, the few-rows
//!   matmul and the short-query attention in bf16), `kernel`, `dtype`,
//!   `rel_err` (worst difference ÷ output range), `tolerance`; the run stops
//!   when one is past its tolerance.
//! * `kind: "attention-time"` (bf16 on a GPU): one attention call's time at
//!   the model's heads, per `keys` (1,000, host-bound; 8,192), `path`
//!   (`short`: our kernels, `explicit`) and `rows` (2–5, 8, 16):
//!   `us_per_call`, the median over three batches of 64 independent calls
//!   evaluated at once.
//! * `kind: "rows-time"` (bf16 on a GPU, with `--rows-time 0,1,...`, which
//!   then measures nothing else): one product's time at the model's shapes,
//!   per row count and path (`mlx`, `rows-vN`): `us_per_call`, `gbps`,
//!   `rel_err` against MLX's product.
//! * `kind: "host"`: the host cost of a plain step, and of synced forwards of 1, 2
//!   and 5 rows phase by phase (`examples/support/host.rs`).
//! * `kind: "decode"`, per (method, depth): `tokens_per_s` = tokens after each
//!   run's first ÷ total decode time, over all prompts; `step_ms` (decode time per
//!   token); `mean_accepted_length`, `acceptance_rate`, `per_position_acceptance`,
//!   `depth_histogram` summed over the requests (and, for auto, `depth_over_time`:
//!   the drafted depth of every round in order); `greedy_equal_plain` (every
//!   request's tokens equal plain's) and `first_divergence` (`[request, token]`);
//!   `ttft_ms` (mean over the requests), `prompts` (requests per case).
//!   Plain is `method: "off"`, `depth: 0`.
//!   `round_costs`: a drafted round's mean wall time and its phases in ms
//!   (host-side phases; see `runner::Phases`); `plain_phases_ms`: the plain
//!   decoder's host time per token (build, dispatch, wait, emit; see
//!   `runner::PlainPhases`), `null` when no token came from it.
//!   `per_position_acceptance[i]` is the share of the rounds that drafted
//!   position `i + 1` in which that draft was accepted (not the rate given
//!   that the drafts before it were).
//! * `kind: "auto-vs-best"` (with auto and a fixed depth among `--depths`):
//!   `ratio`, auto's tokens/s over the best fixed depth's (`best_depth`), and
//!   `interval90`, its 5th and 95th percentiles over 2,000 resamples of the
//!   `blocks` request blocks, the best depth picked again in each;
//!   `priced` and `priced_interval90`, the same with auto's rounds priced
//!   at the fixed cases' seconds a round of each depth (plain's a token;
//!   other drafting depths on the line through the two deepest drafting cases): the timing noise
//!   between the cases mostly drops out, leaving the quality of auto's
//!   choices (`null` where a depth auto ran cannot be priced).
//! * `kind: "round-profile"`: each `--profile-depth` depth again with every
//!   round synced per phase (`runner::set_profile_rounds`): `round_costs`
//!   then holds device times of the draft, the verify forward and the
//!   acceptance (its tokens/s is not comparable: extra syncs).
//! * `kind: "ttft"`: a fresh plain request of `prompt_tokens` (1,000 first, then
//!   another length) in this same process: `ttft_ms`, `request` (1, 2, ...).
//! * `kind: "skipped"`: work not started because `--deadline-s` (seconds
//!   since start) would have passed before it ended: the timed cases' later
//!   request blocks (`method: "all"`, judged by the last block) or a profiled
//!   case (judged by the last case).
//!
//! Each case runs in one session, a 16-token warm-up first (kernels build
//! and JIT there), then its requests, as a server reuses its session. The
//! timed cases run interleaved, request by request: `--passes` times over the
//! prompts, each block (one prompt, every case once) starting one case later,
//! so a drift of the machine's speed falls on every case alike. The profiled
//! cases run after them, one at a time. `--deadline-s` ends the blocks early
//! (a `skipped` row says how many requests ran).
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use mlx_tensor::{Array, Dtype};
use runner::{
    DepthPolicy, GenerateOptions, Generation, LoadOptions, LoadedModel, SamplingOptions, Session,
    SpecStats,
};
use serde_json::{Value, json};

#[path = "support/host.rs"]
mod host;
#[path = "support/logs.rs"]
mod logs;
#[path = "support/pricing.rs"]
mod pricing;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Environment switches of ours and of MLX's CUDA backend that change what a
/// run measures (docs/gpu.md names each).
const SWITCHES: &[&str] = &[
    "MTP_LAYER_DISPATCH",
    "MTP_LAYER_DISPATCH_EVERY",
    "MTP_DELTA_KERNEL",
    "MTP_EARLY_DRAFT_DISPATCH",
    "MTP_ROWS_KERNEL",
    "MTP_ROWS_KERNEL_ONE",
    "MTP_ROWS_KERNEL_MAX_MIB",
    "MTP_ROWS_VARIANT",
    "MTP_ROWS_CPU_AVX512",
    "MLX_MAX_MB_PER_BUFFER",
    "MTP_READ_CONTIGUOUS",
    "MTP_ATTENTION",
    "MTP_KV_RESERVE",
    "MTP_DRAFT_QUANT",
    "MTP_SHAPE_BUCKETS",
    "MTP_DRAFT_VOCAB",
    "MTP_FUSED_HEADS",
    "MTP_SHORT_SDPA_V1",
    "MLX_CUDA_GRAPH_CACHE_SIZE",
    "MLX_CUDA_USE_CUDNN_SDPA",
    "MLX_USE_CUDA_GRAPHS",
    "MLX_MAX_OPS_PER_BUFFER",
];

/// Device and host time of one bf16 attention call of `hq` heads over
/// `hkv` KV heads of width `d`, per key length, query row count (2–5, 8,
/// 16) and path (`short`: our kernels, `explicit`): 64 independent calls
/// built and evaluated at once, as a forward's layers are, after a warm-up.
/// At 1,000 keys the host's encoding bounds a call (session 17: the same
/// kernels measured 1.6–2 × apart in two processes of unlike hosts); 8,192
/// keys give the device eight times the work, so there the kernels' own
/// time shows. One `attention-time` row per case.
fn attention_time(hq: i32, hkv: i32, d: i32, row: &dyn Fn(Value) -> Value) -> Res<()> {
    use runner::testing::{explicit_attention, short_attention};
    const CALLS: usize = 64;
    for (s, l) in [1000, 8192]
        .into_iter()
        .flat_map(|s| [2, 3, 4, 5, 8, 16].map(|l| (s, l)))
    {
        let rnd = |shape: &[i32], j: u64| -> Res<Array> {
            let key = mlx_tensor::random::key(500 + j)?;
            Ok(mlx_tensor::random::normal(shape, Dtype::Bfloat16, &key)?)
        };
        let q = rnd(&[1, l, hq, d], 0)?.transpose(&[0, 2, 1, 3])?;
        let live = |a: Array| a.slice(&[0, 0, 0, 0], &[1, hkv, s, d], &[1, 1, 1, 1]);
        let cap = s + 256;
        let k = live(rnd(&[1, hkv, cap, d], 1)?)?;
        let v = live(rnd(&[1, hkv, cap, d], 2)?)?;
        for a in [&q, &k, &v] {
            a.eval()?;
        }
        let scale = 1.0 / (d as f32).sqrt();
        for path in ["short", "explicit"] {
            // One scale for every call: the kernel takes it as a template
            // value, so each new scale is a new NVRTC compile (seconds).
            // MLX does not merge equal nodes outside `compile`, so the calls
            // stay distinct.
            let call = |_: usize| -> Res<Array> {
                Ok(if path == "short" {
                    short_attention(&q, &k, &v, scale)?
                } else {
                    explicit_attention(&q, &k, &v, scale)?
                })
            };
            let us = us_per_call(CALLS, &call)?;
            emit(&row(
                json!({"kind": "attention-time", "path": path, "heads": hq, "kv_heads": hkv,
                       "head_dim": d, "rows": l, "keys": s, "us_per_call": us}),
            ))?;
        }
    }
    Ok(())
}

/// Device time of one bf16 `x @ W.T` at the model's own product shapes
/// (`qkv`, `o`, `gate_up`, `down`, `unembed`), per row count and path
/// (`mlx`: MLX's matmul, its GEMV for one row and cuBLASLt for more;
/// `rows-vN`: our few-rows kernel with load scheme N): 32 calls evaluated
/// at once over distinct weights (at least 512 MiB in all, so L2 holds
/// none between calls), after a warm-up. `gbps` is weight bytes read per
/// second. One `rows-time` row per case.
fn rows_time(c: &runner::ModelConfig, variants: &[i32], row: &dyn Fn(Value) -> Value) -> Res<()> {
    const CALLS: usize = 32;
    let n = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
    let (h, i, d) = (n(c.hidden_size), n(c.intermediate_size), n(c.head_dim));
    let (hq, hkv) = (n(c.num_attention_heads), n(c.num_key_value_heads));
    let shapes = [
        ("qkv", (hq + 2 * hkv) * d, h),
        ("o", h, hq * d),
        ("gate_up", 2 * i, h),
        ("down", h, i),
        ("unembed", n(c.vocab_size), h),
    ];
    for (name, out, k) in shapes {
        if out % 16 != 0 || k % 32 != 0 {
            continue;
        }
        let bytes = out as u64 * k as u64 * 2;
        let copies = (512u64 << 20).div_ceil(bytes).clamp(2, 16) as usize;
        let rnd =
            |shape: &[i32], j: u64| -> Res<Array> {
                let key = mlx_tensor::random::key(900 + j)?;
                Ok(mlx_tensor::random::normal(shape, Dtype::Float32, &key)?
                    .as_type(Dtype::Bfloat16)?)
            };
        let ws = (0..copies)
            .map(|j| rnd(&[out, k], j as u64))
            .collect::<Res<Vec<_>>>()?;
        mlx_tensor::eval(&ws)?;
        let wts = ws.iter().map(|w| w.t()).collect::<Result<Vec<_>, _>>()?;
        for rows in [1, 2, 5, 8] {
            let x = rnd(&[rows, k], 77)?;
            x.eval()?;
            // The kernel at a verify's row counts (each count is a compile).
            let kernel = rows == 2 || rows == 5;
            let paths = std::iter::once(-1).chain(variants.iter().copied().filter(|_| kernel));
            for v in paths {
                let call = |j: usize| -> Res<Array> {
                    Ok(if v < 0 {
                        x.matmul(&wts[j % copies])?
                    } else {
                        runner::testing::rows_matmul_t(&x, &ws[j % copies], v)?
                    })
                };
                let us = us_per_call(CALLS, &call)?;
                let path = if v < 0 {
                    "mlx".to_owned()
                } else {
                    format!("rows-v{v}")
                };
                // The kernel's worst difference from MLX's product ÷ its range.
                let rel_err = if v < 0 {
                    0.0
                } else {
                    runner::testing::rel_err(&call(0)?, &x.matmul(&wts[0])?)?
                };
                emit(&row(
                    json!({"kind": "rows-time", "product": name, "n": out, "k": k,
                                 "rows": rows, "path": path, "us_per_call": us,
                                 "gbps": bytes as f64 / us / 1e3, "rel_err": rel_err}),
                ))?;
            }
        }
    }
    Ok(())
}

/// µs per call of `calls` independent calls of `call(i)`, built and
/// evaluated at once: the median over three batches after a warm-up one.
fn us_per_call(calls: usize, call: &dyn Fn(usize) -> Res<Array>) -> Res<f64> {
    let mut times = Vec::new();
    for rep in 0..4 {
        let t = Instant::now();
        let outs = (0..calls).map(call).collect::<Res<Vec<_>>>()?;
        mlx_tensor::eval(&outs)?;
        if rep > 0 {
            times.push(t.elapsed().as_secs_f64() * 1e6 / calls as f64);
        }
    }
    Ok(host::median(times))
}

fn emit(line: &Value) -> Res<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    out.write_all(format!("{line}\n").as_bytes())?;
    out.flush()?;
    Ok(())
}

fn parse_depth(s: &str) -> Res<DepthPolicy> {
    Ok(match s.trim() {
        "auto" => DepthPolicy::default(),
        n => DepthPolicy::Fixed(
            n.parse()
                .map_err(|_| format!("--depths: `{n}` is not `auto` or a number"))?,
        ),
    })
}

fn depth_json(d: DepthPolicy) -> Value {
    match d {
        DepthPolicy::Fixed(n) => json!(n),
        DepthPolicy::Auto { .. } => json!("auto"),
    }
}

fn greedy(max_tokens: usize, depth: DepthPolicy) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: SamplingOptions::greedy(),
        depth,
        ..GenerateOptions::default()
    }
}

/// A fresh session of `method`.
fn session<'m>(m: &'m LoadedModel, method: &str) -> Res<Session<'m>> {
    let target = m.model.as_ref();
    Ok(match method {
        "off" => Session::new(target),
        "mtp" => Session::with_mtp(target)?,
        other => return Err(format!("scale-bench runs off and mtp, not `{other}`").into()),
    })
}

/// A fresh session of `method`, warmed up by 16 tokens of `prompt` at
/// `depth` (kernels build and JIT there, outside the timings).
fn warmed<'m>(
    m: &'m LoadedModel,
    method: &str,
    depth: DepthPolicy,
    prompt: &[u32],
) -> Res<Session<'m>> {
    let mut s = session(m, method)?;
    generate(m, &mut s, prompt, &greedy(16, depth))?;
    Ok(s)
}

/// One generation of the whole prompt `ids` in `s`, a session reused across
/// a case's requests as a server reuses its session: it keeps the prefix
/// `ids` shares with what the session holds and rewinds the rest (so the
/// requests do not pile up in one context), and the auto depth controller
/// starts each request from what the last one learned.
fn generate(
    m: &LoadedModel,
    s: &mut Session<'_>,
    ids: &[u32],
    opts: &GenerateOptions,
) -> Res<Generation> {
    let n = s.reuse_prefix(ids)?;
    Ok(s.generate(
        &m.tokenizer,
        &ids[n..],
        opts,
        &AtomicBool::new(false),
        |_| {},
    )?)
}

/// Sums of one case over the prompts.
struct Case {
    prefill: Duration,
    generated: usize,
    spec: SpecStats,
    plain: runner::PlainPhases,
    outputs: Vec<Vec<u32>>,
    /// Each request in order: the case's totals, and the timed cases'
    /// `i`-th requests ran in the same block ([`auto_vs_best`]).
    requests: Vec<Request>,
}

/// One request of a case.
struct Request {
    /// Timed tokens (after the first) and their decode seconds.
    tokens: usize,
    seconds: f64,
    /// Rounds at each depth (`[0]`: plain rounds; a plain request's are its
    /// timed tokens).
    rounds: Vec<usize>,
}

impl Default for Case {
    fn default() -> Case {
        Case {
            prefill: Duration::ZERO,
            generated: 0,
            // The method is not reported from here; the sums are.
            spec: SpecStats::new(runner::DraftMethod::Mtp),
            plain: runner::PlainPhases::default(),
            outputs: Vec::new(),
            requests: Vec::new(),
        }
    }
}

impl Case {
    fn add(&mut self, g: Generation) {
        let tokens = g.stats.generated_tokens.saturating_sub(1);
        self.requests.push(Request {
            tokens,
            seconds: g.stats.decode_time.as_secs_f64(),
            rounds: g
                .speculation
                .as_ref()
                .map_or_else(|| vec![tokens], SpecStats::depth_histogram),
        });
        self.prefill += g.stats.prefill_time;
        self.generated += g.stats.generated_tokens;
        let (p, q) = (&mut self.plain, &g.stats.plain);
        p.tokens += q.tokens;
        p.build += q.build;
        p.dispatch += q.dispatch;
        p.wait += q.wait;
        p.emit += q.emit;
        if let Some(s) = g.speculation {
            let t = &mut self.spec;
            t.rounds += s.rounds;
            t.drafted += s.drafted;
            t.accepted += s.accepted;
            t.emitted += s.emitted;
            t.depth_over_time.extend(s.depth_over_time);
            t.times.merge(&s.times);
            for (sum, part) in [
                (&mut t.drafted_at, &s.drafted_at),
                (&mut t.accepted_at, &s.accepted_at),
            ] {
                if sum.len() < part.len() {
                    sum.resize(part.len(), 0);
                }
                for (a, b) in sum.iter_mut().zip(part) {
                    *a += b;
                }
            }
        }
        self.outputs.push(g.token_ids);
    }
}

/// Auto's tokens/s over the best fixed drafting depth's in the interleaved
/// run, with a 90 % interval from resampling its request blocks (`None`
/// without auto and a fixed depth). A block is one prompt run by every case
/// in turn, so the host's drift falls on all of them alike; resampling
/// whole blocks keeps that pairing, and picking the best depth again in
/// each resample counts the edge that the best of several noisy depths
/// gets by luck. The figure says how far one run's ratio can be trusted.
fn auto_vs_best(timed: &[(&str, DepthPolicy)], sums: &[Case]) -> Option<Value> {
    let auto = timed
        .iter()
        .position(|t| matches!(t.1, DepthPolicy::Auto { .. }))?;
    let fixed: Vec<usize> = (0..timed.len())
        .filter(|&i| timed[i].0 == "mtp" && matches!(timed[i].1, DepthPolicy::Fixed(_)))
        .collect();
    let blocks = sums.iter().map(|c| c.requests.len()).min()?;
    if fixed.is_empty() || blocks == 0 {
        return None;
    }
    // Auto over the best fixed depth, measured and priced, over the blocks
    // `picks` (with repeats).
    let ratio = |picks: &mut dyn Iterator<Item = usize>| -> (f64, Option<f64>, usize) {
        let mut tps = vec![(0usize, 0.0f64, Vec::<usize>::new()); sums.len()];
        for b in picks {
            for (t, c) in tps.iter_mut().zip(sums) {
                let r = &c.requests[b];
                t.0 += r.tokens;
                t.1 += r.seconds;
                if t.2.len() < r.rounds.len() {
                    t.2.resize(r.rounds.len(), 0);
                }
                t.2.iter_mut().zip(&r.rounds).for_each(|(a, n)| *a += n);
            }
        }
        let rate = |i: usize| tps[i].0 as f64 / tps[i].1.max(f64::MIN_POSITIVE);
        let best = fixed
            .iter()
            .copied()
            .max_by(|&a, &b| rate(a).total_cmp(&rate(b)))
            .expect("a fixed depth");
        // A round's seconds at each depth from the fixed cases (plain from
        // the plain case), and auto's rounds priced at them.
        let mut at: Vec<(usize, f64)> = (0..timed.len())
            .filter_map(|i| {
                let DepthPolicy::Fixed(d) = timed[i].1 else {
                    return None;
                };
                let n: usize = tps[i].2.iter().sum();
                (n > 0).then(|| (d, tps[i].1 / n as f64))
            })
            .collect();
        at.sort_by_key(|x| x.0);
        at.dedup_by_key(|x| x.0);
        let auto_rounds: Vec<f64> = tps[auto].2.iter().map(|&n| n as f64).collect();
        let priced = pricing::priced_seconds(&at, &auto_rounds)
            .map(|s| tps[auto].0 as f64 / s / rate(best))
            .filter(|r| r.is_finite());
        (rate(auto) / rate(best), priced, best)
    };
    let (whole, priced, best) = ratio(&mut (0..blocks));
    // Seeded: the same rows give the same interval.
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let (mut draws, mut priced_draws): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
    for _ in 0..2000 {
        let (r, p, _) = ratio(&mut (0..blocks).map(|_| rng.usize(..blocks)));
        draws.push(r);
        priced_draws.extend(p);
    }
    let interval = |mut v: Vec<f64>| {
        if v.is_empty() {
            return Value::Null;
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        json!([at(0.05), at(0.95)])
    };
    Some(json!({
        "kind": "auto-vs-best", "method": "mtp", "depth": "auto",
        "ratio": whole, "best_depth": depth_json(timed[best].1),
        "interval90": interval(draws), "blocks": blocks,
        "priced": priced, "priced_interval90": interval(priced_draws),
    }))
}

/// Mean per-round costs in ms (`null` without drafted rounds).
fn round_costs(t: &runner::RoundTimes) -> Value {
    let Some(m) = t.means_ms() else {
        return Value::Null;
    };
    json!({
        "profiled": t.profiled, "rounds": t.rounds, "round_ms": m.round,
        "draft_ms": m.draft, "draft_step_ms": m.draft_step, "verify_ms": m.verify,
        "wait_ms": m.wait, "commit_ms": m.commit, "syncs_per_round": m.syncs,
    })
}

/// The first `[prompt, token]` where `got` parts from `want`.
fn divergence(want: &[Vec<u32>], got: &[Vec<u32>]) -> Option<(usize, usize)> {
    want.iter().zip(got).enumerate().find_map(|(p, (a, b))| {
        let i = a.iter().zip(b).position(|(x, y)| x != y);
        match i {
            Some(i) => Some((p, i)),
            None if a.len() != b.len() => Some((p, a.len().min(b.len()))),
            None => None,
        }
    })
}

/// The `decode` (or, `profiled`, `round-profile`) row of case `c`, its
/// greedy output checked against `plain`'s.
fn decode_row(
    method: &str,
    depth: DepthPolicy,
    profiled: bool,
    c: &Case,
    plain: &[Vec<u32>],
    weight_bytes: usize,
    tokens: usize,
) -> Value {
    let requests = c.outputs.len();
    let decode_s: f64 = c.requests.iter().map(|r| r.seconds).sum();
    let timed_tokens: usize = c.requests.iter().map(|r| r.tokens).sum();
    let speculative = method != "off";
    let first = divergence(plain, &c.outputs);
    let s = &c.spec;
    json!({
        "kind": if profiled { "round-profile" } else { "decode" }, "method": method, "depth": depth_json(depth),
        "round_costs": round_costs(&s.times),
        "plain_phases_ms": (c.plain.tokens > 0).then(|| {
            let [b, d, w, e] = c.plain.per_token_ms();
            json!({"tokens": c.plain.tokens, "build": b, "dispatch": d, "wait": w, "emit": e})
        }),
        "tokens_per_s": if decode_s > 0.0 { timed_tokens as f64 / decode_s } else { 0.0 },
        "step_ms": if timed_tokens > 0 { decode_s * 1e3 / timed_tokens as f64 } else { 0.0 },
        "mean_accepted_length": if speculative && s.rounds > 0 { s.mean_accepted_length() } else { 1.0 },
        "acceptance_rate": s.acceptance_rate(),
        "per_position_acceptance": s.per_position_acceptance(),
        "depth_histogram": if speculative { json!(s.depth_histogram()) } else { Value::Null },
        // The auto controller's depth per round, all requests in order (drafted tokens).
        "depth_over_time": if matches!(depth, DepthPolicy::Auto { .. }) { json!(s.depth_over_time) } else { Value::Null },
        "rounds": s.rounds,
        "greedy_equal_plain": if speculative { json!(first.is_none()) } else { json!(true) },
        "first_divergence": first.map(|(p, t)| json!([p, t])),
        "ttft_ms": if requests > 0 { c.prefill.as_secs_f64() * 1e3 / requests as f64 } else { 0.0 },
        "generated_tokens": c.generated, "prompts": requests, "tokens": tokens,
        "weight_bytes": weight_bytes,
    })
}

// A benchmark binary: notes go to stderr, results to stdout.
#[allow(clippy::print_stderr)]
fn main() -> Res<()> {
    logs::init_from_env();
    let start = Instant::now();
    let mut args = std::env::args().skip(1);
    let (mut model, mut prompts_file, mut shape) = (None, None, String::from("?"));
    let (mut dtype_name, mut tokens, mut deadline) = (String::from("f32"), 256usize, None);
    // Every depth the auto controller may choose (at most 6), so its rounds
    // are priced at measured costs at each.
    let mut depths = "auto,6,5,4,3,2,1".to_owned();
    let mut profile: Vec<usize> = vec![3];
    let mut ttft = "1000,600".to_owned();
    let mut passes = 1usize;
    let mut rows_variants: Option<Vec<i32>> = None;
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--model" => model = Some(PathBuf::from(val()?)),
            "--prompts" => prompts_file = Some(PathBuf::from(val()?)),
            "--shape" => shape = val()?,
            "--dtype" => dtype_name = val()?,
            "--depths" => depths = val()?,
            "--tokens" => tokens = val()?.parse()?,
            "--profile-depth" => {
                let v = val()?;
                profile = if v == "none" {
                    Vec::new()
                } else {
                    v.split(',')
                        .map(|d| d.trim().parse::<usize>())
                        .collect::<Result<_, _>>()
                        .map_err(|_| {
                            format!("--profile-depth {v}: depths like 3 or 1,2,3,4, or none")
                        })?
                };
            }
            "--ttft-tokens" => ttft = val()?,
            "--passes" => passes = val()?.parse()?,
            "--rows-time" => {
                let v = val()?;
                rows_variants = Some(
                    v.split(',')
                        .map(|s| s.trim().parse::<i32>())
                        .collect::<Result<_, _>>()
                        .map_err(|_| format!("--rows-time {v}: load schemes like 0,1,3"))?,
                );
            }
            "--deadline-s" => deadline = Some(Duration::from_secs_f64(val()?.parse()?)),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let model = model.ok_or("--model DIR is required")?;
    let prompts_file =
        prompts_file.ok_or("--prompts FILE (a JSON array of strings) is required")?;
    let dtype = match dtype_name.as_str() {
        "f32" => Dtype::Float32,
        "bf16" => Dtype::Bfloat16,
        other => return Err(format!("--dtype {other}: f32 or bf16").into()),
    };
    let texts: Vec<String> = serde_json::from_str(&std::fs::read_to_string(&prompts_file)?)
        .map_err(|e| {
            format!(
                "{}: not a JSON array of strings: {e}",
                prompts_file.display()
            )
        })?;
    if texts.is_empty() {
        return Err(format!("{}: no prompts", prompts_file.display()).into());
    }
    if passes == 0 {
        return Err("--passes must be at least 1".into());
    }
    let depths: Vec<DepthPolicy> = depths.split(',').map(parse_depth).collect::<Res<_>>()?;
    // `none`, `0` or an empty list: no TTFT requests.
    let ttft: Vec<usize> = ttft
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "none")
        .map(|s| s.parse::<usize>())
        .filter(|n| *n != Ok(0))
        .collect::<Result<_, _>>()?;
    // The measurement switches this run was started with, on every row, so a
    // row says which kernels and paths it measured.
    let switches: serde_json::Map<String, Value> = SWITCHES
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), json!(v))))
        .collect();
    let base = json!({"bench": "spec-scale", "engine": "mtp-runner", "shape": shape,
                      "dtype": dtype_name, "switches": switches});
    let row = |extra: Value| {
        let mut r = base.clone();
        if let (Value::Object(r), Value::Object(e)) = (&mut r, extra) {
            r.extend(e);
        }
        r
    };

    // Our CUDA kernels against the ops they replace, before anything they
    // compute is timed (only where they run: CUDA).
    let checks = runner::kernel_checks()?;
    for c in &checks {
        emit(&row(
            json!({"kind": "kernel-unit", "kernel": c.kernel, "dtype": c.dtype,
                         "rel_err": c.rel_err, "tolerance": c.tolerance}),
        ))?;
    }
    if let Some(c) = checks.iter().find(|c| !c.passed()) {
        return Err(format!(
            "the {} kernel differs from the ops it replaces in {}: {:.2e} of the output range (tolerance {:e})",
            c.kernel, c.dtype, c.rel_err, c.tolerance
        )
        .into());
    }
    let before = mlx_tensor::memory::active();
    let t0 = Instant::now();
    let opts = LoadOptions {
        dtype,
        ..LoadOptions::default()
    };
    let m = runner::load(&model, opts, |_, _| {})?;
    let weight_bytes = mlx_tensor::memory::active().saturating_sub(before);
    emit(&row(
        json!({"kind": "load", "load_s": t0.elapsed().as_secs_f64(),
                     "weight_bytes": weight_bytes, "model": model.display().to_string(),
                     "draft_quant": m.draft_head.quant.map_or("off".to_owned(), |p| format!("q{}", p.bits)),
                     "draft_vocab": m.draft_head.vocab.as_ref().map(Vec::len)}),
    ))?;
    // One attention call's time at the model's heads, per path and query
    // row count (bf16 on CUDA: where the short-query kernels run).
    if dtype == Dtype::Bfloat16 && mlx_tensor::gpu_available() {
        let c = m.model.config();
        let n = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
        let (hq, hkv, d) = (
            n(c.num_attention_heads),
            n(c.num_key_value_heads),
            n(c.head_dim),
        );
        if let Some(v) = &rows_variants {
            // A probe of its own: the products only, no decoding.
            return rows_time(c, v, &row);
        }
        attention_time(hq, hkv, d, &row)?;
    }
    // The host cost of a plain step (graph build, op count, synced and
    // pipelined time per token), before any case.
    let vocab = m.model.vocab_size() as u32;
    let ids = |n: usize, salt: u32| -> Vec<u32> {
        (0..n as u32).map(|i| (i * 7919 + salt) % vocab).collect()
    };
    emit(&row(
        json!({"kind": "host", "host": host::probe(m.model.as_ref(), &ids, 48)}),
    ))?;
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| {
            let mut ids = vec![0];
            ids.extend(m.tokenizer.encode(t, false)?);
            Ok(ids)
        })
        .collect::<Res<_>>()?;

    // The timed cases run interleaved: request by request, each block of
    // requests (one prompt, every case once) starting at the next case, so a
    // drift of the machine's speed (clocks, other processes, the first
    // process of a fresh GPU machine) falls on every case alike. The
    // --profile-depth depths run after them with every round synced per
    // phase: device time of the draft, the verify forward and the acceptance.
    let mut timed: Vec<(&str, DepthPolicy)> = vec![("off", DepthPolicy::Fixed(0))];
    if m.model.mtp_head().is_some() {
        timed.extend(depths.iter().map(|&d| ("mtp", d)));
    } else {
        eprintln!(
            "scale-bench: {} has no MTP head: plain only",
            model.display()
        );
        profile.clear();
    }
    let mut sessions: Vec<Option<Session<'_>>> = timed.iter().map(|_| None).collect();
    let mut sums: Vec<Case> = timed.iter().map(|_| Case::default()).collect();
    let blocks = passes * prompts.len();
    let mut last_block: Option<Duration> = None;
    for b in 0..blocks {
        // The first block also warms every case up (kernels build there).
        if let (Some(limit), Some(g)) = (deadline, last_block)
            && start.elapsed() + g > limit
        {
            emit(&row(
                json!({"kind": "skipped", "method": "all", "depth": "all",
                "reason": format!("--deadline-s {}: ran {b} of {blocks} requests per case (a request block took {:.1} s)",
                                  limit.as_secs_f64(), g.as_secs_f64())}),
            ))?;
            break;
        }
        let block_start = Instant::now();
        let ids = &prompts[b % prompts.len()];
        for j in 0..timed.len() {
            let i = (j + b) % timed.len();
            let (method, depth) = timed[i];
            let s = match &mut sessions[i] {
                Some(s) => s,
                slot => slot.insert(warmed(&m, method, depth, &prompts[0])?),
            };
            sums[i].add(generate(&m, s, ids, &greedy(tokens, depth))?);
        }
        last_block = Some(block_start.elapsed());
    }
    drop(sessions);
    if let Some(v) = auto_vs_best(&timed, &sums) {
        emit(&row(v))?;
    }
    let plain = &sums[0].outputs;
    for ((method, depth), c) in timed.iter().copied().zip(&sums) {
        emit(&row(decode_row(
            method,
            depth,
            false,
            c,
            plain,
            weight_bytes,
            tokens,
        )))?;
    }
    // Time to first token: fresh plain requests of other prompt lengths.
    let long: Vec<u32> = prompts
        .iter()
        .flatten()
        .copied()
        .cycle()
        .take(ttft.iter().copied().max().unwrap_or(0))
        .collect();
    for (r, &n) in ttft.iter().enumerate() {
        let n = n.min(m.model.context_length().saturating_sub(8));
        let mut fresh = session(&m, "off")?;
        let g = generate(
            &m,
            &mut fresh,
            &long[..n],
            &greedy(2, DepthPolicy::Fixed(0)),
        )?;
        emit(&row(
            json!({"kind": "ttft", "method": "off", "depth": 0, "request": r + 1,
                         "prompt_tokens": n, "ttft_ms": g.stats.prefill_time.as_secs_f64() * 1e3}),
        ))?;
    }
    // The profiled depths after, one case at a time over the prompts.
    let mut last_case = last_block.map(|t| t / timed.len().max(1) as u32 * 3);
    for depth in profile.iter().map(|&p| DepthPolicy::Fixed(p)) {
        if let (Some(limit), Some(g)) = (deadline, last_case)
            && start.elapsed() + g > limit
        {
            emit(&row(
                json!({"kind": "skipped", "method": "mtp", "depth": depth_json(depth),
                             "reason": format!("--deadline-s {}: the last case took {:.1} s", limit.as_secs_f64(), g.as_secs_f64())}),
            ))?;
            continue;
        }
        let case_start = Instant::now();
        runner::set_profile_rounds(true);
        let mut s = warmed(&m, "mtp", depth, &prompts[0])?;
        let mut c = Case::default();
        for ids in &prompts {
            c.add(generate(&m, &mut s, ids, &greedy(tokens, depth))?);
        }
        runner::set_profile_rounds(false);
        last_case = Some(case_start.elapsed());
        emit(&row(decode_row(
            "mtp",
            depth,
            true,
            &c,
            plain,
            weight_bytes,
            tokens,
        )))?;
    }
    // Skip static destructors: OpenBLAS's exit-time shutdown can hang (see `exit_now`).
    mlx_tensor::exit_now(0)
}
