//! `ops::rows_matmul_t` (our few-rows CPU kernel) against a float64 host
//! reference and against itself: the dtypes, strided operands, shapes small
//! enough for one thread and large enough for all, and the errors; likewise
//! `ops::quant_rows_matmul_t` (affine) and `ops::quant_rows_matmul_t_mode`
//! (the floating-point modes) against MLX's dequantized weights, on the
//! decoder the host takes and on the portable one (`ops::hold_portable_decode`).

use crate::common;

use common::{arr, assert_close, host_noise};
use mlx_tensor::ops::QuantMode;
use mlx_tensor::{Array, Dtype, ops};

/// `y[r, j] = Σ x[r, i] · w[j, i]` in f64.
fn reference(x: &[f32], w: &[f32], rows: usize, n: usize, k: usize) -> Vec<f64> {
    (0..rows * n)
        .map(|o| {
            let (r, j) = (o / n, o % n);
            (0..k)
                .map(|i| x[r * k + i] as f64 * w[j * k + i] as f64)
                .sum()
        })
        .collect()
}

/// Asserts `got` close to [`reference`] of `x` and `w` at `rows × n × k`,
/// within `rel` of the row scale: `rel · sqrt(k)` for unit-range terms.
fn assert_near_reference(
    case: &str,
    got: &[f32],
    (x, w): (&[f32], &[f32]),
    (rows, n, k): (usize, usize, usize),
    rel: f32,
) {
    let want: Vec<f32> = reference(x, w, rows, n, k)
        .iter()
        .map(|&v| v as f32)
        .collect();
    assert_close(case, got, &want, rel * (k as f32).sqrt());
}

fn values(a: &Array) -> Vec<f32> {
    a.as_type(Dtype::Float32).unwrap().to_vec::<f32>().unwrap()
}

/// The operands rounded to `dtype` and back, so the reference sees what the
/// kernel sees.
fn rounded(data: &[f32], shape: &[i32], dtype: Dtype) -> (Array, Vec<f32>) {
    let a = arr(data, shape).as_type(dtype).unwrap();
    let v = values(&a);
    (a, v)
}

/// f32, bf16 and f16 over 1-32 rows (more than 8 go as groups of 8); `k` with and without an 8-lane tail;
/// `n` below and above the size that splits the work over threads. f32 is
/// within float rounding of an f64 sum (2e-6 of the row scale); the half
/// types within their output rounding (2^-8 relative for bf16, 2^-11 for
/// f16, of values up to ~3x the scale).
#[test]
fn rows_matmul_matches_a_float64_reference_in_every_dtype() {
    for (dtype, rel) in [
        (Dtype::Float32, 2e-6_f32),
        (Dtype::Bfloat16, 1.2e-2),
        (Dtype::Float16, 1.5e-3),
    ] {
        for (n, k) in [(7, 300), (40, 64), (1100, 300), (600, 1024)] {
            let (w, wv) = rounded(&host_noise(1, n * k), &[n as i32, k as i32], dtype);
            for rows in [1usize, 2, 3, 5, 8, 9, 17, 32] {
                let (x, xv) = rounded(
                    &host_noise(10 + rows as u64, rows * k),
                    &[rows as i32, k as i32],
                    dtype,
                );
                let got = ops::rows_matmul_t(&x, &w).unwrap();
                assert_eq!(got.shape().as_slice(), &[rows as i32, n as i32]);
                assert_eq!(got.dtype(), dtype);
                let case = format!("{dtype:?} [{rows}, {k}] x [{n}, {k}]");
                // `rel` of the row scale: sqrt(k) for unit-range terms.
                assert_near_reference(&case, &values(&got), (&xv, &wv), (rows, n, k), rel);
            }
        }
    }
}

