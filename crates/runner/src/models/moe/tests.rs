//! The MoE block against a per-row, per-expert reference loop, over every expert layout.

use std::collections::{BTreeMap, HashMap};

use mlx_tensor::{Array, Dtype, ops, random};

use super::config::SparseLayers;
use super::*;
use crate::quant::{QuantConfig, QuantParams};
use crate::weights::Weights;

const E: usize = 6;
const H: usize = 64;
const I: usize = 32;
const SHARED: usize = 64;

fn normal(shape: &[usize], seed: u64) -> Array {
    let s: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
    random::normal(&s, Dtype::Float32, &random::key(seed).unwrap())
        .unwrap()
        .multiply(&Array::scalar(0.3, Dtype::Float32).unwrap())
        .unwrap()
}

fn config(top_k: usize, scoring: Scoring, shared: SharedExperts) -> MoeConfig {
    MoeConfig {
        num_experts: E,
        top_k,
        intermediate: I,
        norm_topk_prob: true,
        scoring,
        shared,
        sparse: SparseLayers {
            dense: vec![],
            first_dense: 0,
            step: 1,
            freq: 1,
        },
    }
}

/// The dense weights of one block: router, experts `[E, I, H]` x2 + `[E, H, I]`, shared.
struct Dense {
    gate: Array,
    bias: Array,
    w_gate: Array,
    w_up: Array,
    w_down: Array,
    shared: [Array; 3],
    shared_gate: Array,
}

