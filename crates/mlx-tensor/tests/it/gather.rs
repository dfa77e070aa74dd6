//! `gather_mm` / `gather_qmm` (per-expert matmuls) against a naive per-expert loop on the host.

use crate::common;

use common::{arr, assert_close, host_noise, iarr};
use mlx_tensor::{Array, ops};

/// Experts, inputs, outputs of the cases below.
const E: usize = 5;
const K: usize = 64;
const N: usize = 6;

/// `y[l, j] = x[l] @ w[idx[l, j]].T` for `x` `[L, K]`, `w` `[E, N, K]`: the reference loop.
fn naive(x: &[f32], w: &[f32], idx: &[i32], rows: usize, top: usize) -> Vec<f32> {
    let mut y = vec![0.0; rows * top * N];
    for l in 0..rows {
        for j in 0..top {
            let e = idx[l * top + j] as usize;
            for o in 0..N {
                let dot: f32 = (0..K).map(|i| x[l * K + i] * w[(e * N + o) * K + i]).sum();
                y[(l * top + j) * N + o] = dot;
            }
        }
    }
    y
}

/// Expert choices for `rows` rows, `top` distinct experts each, unsorted and repeating across rows.
fn choices(rows: usize, top: usize) -> Vec<i32> {
    (0..rows)
        .flat_map(|l| (0..top).map(move |j| ((l * 3 + j * 2 + 1) % E) as i32))
        .collect()
}

/// Runs `mm(x_rows, rhs, sorted)` the two ways a mixture-of-experts block
/// does: broadcast (`x` `[L, 1, 1, K]`, indices `[L, k]`) and sorted (rows
/// repeated and ordered by expert, results put back in row order), and
/// returns both `[L, k, N]` results.
fn both_ways(
    x: &Array,
    idx: &[i32],
    rows: usize,
    top: usize,
    mm: impl Fn(&Array, &Array, bool) -> mlx_tensor::Result<Array>,
) -> (Vec<f32>, Vec<f32>) {
    let (l, k) = (rows as i32, top as i32);
    let indices = iarr(idx, &[l, k]);
    let xb = x.reshape(&[l, 1, 1, K as i32]).unwrap();
    let plain = mm(&xb, &indices, false).unwrap();
    assert_eq!(plain.shape().as_slice(), &[l, k, 1, N as i32]);

    let flat = indices.reshape(&[l * k]).unwrap();
    let order = flat.argsort(0).unwrap();
    let inverse = order.argsort(0).unwrap();
    let row_of = order
        .floor_divide(&Array::from_int(k as i64, order.dtype()).unwrap())
        .unwrap();
    let xs = x
        .take(&row_of, 0)
        .unwrap()
        .reshape(&[l * k, 1, K as i32])
        .unwrap();
    let sorted = mm(&xs, &flat.take(&order, 0).unwrap(), true).unwrap();
    assert_eq!(sorted.shape().as_slice(), &[l * k, 1, N as i32]);
    let unsorted = sorted.take(&inverse, 0).unwrap();
    (
        plain.to_vec::<f32>().unwrap(),
        unsorted.to_vec::<f32>().unwrap(),
    )
}

/// Dense experts: both ways equal the loop within f32 rounding of 64-term dot
/// products of values in [-1, 1) (1e-4 absolute).
#[test]
fn gather_mm_equals_per_expert_loop() {
    for (rows, top) in [(1, 2), (4, 2), (7, 3), (16, 1)] {
        let xs = host_noise(1, rows * K);
        let ws = host_noise(2, E * N * K);
        let idx = choices(rows, top);
        let want = naive(&xs, &ws, &idx, rows, top);
        let x = arr(&xs, &[rows as i32, K as i32]);
        // `b` is `[E, K, N]`: the transposed view of the `[E, N, K]` weights.
        let wt = arr(&ws, &[E as i32, N as i32, K as i32])
            .swapaxes(-1, -2)
            .unwrap();
        let (plain, sorted) = both_ways(&x, &idx, rows, top, |a, i, s| {
            ops::gather_mm(a, &wt, None, Some(i), s)
        });
        let case = format!("{rows} rows, top {top}");
        assert_close(&format!("{case} broadcast"), &plain, &want, 1e-4);
        assert_close(&format!("{case} sorted"), &sorted, &want, 1e-4);
    }
}