/// Row `r` of a several-row product equals the one-row product of `x[r]`
/// bit for bit, in every dtype and on the threaded path: the order of each
/// sum does not depend on how many rows share the weight.
#[test]
fn a_row_is_the_same_alone_and_among_others() {
    let (n, k) = (1100, 300);
    for dtype in [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
        let w = arr(&host_noise(2, n * k), &[n as i32, k as i32])
            .as_type(dtype)
            .unwrap();
        let x = arr(&host_noise(3, 32 * k), &[32, k as i32])
            .as_type(dtype)
            .unwrap();
        let all = values(&ops::rows_matmul_t(&x, &w).unwrap());
        for rows in [2, 5, 8, 9, 17] {
            let some = values(&ops::rows_matmul_t(&x.slice_axis(0, 0, rows).unwrap(), &w).unwrap());
            assert_eq!(
                some[..],
                all[..rows as usize * n],
                "{dtype:?}: {rows} rows vs 32"
            );
        }
        for r in 0..32 {
            let one = values(&ops::rows_matmul_t(&x.slice_axis(0, r, r + 1).unwrap(), &w).unwrap());
            let row = &all[r as usize * n..(r as usize + 1) * n];
            assert_eq!(one[..], row[..], "{dtype:?}: row {r} alone");
        }
    }
}

/// The AVX-512VL blocks (four weight rows at a time from three rows on, one
/// pass for six to eight rows) give the AVX2 blocks' results bit for bit, in
/// every dtype, for 1-8 rows, with and without an 8-lane tail. On a CPU
/// without AVX-512VL there is one path and nothing to compare.
#[test]
fn the_avx512_and_avx2_blocks_agree_bit_for_bit() {
    if !ops::set_rows_cpu_avx512(true) {
        assert!(!ops::set_rows_cpu_avx512(false), "off cannot turn it on");
        return;
    }
    for (n, k) in [(1100, 300), (600, 301)] {
        for dtype in [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
            let w = arr(&host_noise(4, n * k), &[n as i32, k as i32])
                .as_type(dtype)
                .unwrap();
            for rows in 1..=8 {
                let x = arr(
                    &host_noise(5 + rows as u64, rows * k),
                    &[rows as i32, k as i32],
                )
                .as_type(dtype)
                .unwrap();
                let wide = values(&ops::rows_matmul_t(&x, &w).unwrap());
                ops::set_rows_cpu_avx512(false);
                let narrow = values(&ops::rows_matmul_t(&x, &w).unwrap());
                ops::set_rows_cpu_avx512(true);
                assert_eq!(wide, narrow, "{dtype:?} [{rows}, {k}] x [{n}, {k}]");
            }
        }
    }
}

/// Strided operands (a transposed weight, every other row of `x`) give the
/// result of their contiguous copies exactly.
#[test]
fn strided_operands_equal_their_contiguous_copies() {
    let (n, k) = (96, 200);
    let wt = arr(&host_noise(4, k * n), &[k as i32, n as i32]);
    let w_view = wt.t().unwrap();
    let x_big = arr(&host_noise(5, 6 * k), &[6, k as i32]);
    let x_view = x_big.slice(&[0, 0], &[6, k as i32], &[2, 1]).unwrap();
    let got = values(&ops::rows_matmul_t(&x_view, &w_view).unwrap());
    let want = values(
        &ops::rows_matmul_t(&x_view.contiguous().unwrap(), &w_view.contiguous().unwrap()).unwrap(),
    );
    assert_eq!(got, want);
}

/// Leading axes are taken as they are, strided or not: `[2, 3, k]` (a
/// transpose of `[3, 2, k]`) gives `[2, 3, n]`, the rows of its contiguous
/// 2-D copy.
#[test]
fn leading_axes_are_kept_and_read_through_their_strides() {
    let (n, k) = (40, 64);
    let w = arr(&host_noise(8, n * k), &[n as i32, k as i32]);
    let x = arr(&host_noise(9, 6 * k), &[3, 2, k as i32])
        .transpose(&[1, 0, 2])
        .unwrap();
    let got = ops::rows_matmul_t(&x, &w).unwrap();
    assert_eq!(got.shape().as_slice(), &[2, 3, n as i32]);
    let flat = x.contiguous().unwrap().reshape(&[6, k as i32]).unwrap();
    assert_eq!(
        values(&got),
        values(&ops::rows_matmul_t(&flat, &w).unwrap())
    );
}

