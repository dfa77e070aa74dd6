//! Property tests: strided views (transposes and strided slices of any 3-D shape) read back in logical order.

use mlx_tensor::Array;
use proptest::prelude::*;

/// Row-major index of `(i, j, k)` in `shape`.
fn at(shape: [usize; 3], i: usize, j: usize, k: usize) -> usize {
    (i * shape[1] + j) * shape[2] + k
}

fn shape_strategy() -> impl Strategy<Value = [usize; 3]> {
    [1usize..5, 1usize..5, 1usize..5]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn transpose_reads_back_permuted(shape in shape_strategy(), perm in Just([0usize, 1, 2]).prop_shuffle()) {
        let n = shape.iter().product::<usize>();
        let data: Vec<f32> = (0..n).map(|v| v as f32).collect();
        let dims: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
        let a = Array::from_slice(&data, &dims).unwrap();
        a.eval().unwrap();
        let axes: Vec<i32> = perm.iter().map(|&p| p as i32).collect();
        let got: Vec<f32> = a.transpose(&axes).unwrap().to_vec().unwrap();
        let out = [shape[perm[0]], shape[perm[1]], shape[perm[2]]];
        let mut want = Vec::with_capacity(n);
        for x in 0..out[0] {
            for y in 0..out[1] {
                for z in 0..out[2] {
                    let mut idx = [0usize; 3];
                    idx[perm[0]] = x;
                    idx[perm[1]] = y;
                    idx[perm[2]] = z;
                    want.push(data[at(shape, idx[0], idx[1], idx[2])]);
                }
            }
        }
        prop_assert_eq!(got, want);
    }

    #[test]
    fn strided_slice_matches_host(
        shape in shape_strategy(),
        starts in [0usize..4, 0usize..4, 0usize..4],
        strides in [1usize..3, 1usize..3, 1usize..3],
    ) {
        let n = shape.iter().product::<usize>();
        let data: Vec<f32> = (0..n).map(|v| v as f32 * 0.5).collect();
        let dims: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
        let a = Array::from_slice(&data, &dims).unwrap();
        let start: Vec<usize> = (0..3).map(|i| starts[i].min(shape[i] - 1)).collect();
        let ranges: Vec<Vec<usize>> = (0..3).map(|i| (start[i]..shape[i]).step_by(strides[i]).collect()).collect();
        let lo: Vec<i32> = start.iter().map(|&v| v as i32).collect();
        let st: Vec<i32> = strides.iter().map(|&v| v as i32).collect();
        let view = a.slice(&lo, &dims, &st).unwrap();
        let want_shape: Vec<i32> = ranges.iter().map(|r| r.len() as i32).collect();
        prop_assert_eq!(view.shape().to_vec(), want_shape);
        let mut want = Vec::new();
        for &i in &ranges[0] {
            for &j in &ranges[1] {
                for &k in &ranges[2] {
                    want.push(data[at(shape, i, j, k)]);
                }
            }
        }
        prop_assert_eq!(view.to_vec::<f32>().unwrap(), want);
    }
}