fn dense(seed: u64) -> Dense {
    Dense {
        gate: normal(&[E, H], seed),
        bias: normal(&[E], seed + 1),
        w_gate: normal(&[E, I, H], seed + 2),
        w_up: normal(&[E, I, H], seed + 3),
        w_down: normal(&[E, H, I], seed + 4),
        shared: [
            normal(&[SHARED, H], seed + 5),
            normal(&[SHARED, H], seed + 6),
            normal(&[H, SHARED], seed + 7),
        ],
        shared_gate: normal(&[1, H], seed + 8),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    Fused,
    PerExpert,
    Switch,
    SwitchQ4,
}

/// The tensors of `d` under `m.` in `layout`.
fn tensors(d: &Dense, layout: Layout) -> HashMap<String, Array> {
    let mut t = HashMap::new();
    let mut put = |k: &str, a: Array| t.insert(format!("m.{k}"), a);
    put("gate.weight", d.gate.clone());
    put("gate.e_score_correction_bias", d.bias.clone());
    for (name, a) in ["gate_proj", "up_proj", "down_proj"].iter().zip(&d.shared) {
        put(&format!("shared_expert.{name}.weight"), a.clone());
        put(&format!("shared_experts.{name}.weight"), a.clone());
    }
    put("shared_expert_gate.weight", d.shared_gate.clone());
    let projs = [
        ("gate_proj", &d.w_gate),
        ("up_proj", &d.w_up),
        ("down_proj", &d.w_down),
    ];
    match layout {
        Layout::Fused => {
            put(
                "experts.gate_up_proj",
                ops::concatenate(&[d.w_gate.clone(), d.w_up.clone()], 1).unwrap(),
            );
            put("experts.down_proj", d.w_down.clone());
        }
        Layout::PerExpert => {
            for (name, w) in projs {
                for e in 0..E as i32 {
                    let one = w.slice_axis(0, e, e + 1).unwrap().squeeze(&[0]).unwrap();
                    put(&format!("experts.{e}.{name}.weight"), one);
                }
            }
        }
        Layout::Switch => {
            for (name, w) in projs {
                put(&format!("switch_mlp.{name}.weight"), w.clone());
            }
        }
        Layout::SwitchQ4 => {
            for (name, w) in projs {
                let (q, s, b) = w.quantize(32, 4).unwrap();
                put(&format!("switch_mlp.{name}.weight"), q);
                put(&format!("switch_mlp.{name}.scales"), s);
                put(&format!("switch_mlp.{name}.biases"), b);
            }
        }
    }
    t
}

fn load(d: &Dense, layout: Layout, c: &MoeConfig) -> MoeBlock {
    let mut w = Weights::from_map(tensors(d, layout), Dtype::Float32).with_quantization(Some(
        QuantConfig {
            default: QuantParams::affine(32, 4),
            overrides: BTreeMap::new(),
        },
    ));
    let b = MoeBlock::load(c, w.vars("m"), H, LinearLayout::DEFAULT).unwrap();
    assert_eq!(b.is_quantized(), layout == Layout::SwitchQ4);
    b
}

fn host(a: &Array) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

/// Row `r` of `[R, C]` (host).
fn row(v: &[f32], r: usize, c: usize) -> &[f32] {
    &v[r * c..(r + 1) * c]
}

fn matvec(w: &[f32], x: &[f32], out: usize) -> Vec<f32> {
    let input = x.len();
    (0..out)
        .map(|o| (0..input).map(|i| w[o * input + i] * x[i]).sum())
        .collect()
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

fn swiglu(g: &[f32], u: &[f32], d: &[f32], x: &[f32], inner: usize) -> Vec<f32> {
    let a: Vec<f32> = matvec(g, x, inner)
        .iter()
        .zip(matvec(u, x, inner))
        .map(|(g, u)| silu(*g) * u)
        .collect();
    matvec(d, &a, x.len())
}

/// The reference: per row, the router on the host, then each chosen expert alone.
fn reference(d: &Dense, c: &MoeConfig, x: &[f32], rows: usize) -> Vec<f32> {
    let (wg, wu, wd) = (host(&d.w_gate), host(&d.w_up), host(&d.w_down));
    let (gate, bias) = (host(&d.gate), host(&d.bias));
    let shared: Vec<Vec<f32>> = d.shared.iter().map(host).collect();
    let mut out = Vec::new();
    for r in 0..rows {
        let xr = row(x, r, H);
        let logits = matvec(&gate, xr, E);
        let (scores, choice): (Vec<f32>, Vec<f32>) = match c.scoring {
            Scoring::Softmax => {
                let m = logits.iter().cloned().fold(f32::MIN, f32::max);
                let z: f32 = logits.iter().map(|l| (l - m).exp()).sum();
                let p: Vec<f32> = logits.iter().map(|l| (l - m).exp() / z).collect();
                (p.clone(), p)
            }
            Scoring::GroupedSigmoid {
                n_group,
                topk_group,
                ..
            } => {
                let s: Vec<f32> = logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect();
                let mut ch: Vec<f32> = s.iter().zip(&bias).map(|(s, b)| s + b).collect();
                let per = E / n_group;
                let mut group_score: Vec<(f32, usize)> = (0..n_group)
                    .map(|g| {
                        let mut v = ch[g * per..(g + 1) * per].to_vec();
                        v.sort_by(|a, b| b.total_cmp(a));
                        (v[0] + v[1], g)
                    })
                    .collect();
                group_score.sort_by(|a, b| b.0.total_cmp(&a.0));
                for &(_, g) in &group_score[topk_group..] {
                    ch[g * per..(g + 1) * per].fill(0.0);
                }
                (s, ch)
            }
        };
        let mut order: Vec<usize> = (0..E).collect();
        order.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]));
        let chosen = &order[..c.top_k];
        let mut w: Vec<f32> = chosen.iter().map(|&e| scores[e]).collect();
        if c.norm_topk_prob {
            let s: f32 = w.iter().sum();
            w.iter_mut().for_each(|v| *v /= s);
        }
        if let Scoring::GroupedSigmoid {
            routed_scaling_factor,
            ..
        } = c.scoring
        {
            w.iter_mut().for_each(|v| *v *= routed_scaling_factor);
        }
        let mut y = vec![0.0; H];
        for (&e, &we) in chosen.iter().zip(&w) {
            let ye = swiglu(
                &wg[e * I * H..(e + 1) * I * H],
                &wu[e * I * H..(e + 1) * I * H],
                &wd[e * H * I..(e + 1) * H * I],
                xr,
                I,
            );
            y.iter_mut().zip(ye).for_each(|(a, b)| *a += we * b);
        }
        let s = swiglu(&shared[0], &shared[1], &shared[2], xr, SHARED);
        match c.shared {
            SharedExperts::None => {}
            SharedExperts::Gated { .. } => {
                let g = 1.0 / (1.0 + (-matvec(&host(&d.shared_gate), xr, 1)[0]).exp());
                y.iter_mut().zip(s).for_each(|(a, b)| *a += g * b);
            }
            SharedExperts::Plain { .. } => y.iter_mut().zip(s).for_each(|(a, b)| *a += b),
        }
        out.extend(y);
    }
    out
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Runs `c` over `rows` rows in `layout`; returns (block output, reference).
fn run(c: &MoeConfig, layout: Layout, rows: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let d = dense(seed);
    let x = normal(&[rows, H], seed + 100);
    let got = load(&d, layout, c).forward(&x).unwrap();
    assert_eq!(got.shape().as_slice(), &[rows as i32, H as i32]);
    (host(&got), reference(&d, c, &host(&x), rows))
}