/// Inputs the kernel does not take are errors that say what is wrong.
#[test]
fn rows_matmul_refuses_what_it_cannot_compute() {
    let w = arr(&host_noise(6, 16 * 32), &[16, 32]);
    let x = |rows: usize, k: usize| arr(&host_noise(7, rows * k), &[rows as i32, k as i32]);
    let err = |r: mlx_tensor::Result<Array>| r.expect_err("an error").to_string();
    assert!(err(ops::rows_matmul_t(&x(33, 32), &w)).contains("1 to 32 rows; got 33"));
    assert!(err(ops::rows_matmul_t(&x(2, 31), &w)).contains("does not match"));
    let x1 = x(1, 32).reshape(&[32]).unwrap();
    assert!(err(ops::rows_matmul_t(&x1, &w)).contains("ranks 1 and 2"));
    let x33 = x(33, 32).reshape(&[3, 11, 32]).unwrap();
    assert!(err(ops::rows_matmul_t(&x33, &w)).contains("1 to 32 rows; got 33"));
    let xi = x(2, 32).as_type(Dtype::Int32).unwrap();
    let wi = w.as_type(Dtype::Int32).unwrap();
    assert!(err(ops::rows_matmul_t(&xi, &wi)).contains("f32, bf16 or f16"));
    let xb = x(2, 32).as_type(Dtype::Bfloat16).unwrap();
    assert!(err(ops::rows_matmul_t(&xb, &w)).contains("one dtype"));
}

/// `ops::quant_rows_matmul_t` against an f64 product with MLX's own
/// dequantized weight, 4 and 8 bits, groups of 32, 64 and 128, f32 and
/// bf16, 1-17 rows, one thread and all; and row `r` of a several-row product
/// equals the one-row product of `x[r]` bit for bit (a verify row is the
/// plain step's product).
#[test]
fn quantized_rows_match_the_dequantized_weight_and_themselves() {
    check_affine_rows();
}

/// The same on the portable affine decoder, forced on this host (where the
/// kernel would take the AVX2 one).
#[test]
fn portable_quantized_rows_match_the_dequantized_weight_and_themselves() {
    let _portable = ops::hold_portable_decode();
    check_affine_rows();
}

/// [`quantized_rows_match_the_dequantized_weight_and_themselves`], on
/// whichever decoder the kernel takes now.
fn check_affine_rows() {
    for (dtype, rel) in [(Dtype::Float32, 2e-6_f32), (Dtype::Bfloat16, 1.2e-2)] {
        for (n, k) in [(40, 128), (1100, 256)] {
            let dense = arr(&host_noise(4, n * k), &[n as i32, k as i32])
                .as_type(dtype)
                .unwrap();
            for bits in [4, 8] {
                for group in [32, 64, 128] {
                    let (w, s, b) = dense.quantize(group, bits).unwrap();
                    let wv = values(&ops::dequantize(&w, &s, &b, group, bits).unwrap());
                    let (x8, xv8) = rounded(&host_noise(5, 17 * k), &[17, k as i32], dtype);
                    let all = ops::quant_rows_matmul_t(&x8, &w, &s, &b, group, bits).unwrap();
                    assert_eq!(all.dtype(), dtype);
                    assert_eq!(all.shape().as_slice(), &[17, n as i32]);
                    let all = values(&all);
                    let case = format!("{dtype:?} {bits}-bit group {group} [17, {k}] x [{n}, {k}]");
                    assert_near_reference(&case, &all, (&xv8, &wv), (17, n, k), rel);
                    for rows in [1, 2, 5, 9] {
                        for r0 in [0, 17 - rows] {
                            let x = x8.slice_axis(0, r0, r0 + rows).unwrap();
                            let some = values(
                                &ops::quant_rows_matmul_t(&x, &w, &s, &b, group, bits).unwrap(),
                            );
                            let at = r0 as usize * n;
                            assert_eq!(
                                some[..],
                                all[at..at + rows as usize * n],
                                "{case}: rows {r0}..{} alone",
                                r0 + rows
                            );
                        }
                    }
                }
            }
        }
    }
}

