//! Array operations: element-wise, linear algebra, shape, indexing, reductions.
//!
//! All are lazy: they add a node to the graph and return at once; errors that
//! MLX can detect from shapes and dtypes (a matmul of mismatched shapes, say)
//! are reported here, at the call site.

use crate::array::List;
use crate::error::check;
use crate::ffi::sys::{self, BinaryOp, ReduceOp, UnaryOp};
use crate::{Array, Dtype, Result};
use std::marker::PhantomData;

macro_rules! unary_ops {
    ($($(#[$doc:meta])* $name:ident = $op:ident;)*) => {
        impl Array {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self) -> Result<Array> {
                    check(sys::unary(self.raw(), UnaryOp::$op)).map(Array::wrap)
                }
            )*
        }
    };
}

macro_rules! binary_ops {
    ($($(#[$doc:meta])* $name:ident = $op:ident;)*) => {
        impl Array {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self, other: &Array) -> Result<Array> {
                    check(sys::binary(self.raw(), other.raw(), BinaryOp::$op)).map(Array::wrap)
                }
            )*
        }
    };
}

unary_ops! {
    /// `-x`.
    negative = Negative;
    /// `e^x`.
    exp = Exp;
    /// Natural logarithm.
    log = Log;
    /// Square root.
    sqrt = Sqrt;
    /// `1 / sqrt(x)`.
    rsqrt = Rsqrt;
    /// Absolute value.
    abs = Abs;
    /// Logistic sigmoid.
    sigmoid = Sigmoid;
    /// Hyperbolic tangent.
    tanh = Tanh;
    /// `x * x`.
    square = Square;
    /// Logical not (boolean result).
    logical_not = LogicalNot;
    /// `1 / x`.
    reciprocal = Reciprocal;
    /// Round down.
    floor = Floor;
    /// Sine.
    sin = Sin;
    /// Cosine.
    cos = Cos;
    /// Error function.
    erf = Erf;
    /// True where the element is NaN.
    isnan = Isnan;
    /// True where the element is ±infinity.
    isinf = Isinf;
    /// `ln(1 + x)`.
    log1p = Log1p;
    /// SiLU: `x * sigmoid(x)`.
    silu = Silu;
}

binary_ops! {
    /// Element-wise sum, with broadcasting.
    add = Add;
    /// Element-wise difference, with broadcasting.
    subtract = Subtract;
    /// Element-wise product, with broadcasting.
    multiply = Multiply;
    /// Element-wise quotient, with broadcasting.
    divide = Divide;
    /// Element-wise maximum.
    maximum = Maximum;
    /// Element-wise minimum.
    minimum = Minimum;
    /// Element-wise power.
    power = Power;
    /// Element-wise `==` (boolean result).
    equal = Equal;
    /// Element-wise `!=`.
    not_equal = NotEqual;
    /// Element-wise `<`.
    less = Less;
    /// Element-wise `<=`.
    less_equal = LessEqual;
    /// Element-wise `>`.
    greater = Greater;
    /// Element-wise `>=`.
    greater_equal = GreaterEqual;
    /// Element-wise logical and.
    logical_and = LogicalAnd;
    /// Element-wise logical or.
    logical_or = LogicalOr;
    /// Element-wise floor division.
    floor_divide = FloorDivide;
    /// Element-wise remainder.
    remainder = Remainder;
    /// Element-wise `ln(eˣ + eʸ)`, without overflow (one node: `softplus(x)` is
    /// `logaddexp(x, 0)`).
    logaddexp = LogAddExp;
}

impl Array {
    #[track_caller]
    fn reduce(&self, axes: &[i32], keepdims: bool, op: ReduceOp) -> Result<Array> {
        check(sys::reduce(self.raw(), axes, keepdims, op)).map(Array::wrap)
    }

    /// Sum over `axes`.
    #[track_caller]
    pub fn sum(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce(axes, keepdims, ReduceOp::Sum)
    }
    /// Maximum over `axes`.
    #[track_caller]
    pub fn max(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce(axes, keepdims, ReduceOp::Max)
    }
    /// Minimum over `axes`.
    #[track_caller]
    pub fn min(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce(axes, keepdims, ReduceOp::Min)
    }
    /// Mean over `axes`.
    #[track_caller]
    pub fn mean(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce(axes, keepdims, ReduceOp::Mean)
    }
    /// Product over `axes`.
    #[track_caller]
    pub fn prod(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce(axes, keepdims, ReduceOp::Prod)
    }
    /// `log(sum(exp(x)))` over `axes`, computed stably.
    #[track_caller]
    pub fn logsumexp(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce(axes, keepdims, ReduceOp::LogSumExp)
    }
    /// True where every element over `axes` is true.
    #[track_caller]
    pub fn all(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce(axes, keepdims, ReduceOp::All)
    }
    /// True where any element over `axes` is true.
    #[track_caller]
    pub fn any(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        self.reduce(axes, keepdims, ReduceOp::Any)
    }

