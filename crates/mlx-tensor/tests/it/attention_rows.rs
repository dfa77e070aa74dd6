//! `ops::attention_rows_cpu` (our few-rows CPU attention) against a float64
//! host reference: grouped heads, causal rows, head widths with and without
//! an 8-lane tail, keys read through a strided cache slice, every dtype; a
//! row of a many-row call equal bit for bit to the one-row call at its
//! position; and the errors.

use crate::common;

use common::{arr, host_noise};
use mlx_tensor::{Array, Dtype, ops};

/// `softmax(q kᵀ · scale, causal) v` in f64 over dense host data
/// `q [hq, l, d]`, `k, v [hkv, s, d]`.
#[allow(clippy::too_many_arguments)]
fn reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    hq: usize,
    hkv: usize,
    l: usize,
    s: usize,
    d: usize,
    scale: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; hq * l * d];
    for h in 0..hq {
        let g = h / (hq / hkv);
        for i in 0..l {
            let keys = s - l + i + 1;
            let qr = &q[(h * l + i) * d..][..d];
            let scores: Vec<f64> = (0..keys)
                .map(|j| {
                    let kr = &k[(g * s + j) * d..][..d];
                    scale
                        * qr.iter()
                            .zip(kr)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                })
                .collect();
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|x| (x - mx).exp()).collect();
            let sum: f64 = e.iter().sum();
            for (j, p) in e.iter().enumerate() {
                let vr = &v[(g * s + j) * d..][..d];
                for c in 0..d {
                    out[(h * l + i) * d + c] += p / sum * vr[c] as f64;
                }
            }
        }
    }
    out
}

fn values(a: &Array) -> Vec<f32> {
    a.as_type(Dtype::Float32).unwrap().to_vec::<f32>().unwrap()
}

/// Every dtype, 1–40 rows (past 16 a prefill chunk's rows go in blocks), grouped and ungrouped heads, head widths 64,
/// 136 (past the 64 lanes the AVX2 kernel holds in registers) and 20 (a tail), keys a multiple of 8 and not, from as many as the rows to past the size that splits
/// the work over threads; the keys and values are the first `s` slots of a
/// larger cache buffer (strided across heads). f32 within 2e-6 of the f64
/// result's scale; bf16 / f16 within their rounding.
#[test]
fn attention_rows_matches_a_float64_reference_in_every_dtype() {
    for (dtype, tol) in [
        (Dtype::Float32, 2e-6_f32),
        (Dtype::Bfloat16, 1.6e-2),
        (Dtype::Float16, 2e-3),
    ] {
        for (hq, hkv, d) in [(8, 4, 64), (4, 4, 20), (6, 1, 32), (4, 2, 136)] {
            for (l, s) in [
                (1, 1),
                (1, 300),
                (2, 2),
                (3, 8),
                (5, 37),
                (16, 700),
                (40, 90),
            ] {
                let cap = s + 9;
                let seed = (hq * 1000 + l * 10 + s) as u64;
                let q = arr(
                    &host_noise(seed, hq * l * d),
                    &[1, hq as i32, l as i32, d as i32],
                )
                .as_type(dtype)
                .unwrap();
                let kb = arr(
                    &host_noise(seed + 1, hkv * cap * d),
                    &[1, hkv as i32, cap as i32, d as i32],
                )
                .as_type(dtype)
                .unwrap();
                let vb = arr(
                    &host_noise(seed + 2, hkv * cap * d),
                    &[1, hkv as i32, cap as i32, d as i32],
                )
                .as_type(dtype)
                .unwrap();
                let k = kb.slice_axis(2, 0, s as i32).unwrap();
                let v = vb.slice_axis(2, 0, s as i32).unwrap();
                let scale = 1.0 / (d as f32).sqrt();
                let got = ops::attention_rows_cpu(&q, &k, &v, scale).unwrap();
                assert_eq!(got.shape().as_slice(), &[1, hq as i32, l as i32, d as i32]);
                assert_eq!(got.dtype(), dtype);
                let dense = |a: &Array| values(&a.contiguous().unwrap());
                let want = reference(
                    &dense(&q),
                    &dense(&k),
                    &dense(&v),
                    hq,
                    hkv,
                    l,
                    s,
                    d,
                    scale as f64,
                );
                let got = values(&got);
                let case = format!("{dtype:?} heads {hq}/{hkv}, D {d}, L {l}, S {s}");
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (*g as f64 - w).abs() <= tol as f64 * (1.0 + w.abs()),
                        "{case}: element {i}: {g} against {w}"
                    );
                }
                // The merged layout holds the same values, each row's heads side by side.
                let merged = ops::attention_rows_cpu_merged(&q, &k, &v, scale).unwrap();
                assert_eq!(merged.shape().as_slice(), &[1, l as i32, (hq * d) as i32]);
                let heads_first = values(&merged);
                for h in 0..hq {
                    for i in 0..l {
                        assert_eq!(
                            heads_first[(i * hq + h) * d..][..d],
                            got[(h * l + i) * d..][..d],
                            "{case}: merged row {i}, head {h}"
                        );
                    }
                }
                // Row i of the L-row call is the one-row call over the keys it sees.
                for i in 0..l {
                    let keys = (s - l + i + 1) as i32;
                    let one = ops::attention_rows_cpu(
                        &q.slice_axis(2, i as i32, i as i32 + 1).unwrap(),
                        &k.slice_axis(2, 0, keys).unwrap(),
                        &v.slice_axis(2, 0, keys).unwrap(),
                        scale,
                    )
                    .unwrap();
                    let row: Vec<f32> = (0..hq)
                        .flat_map(|h| got[(h * l + i) * d..][..d].to_vec())
                        .collect();
                    assert_eq!(
                        values(&one),
                        row,
                        "{case}: row {i} against its one-row call"
                    );
                }
            }
        }
    }
}

#[test]
fn bad_attention_shapes_are_errors_naming_the_limits() {
    let a = |shape: &[i32]| -> Array {
        let n: i32 = shape.iter().product();
        arr(&host_noise(3, n as usize), shape)
    };
    let err = |q: &Array, k: &Array, v: &Array| -> String {
        format!("{}", ops::attention_rows_cpu(q, k, v, 0.125).unwrap_err())
    };
    let kv = a(&[1, 2, 40, 16]);
    let wide = a(&[1, 2, 40, 264]);
    assert!(err(&a(&[1, 4, 2, 264]), &wide, &wide).contains("a head width up to 256"));
    assert!(err(&a(&[1, 3, 2, 16]), &kv, &kv).contains("multiple of the KV heads"));
    assert!(err(&a(&[1, 4, 2, 8]), &kv, &kv).contains("do not match"));
    assert!(err(&a(&[4, 2, 16]), &kv, &kv).contains("q [1, Hq, L, D]"));
    let short = a(&[1, 2, 1, 16]);
    assert!(err(&a(&[1, 4, 2, 16]), &short, &short).contains("at least as many keys as rows"));
    let half = kv.as_type(Dtype::Bfloat16).unwrap();
    assert!(err(&a(&[1, 4, 2, 16]), &half, &half).contains("of one dtype"));
}
