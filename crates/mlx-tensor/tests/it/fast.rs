//! Fused kernels against naive host computations: rms_norm, rope (base, scale, offset), sdpa (causal, mask, GQA).

use crate::common;

use common::{arr, assert_close, check, host_noise};
use mlx_tensor::fast::{self, Mask};
use mlx_tensor::{Array, Dtype};

#[test]
fn rms_norm_matches_formula() {
    let x = arr(&[3.0, 4.0, 0.0, -2.0], &[2, 2]);
    let w = arr(&[1.0, 0.5], &[2]);
    // Row 0: rms = sqrt((9 + 16) / 2) = 3.5355339; row 1: rms = sqrt(2).
    let (r0, r1) = ((12.5f32 + 1e-5).sqrt(), (2.0f32 + 1e-5).sqrt());
    let want = [3.0 / r0, 0.5 * 4.0 / r0, 0.0, 0.5 * -2.0 / r1];
    check(
        "rms_norm",
        fast::rms_norm(&x, Some(&w), 1e-5),
        &[2, 2],
        &want,
        1e-6,
    );
    let want = [3.0 / r0, 4.0 / r0, 0.0, -2.0 / r1];
    check(
        "rms_norm no weight",
        fast::rms_norm(&x, None, 1e-5),
        &[2, 2],
        &want,
        1e-6,
    );
}

/// One rope configuration: `(dims, traditional, base, scale, offset)`.
type RopeCase = (usize, bool, f32, f32, usize);

