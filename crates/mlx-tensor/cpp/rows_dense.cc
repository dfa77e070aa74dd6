// `x @ w.T` for a few rows of `x` on the CPU, as an MLX primitive of our own.
//
// Why: a decode step multiplies one row by each weight and a speculative
// verify multiplies k + 1 rows; both should cost about one read of the
// weight. OpenBLAS (what MLX's CPU backend calls) packs the whole weight into
// panels for a GEMM of two or more rows, and for one row too once the weight
// is large; MLX widens bf16 operands to f32 copies before it. This kernel
// streams each weight row once and multiplies it into every input row while
// it is in registers, on every core. `examples/gemm.rs` times both.
//
// Each output element is one input row's dot product with one weight row,
// accumulated in the same order whatever the row count or thread count: a
// verify row's product is bit-for-bit the one-row step's. Weights may be f32,
// bf16 or f16 (widened to f32 as they are loaded; accumulation is f32, the
// output is rounded to the input dtype as MLX rounds).
#include "mlx-tensor/cpp/rows_kernels.h"

#include <array>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace mtp_mlx {

using namespace rows;

namespace {

// The whole product for element type `T`: inputs as MLX hands them to a
// primitive (any strides), output dense `[rows, n]`.
template <typename T>
void rows_matmul_t(const T* xp, const std::vector<int64_t>& x_rows, int64_t x_col, const T* wp,
                   std::array<int64_t, 2> ws, T* op, int rows, int n, int k) {
  std::vector<T> w_dense;
  const T* w = wp;
  if (!(ws[1] == 1 && ws[0] == k)) {
    w_dense.resize(static_cast<size_t>(n) * k);
    dense_copy(wp, n, k, ws[0], ws[1], w_dense.data());
    w = w_dense.data();
  }
  rows_product(xp, x_rows, x_col, op, rows, n, k, [&](const float* x, int n0, int n1, float* out) {
    features(x, rows, k, w, n0, n1, out, n);
  });
}

class RowsMatmulT : public CpuPrimitive {
 public:
  explicit RowsMatmulT(mx::Stream s) : CpuPrimitive(s) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& x = inputs[0];
    const mx::array& w = inputs[1];
    mx::array& out = outputs[0];
    auto& enc = start_eval(stream(), inputs, out);
    const int k = x.shape(-1), n = w.shape(0);
    const int rows = static_cast<int>(x.size() / k);
    const std::vector<int64_t> x_rows = row_offsets(x);
    const int64_t x_col = x.strides().back();
    const std::array<int64_t, 2> wst{w.strides()[0], w.strides()[1]};
    const void* xp = x.data<void>();
    const void* wp = w.data<void>();
    void* op = out.data<void>();
    const mx::Dtype dtype = out.dtype();
    enc.dispatch([=]() {
      by_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        rows_matmul_t(static_cast<const T*>(xp), x_rows, x_col, static_cast<const T*>(wp), wst, static_cast<T*>(op), rows,
                      n, k);
      });
    });
  }


  const char* name() const override { return "RowsMatmulT"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const RowsMatmulT*>(&other) != nullptr;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape s = inputs[0].shape();
    s.back() = inputs[1].shape(0);
    return {s};
  }
};

}  // namespace

bool rows_cpu_set_wide(bool on) {
  wide_wanted().store(on, std::memory_order_relaxed);
  return use_wide();
}

ArrPtr rows_matmul_t(const Arr& x, const Arr& w) {
  const mx::Stream s = mx::default_stream(mx::default_device());
  if (s.device != mx::Device::cpu) {
    throw std::invalid_argument("rows_matmul_t runs on the CPU; the default device is a GPU");
  }
  if (x.a.ndim() < 2 || w.a.ndim() != 2) {
    throw std::invalid_argument("rows_matmul_t takes x [..., rows, k] and w [n, k]; got ranks " +
                                std::to_string(x.a.ndim()) + " and " + std::to_string(w.a.ndim()));
  }
  const int k = x.a.shape(-1), n = w.a.shape(0);
  const int rows = k < 1 ? 0 : static_cast<int>(x.a.size() / k);
  if (rows < 1 || rows > kMaxRows) {
    throw std::invalid_argument("rows_matmul_t takes 1 to " + std::to_string(kMaxRows) + " rows; got " +
                                std::to_string(rows));
  }
  if (w.a.shape(1) != k || k < 1 || n < 1) {
    throw std::invalid_argument("rows_matmul_t: x [" + std::to_string(rows) + ", " + std::to_string(k) +
                                "] does not match w [" + std::to_string(n) + ", " + std::to_string(w.a.shape(1)) +
                                "]");
  }
  const mx::Dtype d = x.a.dtype();
  if (w.a.dtype() != d || !float_dtype(d)) {
    throw std::invalid_argument("rows_matmul_t takes f32, bf16 or f16 operands of one dtype");
  }
  mx::Shape out = x.a.shape();
  out.back() = n;
  return std::make_unique<Arr>(
      mx::array(std::move(out), d, std::make_shared<RowsMatmulT>(s), std::vector<mx::array>{x.a, w.a}));
}

}  // namespace mtp_mlx
