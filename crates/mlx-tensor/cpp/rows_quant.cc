// `x @ w.T` for a few rows of `x` and a quantized `w` on the CPU, as an MLX
// primitive of our own (`QuantRowsMatmulT`): blocks of weight rows decoded
// once (cpp/rows_decode_affine.cc, cpp/rows_decode_fp.cc) and multiplied
// into every input row by the dense kernels (cpp/rows_kernels.h). The
// layout, the modes and why: cpp/rows_quant.h. Also the builders' checks
// that the gathered form (cpp/rows_gather.cc) shares.
#include "mlx-tensor/cpp/rows_quant.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace mtp_mlx {

namespace rows {

// `scales` are `T` in affine mode, uint8 in the others; `biases` affine only.
template <typename T>
void quant_rows_matmul_t(const T* xp, const std::vector<int64_t>& x_rows, int64_t x_col, const uint32_t* w, Strides2 ws,
                         const void* scales, Strides2 ss, const T* biases, Strides2 bs, T* op, int rows, int n, int k,
                         int group, int bits, QMode mode, bool portable) {
  const auto dequant = [&](int j0, int j1, float* block) {
    if (mode != QMode::Affine) {
      return dequant_rows_fp(mode, w, ws, static_cast<const uint8_t*>(scales), ss, j0, j1, k, portable, block);
    }
    dequant_rows(w, ws, static_cast<const T*>(scales), ss, biases, bs, j0, j1, k, group, bits, portable, block);
  };
  // The task split counts dense elements: dequantizing a weight row costs
  // about what reading its f32 copy does.
  rows_product(xp, x_rows, x_col, op, rows, n, k, [&](const float* x, int n0, int n1, float* out) {
    // One buffer per thread, kept across tasks and calls: a fresh one per
    // task would be a large allocation (and its page faults) every 64
    // features of a vocabulary-sized unembedding.
    thread_local std::vector<float> block;
    block.resize(static_cast<size_t>(kQuantBlock) * k);
    for (int j0 = n0; j0 < n1; j0 += kQuantBlock) {
      const int j1 = std::min(n1, j0 + kQuantBlock);
      dequant(j0, j1, block.data());
      // The block's row `j - j0` is weight row `j`: its products land in
      // columns `j0..j1` of the `[rows, n]` output.
      features(x, rows, k, block.data(), 0, j1 - j0, out + j0, n);
    }
  });
}

template void quant_rows_matmul_t(const float*, const std::vector<int64_t>&, int64_t, const uint32_t*, Strides2,
                                  const void*, Strides2, const float*, Strides2, float*, int, int, int, int, int, QMode,
                                  bool);
template void quant_rows_matmul_t(const mx::bfloat16_t*, const std::vector<int64_t>&, int64_t, const uint32_t*,
                                  Strides2, const void*, Strides2, const mx::bfloat16_t*, Strides2, mx::bfloat16_t*, int,
                                  int, int, int, int, QMode, bool);
template void quant_rows_matmul_t(const mx::float16_t*, const std::vector<int64_t>&, int64_t, const uint32_t*,
                                  Strides2, const void*, Strides2, const mx::float16_t*, Strides2, mx::float16_t*, int,
                                  int, int, int, int, QMode, bool);

// The quantization a rows builder (`what`) takes: `mode_name` parsed, with
// its group size, bits and biases checked.
QMode quant_mode(const char* what, const std::string& name, int32_t group_size, int32_t bits, bool has_biases) {
  const std::string w(what);
  // Each floating-point mode fixes its group size and bits.
  struct Known {
    const char* name;
    QMode mode;
    int group, bits;
  };
  static constexpr Known kModes[] = {{"affine", QMode::Affine, 0, 0},
                                     {"mxfp4", QMode::Mxfp4, 32, 4},
                                     {"mxfp8", QMode::Mxfp8, 32, 8},
                                     {"nvfp4", QMode::Nvfp4, 16, 4}};
  const Known* known = nullptr;
  for (const Known& m : kModes) {
    if (name == m.name) known = &m;
  }
  if (known == nullptr) {
    throw std::invalid_argument(w + " takes modes affine, mxfp4, mxfp8 and nvfp4; got " + name);
  }
  if (known->mode == QMode::Affine) {
    if (bits != 4 && bits != 8) {
      throw std::invalid_argument(w + " takes 4- or 8-bit codes; got " + std::to_string(bits));
    }
    if (group_size != 32 && group_size != 64 && group_size != 128) {
      throw std::invalid_argument(w + " takes groups of 32, 64 or 128; got " + std::to_string(group_size));
    }
    if (!has_biases) throw std::invalid_argument(w + ": affine mode needs biases");
  } else {
    if (group_size != known->group || bits != known->bits) {
      throw std::invalid_argument(w + ": mode " + name + " takes group " + std::to_string(known->group) + " and " +
                                  std::to_string(known->bits) + " bits; got group " + std::to_string(group_size) +
                                  " and " + std::to_string(bits) + " bits");
    }
    if (has_biases) throw std::invalid_argument(w + ": mode " + name + " has no biases");
  }
  return known->mode;
}

// Checks a rows builder's x and packed weight (`w` `[..., n, k · bits / 32]`,
// scales and biases `[..., n, k / group]`: the last two axes) against each
// other and their dtypes.
void check_quant_operands(const char* what, const mx::array& x, const mx::array& w, const mx::array& scales,
                          const mx::array* biases, int32_t group_size, int32_t bits, const std::string& name) {
  const std::string wh(what);
  const int k = x.shape(-1), n = w.shape(-2);
  const int64_t packed_k = static_cast<int64_t>(w.shape(-1)) * 32 / bits;
  if (n < 1 || k < 1 || k % group_size != 0 || packed_k != k || scales.shape(-2) != n ||
      scales.shape(-1) != k / group_size ||
      (biases != nullptr && (biases->shape(-2) != n || biases->shape(-1) != k / group_size))) {
    throw std::invalid_argument(wh + ": x [..., " + std::to_string(k) + "] does not match the packed w [" +
                                std::to_string(n) + ", " + std::to_string(w.shape(-1)) + "] at " +
                                std::to_string(bits) + " bits, group " + std::to_string(group_size));
  }
  const mx::Dtype d = x.dtype();
  if (w.dtype() != mx::uint32 || !float_dtype(d)) {
    throw std::invalid_argument(wh + " takes uint32 codes and an f32, bf16 or f16 x");
  }
  if (biases != nullptr && (scales.dtype() != d || biases->dtype() != d)) {
    throw std::invalid_argument(wh + " takes affine scales and biases in x's dtype");
  }
  if (biases == nullptr && scales.dtype() != mx::uint8) {
    throw std::invalid_argument(wh + ": mode " + name + " takes uint8 scales");
  }
}

}  // namespace rows