    /// Softmax over `axes`; `precise` accumulates in f32 for half inputs.
    #[track_caller]
    pub fn softmax(&self, axes: &[i32], precise: bool) -> Result<Array> {
        check(sys::softmax(self.raw(), axes, precise)).map(Array::wrap)
    }
    /// Index of the maximum along `axis` (uint32).
    #[track_caller]
    pub fn argmax(&self, axis: i32, keepdims: bool) -> Result<Array> {
        check(sys::arg_reduce(self.raw(), axis, keepdims, true)).map(Array::wrap)
    }
    /// Index of the minimum along `axis` (uint32).
    #[track_caller]
    pub fn argmin(&self, axis: i32, keepdims: bool) -> Result<Array> {
        check(sys::arg_reduce(self.raw(), axis, keepdims, false)).map(Array::wrap)
    }
    /// Indices that partition `axis` so that element `kth` is in sorted place.
    #[track_caller]
    pub fn argpartition(&self, kth: i32, axis: i32) -> Result<Array> {
        check(sys::argpartition(self.raw(), kth, axis)).map(Array::wrap)
    }
    /// The `k` largest values along `axis` (unordered).
    #[track_caller]
    pub fn topk(&self, k: i32, axis: i32) -> Result<Array> {
        check(sys::topk(self.raw(), k, axis)).map(Array::wrap)
    }
    /// Ascending sort along `axis`.
    #[track_caller]
    pub fn sort(&self, axis: i32) -> Result<Array> {
        check(sys::sort(self.raw(), axis)).map(Array::wrap)
    }
    /// Indices of an ascending sort along `axis`.
    #[track_caller]
    pub fn argsort(&self, axis: i32) -> Result<Array> {
        check(sys::argsort(self.raw(), axis)).map(Array::wrap)
    }
    /// Cumulative sum along `axis`.
    #[track_caller]
    pub fn cumsum(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        check(sys::cumsum(self.raw(), axis, reverse, inclusive)).map(Array::wrap)
    }
    /// Cumulative product along `axis`.
    #[track_caller]
    pub fn cumprod(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        check(sys::cumprod(self.raw(), axis, reverse, inclusive)).map(Array::wrap)
    }

    /// Converts to another dtype.
    #[track_caller]
    pub fn as_type(&self, dtype: Dtype) -> Result<Array> {
        check(sys::astype(self.raw(), dtype.code())).map(Array::wrap)
    }
    /// Decodes `uint8` codes of 8-bit floats in the E4M3 format (the OCP
    /// `float8_e4m3fn` of fp8 checkpoints: bias 7, no infinities, `0x7f` and
    /// `0xff` are NaN) into `dtype`. Every E4M3 value is exact in f16, bf16
    /// and f32.
    #[track_caller]
    pub fn from_fp8(&self, dtype: Dtype) -> Result<Array> {
        check(sys::from_fp8(self.raw(), dtype.code())).map(Array::wrap)
    }
    /// A row-major copy (a no-op node when already contiguous).
    #[track_caller]
    pub fn contiguous(&self) -> Result<Array> {
        check(sys::contiguous(self.raw())).map(Array::wrap)
    }

    /// Matrix product with broadcasting over leading axes.
    #[track_caller]
    pub fn matmul(&self, other: &Array) -> Result<Array> {
        check(sys::matmul(self.raw(), other.raw())).map(Array::wrap)
    }
    /// `beta * self + alpha * (a @ b)`.
    #[track_caller]
    pub fn addmm(&self, a: &Array, b: &Array, alpha: f32, beta: f32) -> Result<Array> {
        check(sys::addmm(self.raw(), a.raw(), b.raw(), alpha, beta)).map(Array::wrap)
    }

