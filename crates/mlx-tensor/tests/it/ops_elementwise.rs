//! Element-wise arithmetic with broadcasting, unary maths, comparisons, `where`, matmul and `as_type`.

use crate::common;

use common::{arr, check, check_b, check_i};
use mlx_tensor::{Array, Dtype, ops};

const TOL: f32 = 1e-6;

#[test]
fn binary_ops_broadcast() {
    // [2, 3] against [3]: the row broadcasts over both rows.
    let a = arr(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = arr(&[10.0, 20.0, 40.0], &[3]);
    let c = arr(&[2.0], &[1]);
    let s = [2, 3];
    check(
        "add",
        a.add(&b),
        &s,
        &[11.0, 22.0, 43.0, 14.0, 25.0, 46.0],
        TOL,
    );
    check(
        "subtract",
        a.subtract(&b),
        &s,
        &[-9.0, -18.0, -37.0, -6.0, -15.0, -34.0],
        TOL,
    );
    check(
        "multiply",
        a.multiply(&b),
        &s,
        &[10.0, 40.0, 120.0, 40.0, 100.0, 240.0],
        TOL,
    );
    check(
        "divide",
        a.divide(&b),
        &s,
        &[0.1, 0.1, 0.075, 0.4, 0.25, 0.15],
        TOL,
    );
    check(
        "maximum",
        a.maximum(&c),
        &s,
        &[2.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        TOL,
    );
    check(
        "minimum",
        a.minimum(&c),
        &s,
        &[1.0, 2.0, 2.0, 2.0, 2.0, 2.0],
        TOL,
    );
    check(
        "power",
        a.power(&c),
        &s,
        &[1.0, 4.0, 9.0, 16.0, 25.0, 36.0],
        1e-5,
    );
    check(
        "floor_divide",
        a.floor_divide(&c),
        &s,
        &[0.0, 1.0, 1.0, 2.0, 2.0, 3.0],
        TOL,
    );
    check(
        "remainder",
        a.remainder(&c),
        &s,
        &[1.0, 0.0, 1.0, 0.0, 1.0, 0.0],
        TOL,
    );
    // ln(e^a + e^c), and softplus as logaddexp(x, 0) where e^x overflows f32.
    let want: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
        .iter()
        .map(|&x| (x.exp() + 2.0f32.exp()).ln())
        .collect();
    check("logaddexp", a.logaddexp(&c), &s, &want, 1e-5);
    let big = arr(&[-200.0, 0.0, 200.0], &[3]);
    let zero = arr(&[0.0], &[1]);
    check(
        "softplus via logaddexp",
        big.logaddexp(&zero),
        &[3],
        &[0.0, std::f32::consts::LN_2, 200.0],
        1e-5,
    );
    // A column [2, 1] against a row [1, 3] gives the outer sum.
    let col = arr(&[1.0, 2.0], &[2, 1]);
    let row = arr(&[10.0, 20.0, 30.0], &[1, 3]);
    check(
        "outer add",
        col.add(&row),
        &s,
        &[11.0, 21.0, 31.0, 12.0, 22.0, 32.0],
        TOL,
    );
}

#[test]
fn comparisons_and_logic() {
    let a = arr(&[1.0, 2.0, 3.0], &[3]);
    let b = arr(&[2.0], &[1]);
    check_b("equal", a.equal(&b), &[3], &[false, true, false]);
    check_b("not_equal", a.not_equal(&b), &[3], &[true, false, true]);
    check_b("less", a.less(&b), &[3], &[true, false, false]);
    check_b("less_equal", a.less_equal(&b), &[3], &[true, true, false]);
    check_b("greater", a.greater(&b), &[3], &[false, false, true]);
    check_b(
        "greater_equal",
        a.greater_equal(&b),
        &[3],
        &[false, true, true],
    );
    let p = Array::from_slice(&[true, true, false, false], &[4]).unwrap();
    let q = Array::from_slice(&[true, false, true, false], &[4]).unwrap();
    check_b("and", p.logical_and(&q), &[4], &[true, false, false, false]);
    check_b("or", p.logical_or(&q), &[4], &[true, true, true, false]);
    check_b("not", p.logical_not(), &[4], &[false, false, true, true]);
}

#[test]
fn unary_ops_match_std() {
    let xs = [0.25f32, 1.0, 2.5];
    let x = arr(&xs, &[3]);
    type F = fn(f32) -> f32;
    let erf: F = |v| {
        // Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7) as an independent reference.
        let t = 1.0 / (1.0 + 0.327_591_1 * v.abs());
        let y = 1.0
            - (((((1.061_405_4 * t - 1.453_152_1) * t) + 1.421_413_7) * t - 0.284_496_74) * t
                + 0.254_829_6)
                * t
                * (-v * v).exp();
        y.copysign(v)
    };
    let cases: [(&str, mlx_tensor::Result<Array>, F); 15] = [
        ("negative", x.negative(), |v| -v),
        ("exp", x.exp(), f32::exp),
        ("log", x.log(), f32::ln),
        ("sqrt", x.sqrt(), f32::sqrt),
        ("rsqrt", x.rsqrt(), |v| 1.0 / v.sqrt()),
        ("abs", x.negative().and_then(|n| n.abs()), f32::abs),
        ("sigmoid", x.sigmoid(), |v| 1.0 / (1.0 + (-v).exp())),
        ("tanh", x.tanh(), f32::tanh),
        ("square", x.square(), |v| v * v),
        ("reciprocal", x.reciprocal(), |v| 1.0 / v),
        ("floor", x.floor(), f32::floor),
        ("sin", x.sin(), f32::sin),
        ("cos", x.cos(), f32::cos),
        ("log1p", x.log1p(), f32::ln_1p),
        ("silu", x.silu(), |v| v / (1.0 + (-v).exp())),
    ];
    for (name, got, f) in cases {
        let want: Vec<f32> = xs.iter().map(|&v| f(v)).collect();
        check(name, got, &[3], &want, 1e-5);
    }
    let want: Vec<f32> = xs.iter().map(|&v| erf(v)).collect();
    check("erf", x.erf(), &[3], &want, 1e-5);
}

#[test]
fn nan_and_inf_predicates() {
    let x = arr(&[1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY], &[4]);
    check_b("isnan", x.isnan(), &[4], &[false, true, false, false]);
    check_b("isinf", x.isinf(), &[4], &[false, false, true, true]);
}

#[test]
fn where_selects_and_broadcasts() {
    let cond = Array::from_slice(&[true, false, true], &[3]).unwrap();
    let x = arr(&[1.0, 2.0, 3.0], &[3]);
    let y = arr(&[-1.0], &[1]);
    check(
        "where",
        ops::r#where(&cond, &x, &y),
        &[3],
        &[1.0, -1.0, 3.0],
        TOL,
    );
}

#[test]
fn matmul_and_addmm() {
    let a = arr(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = arr(&[7.0, 8.0, 9.0, 10.0, 11.0, 12.0], &[3, 2]);
    // [1 2 3; 4 5 6] · [7 8; 9 10; 11 12] = [58 64; 139 154]
    check(
        "matmul",
        a.matmul(&b),
        &[2, 2],
        &[58.0, 64.0, 139.0, 154.0],
        TOL,
    );
    let c = arr(&[1.0, 1.0, 1.0, 1.0], &[2, 2]);
    // 2·c + 0.5·(a·b)
    check(
        "addmm",
        c.addmm(&a, &b, 0.5, 2.0),
        &[2, 2],
        &[31.0, 34.0, 71.5, 79.0],
        TOL,
    );
    // Batched: [2, 1, 3] · [3, 2] broadcasts the matrix over the batch.
    let batch = arr(&[1.0, 0.0, 0.0, 0.0, 0.0, 1.0], &[2, 1, 3]);
    check(
        "batched matmul",
        batch.matmul(&b),
        &[2, 1, 2],
        &[7.0, 8.0, 11.0, 12.0],
        TOL,
    );
}

#[test]
fn as_type_converts() {
    let x = arr(&[-2.7, -0.5, 0.5, 2.7, 300.0], &[5]);
    // Float → int truncates toward zero, as C++ casts do.
    check_i(
        "to int32",
        x.as_type(Dtype::Int32),
        &[5],
        &[-2, 0, 0, 2, 300],
    );
    check_b(
        "to bool",
        x.as_type(Dtype::Bool),
        &[5],
        &[true, true, true, true, true],
    );
    // bf16 keeps 8 significant bits: 300 is exact, 2.7 rounds to 2.703125.
    let back = x
        .as_type(Dtype::Bfloat16)
        .and_then(|b| b.as_type(Dtype::Float32));
    check(
        "f32→bf16→f32",
        back,
        &[5],
        &[-2.703125, -0.5, 0.5, 2.703125, 300.0],
        0.0,
    );
    let h = x.as_type(Dtype::Float16).unwrap();
    assert_eq!(h.dtype(), Dtype::Float16);
    check(
        "f32→f16→f32",
        h.as_type(Dtype::Float32),
        &[5],
        &[-2.6992188, -0.5, 0.5, 2.6992188, 300.0],
        0.0,
    );
}