/// What the quantized kernel does not take is an error naming it, never a
/// wrong product: other bit widths and group sizes, more than 32 rows,
/// a weight that does not match `x`.
#[test]
fn quantized_rows_refuse_what_they_do_not_take() {
    let (n, k) = (16, 128);
    let dense = arr(&host_noise(6, n * k), &[n as i32, k as i32]);
    let x = arr(&host_noise(7, k), &[1, k as i32]);
    let (w, s, b) = dense.quantize(64, 4).unwrap();
    let err = |r: mlx_tensor::Result<Array>| format!("{}", r.expect_err("an error"));
    let (w2, s2, b2) = dense.quantize(64, 2).unwrap();
    assert!(err(ops::quant_rows_matmul_t(&x, &w2, &s2, &b2, 64, 2)).contains("4- or 8-bit"));
    assert!(err(ops::quant_rows_matmul_t(&x, &w, &s, &b, 32, 4)).contains("does not match"));
    let x33 = arr(&host_noise(8, 33 * k), &[33, k as i32]);
    assert!(err(ops::quant_rows_matmul_t(&x33, &w, &s, &b, 64, 4)).contains("1 to 32 rows"));
    let short = arr(&host_noise(9, 64), &[1, 64]);
    assert!(err(ops::quant_rows_matmul_t(&short, &w, &s, &b, 64, 4)).contains("does not match"));
}

/// The floating-point modes, each with its fixed group size and bits.
const FP_MODES: [QuantMode; 3] = [QuantMode::Mxfp4, QuantMode::Mxfp8, QuantMode::Nvfp4];

/// `mode`'s `(group, bits)`.
fn fixed(mode: QuantMode) -> (i32, i32) {
    mode.fixed().expect("a floating-point mode")
}

/// A floating-point-mode product of 32 rows equals the f64 product on MLX's
/// dequantized weight within rounding, for f32 and bf16 inputs, on one
/// thread and on the threaded path.
#[test]
fn fp_mode_rows_match_the_dequantized_weight() {
    for mode in FP_MODES {
        let (group, bits) = fixed(mode);
        for (dtype, rel) in [(Dtype::Float32, 1e-6_f32), (Dtype::Bfloat16, 1.2e-2)] {
            for (n, k) in [(40, 128), (1100, 256)] {
                let dense = arr(&host_noise(14, n * k), &[n as i32, k as i32]);
                let (w, s, _) = dense.quantize_mode(group, bits, mode).unwrap();
                let deq = ops::dequantize_mode(&w, &s, None, group, bits, mode, Dtype::Float32);
                let wv = values(&deq.unwrap());
                let (x, xv) = rounded(&host_noise(15, 32 * k), &[32, k as i32], dtype);
                let got =
                    ops::quant_rows_matmul_t_mode(&x, &w, &s, None, group, bits, mode).unwrap();
                assert_eq!(got.dtype(), dtype);
                assert_eq!(got.shape().as_slice(), &[32, n as i32]);
                let case = format!("{mode:?} {dtype:?} [32, {k}] x [{n}, {k}]");
                assert_near_reference(&case, &values(&got), (&xv, &wv), (32, n, k), rel);
            }
        }
    }
}

/// Row `r` of a several-row floating-point-mode product equals the one-row
/// product of `x[r]` bit for bit, for 1, 2, 5, 8, 13 and 32 rows taken at the
/// start and at the end of 32, on the threaded path: a verify row is the
/// plain step's product.
#[test]
fn fp_mode_rows_are_the_same_alone_and_among_others() {
    let (n, k) = (1100, 256);
    for mode in FP_MODES {
        let (group, bits) = fixed(mode);
        let dense = arr(&host_noise(16, n * k), &[n as i32, k as i32]);
        let (w, s, _) = dense.quantize_mode(group, bits, mode).unwrap();
        let x = arr(&host_noise(17, 32 * k), &[32, k as i32]);
        let product = |x: &Array| {
            values(&ops::quant_rows_matmul_t_mode(x, &w, &s, None, group, bits, mode).unwrap())
        };
        let each: Vec<Vec<f32>> = (0..32)
            .map(|r| product(&x.slice_axis(0, r, r + 1).unwrap()))
            .collect();
        for rows in [1, 2, 5, 8, 13, 32] {
            for r0 in [0, 32 - rows] {
                let some = product(&x.slice_axis(0, r0, r0 + rows).unwrap());
                for r in 0..rows {
                    let at = r as usize * n;
                    assert_eq!(
                        some[at..at + n],
                        each[(r0 + r) as usize][..],
                        "{mode:?}: row {} of rows {r0}..{} against alone",
                        r0 + r,
                        r0 + rows
                    );
                }
            }
        }
    }
}