/// Dense layouts agree with the reference within f32 rounding of ~64-term
/// sums of values ~0.3 (1e-4 absolute), for one row and for several rows
/// (the sorted path), with both router styles and all shared-expert kinds.
#[test]
fn block_equals_per_expert_reference() {
    let sigmoid = Scoring::GroupedSigmoid {
        n_group: 3,
        topk_group: 2,
        routed_scaling_factor: 2.5,
    };
    let cases = [
        (
            2,
            Scoring::Softmax,
            SharedExperts::Gated {
                intermediate: SHARED,
            },
        ),
        (3, Scoring::Softmax, SharedExperts::None),
        (
            2,
            sigmoid,
            SharedExperts::Plain {
                intermediate: SHARED,
            },
        ),
        (1, sigmoid, SharedExperts::None),
    ];
    for (k, scoring, shared) in cases {
        let c = config(k, scoring, shared);
        for layout in [Layout::Fused, Layout::PerExpert, Layout::Switch] {
            for rows in [1, 5] {
                let (got, want) = run(&c, layout, rows, 7);
                let diff = max_diff(&got, &want);
                assert!(
                    diff < 1e-4,
                    "{layout:?} k {k} {scoring:?} {shared:?} {rows} rows: max diff {diff}"
                );
            }
        }
    }
}

/// Quantized experts stay quantized and are close to the dense block: 4-bit
/// codes move each weight by up to one step (~range/15 ≈ 0.1 here), so the
/// outputs (|y| ~ 1) differ by up to a few tenths; 0.5 is far below a broken
/// gather (which gives unrelated rows) yet above honest rounding.
#[test]
fn quantized_experts_track_dense() {
    let c = config(
        2,
        Scoring::Softmax,
        SharedExperts::Gated {
            intermediate: SHARED,
        },
    );
    for rows in [1, 4] {
        let (got, want) = run(&c, Layout::SwitchQ4, rows, 11);
        let diff = max_diff(&got, &want);
        assert!(diff < 0.5, "{rows} rows: max diff {diff}");
        assert!(
            diff > 0.0,
            "quantization changed nothing: not the quantized path"
        );
    }
}

/// Several rows at once equal the rows one by one (the sorted gather puts rows back in order).
#[test]
fn rows_at_once_equal_rows_one_by_one() {
    let c = config(3, Scoring::Softmax, SharedExperts::None);
    let d = dense(21);
    for layout in [Layout::Fused, Layout::SwitchQ4] {
        let b = load(&d, layout, &c);
        let x = normal(&[6, H], 22);
        let all = host(&b.forward(&x.reshape(&[1, 6, H as i32]).unwrap()).unwrap());
        let one: Vec<f32> = (0..6)
            .flat_map(|r| host(&b.forward(&x.slice_axis(0, r, r + 1).unwrap()).unwrap()))
            .collect();
        let diff = max_diff(&all, &one);
        assert!(diff < 1e-5, "{layout:?}: max diff {diff}");
    }
}

/// A checkpoint without experts names the layer and the layouts looked for.
#[test]
fn missing_experts_are_named() {
    let c = config(2, Scoring::Softmax, SharedExperts::None);
    let d = dense(3);
    let mut t = tensors(&d, Layout::Switch);
    t.retain(|k, _| !k.contains("switch_mlp"));
    let mut w = Weights::from_map(t, Dtype::Float32);
    let err = MoeBlock::load(&c, w.vars("m"), H, LinearLayout::DEFAULT).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("`m`") && msg.contains("switch_mlp"), "{msg}");
}

/// The sparse-layer predicate of each family's keys.
#[test]
fn sparse_layers_follow_each_rule() {
    let check = |rule: SparseLayers, want: &[usize]| {
        let got: Vec<usize> = (0..8).filter(|&i| rule.is_sparse(i)).collect();
        assert_eq!(got, want, "{rule:?}");
    };
    let all = SparseLayers {
        dense: vec![],
        first_dense: 0,
        step: 1,
        freq: 1,
    };
    check(all.clone(), &[0, 1, 2, 3, 4, 5, 6, 7]);
    check(
        SparseLayers {
            dense: vec![1, 4],
            ..all.clone()
        },
        &[0, 2, 3, 5, 6, 7],
    );
    check(
        SparseLayers {
            step: 2,
            ..all.clone()
        },
        &[1, 3, 5, 7],
    );
    check(
        SparseLayers {
            first_dense: 3,
            ..all.clone()
        },
        &[3, 4, 5, 6, 7],
    );
    check(SparseLayers { freq: 3, ..all }, &[0, 3, 6]);
}