    /// New shape with the same elements.
    #[track_caller]
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        check(sys::reshape(self.raw(), shape)).map(Array::wrap)
    }
    /// Permutes axes.
    #[track_caller]
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        check(sys::transpose(self.raw(), axes)).map(Array::wrap)
    }
    /// Reverses all axes (a matrix transpose for 2-D arrays).
    #[track_caller]
    pub fn t(&self) -> Result<Array> {
        let n = self.ndim() as i32;
        let axes: Vec<i32> = (0..n).rev().collect();
        self.transpose(&axes)
    }
    /// Swaps two axes.
    #[track_caller]
    pub fn swapaxes(&self, a: i32, b: i32) -> Result<Array> {
        check(sys::swapaxes(self.raw(), a, b)).map(Array::wrap)
    }
    /// Removes size-1 axes.
    #[track_caller]
    pub fn squeeze(&self, axes: &[i32]) -> Result<Array> {
        check(sys::squeeze(self.raw(), axes)).map(Array::wrap)
    }
    /// Inserts size-1 axes.
    #[track_caller]
    pub fn expand_dims(&self, axes: &[i32]) -> Result<Array> {
        check(sys::expand_dims(self.raw(), axes)).map(Array::wrap)
    }
    /// Broadcasts to a larger shape (a view).
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[i32]) -> Result<Array> {
        check(sys::broadcast_to(self.raw(), shape)).map(Array::wrap)
    }
    /// Strided slice `[start, stop)` with `strides` (all three per axis).
    #[track_caller]
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        check(sys::slice(self.raw(), start, stop, strides)).map(Array::wrap)
    }
    /// Slice with unit strides.
    #[track_caller]
    pub fn slice_range(&self, start: &[i32], stop: &[i32]) -> Result<Array> {
        let ones = vec![1; start.len()];
        self.slice(start, stop, &ones)
    }
    /// Slice `[start, stop)` of one axis, keeping the others whole.
    #[track_caller]
    pub fn slice_axis(&self, axis: i32, start: i32, stop: i32) -> Result<Array> {
        let shape = self.shape();
        let n = shape.len() as i32;
        let ax = if axis < 0 { axis + n } else { axis };
        if !(0..n).contains(&ax) {
            return Err(crate::Error::AxisOutOfRange {
                axis,
                ndim: shape.len(),
                location: std::panic::Location::caller(),
            });
        }
        let mut lo = vec![0; shape.len()];
        let mut hi: Vec<i32> = shape.to_vec();
        lo[ax as usize] = start;
        hi[ax as usize] = stop;
        self.slice_range(&lo, &hi)
    }
    /// A copy of `self` with `[start, stop)` (unit strides) replaced by `update`.
    #[track_caller]
    pub fn slice_update(&self, update: &Array, start: &[i32], stop: &[i32]) -> Result<Array> {
        let ones = vec![1; start.len()];
        check(sys::slice_update(
            self.raw(),
            update.raw(),
            start,
            stop,
            &ones,
        ))
        .map(Array::wrap)
    }

    /// Gathers along `axis` with an index array.
    #[track_caller]
    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array> {
        check(sys::take(self.raw(), indices.raw(), axis)).map(Array::wrap)
    }
    /// Gathers element-wise along `axis` (indices broadcast against `self`).
    #[track_caller]
    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array> {
        check(sys::take_along_axis(self.raw(), indices.raw(), axis)).map(Array::wrap)
    }
    /// A copy with `values` written at `indices` along `axis`.
    #[track_caller]
    pub fn put_along_axis(&self, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
        check(sys::put_along_axis(
            self.raw(),
            indices.raw(),
            values.raw(),
            axis,
        ))
        .map(Array::wrap)
    }
    /// A copy with `values` added at `indices` along `axis` (duplicates accumulate).
    #[track_caller]
    pub fn scatter_add(&self, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
        check(sys::scatter_add_axis(
            self.raw(),
            indices.raw(),
            values.raw(),
            axis,
        ))
        .map(Array::wrap)
    }

    /// Affine-quantizes the last axis: returns `(packed, scales, biases)`.
    #[track_caller]
    pub fn quantize(&self, group_size: i32, bits: i32) -> Result<(Array, Array, Array)> {
        match self.quantize_mode(group_size, bits, QuantMode::Affine)? {
            (w, s, Some(b)) => Ok((w, s, b)),
            _ => Err(crate::Error::Mlx {
                message: "affine quantize returned no biases".into(),
                location: std::panic::Location::caller(),
            }),
        }
    }

    /// Quantizes the last axis in `mode`: returns `(packed, scales, biases)`,
    /// biases only for [`QuantMode::Affine`] (the floating-point modes
    /// store uint8 scales and no biases).
    #[track_caller]
    pub fn quantize_mode(
        &self,
        group_size: i32,
        bits: i32,
        mode: QuantMode,
    ) -> Result<(Array, Array, Option<Array>)> {
        let parts = List {
            inner: check(sys::quantize(self.raw(), group_size, bits, mode.name()))?,
        }
        .into_arrays()?;
        let mut it = parts.into_iter();
        match (it.next(), it.next(), it.next()) {
            (Some(w), Some(s), b) => Ok((w, s, b)),
            _ => Err(crate::Error::Mlx {
                message: format!(
                    "quantize in mode {} returned fewer than two arrays",
                    mode.name()
                ),
                location: std::panic::Location::caller(),
            }),
        }
    }
}

