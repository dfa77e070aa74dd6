// The gathered (per-expert) form of the quantized rows kernel on the CPU, as
// an MLX primitive of our own (`QuantGatherRowsMatmulT`), for mixture-of-
// experts layers.
#include "mlx-tensor/cpp/rows_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace mtp_mlx {

using namespace rows;

namespace {

// `x[b] @ w[indices[b]].T` for a stack of quantized weights `w` `[E, n, ·]`:
// the rows of `x` `[B..., M, k]` grouped by the expert their batch index
// names, each group (in chunks of `kMaxRows`) run through
// `quant_rows_matmul_t` on that expert's matrix, so a chosen expert's weight
// is decoded once for all of its rows. Each row's products are the one-row
// kernel's bit for bit. Inputs: x, w, scales, indices (int32 or uint32,
// shape `[B...]`) and, in affine mode only, biases.
//
// An index outside `0..E` cannot be an `Err` at the call site: the indices
// are read when the CPU task runs on MLX's stream thread, after the call has
// returned, and we have not shown that an exception thrown there reaches
// `eval` rather than ending the process. Its rows are NaN instead, which a
// caller can see and a clamp would hide.
class QuantGatherRowsMatmulT : public QuantPrimitive<QuantGatherRowsMatmulT> {
 public:
  using QuantPrimitive::QuantPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& x = inputs[0];
    mx::array& out = outputs[0];
    auto& enc = start_eval(stream(), inputs, out);
    const mx::array &w = inputs[1], &sc = inputs[2], &idx = inputs[3];
    const bool affine = mode_ == QMode::Affine;
    const int k = x.shape(-1), m = x.shape(-2), n = w.shape(1), experts = w.shape(0);
    const int rows = static_cast<int>(x.size() / k);
    const int batches = rows / m;
    const std::vector<int64_t> x_rows = row_offsets(x);
    const int64_t x_col = x.strides().back();
    // Batch `b`'s index: `idx` viewed as `[B..., 1]`.
    mx::Shape ishape = idx.shape();
    mx::Strides istrides = idx.strides();
    ishape.push_back(1);
    istrides.push_back(0);
    std::vector<int64_t> idx_at(batches);
    for (int b = 0; b < batches; ++b) idx_at[b] = row_offset(ishape, istrides, b);
    const bool idx_signed = idx.dtype() == mx::int32;
    auto strides = [](const mx::array& a) { return Strides2{a.strides()[1], a.strides()[2]}; };
    const mx::array* bi = affine ? &inputs[4] : nullptr;
    const Strides2 ws = strides(w), ss = strides(sc), bs = affine ? strides(*bi) : Strides2{0, 0};
    const int64_t we = w.strides()[0], se = sc.strides()[0], be = affine ? bi->strides()[0] : 0;
    const void* xp = x.data<void>();
    const uint32_t* wp = w.data<uint32_t>();
    const void* sp = sc.data<void>();
    const void* ip = idx.data<void>();
    const void* bp = affine ? bi->data<void>() : nullptr;
    void* op = out.data<void>();
    const mx::Dtype dtype = out.dtype();
    const int group = group_, bits = bits_;
    const QMode mode = mode_;
    const bool portable = portable_;
    enc.dispatch([=]() {
      // The output rows of each expert, in row order.
      std::vector<std::vector<int>> rows_of(experts);
      std::vector<int> bad;
      for (int b = 0; b < batches; ++b) {
        const int64_t e = idx_signed ? int64_t{static_cast<const int32_t*>(ip)[idx_at[b]]}
                                     : int64_t{static_cast<const uint32_t*>(ip)[idx_at[b]]};
        for (int r = b * m; r < (b + 1) * m; ++r) {
          if (e < 0 || e >= experts) {
            bad.push_back(r);
          } else {
            rows_of[e].push_back(r);
          }
        }
      }
      by_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        T* o = static_cast<T*>(op);
        std::vector<T> chunk_out;
        std::vector<int64_t> chunk_rows;
        for (int e = 0; e < experts; ++e) {
          const std::vector<int>& mine = rows_of[e];
          const void* scales = affine ? static_cast<const void*>(static_cast<const T*>(sp) + e * se)
                                      : static_cast<const void*>(static_cast<const uint8_t*>(sp) + e * se);
          const T* biases = affine ? static_cast<const T*>(bp) + e * be : nullptr;
          for (size_t c0 = 0; c0 < mine.size(); c0 += kMaxRows) {
            const int count = static_cast<int>(std::min(mine.size() - c0, size_t{kMaxRows}));
            chunk_rows.resize(count);
            for (int i = 0; i < count; ++i) chunk_rows[i] = x_rows[mine[c0 + i]];
            chunk_out.resize(static_cast<size_t>(count) * n);
            quant_rows_matmul_t(static_cast<const T*>(xp), chunk_rows, x_col, wp + e * we, ws, scales, ss, biases, bs,
                                chunk_out.data(), count, n, k, group, bits, mode, portable);
            for (int i = 0; i < count; ++i) {
              std::memcpy(o + static_cast<size_t>(mine[c0 + i]) * n, chunk_out.data() + static_cast<size_t>(i) * n,
                          sizeof(T) * n);
            }
          }
        }
        for (int r : bad) {
          for (int j = 0; j < n; ++j) narrow(std::nanf(""), o + static_cast<size_t>(r) * n + j);
        }
      });
    });
  }

  const char* name() const override { return "QuantGatherRowsMatmulT"; }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape s = inputs[0].shape();
    s.back() = inputs[1].shape(1);
    return {s};
  }
};

}  // namespace