/// The kernel's decoded weights are MLX's `dequantize` bit for bit: one-hot
/// rows read them back column by column, over every code that is a number
/// (mxfp8: all 254; fp4: all 16) and a spread of scales (e8m0 0, the
/// smallest, a subnormal, included); a code or scale that is not a number
/// makes its output row NaN.
#[test]
fn fp_mode_decoding_is_mlxs_dequantize_bit_for_bit() {
    for mode in FP_MODES {
        check_fp_decoding(mode);
    }
}

/// The portable decoder (forced on this host, where the kernel would take
/// the AVX2 one) holds to the same checks: MLX's `dequantize` bit for bit.
#[test]
fn fp_mode_portable_decoding_is_mlxs_dequantize_bit_for_bit() {
    let _portable = ops::hold_portable_decode();
    for mode in FP_MODES {
        check_fp_decoding(mode);
    }
}

/// [`fp_mode_decoding_is_mlxs_dequantize_bit_for_bit`] for one mode, on
/// whichever decoder the kernel takes now.
fn check_fp_decoding(mode: QuantMode) {
    let (n, k) = (24, 256);
    let (group, bits) = fixed(mode);
    let per_word = (32 / bits) as usize;
    // Codes cycling through every value, offset per row; the NaN codes
    // of e4m3 (0x7f, 0xff) replaced by zero.
    let code = |j: usize, c: usize| -> u32 {
        let v = ((j * 7 + c) % (1 << bits)) as u32;
        if bits == 8 && (v & 0x7f) == 0x7f {
            0
        } else {
            v
        }
    };
    let words: Vec<u32> = (0..n * k / per_word)
        .map(|i| {
            let (j, c0) = (i / (k / per_word), i % (k / per_word) * per_word);
            (0..per_word).fold(0, |acc, p| acc | code(j, c0 + p) << (p as i32 * bits))
        })
        .collect();
    let groups = k / group as usize;
    // e8m0 scales 0 and 100..150 (2^-127 and 2^-27..2^23); e4m3 scales
    // 0..126 (every number, subnormals included).
    let scale = |i: usize| -> u8 {
        match mode {
            QuantMode::Nvfp4 => (i * 5 % 127) as u8,
            _ if i.is_multiple_of(17) => 0,
            _ => 100 + (i * 3 % 51) as u8,
        }
    };
    let scales: Vec<u8> = (0..n * groups).map(scale).collect();
    let w = Array::from_slice(&words, &[n as i32, (k / per_word) as i32]).unwrap();
    let s = Array::from_slice(&scales, &[n as i32, groups as i32]).unwrap();
    let deq = ops::dequantize_mode(&w, &s, None, group, bits, mode, Dtype::Float32).unwrap();
    let want = values(&deq);
    assert!(
        want.iter().all(|v| v.is_finite()),
        "{mode:?}: the weights are numbers"
    );
    let one_hot: Vec<f32> = (0..k * k).map(|i| f32::from(i / k == i % k)).collect();
    for c0 in (0..k).step_by(32) {
        let x = arr(&one_hot[c0 * k..(c0 + 32) * k], &[32, k as i32]);
        let got =
            values(&ops::quant_rows_matmul_t_mode(&x, &w, &s, None, group, bits, mode).unwrap());
        for r in 0..32 {
            for j in 0..n {
                let (g, e) = (got[r * n + j], want[j * k + c0 + r]);
                // A one-hot row's sum turns a -0 weight into +0.
                assert!(
                    g.to_bits() == e.to_bits() || (g == 0.0 && e == 0.0),
                    "{mode:?}: w[{j}, {}] {g} against {e}",
                    c0 + r
                );
            }
        }
    }
    // A NaN code (e4m3) or an e8m0 scale of 255 makes its row NaN.
    let mut bad_scales = scales.clone();
    bad_scales[0] = if mode == QuantMode::Nvfp4 { 0x7f } else { 255 };
    let s = Array::from_slice(&bad_scales, &[n as i32, groups as i32]).unwrap();
    let x = arr(&host_noise(21, k), &[1, k as i32]);
    let got = values(&ops::quant_rows_matmul_t_mode(&x, &w, &s, None, group, bits, mode).unwrap());
    assert!(
        got[0].is_nan(),
        "{mode:?}: a non-finite scale gives {}",
        got[0]
    );
    assert!(
        got[1..].iter().all(|v| v.is_finite()),
        "{mode:?}: other rows stay numbers"
    );
}