/// MLX's quantization modes: how codes and scales turn back into weights.
///
/// `Affine` stores `bits`-bit integer codes with a float scale and bias per
/// group (`w = scale · code + bias`); the floating-point modes store fp4
/// (e2m1) or fp8 (e4m3) codes with a uint8 scale per group and no bias:
/// an e8m0 power of two for `Mxfp4` / `Mxfp8` (groups of 32), an e4m3
/// float for `Nvfp4` (groups of 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantMode {
    /// Integer codes, float scales and biases.
    Affine,
    /// OCP MX fp4: e2m1 codes, e8m0 scales, groups of 32.
    Mxfp4,
    /// OCP MX fp8: e4m3 codes, e8m0 scales, groups of 32.
    Mxfp8,
    /// NVIDIA fp4: e2m1 codes, e4m3 scales, groups of 16.
    Nvfp4,
}

impl QuantMode {
    /// Every mode.
    pub const ALL: [QuantMode; 4] = [
        QuantMode::Affine,
        QuantMode::Mxfp4,
        QuantMode::Mxfp8,
        QuantMode::Nvfp4,
    ];

    /// The name MLX and mlx-lm's config.json use.
    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Mxfp8 => "mxfp8",
            QuantMode::Nvfp4 => "nvfp4",
        }
    }

    /// The mode named `name`, if MLX has it.
    pub fn from_name(name: &str) -> Option<QuantMode> {
        QuantMode::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Whether the mode stores a bias per group (affine only).
    pub fn has_biases(self) -> bool {
        self == QuantMode::Affine
    }

    /// The `(group_size, bits)` a floating-point mode fixes; `None` for affine.
    pub fn fixed(self) -> Option<(i32, i32)> {
        match self {
            QuantMode::Affine => None,
            QuantMode::Mxfp4 => Some((32, 4)),
            QuantMode::Mxfp8 => Some((32, 8)),
            QuantMode::Nvfp4 => Some((16, 4)),
        }
    }
}

/// Elements of `x` where `cond` is true, else of `y` (all three broadcast).
#[track_caller]
pub fn r#where(cond: &Array, x: &Array, y: &Array) -> Result<Array> {
    check(sys::where_(cond.raw(), x.raw(), y.raw())).map(Array::wrap)
}

/// Joins arrays along an existing axis.
#[track_caller]
pub fn concatenate(arrays: &[Array], axis: i32) -> Result<Array> {
    check(sys::concatenate(List::new(arrays).raw(), axis)).map(Array::wrap)
}

/// Joins arrays along a new axis.
#[track_caller]
pub fn stack(arrays: &[Array], axis: i32) -> Result<Array> {
    check(sys::stack(List::new(arrays).raw(), axis)).map(Array::wrap)
}

/// Zeros of the given shape and dtype.
#[track_caller]
pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
    check(sys::zeros(shape, dtype.code())).map(Array::wrap)
}

/// Ones of the given shape and dtype.
#[track_caller]
pub fn ones(shape: &[i32], dtype: Dtype) -> Result<Array> {
    check(sys::ones(shape, dtype.code())).map(Array::wrap)
}

/// An array filled with `value`.
#[track_caller]
pub fn full(shape: &[i32], value: f32, dtype: Dtype) -> Result<Array> {
    let v = Array::scalar(value, Dtype::Float32)?;
    check(sys::full(shape, v.raw(), dtype.code())).map(Array::wrap)
}

/// `start, start + step, ...` below `stop`.
#[track_caller]
pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<Array> {
    check(sys::arange(start, stop, step, dtype.code())).map(Array::wrap)
}

/// An `n × m` matrix with ones on and below diagonal `k`.
#[track_caller]
pub fn tri(n: i32, m: i32, k: i32, dtype: Dtype) -> Result<Array> {
    check(sys::tri(n, m, k, dtype.code())).map(Array::wrap)
}

/// Dequantizes an affine-quantized matrix.
#[track_caller]
pub fn dequantize(
    w: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    dequantize_mode(
        w,
        scales,
        Some(biases),
        group_size,
        bits,
        QuantMode::Affine,
        scales.dtype(),
    )
}

/// Dequantizes a matrix quantized in `mode` into `dtype` (biases only for
/// affine; MLX's own default for the floating-point modes is bf16).
#[track_caller]
pub fn dequantize_mode(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: i32,
    bits: i32,
    mode: QuantMode,
    dtype: Dtype,
) -> Result<Array> {
    check(sys::dequantize(
        w.raw(),
        scales.raw(),
        biases.is_some(),
        biases.unwrap_or(scales).raw(),
        group_size,
        bits,
        mode.name(),
        dtype.code(),
    ))
    .map(Array::wrap)
}

/// `x @ dequantize(w).T` (or without the transpose) without materialising
/// `w`, for an affine-quantized `w`.
#[track_caller]
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    transpose: bool,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    quantized_matmul_mode(
        x,
        w,
        scales,
        Some(biases),
        transpose,
        group_size,
        bits,
        QuantMode::Affine,
    )
}

