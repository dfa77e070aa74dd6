//! Shape ops (reshape, transpose, slices, concatenate, stack, ...), creation ops, and strided views read back.

use crate::common;

use common::{arr, check};
use mlx_tensor::{Array, Dtype, ops};

const TOL: f32 = 0.0;

/// `0, 1, ..., n-1` as f32 in the given shape.
fn iota(shape: &[i32]) -> Array {
    let n: i32 = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
    arr(&data, shape)
}

#[test]
fn reshape_transpose_and_axes() {
    let x = iota(&[2, 3]);
    check(
        "reshape",
        x.reshape(&[3, 2]),
        &[3, 2],
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        TOL,
    );
    check(
        "reshape -1",
        x.reshape(&[-1]),
        &[6],
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        TOL,
    );
    check(
        "transpose",
        x.transpose(&[1, 0]),
        &[3, 2],
        &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0],
        TOL,
    );
    check("t", x.t(), &[3, 2], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0], TOL);
    let y = iota(&[2, 2, 2]);
    check(
        "swapaxes",
        y.swapaxes(0, 2),
        &[2, 2, 2],
        &[0.0, 4.0, 2.0, 6.0, 1.0, 5.0, 3.0, 7.0],
        TOL,
    );
    check(
        "transpose 3d",
        y.transpose(&[1, 0, 2]),
        &[2, 2, 2],
        &[0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0],
        TOL,
    );
    let z = iota(&[1, 3, 1]);
    check("squeeze", z.squeeze(&[0, 2]), &[3], &[0.0, 1.0, 2.0], TOL);
    check(
        "expand_dims",
        iota(&[3]).expand_dims(&[0, 2]),
        &[1, 3, 1],
        &[0.0, 1.0, 2.0],
        TOL,
    );
    check(
        "broadcast_to",
        iota(&[3]).broadcast_to(&[2, 3]),
        &[2, 3],
        &[0.0, 1.0, 2.0, 0.0, 1.0, 2.0],
        TOL,
    );
    assert_eq!(y.ndim(), 3);
    assert_eq!(y.dim(-1), 2);
    assert_eq!(y.size(), 8);
    assert_eq!(y.nbytes(), 32);
}

#[test]
fn slices() {
    let x = iota(&[3, 4]);
    // x[0:3:2, 1:4:2]
    check(
        "strided slice",
        x.slice(&[0, 1], &[3, 4], &[2, 2]),
        &[2, 2],
        &[1.0, 3.0, 9.0, 11.0],
        TOL,
    );
    check(
        "slice_range",
        x.slice_range(&[1, 1], &[3, 3]),
        &[2, 2],
        &[5.0, 6.0, 9.0, 10.0],
        TOL,
    );
    check(
        "slice_axis",
        x.slice_axis(-1, 2, 4),
        &[3, 2],
        &[2.0, 3.0, 6.0, 7.0, 10.0, 11.0],
        TOL,
    );
    check(
        "slice_axis 0",
        x.slice_axis(0, 2, 3),
        &[1, 4],
        &[8.0, 9.0, 10.0, 11.0],
        TOL,
    );
    let upd = arr(&[-1.0, -2.0, -3.0, -4.0], &[2, 2]);
    check(
        "slice_update",
        x.slice_update(&upd, &[1, 2], &[3, 4]),
        &[3, 4],
        &[
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, -1.0, -2.0, 8.0, 9.0, -3.0, -4.0,
        ],
        TOL,
    );
    // The source is unchanged: slice_update returns a new array.
    check(
        "source intact",
        Ok(x.clone()),
        &[3, 4],
        &(0..12).map(|i| i as f32).collect::<Vec<_>>(),
        TOL,
    );
}

