//! The cxx bridge to MLX's C++ API: with `budget.rs` (a counting `GlobalAlloc`), the only
//! module of the workspace with `unsafe`.
//!
//! Every function that can throw is declared `-> Result`, so cxx catches the C++
//! exception and returns it as `cxx::Exception`; the safe wrappers in the other
//! modules turn that into [`crate::Error`] carrying the Rust call site.
//!
//! The opaque C++ types (`Arr`, `ArrList`, `TensorFile`) are neither `Send` nor
//! `Sync` (cxx's default), which keeps every MLX handle on the thread that made it.

#[allow(unsafe_code)]
// cxx writes its generated items `pub`; the bridge module itself is `pub(crate)`.
#[allow(unreachable_pub)]
#[cxx::bridge(namespace = "mtp_mlx")]
pub(crate) mod sys {
    // Shared enums: cxx writes their C++ definitions into the generated
    // header, so the codes on both sides of the bridge are one list.
    /// MLX element types, one per [`crate::Dtype`] variant; `Other` is an MLX dtype
    /// this crate does not model (complex64).
    #[repr(u8)]
    enum DtypeCode {
        Bool,
        Uint8,
        Uint16,
        Uint32,
        Uint64,
        Int8,
        Int16,
        Int32,
        Int64,
        Float16,
        Float32,
        Bfloat16,
        Float64,
        Other,
    }

    /// Element-wise operations of one array (`unary`).
    #[repr(u8)]
    enum UnaryOp {
        Negative,
        Exp,
        Log,
        Sqrt,
        Rsqrt,
        Abs,
        Sigmoid,
        Tanh,
        Square,
        LogicalNot,
        Reciprocal,
        Floor,
        Sin,
        Cos,
        Erf,
        Isnan,
        Isinf,
        Log1p,
        Silu,
    }

    /// Element-wise operations of two arrays, with broadcasting (`binary`).
    #[repr(u8)]
    enum BinaryOp {
        Add,
        Subtract,
        Multiply,
        Divide,
        Maximum,
        Minimum,
        Power,
        Equal,
        NotEqual,
        Less,
        LessEqual,
        Greater,
        GreaterEqual,
        LogicalAnd,
        LogicalOr,
        FloorDivide,
        Remainder,
        LogAddExp,
    }

    /// Reductions over axes (`reduce`).
    #[repr(u8)]
    enum ReduceOp {
        Sum,
        Max,
        Min,
        Mean,
        Prod,
        LogSumExp,
        All,
        Any,
    }

