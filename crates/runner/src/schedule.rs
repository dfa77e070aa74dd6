//! Evaluation order of lazy MLX graphs: one block's work scheduled after another's.

use mlx_tensor::{Array, ops};

use crate::error::Result;

/// `a` unchanged in value, but scheduled after `prev`: a zero-size slice of
/// `prev` joined to it along `axis`.
///
/// Why: MLX orders an evaluation breadth-first, up to `MLX_BFS_MAX_WIDTH`
/// (20) nodes wide, so blocks of work that are independent of each other
/// (the query blocks of a long attention, the weight blocks of a dequantized
/// product) would run about 20 at a time with all of their temporaries
/// alive. When each block's first input is `after` the previous block's
/// result, a block's temporaries are freed (their consumers evaluated)
/// before the next block's are built. The cost is one copy of `a`.
pub(crate) fn after(a: &Array, prev: &Array, axis: i32) -> Result<Array> {
    let n = a.ndim() as i32;
    let ax = if axis < 0 { axis + n } else { axis };
    assert!(
        (0..n).contains(&ax) && prev.ndim() >= 1,
        "after: axis {axis} of a rank-{n} array, after a rank-{} one",
        prev.ndim()
    );
    let mut shape = a.shape().to_vec();
    shape[ax as usize] = 0;
    let nothing = prev
        .slice_axis(0, 0, 0)?
        .reshape(&shape)?
        .as_type(a.dtype())?;
    Ok(ops::concatenate(&[nothing, a.clone()], ax)?)
}
