// Thin C++ layer between MLX's C++ API and the cxx bridge in src/ffi.rs.
// Every function that can throw is declared `-> Result` on the Rust side, so
// cxx turns the exception into an `Err` instead of aborting the process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mlx/mlx.h"
#include "rust/cxx.h"

namespace mtp_mlx {

namespace mx = mlx::core;

// One graph node. Copying it shares the node, as `mx::array` does.
struct Arr {
  mx::array a;
  explicit Arr(mx::array x) : a(std::move(x)) {}
};

// An ordered list of arrays, used to pass many arrays across the bridge.
struct ArrList {
  std::vector<mx::array> items;
};

// The tensors and metadata of one safetensors file.
struct TensorFile {
  std::vector<std::string> names;
  std::vector<mx::array> arrays;
  std::vector<std::string> meta_keys;
  std::vector<std::string> meta_values;
};

using ArrPtr = std::unique_ptr<Arr>;

// The bridge's shared enums (src/ffi.rs), defined by cxx in the generated
// mlx-tensor/src/ffi.rs.h; declared here so the signatures below can name them.
enum class DtypeCode : std::uint8_t;
enum class UnaryOp : std::uint8_t;
enum class BinaryOp : std::uint8_t;
enum class ReduceOp : std::uint8_t;

// Construction and inspection.
ArrPtr from_bytes(rust::Slice<const uint8_t> data, rust::Slice<const int32_t> shape, DtypeCode dtype);
ArrPtr scalar_f32(float v, DtypeCode dtype);
ArrPtr scalar_i64(int64_t v, DtypeCode dtype);
ArrPtr clone_arr(const Arr& a);
DtypeCode dtype_of(const Arr& a);
rust::Vec<int32_t> shape_of(const Arr& a);
size_t nbytes_of(const Arr& a);
size_t size_of(const Arr& a);
size_t pending_nodes(const Arr& a);
rust::String pending_census(const Arr& a);
void read_into(const Arr& a, rust::Slice<uint8_t> out);
void eval_one(const Arr& a);
void wait_one(const Arr& a);
void async_eval_one(const Arr& a);

// Lists.
std::unique_ptr<ArrList> list_new();
void list_push(ArrList& l, const Arr& a);
size_t list_len(const ArrList& l);
ArrPtr list_get(const ArrList& l, size_t i);
void eval_list(const ArrList& l);
void async_eval_list(const ArrList& l);

// Creation.
ArrPtr zeros(rust::Slice<const int32_t> shape, DtypeCode dtype);
ArrPtr ones(rust::Slice<const int32_t> shape, DtypeCode dtype);
ArrPtr full(rust::Slice<const int32_t> shape, const Arr& v, DtypeCode dtype);
ArrPtr arange(double start, double stop, double step, DtypeCode dtype);
ArrPtr tri(int32_t n, int32_t m, int32_t k, DtypeCode dtype);

// Element-wise.
ArrPtr unary(const Arr& a, UnaryOp op);
ArrPtr binary(const Arr& a, const Arr& b, BinaryOp op);
ArrPtr where_(const Arr& c, const Arr& x, const Arr& y);
ArrPtr astype(const Arr& a, DtypeCode dtype);
ArrPtr contiguous(const Arr& a);
ArrPtr from_fp8(const Arr& a, DtypeCode dtype);

// Linear algebra.
ArrPtr matmul(const Arr& a, const Arr& b);
ArrPtr addmm(const Arr& c, const Arr& a, const Arr& b, float alpha, float beta);
// `mode` is MLX's quantization mode ("affine", "mxfp4", "mxfp8", "nvfp4"); only
// affine has biases (`has_biases` false: none).
std::unique_ptr<ArrList> quantize(const Arr& w, int32_t group_size, int32_t bits, rust::Str mode);
ArrPtr dequantize(const Arr& w, const Arr& scales, bool has_biases, const Arr& biases, int32_t group_size,
                  int32_t bits, rust::Str mode, DtypeCode dtype);
ArrPtr quantized_matmul(const Arr& x, const Arr& w, const Arr& scales, bool has_biases, const Arr& biases,
                        bool transpose, int32_t group_size, int32_t bits, rust::Str mode);
// Gathered (per-expert) matmuls; an index flag `has_*` false means "no indices".
ArrPtr gather_mm(const Arr& a, const Arr& b, bool has_lhs, const Arr& lhs, bool has_rhs, const Arr& rhs,
                 bool sorted);
// `x @ w.T` for 1-32 rows on the CPU (cpp/rows_dense.cc).
ArrPtr rows_matmul_t(const Arr& x, const Arr& w);
// `x @ w.T` for 1-32 rows and a quantized w on the CPU (cpp/rows_quant.cc): 4- or 8-bit affine
// codes with biases, or mxfp4 / mxfp8 / nvfp4 codes with uint8 scales and no biases.
ArrPtr quant_rows_matmul_t(const Arr& x, const Arr& w, const Arr& scales, bool has_biases, const Arr& biases,
                           int32_t group_size, int32_t bits, rust::Str mode);
// `x[b] @ w[indices[b]].T` over a quantized stack `w` `[E, n, ...]` on the CPU (cpp/rows_gather.cc):
// x `[B..., M, k]`, indices `[B...]`; the modes of quant_rows_matmul_t, any number of rows.
ArrPtr quant_gather_rows_matmul_t(const Arr& x, const Arr& w, const Arr& scales, bool has_biases, const Arr& biases,
                                  const Arr& indices, int32_t group_size, int32_t bits, rust::Str mode);
// Lets (or stops) rows_matmul_t's blocks use AVX-512VL's 32 registers;
// whether they now do.
bool rows_cpu_set_wide(bool on);
// Adds (`on`) or drops a hold on this thread: the quantized rows primitives it
// builds meanwhile decode on the portable path even where AVX2 is there (for
// tests); whether they now would.
bool rows_cpu_hold_portable(bool on);
// Attention for query rows on the CPU (cpp/attention_cpu.cc); `keys`: the rows of k and v
// attended over, negative for all of them.
ArrPtr attention_rows_cpu(const Arr& q, const Arr& k, const Arr& v, float scale, bool merged, int32_t keys);
// A KV cache write on the CPU, in place where it can be (cpp/kv_cpu.cc).
ArrPtr kv_write_cpu(const Arr& buffer, const Arr& update, int32_t slot);
// A layer's elementwise stages on the CPU (cpp/fused_cpu.cc).
ArrPtr rms_norm_cpu(const Arr& x, const Arr& w, float eps);
ArrPtr heads_cpu(const Arr& x, bool has_norm, const Arr& norm, float eps, int32_t offset, int32_t rot_dims,
                 float log2_base, float scale, bool has_freqs, const Arr& freqs, float mscale);
ArrPtr swiglu_cpu(const Arr& gu);
ArrPtr gather_qmm(const Arr& x, const Arr& w, const Arr& scales, bool has_biases, const Arr& biases, bool has_lhs,
                  const Arr& lhs, bool has_rhs, const Arr& rhs, bool transpose, int32_t group_size, int32_t bits,
                  rust::Str mode, bool sorted);

// Shape.
ArrPtr reshape(const Arr& a, rust::Slice<const int32_t> shape);
ArrPtr transpose(const Arr& a, rust::Slice<const int32_t> axes);
ArrPtr swapaxes(const Arr& a, int32_t a1, int32_t a2);
ArrPtr squeeze(const Arr& a, rust::Slice<const int32_t> axes);
ArrPtr expand_dims(const Arr& a, rust::Slice<const int32_t> axes);
ArrPtr broadcast_to(const Arr& a, rust::Slice<const int32_t> shape);
ArrPtr slice(const Arr& a, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop,
             rust::Slice<const int32_t> strides);
ArrPtr slice_update(const Arr& src, const Arr& upd, rust::Slice<const int32_t> start,
                    rust::Slice<const int32_t> stop, rust::Slice<const int32_t> strides);
ArrPtr concatenate(const ArrList& l, int32_t axis);
ArrPtr stack(const ArrList& l, int32_t axis);

// Indexing.
ArrPtr take(const Arr& a, const Arr& idx, int32_t axis);
ArrPtr take_along_axis(const Arr& a, const Arr& idx, int32_t axis);
ArrPtr put_along_axis(const Arr& a, const Arr& idx, const Arr& v, int32_t axis);
ArrPtr scatter_add_axis(const Arr& a, const Arr& idx, const Arr& v, int32_t axis);

// Reductions and orderings.
ArrPtr reduce(const Arr& a, rust::Slice<const int32_t> axes, bool keepdims, ReduceOp op);
ArrPtr softmax(const Arr& a, rust::Slice<const int32_t> axes, bool precise);
ArrPtr arg_reduce(const Arr& a, int32_t axis, bool keepdims, bool is_max);
ArrPtr argpartition(const Arr& a, int32_t kth, int32_t axis);
ArrPtr topk(const Arr& a, int32_t k, int32_t axis);
ArrPtr sort(const Arr& a, int32_t axis);
ArrPtr argsort(const Arr& a, int32_t axis);
ArrPtr cumsum(const Arr& a, int32_t axis, bool reverse, bool inclusive);
ArrPtr cumprod(const Arr& a, int32_t axis, bool reverse, bool inclusive);

// Fast kernels.
ArrPtr rms_norm(const Arr& x, const Arr& w, float eps);
ArrPtr rms_norm_noweight(const Arr& x, float eps);
ArrPtr rope(const Arr& x, int32_t dims, bool traditional, float base, float scale, int32_t offset);
ArrPtr rope_freqs(const Arr& x, int32_t dims, bool traditional, float scale, int32_t offset, const Arr& freqs);
ArrPtr sdpa(const Arr& q, const Arr& k, const Arr& v, float scale, bool causal);
ArrPtr sdpa_masked(const Arr& q, const Arr& k, const Arr& v, float scale, const Arr& mask);
std::unique_ptr<ArrList> cuda_kernel(rust::Str name, rust::Str source, rust::Slice<const rust::Str> input_names,
                                     const ArrList& inputs, rust::Slice<const rust::Str> output_names,
                                     rust::Slice<const int32_t> out_dims, rust::Slice<const int32_t> out_ranks,
                                     rust::Slice<const uint8_t> out_dtypes, rust::Slice<const int32_t> grid,
                                     rust::Slice<const int32_t> block, rust::Slice<const rust::Str> tmpl_names,
                                     rust::Slice<const int32_t> tmpl_values, bool row_contiguous);

// Random numbers from explicit keys.
ArrPtr random_key(uint64_t seed);
ArrPtr random_split(const Arr& key, int32_t num);
ArrPtr random_uniform(rust::Slice<const int32_t> shape, DtypeCode dtype, const Arr& key);
ArrPtr random_normal(rust::Slice<const int32_t> shape, DtypeCode dtype, const Arr& key);
ArrPtr random_bernoulli(const Arr& p, const Arr& key);
ArrPtr random_categorical(const Arr& logits, int32_t axis, const Arr& key);
ArrPtr random_categorical_n(const Arr& logits, int32_t axis, int32_t n, const Arr& key);

// Safetensors.
std::unique_ptr<TensorFile> load_safetensors(rust::Str path);
size_t tf_len(const TensorFile& f);
rust::String tf_name(const TensorFile& f, size_t i);
ArrPtr tf_array(const TensorFile& f, size_t i);
size_t tf_meta_len(const TensorFile& f);
rust::String tf_meta_key(const TensorFile& f, size_t i);
rust::String tf_meta_value(const TensorFile& f, size_t i);
void save_safetensors(rust::Str path, rust::Slice<const rust::String> names, const ArrList& arrays);

// Devices and memory.
void set_default_device(bool gpu);
bool default_device_is_gpu();
bool gpu_available();
rust::String device_name();
uint32_t gpu_compute_capability();
void synchronize();
// Streams, identified by (index, device) as MLX does.
int32_t new_stream(bool gpu);
int32_t default_stream_index(bool gpu);
void set_default_stream(int32_t index, bool gpu);
void synchronize_stream(int32_t index, bool gpu);
size_t active_memory();
size_t peak_memory();
void reset_peak_memory();
size_t cache_memory();
size_t set_cache_limit(size_t limit);
size_t set_memory_limit(size_t limit);
void clear_cache();
rust::String mlx_version();
rust::String blas_info();
[[noreturn]] void exit_now(int32_t code);

}  // namespace mtp_mlx