    unsafe extern "C++" {
        include!("mlx-tensor/cpp/shim.h");

        type Arr;
        type ArrList;
        type TensorFile;

        fn from_bytes(data: &[u8], shape: &[i32], dtype: DtypeCode) -> Result<UniquePtr<Arr>>;
        fn scalar_f32(v: f32, dtype: DtypeCode) -> Result<UniquePtr<Arr>>;
        fn scalar_i64(v: i64, dtype: DtypeCode) -> Result<UniquePtr<Arr>>;
        fn clone_arr(a: &Arr) -> UniquePtr<Arr>;
        fn dtype_of(a: &Arr) -> DtypeCode;
        fn shape_of(a: &Arr) -> Vec<i32>;
        fn nbytes_of(a: &Arr) -> usize;
        fn size_of(a: &Arr) -> usize;
        fn pending_nodes(a: &Arr) -> usize;
        fn pending_census(a: &Arr) -> String;
        fn read_into(a: &Arr, out: &mut [u8]) -> Result<()>;
        fn eval_one(a: &Arr) -> Result<()>;
        fn wait_one(a: &Arr) -> Result<()>;
        fn async_eval_one(a: &Arr) -> Result<()>;

        fn list_new() -> UniquePtr<ArrList>;
        fn list_push(l: Pin<&mut ArrList>, a: &Arr);
        fn list_len(l: &ArrList) -> usize;
        fn list_get(l: &ArrList, i: usize) -> Result<UniquePtr<Arr>>;
        fn eval_list(l: &ArrList) -> Result<()>;
        fn async_eval_list(l: &ArrList) -> Result<()>;

        fn zeros(shape: &[i32], dtype: DtypeCode) -> Result<UniquePtr<Arr>>;
        fn ones(shape: &[i32], dtype: DtypeCode) -> Result<UniquePtr<Arr>>;
        fn full(shape: &[i32], v: &Arr, dtype: DtypeCode) -> Result<UniquePtr<Arr>>;
        fn arange(start: f64, stop: f64, step: f64, dtype: DtypeCode) -> Result<UniquePtr<Arr>>;
        fn tri(n: i32, m: i32, k: i32, dtype: DtypeCode) -> Result<UniquePtr<Arr>>;

        fn unary(a: &Arr, op: UnaryOp) -> Result<UniquePtr<Arr>>;
        fn binary(a: &Arr, b: &Arr, op: BinaryOp) -> Result<UniquePtr<Arr>>;
        fn where_(c: &Arr, x: &Arr, y: &Arr) -> Result<UniquePtr<Arr>>;
        fn astype(a: &Arr, dtype: DtypeCode) -> Result<UniquePtr<Arr>>;
        fn contiguous(a: &Arr) -> Result<UniquePtr<Arr>>;
        fn from_fp8(a: &Arr, dtype: DtypeCode) -> Result<UniquePtr<Arr>>;

        fn matmul(a: &Arr, b: &Arr) -> Result<UniquePtr<Arr>>;
        fn addmm(c: &Arr, a: &Arr, b: &Arr, alpha: f32, beta: f32) -> Result<UniquePtr<Arr>>;
        fn quantize(w: &Arr, group_size: i32, bits: i32, mode: &str) -> Result<UniquePtr<ArrList>>;
        #[allow(clippy::too_many_arguments)]
        fn dequantize(
            w: &Arr,
            scales: &Arr,
            has_biases: bool,
            biases: &Arr,
            group_size: i32,
            bits: i32,
            mode: &str,
            dtype: DtypeCode,
        ) -> Result<UniquePtr<Arr>>;
        #[allow(clippy::too_many_arguments)]
        fn quantized_matmul(
            x: &Arr,
            w: &Arr,
            scales: &Arr,
            has_biases: bool,
            biases: &Arr,
            transpose: bool,
            group_size: i32,
            bits: i32,
            mode: &str,
        ) -> Result<UniquePtr<Arr>>;
        fn rows_matmul_t(x: &Arr, w: &Arr) -> Result<UniquePtr<Arr>>;
        #[allow(clippy::too_many_arguments)]
        fn quant_rows_matmul_t(
            x: &Arr,
            w: &Arr,
            scales: &Arr,
            has_biases: bool,
            biases: &Arr,
            group_size: i32,
            bits: i32,
            mode: &str,
        ) -> Result<UniquePtr<Arr>>;
        #[allow(clippy::too_many_arguments)]
        fn quant_gather_rows_matmul_t(
            x: &Arr,
            w: &Arr,
            scales: &Arr,
            has_biases: bool,
            biases: &Arr,
            indices: &Arr,
            group_size: i32,
            bits: i32,
            mode: &str,
        ) -> Result<UniquePtr<Arr>>;
        fn rows_cpu_set_wide(on: bool) -> bool;
        fn rows_cpu_hold_portable(on: bool) -> bool;
        fn attention_rows_cpu(
            q: &Arr,
            k: &Arr,
            v: &Arr,
            scale: f32,
            merged: bool,
            keys: i32,
        ) -> Result<UniquePtr<Arr>>;
        fn kv_write_cpu(buffer: &Arr, update: &Arr, slot: i32) -> Result<UniquePtr<Arr>>;
        fn rms_norm_cpu(x: &Arr, w: &Arr, eps: f32) -> Result<UniquePtr<Arr>>;
        #[allow(clippy::too_many_arguments)]
        fn heads_cpu(
            x: &Arr,
            has_norm: bool,
            norm: &Arr,
            eps: f32,
            offset: i32,
            rot_dims: i32,
            log2_base: f32,
            scale: f32,
            has_freqs: bool,
            freqs: &Arr,
            mscale: f32,
        ) -> Result<UniquePtr<Arr>>;
        fn swiglu_cpu(gu: &Arr) -> Result<UniquePtr<Arr>>;
        fn gather_mm(
            a: &Arr,
            b: &Arr,
            has_lhs: bool,
            lhs: &Arr,
            has_rhs: bool,
            rhs: &Arr,
            sorted: bool,
        ) -> Result<UniquePtr<Arr>>;
        #[allow(clippy::too_many_arguments)]
        fn gather_qmm(
            x: &Arr,
            w: &Arr,
            scales: &Arr,
            has_biases: bool,
            biases: &Arr,
            has_lhs: bool,
            lhs: &Arr,
            has_rhs: bool,
            rhs: &Arr,
            transpose: bool,
            group_size: i32,
            bits: i32,
            mode: &str,
            sorted: bool,
        ) -> Result<UniquePtr<Arr>>;

        fn reshape(a: &Arr, shape: &[i32]) -> Result<UniquePtr<Arr>>;
        fn transpose(a: &Arr, axes: &[i32]) -> Result<UniquePtr<Arr>>;
        fn swapaxes(a: &Arr, a1: i32, a2: i32) -> Result<UniquePtr<Arr>>;
        fn squeeze(a: &Arr, axes: &[i32]) -> Result<UniquePtr<Arr>>;
        fn expand_dims(a: &Arr, axes: &[i32]) -> Result<UniquePtr<Arr>>;
        fn broadcast_to(a: &Arr, shape: &[i32]) -> Result<UniquePtr<Arr>>;
        fn slice(a: &Arr, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<UniquePtr<Arr>>;
        fn slice_update(
            src: &Arr,
            upd: &Arr,
            start: &[i32],
            stop: &[i32],
            strides: &[i32],
        ) -> Result<UniquePtr<Arr>>;
        fn concatenate(l: &ArrList, axis: i32) -> Result<UniquePtr<Arr>>;
        fn stack(l: &ArrList, axis: i32) -> Result<UniquePtr<Arr>>;

        fn take(a: &Arr, idx: &Arr, axis: i32) -> Result<UniquePtr<Arr>>;
        fn take_along_axis(a: &Arr, idx: &Arr, axis: i32) -> Result<UniquePtr<Arr>>;
        fn put_along_axis(a: &Arr, idx: &Arr, v: &Arr, axis: i32) -> Result<UniquePtr<Arr>>;
        fn scatter_add_axis(a: &Arr, idx: &Arr, v: &Arr, axis: i32) -> Result<UniquePtr<Arr>>;

        fn reduce(a: &Arr, axes: &[i32], keepdims: bool, op: ReduceOp) -> Result<UniquePtr<Arr>>;
        fn softmax(a: &Arr, axes: &[i32], precise: bool) -> Result<UniquePtr<Arr>>;
        fn arg_reduce(a: &Arr, axis: i32, keepdims: bool, is_max: bool) -> Result<UniquePtr<Arr>>;
        fn argpartition(a: &Arr, kth: i32, axis: i32) -> Result<UniquePtr<Arr>>;
        fn topk(a: &Arr, k: i32, axis: i32) -> Result<UniquePtr<Arr>>;
        fn sort(a: &Arr, axis: i32) -> Result<UniquePtr<Arr>>;
        fn argsort(a: &Arr, axis: i32) -> Result<UniquePtr<Arr>>;
        fn cumsum(a: &Arr, axis: i32, reverse: bool, inclusive: bool) -> Result<UniquePtr<Arr>>;
        fn cumprod(a: &Arr, axis: i32, reverse: bool, inclusive: bool) -> Result<UniquePtr<Arr>>;

        fn rms_norm(x: &Arr, w: &Arr, eps: f32) -> Result<UniquePtr<Arr>>;
        fn rms_norm_noweight(x: &Arr, eps: f32) -> Result<UniquePtr<Arr>>;
        fn rope(
            x: &Arr,
            dims: i32,
            traditional: bool,
            base: f32,
            scale: f32,
            offset: i32,
        ) -> Result<UniquePtr<Arr>>;
        fn rope_freqs(
            x: &Arr,
            dims: i32,
            traditional: bool,
            scale: f32,
            offset: i32,
            freqs: &Arr,
        ) -> Result<UniquePtr<Arr>>;
        fn sdpa(q: &Arr, k: &Arr, v: &Arr, scale: f32, causal: bool) -> Result<UniquePtr<Arr>>;
        fn sdpa_masked(q: &Arr, k: &Arr, v: &Arr, scale: f32, mask: &Arr)
        -> Result<UniquePtr<Arr>>;
        #[allow(clippy::too_many_arguments)]
        fn cuda_kernel(
            name: &str,
            source: &str,
            input_names: &[&str],
            inputs: &ArrList,
            output_names: &[&str],
            out_dims: &[i32],
            out_ranks: &[i32],
            out_dtypes: &[u8],
            grid: &[i32],
            block: &[i32],
            tmpl_names: &[&str],
            tmpl_values: &[i32],
            row_contiguous: bool,
        ) -> Result<UniquePtr<ArrList>>;

        fn random_key(seed: u64) -> Result<UniquePtr<Arr>>;
        fn random_split(key: &Arr, num: i32) -> Result<UniquePtr<Arr>>;
        fn random_uniform(shape: &[i32], dtype: DtypeCode, key: &Arr) -> Result<UniquePtr<Arr>>;
        fn random_normal(shape: &[i32], dtype: DtypeCode, key: &Arr) -> Result<UniquePtr<Arr>>;
        fn random_bernoulli(p: &Arr, key: &Arr) -> Result<UniquePtr<Arr>>;
        fn random_categorical(logits: &Arr, axis: i32, key: &Arr) -> Result<UniquePtr<Arr>>;
        fn random_categorical_n(
            logits: &Arr,
            axis: i32,
            n: i32,
            key: &Arr,
        ) -> Result<UniquePtr<Arr>>;

        fn load_safetensors(path: &str) -> Result<UniquePtr<TensorFile>>;
        fn tf_len(f: &TensorFile) -> usize;
        fn tf_name(f: &TensorFile, i: usize) -> Result<String>;
        fn tf_array(f: &TensorFile, i: usize) -> Result<UniquePtr<Arr>>;
        fn tf_meta_len(f: &TensorFile) -> usize;
        fn tf_meta_key(f: &TensorFile, i: usize) -> Result<String>;
        fn tf_meta_value(f: &TensorFile, i: usize) -> Result<String>;
        fn save_safetensors(path: &str, names: &[String], arrays: &ArrList) -> Result<()>;

        fn set_default_device(gpu: bool) -> Result<()>;
        fn default_device_is_gpu() -> bool;
        fn gpu_available() -> bool;
        fn device_name() -> Result<String>;
        fn gpu_compute_capability() -> Result<u32>;
        fn synchronize() -> Result<()>;
        fn new_stream(gpu: bool) -> Result<i32>;
        fn default_stream_index(gpu: bool) -> Result<i32>;
        fn set_default_stream(index: i32, gpu: bool) -> Result<()>;
        fn synchronize_stream(index: i32, gpu: bool) -> Result<()>;
        fn active_memory() -> usize;
        fn peak_memory() -> usize;
        fn reset_peak_memory();
        fn cache_memory() -> usize;
        fn set_cache_limit(limit: usize) -> usize;
        fn set_memory_limit(limit: usize) -> usize;
        fn clear_cache();
        fn mlx_version() -> String;
        fn blas_info() -> String;
        fn exit_now(code: i32);
    }
}