ArrPtr quant_gather_rows_matmul_t(const Arr& x, const Arr& w, const Arr& scales, bool has_biases, const Arr& biases,
                                  const Arr& indices, int32_t group_size, int32_t bits, rust::Str mode_name) {
  const char* what = "quant_gather_rows_matmul_t";
  const mx::Stream s = mx::default_stream(mx::default_device());
  if (s.device != mx::Device::cpu) {
    throw std::invalid_argument(std::string(what) + " runs on the CPU; the default device is a GPU");
  }
  const std::string name(mode_name);
  const QMode mode = quant_mode(what, name, group_size, bits, has_biases);
  const bool affine = mode == QMode::Affine;
  if (w.a.ndim() != 3 || scales.a.ndim() != 3 || (affine && biases.a.ndim() != 3) ||
      scales.a.shape(0) != w.a.shape(0) || (affine && biases.a.shape(0) != w.a.shape(0)) || w.a.shape(0) < 1) {
    throw std::invalid_argument(std::string(what) +
                                " takes a stack of packed weights: w, scales (and biases) [E, n, ...] of one E >= 1");
  }
  mx::Shape batch = indices.a.shape();
  if (x.a.ndim() != indices.a.ndim() + 2 || !std::equal(batch.begin(), batch.end(), x.a.shape().begin())) {
    throw std::invalid_argument(std::string(what) + " takes x [B..., M, k] and indices [B...] of the same B");
  }
  if (indices.a.dtype() != mx::int32 && indices.a.dtype() != mx::uint32) {
    throw std::invalid_argument(std::string(what) + " takes int32 or uint32 indices");
  }
  if (x.a.size() == 0) throw std::invalid_argument(std::string(what) + " takes at least one row");
  check_quant_operands(what, x.a, w.a, scales.a, affine ? &biases.a : nullptr, group_size, bits, name);
  mx::Shape out = x.a.shape();
  out.back() = w.a.shape(1);
  std::vector<mx::array> inputs{x.a, w.a, scales.a, indices.a};
  if (affine) inputs.push_back(biases.a);
  return std::make_unique<Arr>(mx::array(std::move(out), x.a.dtype(),
                                         std::make_shared<QuantGatherRowsMatmulT>(s, group_size, bits, mode),
                                         std::move(inputs)));
}

}  // namespace mtp_mlx
