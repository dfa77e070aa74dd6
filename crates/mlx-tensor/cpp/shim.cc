// Implementation of the bridge declared in shim.h. Kept free of logic: each
// function converts arguments, calls MLX, and wraps the result.
#include "mlx-tensor/cpp/shim.h"
#include "mlx-tensor/src/ffi.rs.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include "mlx/primitives.h"
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace mtp_mlx {

namespace {

mx::Dtype to_dtype(DtypeCode code) {
  switch (code) {
    case DtypeCode::Bool: return mx::bool_;
    case DtypeCode::Uint8: return mx::uint8;
    case DtypeCode::Uint16: return mx::uint16;
    case DtypeCode::Uint32: return mx::uint32;
    case DtypeCode::Uint64: return mx::uint64;
    case DtypeCode::Int8: return mx::int8;
    case DtypeCode::Int16: return mx::int16;
    case DtypeCode::Int32: return mx::int32;
    case DtypeCode::Int64: return mx::int64;
    case DtypeCode::Float16: return mx::float16;
    case DtypeCode::Float32: return mx::float32;
    case DtypeCode::Bfloat16: return mx::bfloat16;
    case DtypeCode::Float64: return mx::float64;
    default: throw std::invalid_argument("unmodelled dtype code " + std::to_string(static_cast<int>(code)));
  }
}

DtypeCode from_dtype(mx::Dtype d) {
  switch (d.val()) {
    case mx::Dtype::Val::bool_: return DtypeCode::Bool;
    case mx::Dtype::Val::uint8: return DtypeCode::Uint8;
    case mx::Dtype::Val::uint16: return DtypeCode::Uint16;
    case mx::Dtype::Val::uint32: return DtypeCode::Uint32;
    case mx::Dtype::Val::uint64: return DtypeCode::Uint64;
    case mx::Dtype::Val::int8: return DtypeCode::Int8;
    case mx::Dtype::Val::int16: return DtypeCode::Int16;
    case mx::Dtype::Val::int32: return DtypeCode::Int32;
    case mx::Dtype::Val::int64: return DtypeCode::Int64;
    case mx::Dtype::Val::float16: return DtypeCode::Float16;
    case mx::Dtype::Val::float32: return DtypeCode::Float32;
    case mx::Dtype::Val::bfloat16: return DtypeCode::Bfloat16;
    case mx::Dtype::Val::float64: return DtypeCode::Float64;
    default: return DtypeCode::Other;
  }
}

mx::Shape to_shape(rust::Slice<const int32_t> s) { return mx::Shape(s.begin(), s.end()); }
std::vector<int> to_ints(rust::Slice<const int32_t> s) { return std::vector<int>(s.begin(), s.end()); }
ArrPtr wrap(mx::array a) { return std::make_unique<Arr>(std::move(a)); }

}  // namespace

ArrPtr from_bytes(rust::Slice<const uint8_t> data, rust::Slice<const int32_t> shape, DtypeCode dtype) {
  auto dt = to_dtype(dtype);
  auto sh = to_shape(shape);
  size_t n = 1;
  for (auto d : sh) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape");
    n *= static_cast<size_t>(d);
  }
  size_t want = n * dt.size();
  if (want != data.size()) {
    throw std::invalid_argument("data has " + std::to_string(data.size()) + " bytes but the shape needs " +
                                std::to_string(want));
  }
  void* buf = std::malloc(want == 0 ? 1 : want);
  if (buf == nullptr) throw std::bad_alloc();
  if (want > 0) std::memcpy(buf, data.data(), want);
  return wrap(mx::array(buf, std::move(sh), dt, [](void* p) { std::free(p); }));
}