/// [`quantized_matmul`] for `w` quantized in `mode` (biases only for affine).
#[track_caller]
#[allow(clippy::too_many_arguments)]
pub fn quantized_matmul_mode(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    transpose: bool,
    group_size: i32,
    bits: i32,
    mode: QuantMode,
) -> Result<Array> {
    check(sys::quantized_matmul(
        x.raw(),
        w.raw(),
        scales.raw(),
        biases.is_some(),
        biases.unwrap_or(scales).raw(),
        transpose,
        group_size,
        bits,
        mode.name(),
    ))
    .map(Array::wrap)
}

/// The most rows [`rows_matmul_t`] and [`quant_rows_matmul_t`] take: a
/// verify of up to 31 drafts (more than 8 rows run as groups of 8 over each
/// task's weight rows, the later groups reading them from cache).
pub const ROWS_MATMUL_MAX_ROWS: i32 = 32;

/// `x @ w.T` for `x: [..., k]` (any strides) whose leading axes hold 1 to
/// [`ROWS_MATMUL_MAX_ROWS`] rows and a weight `w: [n, k]`, giving `[..., n]`,
/// on the CPU (the default device must be the CPU). Taking the leading axes
/// as they are spares a model's `[1, L, k]` activations two reshape nodes.
///
/// Our own MLX primitive (`cpp/rows_dense.cc`): it streams each weight row once
/// and multiplies it into every input row, on all cores, where BLAS would
/// pack the whole weight for a GEMM of two or more rows. f32, bf16 or f16
/// operands of one dtype; accumulation is in f32 and the output has the
/// operands' dtype. Each output element is accumulated in the same order
/// whatever the row count, so row `i` of a 5-row product equals the 1-row
/// product of `x[i]` bit for bit.
#[track_caller]
pub fn rows_matmul_t(x: &Array, w: &Array) -> Result<Array> {
    check(sys::rows_matmul_t(x.raw(), w.raw())).map(Array::wrap)
}

/// [`rows_matmul_t`] for an affine-quantized weight in MLX's layout (what
/// [`quantized_matmul`] takes with `transpose`): `w` `[n, k · bits / 32]`
/// uint32 codes, `scales` and `biases` `[n, k / group_size]` in `x`'s dtype;
/// 4 or 8 bits, groups of 32, 64 or 128; 1 to [`ROWS_MATMUL_MAX_ROWS`] rows,
/// on the CPU. [`quant_rows_matmul_t_mode`] takes the floating-point modes.
///
/// Our own MLX primitive (`cpp/rows_quant.cc`): it dequantizes each block of
/// weight rows once into f32 and multiplies it into every input row, where
/// MLX's CPU `quantized_matmul` runs each row through the whole weight on
/// its own (a speculative verify of `k + 1` rows then costs `k + 1` steps).
/// Accumulation is f32 in a fixed order per output element, so row `i` of a
/// 5-row product equals the 1-row product of `x[i]` bit for bit; against
/// MLX's product it differs by summation order.
#[track_caller]
pub fn quant_rows_matmul_t(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    quant_rows_matmul_t_mode(
        x,
        w,
        scales,
        Some(biases),
        group_size,
        bits,
        QuantMode::Affine,
    )
}

/// [`quant_rows_matmul_t`] for a weight quantized in `mode`: affine as
/// there (biases required), or a floating-point mode with its own group size
/// and bits ([`QuantMode::fixed`]), uint8 `scales` and no biases.
///
/// The kernel decodes a block of weight rows into f32 exactly as MLX's
/// `dequantize` does (every decoded weight is exact in f32: e2m1 or e4m3
/// codes times an e8m0 or e4m3 scale), then multiplies it like
/// [`rows_matmul_t`]: against `x @ dequantize(w).T` in f32 it differs only
/// by summation order, and row `i` of a several-row product equals the
/// one-row product of `x[i]` bit for bit. Another mode's sizes, biases in
/// a floating-point mode (or none in affine), or scales of the wrong dtype
/// are errors.
#[track_caller]
pub fn quant_rows_matmul_t_mode(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: i32,
    bits: i32,
    mode: QuantMode,
) -> Result<Array> {
    check(sys::quant_rows_matmul_t(
        x.raw(),
        w.raw(),
        scales.raw(),
        biases.is_some(),
        biases.unwrap_or(scales).raw(),
        group_size,
        bits,
        mode.name(),
    ))
    .map(Array::wrap)
}

