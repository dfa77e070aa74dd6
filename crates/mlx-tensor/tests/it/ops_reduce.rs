//! Reductions, softmax, logsumexp, arg-reductions, partitions, top-k, sorts and cumulative sums.

use crate::common;

use common::{arr, check, check_b, check_i};

const TOL: f32 = 1e-6;

#[test]
fn reductions() {
    let x = arr(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    check("sum all", x.sum(&[0, 1], false), &[], &[21.0], TOL);
    check("sum rows", x.sum(&[1], false), &[2], &[6.0, 15.0], TOL);
    check(
        "sum keepdims",
        x.sum(&[0], true),
        &[1, 3],
        &[5.0, 7.0, 9.0],
        TOL,
    );
    check("max", x.max(&[1], false), &[2], &[3.0, 6.0], TOL);
    check("min", x.min(&[0], false), &[3], &[1.0, 2.0, 3.0], TOL);
    check("mean", x.mean(&[1], false), &[2], &[2.0, 5.0], TOL);
    check("prod", x.prod(&[1], false), &[2], &[6.0, 120.0], TOL);
    // logsumexp([1, 2, 3]) = 3 + ln(1 + e^-1 + e^-2) = 3.40760596
    check(
        "logsumexp",
        x.logsumexp(&[1], false),
        &[2],
        &[3.407_606, 6.407_606],
        1e-5,
    );
    let big = arr(&[1000.0, 1000.0], &[2]);
    check(
        "logsumexp stable",
        big.logsumexp(&[0], false),
        &[],
        &[1_000.693],
        1e-3,
    );
    let b = mlx_tensor::Array::from_slice(&[true, false, true, true], &[2, 2]).unwrap();
    check_b("all", b.all(&[1], false), &[2], &[false, true]);
    check_b("any", b.any(&[1], false), &[2], &[true, true]);
}

#[test]
fn softmax_rows() {
    let x = arr(&[1.0, 2.0, 3.0, 0.0, 0.0, 0.0], &[2, 3]);
    let want = [
        0.090_030_57,
        0.244_728_48,
        0.665_240_94,
        1.0 / 3.0,
        1.0 / 3.0,
        1.0 / 3.0,
    ];
    check("softmax", x.softmax(&[-1], false), &[2, 3], &want, 1e-6);
    check(
        "softmax precise",
        x.softmax(&[-1], true),
        &[2, 3],
        &want,
        1e-6,
    );
    // -inf entries (masked logits) get probability zero.
    let m = arr(&[0.0, f32::NEG_INFINITY, 0.0], &[3]);
    check(
        "softmax -inf",
        m.softmax(&[0], false),
        &[3],
        &[0.5, 0.0, 0.5],
        1e-6,
    );
}

#[test]
fn arg_reductions_and_orderings() {
    let x = arr(&[3.0, 1.0, 4.0, 1.5, 9.0, 2.0], &[2, 3]);
    check_i("argmax", x.argmax(-1, false), &[2], &[2, 1]);
    check_i("argmax keepdims", x.argmax(0, true), &[1, 3], &[0, 1, 0]);
    check_i("argmin", x.argmin(-1, false), &[2], &[1, 0]);
    check(
        "sort",
        x.sort(-1),
        &[2, 3],
        &[1.0, 3.0, 4.0, 1.5, 2.0, 9.0],
        0.0,
    );
    check_i("argsort", x.argsort(-1), &[2, 3], &[1, 0, 2, 0, 2, 1]);
}

#[test]
fn topk_and_argpartition_select_the_right_sets() {
    let data = [5.0, -1.0, 7.0, 3.0, 9.0, 0.0, 8.0, 2.0];
    let x = arr(&data, &[8]);
    // top-k is unordered: compare as a sorted set.
    let mut top: Vec<f32> = x.topk(3, 0).unwrap().to_vec().unwrap();
    top.sort_by(f32::total_cmp);
    assert_eq!(top, [7.0, 8.0, 9.0]);
    // After argpartition(kth), the element at kth is the kth smallest, smaller ones precede it.
    for kth in [0, 3, 7] {
        let idx: Vec<u32> = x.argpartition(kth, 0).unwrap().to_vec().unwrap();
        let vals: Vec<f32> = idx.iter().map(|&i| data[i as usize]).collect();
        let mut sorted = data;
        sorted.sort_by(f32::total_cmp);
        let k = kth as usize;
        assert_eq!(vals[k], sorted[k], "kth={kth}: {vals:?}");
        assert!(
            vals[..k].iter().all(|&v| v <= vals[k]),
            "kth={kth}: {vals:?}"
        );
        assert!(
            vals[k + 1..].iter().all(|&v| v >= vals[k]),
            "kth={kth}: {vals:?}"
        );
        let mut seen = idx.clone();
        seen.sort();
        assert_eq!(seen, (0..8).collect::<Vec<u32>>(), "a permutation");
    }
    // Top-k along the last axis of a batch keeps the batch axis.
    let rows = arr(&[1.0, 5.0, 3.0, 6.0, 4.0, 2.0], &[2, 3]);
    assert_eq!(rows.topk(2, -1).unwrap().shape().as_slice(), &[2, 2]);
}

#[test]
fn cumulative_ops() {
    let x = arr(&[1.0, 2.0, 3.0, 4.0], &[4]);
    check(
        "cumsum",
        x.cumsum(0, false, true),
        &[4],
        &[1.0, 3.0, 6.0, 10.0],
        TOL,
    );
    check(
        "cumsum exclusive",
        x.cumsum(0, false, false),
        &[4],
        &[0.0, 1.0, 3.0, 6.0],
        TOL,
    );
    check(
        "cumsum reverse",
        x.cumsum(0, true, true),
        &[4],
        &[10.0, 9.0, 7.0, 4.0],
        TOL,
    );
    check(
        "cumprod",
        x.cumprod(0, false, true),
        &[4],
        &[1.0, 2.0, 6.0, 24.0],
        TOL,
    );
    let m = arr(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    check(
        "cumsum axis 0",
        m.cumsum(0, false, true),
        &[2, 2],
        &[1.0, 2.0, 4.0, 6.0],
        TOL,
    );
}