using namespace rows;

namespace {

// Inputs: x, w, scales and, in affine mode only, biases.
class QuantRowsMatmulT : public QuantPrimitive<QuantRowsMatmulT> {
 public:
  using QuantPrimitive::QuantPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& x = inputs[0];
    mx::array& out = outputs[0];
    auto& enc = start_eval(stream(), inputs, out);
    const mx::array &w = inputs[1], &sc = inputs[2];
    const bool affine = mode_ == QMode::Affine;
    const int k = x.shape(-1), n = w.shape(0);
    const int rows = static_cast<int>(x.size() / k);
    const std::vector<int64_t> x_rows = row_offsets(x);
    const int64_t x_col = x.strides().back();
    auto strides = [](const mx::array& a) { return Strides2{a.strides()[0], a.strides()[1]}; };
    const Strides2 ws = strides(w), ss = strides(sc), bs = affine ? strides(inputs[3]) : Strides2{0, 0};
    const void* xp = x.data<void>();
    const uint32_t* wp = w.data<uint32_t>();
    const void* sp = sc.data<void>();
    const void* bp = affine ? inputs[3].data<void>() : nullptr;
    void* op = out.data<void>();
    const mx::Dtype dtype = out.dtype();
    const int group = group_, bits = bits_;
    const QMode mode = mode_;
    const bool portable = portable_;
    enc.dispatch([=]() {
      by_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        quant_rows_matmul_t(static_cast<const T*>(xp), x_rows, x_col, wp, ws, sp, ss, static_cast<const T*>(bp), bs,
                            static_cast<T*>(op), rows, n, k, group, bits, mode, portable);
      });
    });
  }

  const char* name() const override { return "QuantRowsMatmulT"; }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape s = inputs[0].shape();
    s.back() = inputs[1].shape(0);
    return {s};
  }
};

}  // namespace

bool rows_cpu_hold_portable(bool on) {
  // Balanced by its one caller, the Rust guard `PortableDecode` (true when
  // made, false when dropped, on the thread that made it).
  portable_holds() += on ? 1 : -1;
  return portable_wanted();
}

ArrPtr quant_rows_matmul_t(const Arr& x, const Arr& w, const Arr& scales, bool has_biases, const Arr& biases,
                           int32_t group_size, int32_t bits, rust::Str mode_name) {
  const mx::Stream s = mx::default_stream(mx::default_device());
  if (s.device != mx::Device::cpu) {
    throw std::invalid_argument("quant_rows_matmul_t runs on the CPU; the default device is a GPU");
  }
  const std::string name(mode_name);
  const QMode mode = quant_mode("quant_rows_matmul_t", name, group_size, bits, has_biases);
  const bool affine = mode == QMode::Affine;
  if (x.a.ndim() < 2 || w.a.ndim() != 2 || scales.a.ndim() != 2 || (affine && biases.a.ndim() != 2)) {
    throw std::invalid_argument("quant_rows_matmul_t takes x [..., rows, k] and a 2-D packed w, scales, biases");
  }
  const int k = x.a.shape(-1), n = w.a.shape(0);
  const int rows = k < 1 ? 0 : static_cast<int>(x.a.size() / k);
  if (rows < 1 || rows > kMaxRows) {
    throw std::invalid_argument("quant_rows_matmul_t takes 1 to " + std::to_string(kMaxRows) + " rows; got " +
                                std::to_string(rows));
  }
  check_quant_operands("quant_rows_matmul_t", x.a, w.a, scales.a, affine ? &biases.a : nullptr, group_size, bits,
                       name);
  mx::Shape out = x.a.shape();
  out.back() = n;
  std::vector<mx::array> inputs{x.a, w.a, scales.a};
  if (affine) inputs.push_back(biases.a);
  return std::make_unique<Arr>(mx::array(std::move(out), x.a.dtype(),
                                         std::make_shared<QuantRowsMatmulT>(s, group_size, bits, mode),
                                         std::move(inputs)));
}

}  // namespace mtp_mlx