/// Host rope over `[L, D]` rows at positions `offset..offset + L`.
fn rope_host(x: &[f32], l: usize, d: usize, case: RopeCase) -> Vec<f32> {
    let (dims, traditional, base, scale, offset) = case;
    let mut out = x.to_vec();
    let half = dims / 2;
    for pos in 0..l {
        let row = &x[pos * d..(pos + 1) * d];
        let o = &mut out[pos * d..(pos + 1) * d];
        for i in 0..half {
            let inv_freq = base.powf(-(2.0 * i as f32) / dims as f32);
            let theta = (offset + pos) as f32 * scale * inv_freq;
            let (s, c) = theta.sin_cos();
            let (a, b) = if traditional {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            o[a] = row[a] * c - row[b] * s;
            o[b] = row[a] * s + row[b] * c;
        }
    }
    out
}

#[test]
fn rope_matches_hand_computation() {
    let (l, d) = (5usize, 8usize);
    let data = host_noise(11, l * d);
    let x = arr(&data, &[1, 1, l as i32, d as i32]);
    // (dims, traditional, base, scale, offset)
    let cases: [RopeCase; 6] = [
        (8, false, 10_000.0, 1.0, 0),
        (8, false, 10_000.0, 1.0, 7),
        (8, true, 10_000.0, 1.0, 3),
        (8, false, 500.0, 0.5, 2),
        (8, true, 1_000_000.0, 0.25, 100),
        // Partial rotation: only the first 4 features rotate, the rest pass through.
        (4, false, 10_000.0, 1.0, 5),
    ];
    for (dims, traditional, base, scale, offset) in cases {
        let case = format!(
            "dims {dims} traditional {traditional} base {base} scale {scale} offset {offset}"
        );
        let want = rope_host(&data, l, d, (dims, traditional, base, scale, offset));
        let got = fast::rope(&x, dims as i32, traditional, base, scale, offset as i32);
        check(&case, got, &[1, 1, l as i32, d as i32], &want, 1e-4);
    }
}

#[test]
fn rope_with_explicit_freqs_matches_base() {
    let (l, d) = (3usize, 4usize);
    let data = host_noise(12, l * d);
    let x = arr(&data, &[1, l as i32, d as i32]);
    // MLX's `freqs` are periods (base^(2i/d)); the angle is pos / freq.
    let freqs = arr(&[1.0, 100.0], &[2]);
    let got = fast::rope_with_freqs(&x, 4, false, 1.0, 1, &freqs);
    let want = rope_host(&data, l, d, (4, false, 10_000.0, 1.0, 1));
    check("rope freqs", got, &[1, l as i32, d as i32], &want, 1e-4);
}

/// Naive attention for q `[1, hq, lq, dh]`, k/v `[1, hkv, s, dh]`; `keep(i, j)` masks, `bias(i, j)` adds.
fn sdpa_host(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (hq, hkv, lq, s, dh): (usize, usize, usize, usize, usize),
    scale: f32,
    mask: impl Fn(usize, usize) -> f32,
) -> Vec<f32> {
    let mut out = vec![0.0; hq * lq * dh];
    for h in 0..hq {
        let kh = h / (hq / hkv);
        for i in 0..lq {
            let qi = &q[(h * lq + i) * dh..][..dh];
            let logits: Vec<f32> = (0..s)
                .map(|j| {
                    let kj = &k[(kh * s + j) * dh..][..dh];
                    qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale + mask(i, j)
                })
                .collect();
            let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = logits.iter().map(|x| (x - m).exp()).collect();
            let z: f32 = e.iter().sum();
            for (j, p) in e.iter().enumerate() {
                let vj = &v[(kh * s + j) * dh..][..dh];
                for c in 0..dh {
                    out[(h * lq + i) * dh + c] += p / z * vj[c];
                }
            }
        }
    }
    out
}

#[test]
fn sdpa_matches_naive_attention() {
    // (hq, hkv, lq, s, dh): plain MHA, GQA 4/2, GQA 4/1 with a query block shorter than the keys.
    for dims in [(2, 2, 3, 3, 8), (4, 2, 3, 5, 8), (4, 1, 2, 6, 16)] {
        let (hq, hkv, lq, s, dh) = dims;
        let qd = host_noise(21, hq * lq * dh);
        let kd = host_noise(22, hkv * s * dh);
        let vd = host_noise(23, hkv * s * dh);
        let q = arr(&qd, &[1, hq as i32, lq as i32, dh as i32]);
        let k = arr(&kd, &[1, hkv as i32, s as i32, dh as i32]);
        let v = arr(&vd, &[1, hkv as i32, s as i32, dh as i32]);
        let scale = 1.0 / (dh as f32).sqrt();
        let shape = [1, hq as i32, lq as i32, dh as i32];
        let case = format!("{dims:?}");

        let want = sdpa_host(&qd, &kd, &vd, dims, scale, |_, _| 0.0);
        check(
            &format!("{case} none"),
            fast::scaled_dot_product_attention(&q, &k, &v, scale, Mask::None),
            &shape,
            &want,
            1e-5,
        );

        // Causal aligned at the end: query i sees keys 0..=s-lq+i.
        let causal = |i: usize, j: usize| {
            if j <= s - lq + i {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        };
        let want = sdpa_host(&qd, &kd, &vd, dims, scale, causal);
        check(
            &format!("{case} causal"),
            fast::scaled_dot_product_attention(&q, &k, &v, scale, Mask::Causal),
            &shape,
            &want,
            1e-5,
        );

        // An explicit boolean mask: a sliding window of two keys ending at the causal edge.
        let keep = |i: usize, j: usize| j <= s - lq + i && j + 2 > s - lq + i;
        let bools: Vec<bool> = (0..lq * s).map(|n| keep(n / s, n % s)).collect();
        let m = Array::from_slice(&bools, &[lq as i32, s as i32]).unwrap();
        let want = sdpa_host(&qd, &kd, &vd, dims, scale, |i, j| {
            if keep(i, j) { 0.0 } else { f32::NEG_INFINITY }
        });
        check(
            &format!("{case} bool mask"),
            fast::scaled_dot_product_attention(&q, &k, &v, scale, Mask::Array(&m)),
            &shape,
            &want,
            1e-5,
        );

        // An additive float mask.
        let bias: Vec<f32> = (0..lq * s).map(|n| -0.5 * (n % s) as f32).collect();
        let m = arr(&bias, &[lq as i32, s as i32]);
        let want = sdpa_host(&qd, &kd, &vd, dims, scale, |i, j| bias[i * s + j]);
        check(
            &format!("{case} additive mask"),
            fast::scaled_dot_product_attention(&q, &k, &v, scale, Mask::Array(&m)),
            &shape,
            &want,
            1e-5,
        );
    }
}

#[test]
fn sdpa_in_bf16_is_close_to_f32() {
    let dims = (2, 1, 2, 4, 8);
    let (hq, hkv, lq, s, dh) = dims;
    let (qd, kd, vd) = (
        host_noise(31, hq * lq * dh),
        host_noise(32, hkv * s * dh),
        host_noise(33, hkv * s * dh),
    );
    let to = |d: &[f32], h: usize, l: usize| {
        arr(d, &[1, h as i32, l as i32, dh as i32])
            .as_type(Dtype::Bfloat16)
            .unwrap()
    };
    let got = fast::scaled_dot_product_attention(
        &to(&qd, hq, lq),
        &to(&kd, hkv, s),
        &to(&vd, hkv, s),
        0.35,
        Mask::Causal,
    )
    .unwrap();
    assert_eq!(got.dtype(), Dtype::Bfloat16);
    let want = sdpa_host(&qd, &kd, &vd, dims, 0.35, |i, j| {
        if j <= s - lq + i {
            0.0
        } else {
            f32::NEG_INFINITY
        }
    });
    // bf16 keeps 8 significant bits: 2^-8 relative on values below 1, plus rounding of the inputs.
    assert_close("bf16 sdpa", &got.to_vec::<f32>().unwrap(), &want, 2e-2);
}

#[test]
fn a_cuda_kernel_called_with_the_wrong_number_of_inputs_is_an_error_naming_both() {
    use mlx_tensor::fast::{CudaKernel, CudaLaunch};
    let kernel = CudaKernel {
        name: "mtp_test_two_inputs",
        source: "out[0] = a[0] + b[0];",
        inputs: &["a", "b"],
        outputs: &["out"],
        row_contiguous: true,
    };
    let launch = CudaLaunch {
        outputs: &[(&[1], Dtype::Float32)],
        grid: [1, 1, 1],
        block: [1, 1, 1],
        templates: &[],
    };
    let a = Array::from_slice(&[1.0f32], &[1]).unwrap();
    let err = kernel.apply(&[&a], &launch).unwrap_err().to_string();
    assert!(err.contains("2 input names but 1 inputs"), "{err}");
}
