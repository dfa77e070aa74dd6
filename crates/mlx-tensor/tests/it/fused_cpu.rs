//! `ops::{rms_norm_cpu, heads_cpu, swiglu_cpu}` (a layer's elementwise
//! stages as one node each on the CPU) against float64 host references, in
//! f32 and bf16, over strided inputs (slices of one fused projection, as a
//! model hands them over); every row of a many-row call equal bit for bit
//! to the one-row call (what keeps a verify row equal to the plain step's);
//! and the errors.

use crate::common;

use common::{arr, host_noise};
use mlx_tensor::ops::{self, HeadsRope};
use mlx_tensor::{Array, Dtype};

fn values(a: &Array) -> Vec<f32> {
    a.as_type(Dtype::Float32).unwrap().to_vec::<f32>().unwrap()
}

/// Asserts `got` within `tol · (1 + |want|)` of `want` everywhere.
fn assert_near(case: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{case}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "{case}: element {i}: {g} against {w}"
        );
    }
}

/// `x · w / sqrt(mean(x²) + eps)` over `d`-wide rows, in f64.
fn norm_ref(x: &[f32], w: &[f32], eps: f64) -> Vec<f64> {
    let d = w.len();
    x.chunks(d)
        .flat_map(|r| {
            let ms = r.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / d as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            r.iter()
                .zip(w)
                .map(move |(&v, &g)| v as f64 * inv * g as f64)
        })
        .collect()
}

/// Rows 3..8 of a `[1, 8, 2·d]` array (strided: every row skips `d` columns).
fn strided_rows(seed: u64, d: i32, dtype: Dtype) -> Array {
    arr(&host_noise(seed, (8 * 3 * d) as usize), &[1, 8, 3 * d])
        .as_type(dtype)
        .unwrap()
        .slice_axis(1, 3, 8)
        .unwrap()
        .slice_axis(2, d, 3 * d)
        .unwrap()
}

#[test]
fn rms_norm_matches_a_float64_reference_and_itself_row_by_row() {
    for (dtype, tol) in [(Dtype::Float32, 2e-6), (Dtype::Bfloat16, 1.6e-2)] {
        let x = strided_rows(1, 48, dtype);
        let w = arr(&host_noise(2, 96), &[96]).as_type(dtype).unwrap();
        let got = ops::rms_norm_cpu(&x, &w, 1e-5).unwrap();
        assert_eq!(got.shape().as_slice(), &[1, 5, 96]);
        assert_eq!(got.dtype(), dtype);
        let want = norm_ref(&values(&x.contiguous().unwrap()), &values(&w), 1e-5);
        let got = values(&got);
        assert_near(&format!("{dtype:?}"), &got, &want, tol);
        for r in 0..5 {
            let one = ops::rms_norm_cpu(&x.slice_axis(1, r, r + 1).unwrap(), &w, 1e-5).unwrap();
            assert_eq!(
                values(&one),
                got[r as usize * 96..][..96].to_vec(),
                "{dtype:?} row {r}"
            );
        }
    }
}

#[test]
fn swiglu_matches_a_float64_reference_and_itself_row_by_row() {
    for (dtype, tol) in [(Dtype::Float32, 2e-6), (Dtype::Bfloat16, 1.6e-2)] {
        let gu = strided_rows(3, 40, dtype);
        let got = ops::swiglu_cpu(&gu).unwrap();
        assert_eq!(got.shape().as_slice(), &[1, 5, 40]);
        let host = values(&gu.contiguous().unwrap());
        let want: Vec<f64> = host
            .chunks(80)
            .flat_map(|r| {
                (0..40).map(move |j| {
                    let g = r[j] as f64;
                    g / (1.0 + (-g).exp()) * r[40 + j] as f64
                })
            })
            .collect();
        let got = values(&got);
        assert_near(&format!("{dtype:?}"), &got, &want, tol);
        for r in 0..5 {
            let one = ops::swiglu_cpu(&gu.slice_axis(1, r, r + 1).unwrap()).unwrap();
            assert_eq!(
                values(&one),
                got[r as usize * 40..][..40].to_vec(),
                "{dtype:?} row {r}"
            );
        }
    }
}