ArrPtr scalar_f32(float v, DtypeCode dtype) { return wrap(mx::array(v, to_dtype(dtype))); }
ArrPtr scalar_i64(int64_t v, DtypeCode dtype) { return wrap(mx::astype(mx::array(v, mx::int64), to_dtype(dtype))); }
ArrPtr clone_arr(const Arr& a) { return wrap(a.a); }
DtypeCode dtype_of(const Arr& a) { return from_dtype(a.a.dtype()); }
rust::Vec<int32_t> shape_of(const Arr& a) {
  rust::Vec<int32_t> out;
  for (auto d : a.a.shape()) out.push_back(d);
  return out;
}
size_t nbytes_of(const Arr& a) { return a.a.nbytes(); }
size_t size_of(const Arr& a) { return a.a.size(); }
// Unevaluated nodes reachable from `a` (each counted once): what one eval of
// `a` would dispatch. Evaluated arrays are detached, so the walk stops there.
size_t pending_nodes(const Arr& a) {
  std::vector<mx::array> stack{a.a};
  std::unordered_set<std::uintptr_t> seen;
  size_t n = 0;
  while (!stack.empty()) {
    mx::array x = std::move(stack.back());
    stack.pop_back();
    if (!x.has_primitive() || !seen.insert(x.id()).second) {
      continue;
    }
    n++;
    for (const auto& in : x.inputs()) {
      stack.push_back(in);
    }
  }
  return n;
}

rust::String pending_census(const Arr& a) {
  // Like pending_nodes, counted per primitive name: "Name count" lines.
  std::vector<mx::array> stack{a.a};
  std::unordered_set<std::uintptr_t> seen;
  std::map<std::string, size_t> counts;
  while (!stack.empty()) {
    mx::array x = std::move(stack.back());
    stack.pop_back();
    if (!x.has_primitive() || !seen.insert(x.id()).second) {
      continue;
    }
    counts[x.primitive().name()]++;
    for (const auto& in : x.inputs()) {
      stack.push_back(in);
    }
  }
  std::string out;
  for (const auto& [name, n] : counts) {
    out += name + " " + std::to_string(n) + "\n";
  }
  return rust::String(out);
}