#[test]
fn strided_views_read_back_in_logical_order() {
    let x = iota(&[2, 3, 4]);
    x.eval().unwrap();
    // A transpose of a strided slice of an evaluated array: a view with non-unit strides.
    let view = x
        .slice(&[0, 0, 1], &[2, 3, 4], &[1, 2, 2])
        .unwrap()
        .transpose(&[2, 1, 0])
        .unwrap();
    // x[:, ::2, 1::2] = [[[1,3],[9,11]], [[13,15],[21,23]]]; transposed (2,1,0).
    check(
        "view",
        Ok(view.clone()),
        &[2, 2, 2],
        &[1.0, 13.0, 9.0, 21.0, 3.0, 15.0, 11.0, 23.0],
        TOL,
    );
    // The same view as bf16 goes through as_type and back.
    let bf: Vec<mlx_tensor::bf16> = view.as_type(Dtype::Bfloat16).unwrap().to_vec().unwrap();
    assert_eq!(
        bf.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
        [1.0, 13.0, 9.0, 21.0, 3.0, 15.0, 11.0, 23.0]
    );
    // A broadcast view has zero strides.
    let b = arr(&[5.0, 6.0], &[2, 1]).broadcast_to(&[2, 3]).unwrap();
    check(
        "broadcast view",
        Ok(b),
        &[2, 3],
        &[5.0, 5.0, 5.0, 6.0, 6.0, 6.0],
        TOL,
    );
    check(
        "contiguous",
        view.contiguous(),
        &[2, 2, 2],
        &[1.0, 13.0, 9.0, 21.0, 3.0, 15.0, 11.0, 23.0],
        TOL,
    );
}

#[test]
fn concatenate_and_stack() {
    let a = iota(&[2, 2]);
    let b = arr(&[10.0, 11.0], &[2, 1]);
    check(
        "concat axis 1",
        ops::concatenate(&[a.clone(), b], 1),
        &[2, 3],
        &[0.0, 1.0, 10.0, 2.0, 3.0, 11.0],
        TOL,
    );
    let c = arr(&[7.0, 8.0], &[1, 2]);
    check(
        "concat axis 0",
        ops::concatenate(&[a.clone(), c], 0),
        &[3, 2],
        &[0.0, 1.0, 2.0, 3.0, 7.0, 8.0],
        TOL,
    );
    let d = arr(&[4.0, 5.0, 6.0, 7.0], &[2, 2]);
    check(
        "stack 0",
        ops::stack(&[a.clone(), d.clone()], 0),
        &[2, 2, 2],
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
        TOL,
    );
    check(
        "stack 2",
        ops::stack(&[a, d], 2),
        &[2, 2, 2],
        &[0.0, 4.0, 1.0, 5.0, 2.0, 6.0, 3.0, 7.0],
        TOL,
    );
}

#[test]
fn creation_ops() {
    check(
        "zeros",
        ops::zeros(&[2, 2], Dtype::Float32),
        &[2, 2],
        &[0.0; 4],
        TOL,
    );
    check(
        "ones",
        ops::ones(&[3], Dtype::Float16),
        &[3],
        &[1.0; 3],
        TOL,
    );
    check(
        "full",
        ops::full(&[2], 2.5, Dtype::Float32),
        &[2],
        &[2.5, 2.5],
        TOL,
    );
    check(
        "arange",
        ops::arange(1.0, 2.0, 0.25, Dtype::Float32),
        &[4],
        &[1.0, 1.25, 1.5, 1.75],
        TOL,
    );
    check(
        "tri",
        ops::tri(2, 3, 0, Dtype::Float32),
        &[2, 3],
        &[1.0, 0.0, 0.0, 1.0, 1.0, 0.0],
        TOL,
    );
    check(
        "tri k=1",
        ops::tri(2, 3, 1, Dtype::Float32),
        &[2, 3],
        &[1.0, 1.0, 0.0, 1.0, 1.0, 1.0],
        TOL,
    );
    check("scalar", Array::from_f32(3.5), &[], &[3.5], TOL);
    let i = Array::from_int(-7, Dtype::Int64).unwrap();
    assert_eq!((i.dtype(), i.item::<i64>().unwrap()), (Dtype::Int64, -7));
    let empty = Array::from_slice::<f32>(&[], &[0, 3]).unwrap();
    assert_eq!((empty.size(), empty.to_vec::<f32>().unwrap()), (0, vec![]));
}