/// [`gather_qmm`] with `rhs_indices` and `transpose` on the CPU, through
/// the rows kernel of [`quant_rows_matmul_t_mode`]: `x[b] @ w[indices[b]].T`
/// for `x` `[..., M, k]` and integer (int32 or uint32) `indices`, their
/// leading axes broadcast together as `gather_qmm` broadcasts them into
/// `[B...]`, giving `[B..., M, n]` for a stack `w` `[E, n, k · bits / 32]`.
/// The modes, group sizes and dtypes are [`quant_rows_matmul_t_mode`]'s;
/// any number of rows (each expert's rows run in chunks of
/// [`ROWS_MATMUL_MAX_ROWS`]).
///
/// Our own MLX primitive (`cpp/rows_gather.cc`): when it runs, it reads the
/// indices, groups the rows by expert and decodes each chosen expert's
/// weight once for all of its rows, where MLX's CPU `gather_qmm` runs each
/// row through its expert's weight on its own. Each output row equals
/// [`quant_rows_matmul_t_mode`] of that row on its expert's matrix bit for
/// bit, whatever other rows share the call. Shapes, modes or dtypes the
/// kernel does not take are errors; an index outside `0..E` (only known
/// when the graph runs) makes its rows NaN.
#[track_caller]
pub fn quant_gather_rows_matmul_t(
    x: &Array,
    w: QuantizedStack<'_>,
    indices: &Array,
) -> Result<Array> {
    let (mut x, mut indices) = (x.clone(), indices.clone());
    if x.ndim() >= 2 {
        let xs = x.shape();
        let (xb, tail) = xs.split_at(xs.len() - 2);
        let ib = indices.shape();
        let len = xb.len().max(ib.len());
        let dim = |s: &[i32], i: usize| (i + s.len()).checked_sub(len).map_or(1, |j| s[j]);
        // A mismatch keeps `x`'s size: `broadcast_to` then reports it.
        let batch: Vec<i32> = (0..len)
            .map(|i| match (dim(xb, i), dim(&ib, i)) {
                (a, 1) => a,
                (1, b) => b,
                (a, _) => a,
            })
            .collect();
        if batch.as_slice() != xb {
            let full: Vec<i32> = batch.iter().chain(tail).copied().collect();
            x = x.broadcast_to(&full)?;
        }
        if batch.as_slice() != ib.as_slice() {
            indices = indices.broadcast_to(&batch)?;
        }
    }
    check(sys::quant_gather_rows_matmul_t(
        x.raw(),
        w.w.raw(),
        w.scales.raw(),
        w.biases.is_some(),
        w.biases.unwrap_or(w.scales).raw(),
        indices.raw(),
        w.group_size,
        w.bits,
        w.mode.name(),
    ))
    .map(Array::wrap)
}

/// Lets [`rows_matmul_t`] use AVX-512VL where the CPU has it (the default,
/// unless the environment sets `MTP_ROWS_CPU_AVX512=0`), or stops it; returns
/// whether it now does. The arithmetic is the same 8-lane AVX2 arithmetic
/// either way: AVX-512VL gives it 32 vector registers, so from three rows on
/// a block multiplies four weight rows where AVX2 has room for two. Results
/// are the same bit for bit on both paths (a test holds them to it); the
/// environment variable times one against the other across processes.
pub fn set_rows_cpu_avx512(on: bool) -> bool {
    sys::rows_cpu_set_wide(on)
}

/// Makes the [`quant_rows_matmul_t_mode`] and [`quant_gather_rows_matmul_t`]
/// products that this thread builds decode their weights on the portable
/// path, even where the CPU has AVX2, for as long as the returned guard lives
/// (the environment's `MTP_CPU_QROWS_PORTABLE=1` does it for a whole
/// process): for tests, so an AVX2 host checks the portable decoders too. The
/// choice is made when a product is built, so other threads (tests running at
/// once) keep the decoder their host takes. Both paths decode to MLX's
/// `dequantize` bit for bit, in every mode.
pub fn hold_portable_decode() -> PortableDecode {
    sys::rows_cpu_hold_portable(true);
    PortableDecode(PhantomData)
}

/// The guard [`hold_portable_decode`] returns: this thread's quantized rows
/// products decode portably until it is dropped. Not `Send`: the hold
/// belongs to the thread that made it.
#[must_use = "the portable decode ends when the guard is dropped"]
#[derive(Debug)]
pub struct PortableDecode(PhantomData<*const ()>);

impl Drop for PortableDecode {
    fn drop(&mut self) {
        sys::rows_cpu_hold_portable(false);
    }
}

/// The widest head [`attention_rows_cpu`] takes.
pub const ATTENTION_ROWS_MAX_DIM: i32 = 256;