/// `lhs_indices` pick rows of `a`: `a[lhs[i]] @ b[rhs[i]]`.
#[test]
fn gather_mm_lhs_indices_pick_rows() {
    let xs = host_noise(3, 3 * K);
    let ws = host_noise(4, E * N * K);
    let (lhs, rhs) = ([2, 0, 2, 1], [4, 1, 0, 4]);
    let x = arr(&xs, &[3, 1, K as i32]);
    let wt = arr(&ws, &[E as i32, N as i32, K as i32])
        .swapaxes(-1, -2)
        .unwrap();
    let got = ops::gather_mm(
        &x,
        &wt,
        Some(&iarr(&lhs, &[4])),
        Some(&iarr(&rhs, &[4])),
        false,
    )
    .unwrap();
    assert_eq!(got.shape().as_slice(), &[4, 1, N as i32]);
    let picked: Vec<f32> = lhs
        .iter()
        .flat_map(|&r| xs[r as usize * K..(r as usize + 1) * K].to_vec())
        .collect();
    let want = naive(&picked, &ws, &rhs, 4, 1);
    assert_close("lhs+rhs", &got.to_vec::<f32>().unwrap(), &want, 1e-4);
}

/// Quantized experts: both ways equal the loop over the dequantized weights
/// (same codes, so only summation order differs: 1e-4 absolute), for 4- and
/// 8-bit affine codes and each floating-point mode (no biases).
#[test]
fn gather_qmm_equals_per_expert_loop_over_dequantized() {
    use ops::QuantMode;
    let modes = [
        (QuantMode::Affine, 32, 4),
        (QuantMode::Affine, 32, 8),
        (QuantMode::Mxfp4, 32, 4),
        (QuantMode::Mxfp8, 32, 8),
        (QuantMode::Nvfp4, 16, 4),
    ];
    for (mode, group, bits) in modes {
        for (rows, top) in [(1, 2), (6, 3)] {
            let xs = host_noise(5, rows * K);
            let dense = arr(&host_noise(6, E * N * K), &[E as i32, N as i32, K as i32]);
            let (wq, scales, biases) = dense.quantize_mode(group, bits, mode).unwrap();
            assert_eq!(biases.is_some(), mode.has_biases(), "{mode:?}");
            assert_eq!(
                wq.shape().as_slice(),
                &[E as i32, N as i32, (K as i32) * bits / 32]
            );
            let deq = ops::dequantize_mode(
                &wq,
                &scales,
                biases.as_ref(),
                group,
                bits,
                mode,
                mlx_tensor::Dtype::Float32,
            )
            .unwrap();
            let idx = choices(rows, top);
            let want = naive(&xs, &deq.to_vec::<f32>().unwrap(), &idx, rows, top);
            let x = arr(&xs, &[rows as i32, K as i32]);
            let stack = ops::QuantizedStack {
                w: &wq,
                scales: &scales,
                biases: biases.as_ref(),
                group_size: group,
                bits,
                mode,
            };
            let (plain, sorted) = both_ways(&x, &idx, rows, top, |a, i, s| {
                ops::gather_qmm(a, stack, None, Some(i), true, s)
            });
            let case = format!("{mode:?} {bits} bits, {rows} rows, top {top}");
            assert_close(&format!("{case} broadcast"), &plain, &want, 1e-4);
            assert_close(&format!("{case} sorted"), &sorted, &want, 1e-4);
        }
    }
}

/// Mismatched shapes are errors at the call site, not aborts.
#[test]
fn gather_mm_shape_errors_are_errors() {
    let x = arr(&host_noise(7, 2 * K), &[2, 1, 1, K as i32]);
    let w = arr(
        &host_noise(8, E * (K + 1) * N),
        &[E as i32, K as i32 + 1, N as i32],
    );
    let idx = iarr(&[0, 1], &[2, 1]);
    let err = ops::gather_mm(&x, &w, None, Some(&idx), false).unwrap_err();
    assert!(err.to_string().contains("gather"), "{err}");
    let float_idx = arr(&[0.0, 1.0], &[2, 1]);
    assert!(ops::gather_mm(&x, &w, None, Some(&float_idx), false).is_err());
}