/// One case of [`heads_cpu`]: head width, rotated features, scaled RoPE
/// (a period table), YaRN's attention scale, norms.
struct Case {
    d: usize,
    rot: usize,
    periods: bool,
    mscale: f32,
    norms: bool,
}

/// The heads `[H, L, D]` of host `x` `[L, H, D]` after the optional norm and
/// RoPE at `offset`, in f64.
fn heads_ref(
    x: &[f32],
    (l, h, d): (usize, usize, usize),
    norm: Option<&[f32]>,
    c: &Case,
    inv_freq: &[f64],
    offset: usize,
) -> Vec<f64> {
    let mut out = vec![0.0; l * h * d];
    let half = c.rot / 2;
    for row in 0..l {
        for head in 0..h {
            let src = &x[(row * h + head) * d..][..d];
            let v: Vec<f64> = match norm {
                Some(w) => norm_ref(src, w, 1e-6),
                None => src.iter().map(|&a| a as f64).collect(),
            };
            let o = &mut out[(head * l + row) * d..][..d];
            let pos = (offset + row) as f64;
            for i in 0..half {
                let (s, co) = (pos * inv_freq[i]).sin_cos();
                o[i] = (v[i] * co - v[i + half] * s) * c.mscale as f64;
                o[i + half] = (v[i + half] * co + v[i] * s) * c.mscale as f64;
            }
            o[c.rot..].copy_from_slice(&v[c.rot..]);
        }
    }
    out
}

