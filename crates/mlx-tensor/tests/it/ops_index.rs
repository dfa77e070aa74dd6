//! Gathers and scatters: take, take_along_axis, put_along_axis, scatter_add.

use crate::common;

use common::{arr, check, iarr};

const TOL: f32 = 0.0;

#[test]
fn take_gathers_along_an_axis() {
    let x = arr(
        &[0.0, 1.0, 2.0, 10.0, 11.0, 12.0, 20.0, 21.0, 22.0],
        &[3, 3],
    );
    let rows = iarr(&[2, 0, 2], &[3]);
    check(
        "take rows",
        x.take(&rows, 0),
        &[3, 3],
        &[20.0, 21.0, 22.0, 0.0, 1.0, 2.0, 20.0, 21.0, 22.0],
        TOL,
    );
    let cols = iarr(&[1], &[1]);
    check(
        "take cols",
        x.take(&cols, 1),
        &[3, 1],
        &[1.0, 11.0, 21.0],
        TOL,
    );
    // An index array of shape [2, 2] on axis 0 of an embedding table gives [2, 2, 3].
    let ids = iarr(&[0, 1, 1, 2], &[2, 2]);
    check(
        "embedding lookup",
        x.take(&ids, 0),
        &[2, 2, 3],
        &[
            0.0, 1.0, 2.0, 10.0, 11.0, 12.0, 10.0, 11.0, 12.0, 20.0, 21.0, 22.0,
        ],
        TOL,
    );
}

#[test]
fn take_and_put_along_axis() {
    let x = arr(&[5.0, 6.0, 7.0, 8.0, 9.0, 10.0], &[2, 3]);
    let idx = iarr(&[2, 0, 1, 1], &[2, 2]);
    check(
        "take_along_axis",
        x.take_along_axis(&idx, 1),
        &[2, 2],
        &[7.0, 5.0, 9.0, 9.0],
        TOL,
    );
    let idx1 = iarr(&[1, 2], &[2, 1]);
    let vals = arr(&[-1.0, -2.0], &[2, 1]);
    check(
        "put_along_axis",
        x.put_along_axis(&idx1, &vals, 1),
        &[2, 3],
        &[5.0, -1.0, 7.0, 8.0, 9.0, -2.0],
        TOL,
    );
}

#[test]
fn scatter_add_accumulates_duplicates() {
    let base = arr(&[0.0; 4], &[1, 4]);
    // Index 1 appears twice: both values add up.
    let idx = iarr(&[1, 3, 1], &[1, 3]);
    let vals = arr(&[1.0, 2.0, 4.0], &[1, 3]);
    check(
        "scatter_add",
        base.scatter_add(&idx, &vals, 1),
        &[1, 4],
        &[0.0, 5.0, 0.0, 2.0],
        TOL,
    );
    // A token-count histogram, the way a repetition penalty builds one.
    let counts = arr(&[0.0; 5], &[5]);
    let tokens = iarr(&[4, 0, 4, 4, 2], &[5]);
    let ones = arr(&[1.0; 5], &[5]);
    check(
        "histogram",
        counts.scatter_add(&tokens, &ones, 0),
        &[5],
        &[1.0, 0.0, 1.0, 0.0, 3.0],
        TOL,
    );
}