/// `softmax(q kᵀ · scale + causal) v` for `q: [1, Hq, L, D]` (any number of
/// rows: a decode step, a verify, a prefill chunk; `D` up to [`ATTENTION_ROWS_MAX_DIM`])
/// over `k, v: [1, Hkv, S, D]` with `Hq` a multiple of `Hkv` and `S ≥ L`:
/// query `i` sees keys `0..=S-L+i` (all of them for one row). On the CPU
/// (the default device must be the CPU); output `[1, Hq, L, D]` in q's dtype.
///
/// Our own MLX primitive (`cpp/attention_cpu.cc`): it reads each key and value
/// row in place (a strided slice of a cache buffer is fine), on AVX2 once
/// for all the query rows and heads of a KV head (a verify's rows would
/// otherwise read the cache once each), where MLX's CPU attention runs BLAS GEMMs that copy and pack the
/// keys every call and a scalar exponential per score. f32, bf16 or f16
/// operands of one dtype; f32 accumulation and softmax. Each (head, row) is
/// computed alone in a fixed order, so row `i` of an `L`-row call equals the
/// one-row call at its position bit for bit.
#[track_caller]
pub fn attention_rows_cpu(q: &Array, k: &Array, v: &Array, scale: f32) -> Result<Array> {
    attention_rows(q, k, v, scale, false, -1)
}

/// The one call behind the `attention_rows_cpu*` functions (`keys`
/// negative: all of k's rows).
#[track_caller]
fn attention_rows(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    merged: bool,
    keys: i32,
) -> Result<Array> {
    check(sys::attention_rows_cpu(
        q.raw(),
        k.raw(),
        v.raw(),
        scale,
        merged,
        keys,
    ))
    .map(Array::wrap)
}

/// [`attention_rows_cpu`] with its output as the output projection takes
/// it, `[1, L, Hq·D]` (each row's heads side by side), written so in place
/// of a transpose and a reshape node.
#[track_caller]
pub fn attention_rows_cpu_merged(q: &Array, k: &Array, v: &Array, scale: f32) -> Result<Array> {
    attention_rows(q, k, v, scale, true, -1)
}

/// [`attention_rows_cpu_merged`] over the first `keys` rows of a KV cache's
/// buffers `k, v: [1, Hkv, capacity, D]` (`L ≤ keys ≤ capacity`), read in
/// place: no slice node holds the buffers, so a later [`kv_write_cpu`] to
/// rows at and after `keys` can write in place even while this attention's
/// work is still queued.
#[track_caller]
pub fn attention_rows_cpu_cached(
    q: &Array,
    k: &Array,
    v: &Array,
    keys: i32,
    scale: f32,
) -> Result<Array> {
    attention_rows(q, k, v, scale, true, keys)
}

/// `buffer` `[B, H, S, D]` with rows `slot..slot + L` replaced by `update`
/// `[B, H, L, D]` (same dtype), on the CPU (the default device must be the
/// CPU): what `buffer.slice_update(update, [0, 0, slot, 0], ...)` computes.
///
/// Our own MLX primitive (`cpp/kv_cpu.cc`). MLX's update writes in place
/// only when nothing else shares the buffer's data, and its CPU encoder
/// holds an attention's inputs until that attention has run: a draft chain
/// built faster than it runs copies the whole buffer at every step. This
/// write also writes in place when the other holders are queued
/// [`attention_rows_cpu_cached`] reads of rows below `slot`; any other
/// sharer (a snapshot's view, a second handle) makes it copy, as MLX does.
#[track_caller]
pub fn kv_write_cpu(buffer: &Array, update: &Array, slot: i32) -> Result<Array> {
    check(sys::kv_write_cpu(buffer.raw(), update.raw(), slot)).map(Array::wrap)
}

/// `x · rsqrt(mean(x²) + eps) · w` over the last axis of `x` `[..., D]` (any
/// strides), `w` `[D]` in x's dtype, as one node on the CPU (the default
/// device must be the CPU).
///
/// Our own MLX primitive (`cpp/fused_cpu.cc`): MLX's `fast::rms_norm` falls
/// back to about nine graph nodes on the CPU, each ~5 µs of host time. The
/// normalised row is rounded to the dtype before the weight multiplies it,
/// as MLX's ops round; each row is computed alone, the same way whatever
/// the row count.
#[track_caller]
pub fn rms_norm_cpu(x: &Array, w: &Array, eps: f32) -> Result<Array> {
    check(sys::rms_norm_cpu(x.raw(), w.raw(), eps)).map(Array::wrap)
}

/// The rotation [`heads_cpu`] applies: RoPE, half-split, over the first
/// `dims` features of each head (the rest pass through), at positions
/// `scale · (offset + row)`; the angle of pair `i` is `position ·
/// 2^(−i/(dims/2) · log2_base)`, or `position / periods[i]` with a period
/// table (f32 `[dims / 2]`); the rotated features are multiplied by
/// `mscale` (YaRN's attention scale; 1 for none).
#[derive(Debug, Clone, Copy)]
pub struct HeadsRope<'a> {
    /// Features rotated from each head's start (even, at most the head width).
    pub dims: i32,
    /// The first row's position before `scale` (the cache's offset).
    pub offset: i32,
    /// `log2` of the RoPE base (unused with `periods`).
    pub log2_base: f32,
    /// The position scale (1 / linear scaling factor).
    pub scale: f32,
    /// Per-pair periods (f32 `[dims / 2]`) instead of the base.
    pub periods: Option<&'a Array>,
    /// Multiplies the rotated features (1: none).
    pub mscale: f32,
}