// `MTP_READ_CONTIGUOUS=1`: read through a fresh contiguous copy every time
// (the old path, for measurement; see read_into).
static bool read_through_copy() {
  static const bool on = [] {
    const char* v = std::getenv("MTP_READ_CONTIGUOUS");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

void read_into(const Arr& a, rust::Slice<uint8_t> out) {
  // Wait for this array's own evaluation (scheduling it first if nobody
  // did), then copy straight from its buffer when it is row-major. Building a
  // contiguous copy first would put a new node on the stream *behind* the
  // work dispatched since (the pipelined decoder's next step), so every read
  // waited for that step too: measured on an H200, bf16, one call, plain
  // decoding 595 / 910 vs 1,237 / 1,094 tokens/s (tiny-mtp) and 149 vs 189
  // (8B shape), the wait per token 2.76 vs 0.46 ms. Views (slices,
  // transposes, broadcasts) still go through a row-major copy.
  mx::array x = a.a;
  if (!read_through_copy()) {
    x.eval();
    if (x.flags().row_contiguous && x.data_size() == x.size()) {
      if (x.nbytes() != out.size()) {
        throw std::invalid_argument("read buffer has " + std::to_string(out.size()) + " bytes, array has " +
                                    std::to_string(x.nbytes()));
      }
      if (out.size() > 0) std::memcpy(out.data(), x.data<uint8_t>(), out.size());
      return;
    }
  }
  auto c = mx::contiguous(a.a);
  c.eval();
  c.wait();
  if (!c.flags().row_contiguous) throw std::runtime_error("internal: contiguous() gave a strided array");
  if (c.nbytes() != out.size()) {
    throw std::invalid_argument("read buffer has " + std::to_string(out.size()) + " bytes, array has " +
                                std::to_string(c.nbytes()));
  }
  if (out.size() > 0) std::memcpy(out.data(), c.data<uint8_t>(), out.size());
}

void eval_one(const Arr& a) { mx::eval({a.a}); }
void wait_one(const Arr& a) {
  auto x = a.a;
  x.wait();
}
void async_eval_one(const Arr& a) { mx::async_eval({a.a}); }

std::unique_ptr<ArrList> list_new() { return std::make_unique<ArrList>(); }
void list_push(ArrList& l, const Arr& a) { l.items.push_back(a.a); }
size_t list_len(const ArrList& l) { return l.items.size(); }
ArrPtr list_get(const ArrList& l, size_t i) {
  if (i >= l.items.size()) throw std::out_of_range("list index out of range");
  return wrap(l.items[i]);
}
void eval_list(const ArrList& l) { mx::eval(l.items); }
void async_eval_list(const ArrList& l) { mx::async_eval(l.items); }

ArrPtr zeros(rust::Slice<const int32_t> shape, DtypeCode dtype) { return wrap(mx::zeros(to_shape(shape), to_dtype(dtype))); }
ArrPtr ones(rust::Slice<const int32_t> shape, DtypeCode dtype) { return wrap(mx::ones(to_shape(shape), to_dtype(dtype))); }
ArrPtr full(rust::Slice<const int32_t> shape, const Arr& v, DtypeCode dtype) {
  return wrap(mx::full(to_shape(shape), v.a, to_dtype(dtype)));
}
ArrPtr arange(double start, double stop, double step, DtypeCode dtype) {
  return wrap(mx::arange(start, stop, step, to_dtype(dtype)));
}
ArrPtr tri(int32_t n, int32_t m, int32_t k, DtypeCode dtype) { return wrap(mx::tri(n, m, k, to_dtype(dtype))); }

ArrPtr unary(const Arr& x, UnaryOp op) {
  const auto& a = x.a;
  switch (op) {
    case UnaryOp::Negative: return wrap(mx::negative(a));
    case UnaryOp::Exp: return wrap(mx::exp(a));
    case UnaryOp::Log: return wrap(mx::log(a));
    case UnaryOp::Sqrt: return wrap(mx::sqrt(a));
    case UnaryOp::Rsqrt: return wrap(mx::rsqrt(a));
    case UnaryOp::Abs: return wrap(mx::abs(a));
    case UnaryOp::Sigmoid: return wrap(mx::sigmoid(a));
    case UnaryOp::Tanh: return wrap(mx::tanh(a));
    case UnaryOp::Square: return wrap(mx::square(a));
    case UnaryOp::LogicalNot: return wrap(mx::logical_not(a));
    case UnaryOp::Reciprocal: return wrap(mx::reciprocal(a));
    case UnaryOp::Floor: return wrap(mx::floor(a));
    case UnaryOp::Sin: return wrap(mx::sin(a));
    case UnaryOp::Cos: return wrap(mx::cos(a));
    case UnaryOp::Erf: return wrap(mx::erf(a));
    case UnaryOp::Isnan: return wrap(mx::isnan(a));
    case UnaryOp::Isinf: return wrap(mx::isinf(a));
    case UnaryOp::Log1p: return wrap(mx::log1p(a));
    case UnaryOp::Silu: return wrap(mx::multiply(a, mx::sigmoid(a)));
    default: throw std::invalid_argument("unknown unary op " + std::to_string(static_cast<int>(op)));
  }
}

ArrPtr binary(const Arr& x, const Arr& y, BinaryOp op) {
  const auto& a = x.a;
  const auto& b = y.a;
  switch (op) {
    case BinaryOp::Add: return wrap(mx::add(a, b));
    case BinaryOp::Subtract: return wrap(mx::subtract(a, b));
    case BinaryOp::Multiply: return wrap(mx::multiply(a, b));
    case BinaryOp::Divide: return wrap(mx::divide(a, b));
    case BinaryOp::Maximum: return wrap(mx::maximum(a, b));
    case BinaryOp::Minimum: return wrap(mx::minimum(a, b));
    case BinaryOp::Power: return wrap(mx::power(a, b));
    case BinaryOp::Equal: return wrap(mx::equal(a, b));
    case BinaryOp::NotEqual: return wrap(mx::not_equal(a, b));
    case BinaryOp::Less: return wrap(mx::less(a, b));
    case BinaryOp::LessEqual: return wrap(mx::less_equal(a, b));
    case BinaryOp::Greater: return wrap(mx::greater(a, b));
    case BinaryOp::GreaterEqual: return wrap(mx::greater_equal(a, b));
    case BinaryOp::LogicalAnd: return wrap(mx::logical_and(a, b));
    case BinaryOp::LogicalOr: return wrap(mx::logical_or(a, b));
    case BinaryOp::FloorDivide: return wrap(mx::floor_divide(a, b));
    case BinaryOp::Remainder: return wrap(mx::remainder(a, b));
    case BinaryOp::LogAddExp: return wrap(mx::logaddexp(a, b));
    default: throw std::invalid_argument("unknown binary op " + std::to_string(static_cast<int>(op)));
  }
}

ArrPtr where_(const Arr& c, const Arr& x, const Arr& y) { return wrap(mx::where(c.a, x.a, y.a)); }
ArrPtr astype(const Arr& a, DtypeCode dtype) { return wrap(mx::astype(a.a, to_dtype(dtype))); }
ArrPtr contiguous(const Arr& a) { return wrap(mx::contiguous(a.a)); }
ArrPtr from_fp8(const Arr& a, DtypeCode dtype) { return wrap(mx::from_fp8(a.a, to_dtype(dtype))); }

ArrPtr matmul(const Arr& a, const Arr& b) { return wrap(mx::matmul(a.a, b.a)); }
ArrPtr addmm(const Arr& c, const Arr& a, const Arr& b, float alpha, float beta) {
  return wrap(mx::addmm(c.a, a.a, b.a, alpha, beta));
}
static std::optional<mx::array> opt(bool has, const Arr& a) {
  return has ? std::optional<mx::array>(a.a) : std::nullopt;
}
std::unique_ptr<ArrList> quantize(const Arr& w, int32_t group_size, int32_t bits, rust::Str mode) {
  auto l = std::make_unique<ArrList>();
  l->items = mx::quantize(w.a, group_size, bits, std::string(mode));
  return l;
}
ArrPtr dequantize(const Arr& w, const Arr& scales, bool has_biases, const Arr& biases, int32_t group_size,
                  int32_t bits, rust::Str mode, DtypeCode dtype) {
  return wrap(mx::dequantize(w.a, scales.a, opt(has_biases, biases), group_size, bits, std::string(mode),
                             std::nullopt, to_dtype(dtype)));
}
ArrPtr quantized_matmul(const Arr& x, const Arr& w, const Arr& scales, bool has_biases, const Arr& biases,
                        bool transpose, int32_t group_size, int32_t bits, rust::Str mode) {
  return wrap(mx::quantized_matmul(x.a, w.a, scales.a, opt(has_biases, biases), transpose, group_size, bits,
                                   std::string(mode)));
}
ArrPtr gather_mm(const Arr& a, const Arr& b, bool has_lhs, const Arr& lhs, bool has_rhs, const Arr& rhs,
                 bool sorted) {
  return wrap(mx::gather_mm(a.a, b.a, opt(has_lhs, lhs), opt(has_rhs, rhs), sorted));
}
ArrPtr gather_qmm(const Arr& x, const Arr& w, const Arr& scales, bool has_biases, const Arr& biases, bool has_lhs,
                  const Arr& lhs, bool has_rhs, const Arr& rhs, bool transpose, int32_t group_size, int32_t bits,
                  rust::Str mode, bool sorted) {
  return wrap(mx::gather_qmm(x.a, w.a, scales.a, opt(has_biases, biases), opt(has_lhs, lhs), opt(has_rhs, rhs),
                             transpose, group_size, bits, std::string(mode), std::nullopt, sorted));
}

ArrPtr reshape(const Arr& a, rust::Slice<const int32_t> shape) { return wrap(mx::reshape(a.a, to_shape(shape))); }
ArrPtr transpose(const Arr& a, rust::Slice<const int32_t> axes) { return wrap(mx::transpose(a.a, to_ints(axes))); }
ArrPtr swapaxes(const Arr& a, int32_t a1, int32_t a2) { return wrap(mx::swapaxes(a.a, a1, a2)); }
ArrPtr squeeze(const Arr& a, rust::Slice<const int32_t> axes) { return wrap(mx::squeeze(a.a, to_ints(axes))); }
ArrPtr expand_dims(const Arr& a, rust::Slice<const int32_t> axes) {
  return wrap(mx::expand_dims(a.a, to_ints(axes)));
}
ArrPtr broadcast_to(const Arr& a, rust::Slice<const int32_t> shape) {
  return wrap(mx::broadcast_to(a.a, to_shape(shape)));
}
ArrPtr slice(const Arr& a, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop,
             rust::Slice<const int32_t> strides) {
  return wrap(mx::slice(a.a, to_shape(start), to_shape(stop), to_shape(strides)));
}
ArrPtr slice_update(const Arr& src, const Arr& upd, rust::Slice<const int32_t> start,
                    rust::Slice<const int32_t> stop, rust::Slice<const int32_t> strides) {
  return wrap(mx::slice_update(src.a, upd.a, to_shape(start), to_shape(stop), to_shape(strides)));
}
ArrPtr concatenate(const ArrList& l, int32_t axis) { return wrap(mx::concatenate(l.items, axis)); }
ArrPtr stack(const ArrList& l, int32_t axis) { return wrap(mx::stack(l.items, axis)); }

ArrPtr take(const Arr& a, const Arr& idx, int32_t axis) { return wrap(mx::take(a.a, idx.a, axis)); }
ArrPtr take_along_axis(const Arr& a, const Arr& idx, int32_t axis) {
  return wrap(mx::take_along_axis(a.a, idx.a, axis));
}
ArrPtr put_along_axis(const Arr& a, const Arr& idx, const Arr& v, int32_t axis) {
  return wrap(mx::put_along_axis(a.a, idx.a, v.a, axis));
}
ArrPtr scatter_add_axis(const Arr& a, const Arr& idx, const Arr& v, int32_t axis) {
  return wrap(mx::scatter_add_axis(a.a, idx.a, v.a, axis));
}

ArrPtr reduce(const Arr& x, rust::Slice<const int32_t> axes, bool keepdims, ReduceOp op) {
  auto ax = to_ints(axes);
  const auto& a = x.a;
  switch (op) {
    case ReduceOp::Sum: return wrap(mx::sum(a, ax, keepdims));
    case ReduceOp::Max: return wrap(mx::max(a, ax, keepdims));
    case ReduceOp::Min: return wrap(mx::min(a, ax, keepdims));
    case ReduceOp::Mean: return wrap(mx::mean(a, ax, keepdims));
    case ReduceOp::Prod: return wrap(mx::prod(a, ax, keepdims));
    case ReduceOp::LogSumExp: return wrap(mx::logsumexp(a, ax, keepdims));
    case ReduceOp::All: return wrap(mx::all(a, ax, keepdims));
    case ReduceOp::Any: return wrap(mx::any(a, ax, keepdims));
    default: throw std::invalid_argument("unknown reduction " + std::to_string(static_cast<int>(op)));
  }
}
ArrPtr softmax(const Arr& a, rust::Slice<const int32_t> axes, bool precise) {
  return wrap(mx::softmax(a.a, to_ints(axes), precise));
}
ArrPtr arg_reduce(const Arr& a, int32_t axis, bool keepdims, bool is_max) {
  return wrap(is_max ? mx::argmax(a.a, axis, keepdims) : mx::argmin(a.a, axis, keepdims));
}
ArrPtr argpartition(const Arr& a, int32_t kth, int32_t axis) { return wrap(mx::argpartition(a.a, kth, axis)); }
ArrPtr topk(const Arr& a, int32_t k, int32_t axis) { return wrap(mx::topk(a.a, k, axis)); }
ArrPtr sort(const Arr& a, int32_t axis) { return wrap(mx::sort(a.a, axis)); }
ArrPtr argsort(const Arr& a, int32_t axis) { return wrap(mx::argsort(a.a, axis)); }
ArrPtr cumsum(const Arr& a, int32_t axis, bool reverse, bool inclusive) {
  return wrap(mx::cumsum(a.a, axis, reverse, inclusive));
}
ArrPtr cumprod(const Arr& a, int32_t axis, bool reverse, bool inclusive) {
  return wrap(mx::cumprod(a.a, axis, reverse, inclusive));
}

ArrPtr rms_norm(const Arr& x, const Arr& w, float eps) { return wrap(mx::fast::rms_norm(x.a, w.a, eps)); }
ArrPtr rms_norm_noweight(const Arr& x, float eps) { return wrap(mx::fast::rms_norm(x.a, std::nullopt, eps)); }
ArrPtr rope(const Arr& x, int32_t dims, bool traditional, float base, float scale, int32_t offset) {
  return wrap(mx::fast::rope(x.a, dims, traditional, base, scale, offset));
}
ArrPtr rope_freqs(const Arr& x, int32_t dims, bool traditional, float scale, int32_t offset, const Arr& freqs) {
  return wrap(mx::fast::rope(x.a, dims, traditional, std::nullopt, scale, offset, freqs.a));
}
ArrPtr sdpa(const Arr& q, const Arr& k, const Arr& v, float scale, bool causal) {
  return wrap(mx::fast::scaled_dot_product_attention(q.a, k.a, v.a, scale, causal ? "causal" : ""));
}
ArrPtr sdpa_masked(const Arr& q, const Arr& k, const Arr& v, float scale, const Arr& mask) {
  return wrap(mx::fast::scaled_dot_product_attention(q.a, k.a, v.a, scale, "array", mask.a));
}

// One kernel function of ours (name, source, input and output names, row_contiguous) and the MLX
// primitives built for it, one per launch signature (input dtypes and ranks, output dtypes, template
// values, grid, block, stream).
//
// Why: MLX's kernel function builds the kernel's whole source text (its header, the signature, the
// template constants, the body: several KB of string appends) and a new primitive at every call,
// before any hashing at evaluation; a verify at the 8B shape makes ~200 such calls (the heads, the
// short-query attention's two kernels, the few-rows matmuls, SwiGLU per layer). The primitive holds
// no arrays and no per-node state, so one built for a launch signature serves every later call
// with that signature, as MLX's own `compile` reuses primitives when it replays a graph. The entry
// is found by the address of the caller's source and name (constants in practice) and then
// checked against their text, so a different text at a reused address rebuilds it.
// `MTP_KERNEL_REUSE=0` builds every call through MLX's function, for measurement.
struct KernelEntry {
  std::string name, source;
  std::vector<std::string> in_names, out_names;
  bool row_contiguous = false;
  std::unique_ptr<mx::fast::CustomKernelFunction> fn;
  std::unordered_map<std::string, std::shared_ptr<mx::Primitive>> built;
};

// Launch signatures kept per kernel: the short-query attention's grid grows with the key count
// (one chunk of keys per block), so a long context makes new ones; past this many, the entry
// starts over. Likewise the kernels kept: a caller whose source lives at a new address each call
// (a formatted string) makes a new entry each time, so past this many the table starts over.
constexpr size_t kMaxBuiltPerKernel = 512;
constexpr size_t kMaxKernels = 256;

static bool kernel_reuse() {
  static const bool on = [] {
    const char* v = std::getenv("MTP_KERNEL_REUSE");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

template <typename T>
static void put(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

static bool same_names(const std::vector<std::string>& a, rust::Slice<const rust::Str> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size()) != 0) return false;
  }
  return true;
}

static std::vector<std::string> to_strings(rust::Slice<const rust::Str> names) {
  std::vector<std::string> out;
  out.reserve(names.size());
  for (auto n : names) out.emplace_back(n.data(), n.size());
  return out;
}

std::unique_ptr<ArrList> cuda_kernel(rust::Str name, rust::Str source, rust::Slice<const rust::Str> input_names,
                                     const ArrList& inputs, rust::Slice<const rust::Str> output_names,
                                     rust::Slice<const int32_t> out_dims, rust::Slice<const int32_t> out_ranks,
                                     rust::Slice<const uint8_t> out_dtypes, rust::Slice<const int32_t> grid,
                                     rust::Slice<const int32_t> block, rust::Slice<const rust::Str> tmpl_names,
                                     rust::Slice<const int32_t> tmpl_values, bool row_contiguous) {
  if (grid.size() != 3 || block.size() != 3) throw std::invalid_argument("cuda_kernel: grid and block take 3 sizes");
  if (out_ranks.size() != output_names.size() || out_dtypes.size() != output_names.size())
    throw std::invalid_argument("cuda_kernel: one shape and one dtype per output");
  if (tmpl_names.size() != tmpl_values.size()) throw std::invalid_argument("cuda_kernel: one value per template name");
  if (inputs.items.size() != input_names.size())
    throw std::invalid_argument("cuda_kernel: " + std::to_string(input_names.size()) + " input names but " +
                                std::to_string(inputs.items.size()) + " inputs");
  std::vector<mx::Shape> shapes;
  std::vector<mx::Dtype> dtypes;
  size_t at = 0;
  for (size_t i = 0; i < out_ranks.size(); ++i) {
    size_t r = static_cast<size_t>(out_ranks[i]);
    if (at + r > out_dims.size()) throw std::invalid_argument("cuda_kernel: output ranks exceed the dims given");
    shapes.emplace_back(out_dims.begin() + at, out_dims.begin() + at + r);
    at += r;
    dtypes.push_back(to_dtype(static_cast<DtypeCode>(out_dtypes[i])));
  }
  const mx::Stream stream = mx::default_stream(mx::default_device());

  static std::mutex lock;
  static std::unordered_map<std::string, KernelEntry> kernels;
  std::string id;
  put(id, name.data());
  put(id, name.size());
  put(id, source.data());
  put(id, source.size());
  put(id, row_contiguous);
  std::string launch;
  put(launch, stream.index);
  for (const auto& x : inputs.items) {
    put(launch, static_cast<int>(x.dtype().val()));
    put(launch, x.ndim() > 0);
  }
  for (const auto& d : dtypes) put(launch, static_cast<int>(d.val()));
  for (size_t i = 0; i < tmpl_names.size(); ++i) {
    launch.append(tmpl_names[i].data(), tmpl_names[i].size()).push_back('\0');
    put(launch, tmpl_values[i]);
  }
  for (int i = 0; i < 3; ++i) put(launch, grid[i]);
  for (int i = 0; i < 3; ++i) put(launch, block[i]);

  std::shared_ptr<mx::Primitive> prim;
  std::lock_guard<std::mutex> guard(lock);
  if (kernels.size() >= kMaxKernels && kernels.find(id) == kernels.end()) kernels.clear();
  KernelEntry& e = kernels[id];
  if (!e.fn || e.row_contiguous != row_contiguous || e.name.size() != name.size() ||
      std::memcmp(e.name.data(), name.data(), name.size()) != 0 || e.source.size() != source.size() ||
      std::memcmp(e.source.data(), source.data(), source.size()) != 0 || !same_names(e.in_names, input_names) ||
      !same_names(e.out_names, output_names)) {
    e = KernelEntry{};
    e.name.assign(name.data(), name.size());
    e.source.assign(source.data(), source.size());
    e.in_names = to_strings(input_names);
    e.out_names = to_strings(output_names);
    e.row_contiguous = row_contiguous;
    e.fn = std::make_unique<mx::fast::CustomKernelFunction>(
        mx::fast::cuda_kernel(e.name, e.in_names, e.out_names, e.source, "", row_contiguous, 0));
  }
  const bool reuse = kernel_reuse();
  if (reuse) {
    auto found = e.built.find(launch);
    if (found != e.built.end()) prim = found->second;
  }
  auto list = std::make_unique<ArrList>();
  if (prim) {
    list->items = mx::array::make_arrays(std::move(shapes), dtypes, prim, inputs.items);
    return list;
  }
  std::vector<std::pair<std::string, mx::fast::TemplateArg>> tmpl;
  for (size_t i = 0; i < tmpl_names.size(); ++i)
    tmpl.emplace_back(std::string(tmpl_names[i]), mx::fast::TemplateArg(int(tmpl_values[i])));
  list->items = (*e.fn)(inputs.items, shapes, dtypes, {grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]},
                        tmpl, std::nullopt, false, stream);
  if (reuse && !list->items.empty()) {
    if (e.built.size() >= kMaxBuiltPerKernel) e.built.clear();
    e.built.emplace(std::move(launch), list->items[0].primitive_ptr());
  }
  return list;
}

ArrPtr random_key(uint64_t seed) { return wrap(mx::random::key(seed)); }
ArrPtr random_split(const Arr& key, int32_t num) { return wrap(mx::random::split(key.a, num)); }
ArrPtr random_uniform(rust::Slice<const int32_t> shape, DtypeCode dtype, const Arr& key) {
  return wrap(mx::random::uniform(to_shape(shape), to_dtype(dtype), key.a));
}
ArrPtr random_normal(rust::Slice<const int32_t> shape, DtypeCode dtype, const Arr& key) {
  return wrap(mx::random::normal(to_shape(shape), to_dtype(dtype), std::nullopt, std::nullopt, key.a));
}
ArrPtr random_bernoulli(const Arr& p, const Arr& key) { return wrap(mx::random::bernoulli(p.a, key.a)); }
ArrPtr random_categorical(const Arr& logits, int32_t axis, const Arr& key) {
  return wrap(mx::random::categorical(logits.a, axis, key.a));
}
ArrPtr random_categorical_n(const Arr& logits, int32_t axis, int32_t n, const Arr& key) {
  return wrap(mx::random::categorical(logits.a, axis, n, key.a));
}

std::unique_ptr<TensorFile> load_safetensors(rust::Str path) {
  auto loaded = mx::load_safetensors(std::string(path));
  auto f = std::make_unique<TensorFile>();
  for (auto& [name, arr] : loaded.first) {
    f->names.push_back(name);
    f->arrays.push_back(arr);
  }
  for (auto& [k, v] : loaded.second) {
    f->meta_keys.push_back(k);
    f->meta_values.push_back(v);
  }
  return f;
}
size_t tf_len(const TensorFile& f) { return f.names.size(); }
rust::String tf_name(const TensorFile& f, size_t i) { return rust::String(f.names.at(i)); }
ArrPtr tf_array(const TensorFile& f, size_t i) { return wrap(f.arrays.at(i)); }
size_t tf_meta_len(const TensorFile& f) { return f.meta_keys.size(); }
rust::String tf_meta_key(const TensorFile& f, size_t i) { return rust::String(f.meta_keys.at(i)); }
rust::String tf_meta_value(const TensorFile& f, size_t i) { return rust::String(f.meta_values.at(i)); }
void save_safetensors(rust::Str path, rust::Slice<const rust::String> names, const ArrList& arrays) {
  if (names.size() != arrays.items.size()) throw std::invalid_argument("names and arrays differ in length");
  std::unordered_map<std::string, mx::array> m;
  for (size_t i = 0; i < names.size(); ++i) m.insert_or_assign(std::string(names[i]), arrays.items[i]);
  mx::save_safetensors(std::string(path), std::move(m));
}

void set_default_device(bool gpu) { mx::set_default_device(mx::Device(gpu ? mx::Device::gpu : mx::Device::cpu)); }
bool default_device_is_gpu() { return mx::default_device().type == mx::Device::gpu; }
bool gpu_available() { return mx::is_available(mx::Device(mx::Device::gpu)); }
rust::String device_name() {
  const auto& info = mx::device_info(mx::default_device());
  auto it = info.find("device_name");
  if (it != info.end()) {
    if (auto s = std::get_if<std::string>(&it->second)) return rust::String(*s);
  }
  return rust::String(default_device_is_gpu() ? "gpu" : "cpu");
}
uint32_t gpu_compute_capability() {
  // CUDA's compute capability as major * 10 + minor; 0 where the GPU
  // backend reports none (Metal) or there is no GPU.
  if (!gpu_available()) return 0;
  const auto& info = mx::device_info(mx::Device(mx::Device::gpu));
  auto part = [&](const char* key) -> size_t {
    auto it = info.find(key);
    if (it == info.end()) return 0;
    auto v = std::get_if<size_t>(&it->second);
    return v ? *v : 0;
  };
  return static_cast<uint32_t>(part("compute_capability_major") * 10 + part("compute_capability_minor"));
}
void synchronize() { mx::synchronize(); }
namespace {
mx::Device device_of(bool gpu) { return mx::Device(gpu ? mx::Device::gpu : mx::Device::cpu); }
}  // namespace
int32_t new_stream(bool gpu) { return mx::new_stream(device_of(gpu)).index; }
int32_t default_stream_index(bool gpu) { return mx::default_stream(device_of(gpu)).index; }
void set_default_stream(int32_t index, bool gpu) { mx::set_default_stream(mx::Stream(index, device_of(gpu))); }
void synchronize_stream(int32_t index, bool gpu) { mx::synchronize(mx::Stream(index, device_of(gpu))); }
size_t active_memory() { return mx::get_active_memory(); }
size_t peak_memory() { return mx::get_peak_memory(); }
void reset_peak_memory() { mx::reset_peak_memory(); }
size_t cache_memory() { return mx::get_cache_memory(); }
size_t set_cache_limit(size_t limit) { return mx::set_cache_limit(limit); }
size_t set_memory_limit(size_t limit) { return mx::set_memory_limit(limit); }
void clear_cache() { mx::clear_cache(); }
rust::String mlx_version() { return rust::String(mx::version()); }

void exit_now(int32_t code) {
  mx::synchronize();
  std::fflush(nullptr);
  std::_Exit(code);
}

#ifdef MTP_OPENBLAS
extern "C" char* openblas_get_config(void);
namespace {
// A dynamic initializer is never garbage-collected by the linker, so this
// reference keeps libopenblas.so.0 a direct dependency of every binary that
// links the shim (see build.rs for why that matters).
// openblas_get_config() already starts with "OpenBLAS <version>".
const std::string kBlasConfig = openblas_get_config();
}  // namespace
rust::String blas_info() { return rust::String(kBlasConfig); }
#else
rust::String blas_info() { return rust::String("the BLAS bundled with MLX"); }
#endif

}  // namespace mtp_mlx