#[test]
fn heads_match_a_float64_reference_and_themselves_row_by_row() {
    let cases = [
        Case {
            d: 64,
            rot: 64,
            periods: false,
            mscale: 1.0,
            norms: true,
        },
        Case {
            d: 64,
            rot: 16,
            periods: false,
            mscale: 1.0,
            norms: true,
        },
        Case {
            d: 32,
            rot: 32,
            periods: true,
            mscale: 1.25,
            norms: false,
        },
        Case {
            d: 40,
            rot: 20,
            periods: true,
            mscale: 1.0,
            norms: true,
        },
    ];
    let (hq, hkv, offset) = (4usize, 2usize, 300usize);
    for (dtype, tol) in [(Dtype::Float32, 1e-4), (Dtype::Bfloat16, 3e-2)] {
        for c in &cases {
            let d = c.d;
            let half = c.rot / 2;
            let base = 10_000.0f64;
            let periods: Vec<f32> = (0..half)
                .map(|i| (1.5 * base.powf(2.0 * i as f64 / c.rot as f64)) as f32)
                .collect();
            let inv_freq: Vec<f64> = (0..half)
                .map(|i| match c.periods {
                    true => 1.0 / periods[i] as f64,
                    false => base.powf(-(i as f64) / half as f64),
                })
                .collect();
            let l = 5usize;
            let width = (hq + 2 * hkv) * d;
            let fused = arr(
                &host_noise(7 + d as u64, l * width),
                &[1, l as i32, width as i32],
            )
            .as_type(dtype)
            .unwrap();
            let part = |lo: usize, n: usize| {
                fused
                    .slice_axis(2, (lo * d) as i32, ((lo + n) * d) as i32)
                    .unwrap()
                    .reshape(&[1, l as i32, n as i32, d as i32])
                    .unwrap()
            };
            let (q, k) = (part(0, hq), part(hq, hkv));
            let qw = arr(&host_noise(21, d), &[d as i32]).as_type(dtype).unwrap();
            let kw = arr(&host_noise(22, d), &[d as i32]).as_type(dtype).unwrap();
            let table = arr(&periods, &[half as i32]);
            let rope = |offset: usize| HeadsRope {
                dims: c.rot as i32,
                offset: offset as i32,
                log2_base: (base as f32).log2(),
                scale: 1.0,
                periods: c.periods.then_some(&table),
                mscale: c.mscale,
            };
            let qn = c.norms.then_some((&qw, 1e-6));
            let kn = c.norms.then_some((&kw, 1e-6));
            let qo = ops::heads_cpu(&q, qn, rope(offset)).unwrap();
            let ko = ops::heads_cpu(&k, kn, rope(offset)).unwrap();
            let case = format!("{dtype:?} D {d}, rotated {}, periods {}", c.rot, c.periods);
            assert_eq!(
                qo.shape().as_slice(),
                &[1, hq as i32, l as i32, d as i32],
                "{case}"
            );
            assert_eq!(
                ko.shape().as_slice(),
                &[1, hkv as i32, l as i32, d as i32],
                "{case}"
            );
            let host = |a: &Array| values(&a.contiguous().unwrap());
            let (qh, kh) = (host(&q), host(&k));
            let (qwh, kwh) = (values(&qw), values(&kw));
            let got_q = values(&qo);
            assert_near(
                &format!("{case}: q"),
                &got_q,
                &heads_ref(
                    &qh,
                    (l, hq, d),
                    c.norms.then_some(qwh.as_slice()),
                    c,
                    &inv_freq,
                    offset,
                ),
                tol,
            );
            assert_near(
                &format!("{case}: k"),
                &values(&ko),
                &heads_ref(
                    &kh,
                    (l, hkv, d),
                    c.norms.then_some(kwh.as_slice()),
                    c,
                    &inv_freq,
                    offset,
                ),
                tol,
            );
            // Row r of the 5-row call is the one-row call at offset + r.
            for r in 0..l {
                let q1 = q.slice_axis(1, r as i32, r as i32 + 1).unwrap();
                let one = ops::heads_cpu(&q1, qn, rope(offset + r)).unwrap();
                let row: Vec<f32> = (0..hq)
                    .flat_map(|h| got_q[(h * l + r) * d..][..d].to_vec())
                    .collect();
                assert_eq!(
                    values(&one),
                    row,
                    "{case}: row {r} against its one-row call"
                );
            }
        }
    }
}

#[test]
fn bad_fused_inputs_are_errors_naming_the_problem() {
    let a = |shape: &[i32]| -> Array {
        let n: i32 = shape.iter().product();
        arr(&host_noise(5, n as usize), shape)
    };
    let err = |r: mlx_tensor::Result<Array>| format!("{}", r.unwrap_err());
    assert!(err(ops::rms_norm_cpu(&a(&[2, 8]), &a(&[6]), 1e-6)).contains("weight [D]"));
    let half = a(&[8]).as_type(Dtype::Bfloat16).unwrap();
    assert!(err(ops::rms_norm_cpu(&a(&[2, 8]), &half, 1e-6)).contains("of its dtype"));
    assert!(err(ops::swiglu_cpu(&a(&[2, 7]))).contains("[..., 2 * I]"));
    let rope = |dims: i32| HeadsRope {
        dims,
        offset: 0,
        log2_base: 13.3,
        scale: 1.0,
        periods: None,
        mscale: 1.0,
    };
    let heads_err = |x: &Array, norm: Option<(&Array, f32)>, dims: i32| -> String {
        format!("{}", ops::heads_cpu(x, norm, rope(dims)).unwrap_err())
    };
    let q = a(&[1, 3, 4, 16]);
    assert!(heads_err(&q, None, 18).contains("2 to the head width 16"));
    assert!(heads_err(&q, None, 7).contains("even number"));
    assert!(heads_err(&a(&[3, 4, 16]), None, 16).contains("x [1, L, H, D]"));
    let w = a(&[8]);
    assert!(heads_err(&q, Some((&w, 1e-6)), 16).contains("norm weight must be [16]"));
}
