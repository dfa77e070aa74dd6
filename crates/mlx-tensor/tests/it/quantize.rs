//! Affine quantization: quantize / dequantize / quantized_matmul for groups 32, 64, 128 and 4 or 8 bits.

use crate::common;

use common::{arr, assert_close, host_noise};
use mlx_tensor::{Array, Dtype, ops};

const GROUPS: [i32; 3] = [32, 64, 128];
const BITS: [i32; 2] = [4, 8];

/// Values on the integer grid `0..2^bits` survive a round trip exactly: the
/// group's range is `2^bits - 1`, so the scale is 1 and the bias is the edge.
#[test]
fn grid_values_round_trip_exactly() {
    for group in GROUPS {
        for bits in BITS {
            let levels = 1 << bits;
            let (n, k) = (2, 256);
            let data: Vec<f32> = (0..n * k).map(|i| ((i * 7) % levels) as f32).collect();
            // Every group must span the whole grid for the scale to be exactly 1.
            let mut data = data;
            for g in 0..(n * k / group) as usize {
                data[g * group as usize] = 0.0;
                data[g * group as usize + 1] = (levels - 1) as f32;
            }
            let w = arr(&data, &[n, k]);
            let (wq, s, b) = w.quantize(group, bits).unwrap();
            let case = format!("group {group} bits {bits}");
            assert_eq!(wq.dtype(), Dtype::Uint32, "{case}");
            assert_eq!(
                wq.shape().as_slice(),
                &[n, k * bits / 32],
                "{case}: packed shape"
            );
            assert_eq!(
                s.shape().as_slice(),
                &[n, k / group],
                "{case}: scales shape"
            );
            assert_eq!(
                b.shape().as_slice(),
                &[n, k / group],
                "{case}: biases shape"
            );
            let back = ops::dequantize(&wq, &s, &b, group, bits).unwrap();
            assert_close(&case, &back.to_vec::<f32>().unwrap(), &data, 0.0);
        }
    }
}

/// Per group, the error of dequantize(quantize(w)) is at most one step, where a
/// step is `range / (2^bits - 1)`, and on average at most a third of a step.
///
/// Why one step and not half: MLX makes the group's larger-magnitude edge exact
/// by rounding `edge / step` to an integer `q0` (`|q0| >= n / 2` for `n` steps)
/// and using `edge / q0` as the scale; that moves the far end of the grid by up
/// to `n · 0.5 / |q0| <= 1` step. Uniform rounding error averages a quarter step.
#[test]
fn dequantize_error_is_within_one_step() {
    for group in GROUPS {
        for bits in BITS {
            let (n, k) = (8, 256);
            let data = host_noise(u64::from(group as u32 * 10 + bits as u32), (n * k) as usize);
            let w = arr(&data, &[n, k]);
            let (wq, s, b) = w.quantize(group, bits).unwrap();
            let back: Vec<f32> = ops::dequantize(&wq, &s, &b, group, bits)
                .unwrap()
                .to_vec()
                .unwrap();
            let steps = ((1 << bits) - 1) as f32;
            for (g, (orig, deq)) in data
                .chunks(group as usize)
                .zip(back.chunks(group as usize))
                .enumerate()
            {
                let lo = orig.iter().copied().fold(f32::INFINITY, f32::min);
                let hi = orig.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let step = (hi - lo) / steps;
                let errs: Vec<f32> = orig.iter().zip(deq).map(|(a, b)| (a - b).abs()).collect();
                let worst = errs.iter().copied().fold(0.0, f32::max);
                let mean = errs.iter().sum::<f32>() / errs.len() as f32;
                let case = format!("group {group} bits {bits}, group #{g}");
                assert!(
                    worst <= step * 1.001 + 1e-6,
                    "{case}: max error {worst} > step {step}"
                );
                assert!(
                    mean <= step / 3.0,
                    "{case}: mean error {mean} > step/3 ({step})"
                );
            }
        }
    }
}

/// `quantized_matmul(x, w)` equals `x @ dequantize(w)ᵀ` (same weights, so only
/// summation order differs: 1e-4 relative), and is within the quantization
/// error bound `Σ|x| · max|w - deq(w)|` of `x @ wᵀ` with the original weights.
#[test]
fn quantized_matmul_matches_dequantize_then_matmul() {
    let (m, n, k) = (4, 16, 256);
    let xdata = host_noise(7, (m * k) as usize);
    let x = arr(&xdata, &[m, k]);
    for group in GROUPS {
        for bits in BITS {
            let case = format!("group {group} bits {bits}");
            let wdata = host_noise(u64::from(group as u32 + bits as u32), (n * k) as usize);
            let w = arr(&wdata, &[n, k]);
            let (wq, s, b) = w.quantize(group, bits).unwrap();
            let deq = ops::dequantize(&wq, &s, &b, group, bits).unwrap();
            let qmm: Vec<f32> = ops::quantized_matmul(&x, &wq, &s, &b, true, group, bits)
                .unwrap()
                .to_vec()
                .unwrap();
            let reference: Vec<f32> = x.matmul(&deq.t().unwrap()).unwrap().to_vec().unwrap();
            let scale = reference.iter().fold(1.0f32, |a, v| a.max(v.abs()));
            assert_close(
                &format!("{case}: vs dequantize"),
                &qmm,
                &reference,
                1e-4 * scale,
            );

            let exact: Vec<f32> = x.matmul(&w.t().unwrap()).unwrap().to_vec().unwrap();
            let deq_host: Vec<f32> = deq.to_vec().unwrap();
            let max_err = wdata
                .iter()
                .zip(&deq_host)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            let sum_abs_x = xdata
                .chunks(k as usize)
                .map(|r| r.iter().map(|v| v.abs()).sum::<f32>());
            let bound = sum_abs_x.fold(0.0, f32::max) * max_err + 1e-4;
            assert_close(&format!("{case}: vs original"), &qmm, &exact, bound);
        }
    }
}

/// Without the transpose, `w` is `[K, N]` quantized along N and the product is `x @ deq(w)`.
#[test]
fn quantized_matmul_without_transpose() {
    let (m, n, k) = (2, 64, 32);
    let x = arr(&host_noise(3, (m * k) as usize), &[m, k]);
    let w = arr(&host_noise(4, (k * n) as usize), &[k, n]);
    let (wq, s, b) = w.quantize(64, 8).unwrap();
    let deq = ops::dequantize(&wq, &s, &b, 64, 8).unwrap();
    let got: Vec<f32> = ops::quantized_matmul(&x, &wq, &s, &b, false, 64, 8)
        .unwrap()
        .to_vec()
        .unwrap();
    let want: Vec<f32> = x.matmul(&deq).unwrap().to_vec().unwrap();
    assert_close("no transpose", &got, &want, 1e-4);
}

/// A group size that does not divide the last axis is an error, not a crash.
#[test]
fn bad_group_size_is_an_error() {
    let w = Array::from_slice(&[0.0f32; 48], &[1, 48]).unwrap();
    let err = w.quantize(32, 4).unwrap_err().to_string();
    assert!(err.contains("quantize"), "{err}");
}