/// The affine decoders are MLX's f32 `dequantize` bit for bit, 4 and 8
/// bits, groups of 32, 64 and 128: one-hot rows read the weights back.
/// (`scale · code + bias` rounds twice, as MLX's does; GCC would fuse it
/// into one FMA in the AVX2 build without `cpp/rows_decode_affine.cc`'s
/// `fp-contract=off`.)
#[test]
fn affine_decoding_is_mlxs_dequantize_bit_for_bit() {
    check_affine_decoding();
}

/// The same on the portable decoder, forced on this host.
#[test]
fn portable_affine_decoding_is_mlxs_dequantize_bit_for_bit() {
    let _portable = ops::hold_portable_decode();
    check_affine_decoding();
}

/// [`affine_decoding_is_mlxs_dequantize_bit_for_bit`] on whichever decoder
/// the kernel takes now.
fn check_affine_decoding() {
    let (n, k) = (24, 256);
    let one_hot: Vec<f32> = (0..k * k).map(|i| f32::from(i / k == i % k)).collect();
    let dense = arr(&host_noise(30, n * k), &[n as i32, k as i32]);
    for bits in [4, 8] {
        for group in [32, 64, 128] {
            let (w, s, b) = dense.quantize(group, bits).unwrap();
            let want = values(&ops::dequantize(&w, &s, &b, group, bits).unwrap());
            for c0 in (0..k).step_by(32) {
                let x = arr(&one_hot[c0 * k..(c0 + 32) * k], &[32, k as i32]);
                let got = values(&ops::quant_rows_matmul_t(&x, &w, &s, &b, group, bits).unwrap());
                for r in 0..32 {
                    for j in 0..n {
                        let (g, e) = (got[r * n + j], want[j * k + c0 + r]);
                        // A one-hot row's sum turns a -0 weight into +0.
                        assert!(
                            g.to_bits() == e.to_bits() || (g == 0.0 && e == 0.0),
                            "{bits}-bit group {group}: w[{j}, {}] {g} against {e}",
                            c0 + r
                        );
                    }
                }
            }
        }
    }
}

/// What the floating-point path does not take is an error naming it: another
/// mode's sizes, biases, scales that are not uint8, an affine call without
/// biases, more than 32 rows.
#[test]
fn fp_mode_rows_refuse_what_they_do_not_take() {
    let (n, k) = (16, 128);
    let dense = arr(&host_noise(18, n * k), &[n as i32, k as i32]);
    let x = arr(&host_noise(19, k), &[1, k as i32]);
    let (w, s, _) = dense.quantize_mode(32, 4, QuantMode::Mxfp4).unwrap();
    let sf = s.as_type(Dtype::Float32).unwrap();
    let err = |x: &Array, s: &Array, b: Option<&Array>, group, bits, mode| {
        let r = ops::quant_rows_matmul_t_mode(x, &w, s, b, group, bits, mode);
        format!("{}", r.expect_err("an error"))
    };
    let mx4 = QuantMode::Mxfp4;
    let e = err(&x, &s, None, 16, 4, mx4);
    assert!(e.contains("takes group 32 and 4 bits"), "{e}");
    let e = err(&x, &s, None, 32, 4, QuantMode::Mxfp8);
    assert!(e.contains("takes group 32 and 8 bits"), "{e}");
    let e = err(&x, &s, Some(&s), 32, 4, mx4);
    assert!(e.contains("has no biases"), "{e}");
    let e = err(&x, &sf, None, 32, 4, mx4);
    assert!(e.contains("uint8 scales"), "{e}");
    let e = err(&x, &s, None, 32, 4, QuantMode::Affine);
    assert!(e.contains("needs biases"), "{e}");
    let x33 = arr(&host_noise(20, 33 * k), &[33, k as i32]);
    let e = err(&x33, &s, None, 32, 4, mx4);
    assert!(e.contains("1 to 32 rows"), "{e}");
}