/// A projection `[1, L, H, D]` (any strides) as the heads attention and the
/// cache take, `[1, H, L, D]`, in one node on the CPU: each head through the
/// optional per-head RMSNorm (`norm`: a weight `[D]` in x's dtype and its
/// eps), then `rope`. A layer calls it for q and for k.
///
/// Our own MLX primitive (`cpp/fused_cpu.cc`): on the CPU MLX runs RoPE as
/// about twenty nodes (its angles recomputed each call) and a norm as about
/// nine. Every row is computed alone, so a verify row equals the one-row
/// step's bit for bit.
#[track_caller]
pub fn heads_cpu(x: &Array, norm: Option<(&Array, f32)>, rope: HeadsRope<'_>) -> Result<Array> {
    check(sys::heads_cpu(
        x.raw(),
        norm.is_some(),
        norm.map_or(x, |n| n.0).raw(),
        norm.map_or(0.0, |n| n.1),
        rope.offset,
        rope.dims,
        rope.log2_base,
        rope.scale,
        rope.periods.is_some(),
        rope.periods.unwrap_or(x).raw(),
        rope.mscale,
    ))
    .map(Array::wrap)
}

/// `silu(gu[..., :I]) · gu[..., I:]` for `gu` `[..., 2·I]` (any strides), in
/// f32, rounded once, as one node on the CPU (MLX's ops take five: two
/// slices, a sigmoid, two multiplies).
#[track_caller]
pub fn swiglu_cpu(gu: &Array) -> Result<Array> {
    check(sys::swiglu_cpu(gu.raw())).map(Array::wrap)
}

/// A batched matmul whose operands are gathered first: `a[lhs] @ b[rhs]`
/// over the batch axes (MLX `gather_mm`).
///
/// `a` is `[..., M, K]` and `b` `[..., K, N]`; `lhs_indices` index `a`'s
/// batch and `rhs_indices` `b`'s (absent means the plain batch, broadcast
/// with the other side's indices). The mixture-of-experts use: `a` the token
/// rows `[L, 1, 1, K]`, `b` the stacked expert weights `[E, K, N]`,
/// `rhs_indices` the chosen experts `[L, k]` → `[L, k, 1, N]`. `sorted`
/// promises that `rhs_indices` are sorted ascending (flattened), which lets
/// MLX run each expert's rows as one matmul.
#[track_caller]
pub fn gather_mm(
    a: &Array,
    b: &Array,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
    sorted: bool,
) -> Result<Array> {
    check(sys::gather_mm(
        a.raw(),
        b.raw(),
        lhs_indices.is_some(),
        lhs_indices.unwrap_or(a).raw(),
        rhs_indices.is_some(),
        rhs_indices.unwrap_or(a).raw(),
        sorted,
    ))
    .map(Array::wrap)
}

/// Quantized stacked weights for [`gather_qmm`]: `w` packed
/// `[E, out, in · bits / 32]`, `scales` (and, affine only, `biases`)
/// `[E, out, in / group_size]` (with `transpose`; MLX's layout of a
/// quantized `[E, out, in]` stack).
#[derive(Debug, Clone, Copy)]
pub struct QuantizedStack<'a> {
    /// Packed uint32 codes.
    pub w: &'a Array,
    /// Per-group scales.
    pub scales: &'a Array,
    /// Per-group biases (affine only).
    pub biases: Option<&'a Array>,
    /// Inputs per group.
    pub group_size: i32,
    /// Bits per code.
    pub bits: i32,
    /// How the codes and scales decode.
    pub mode: QuantMode,
}

/// [`gather_mm`] over quantized `b`: `x[lhs] @ dequantize(w[rhs]).T`
/// (or without the transpose) without dequantizing (MLX `gather_qmm`).
#[track_caller]
pub fn gather_qmm(
    x: &Array,
    w: QuantizedStack<'_>,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
    transpose: bool,
    sorted: bool,
) -> Result<Array> {
    check(sys::gather_qmm(
        x.raw(),
        w.w.raw(),
        w.scales.raw(),
        w.biases.is_some(),
        w.biases.unwrap_or(w.scales).raw(),
        lhs_indices.is_some(),
        lhs_indices.unwrap_or(x).raw(),
        rhs_indices.is_some(),
        rhs_indices.unwrap_or(x).raw(),
        transpose,
        w.group_size,
        w.bits,
        w.mode.name(),
        sorted,
    ))
    .map(Array::wrap)
}
