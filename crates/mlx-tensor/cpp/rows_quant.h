// What the quantized few-rows kernels share (cpp/rows_quant.cc,
// cpp/rows_gather.cc and the two decoders, cpp/rows_decode_affine.cc and
// cpp/rows_decode_fp.cc): the modes, the decoders' entry points, the product
// over decoded blocks, the switch to the decoders' portable path, and the
// primitives' base and builder checks.
#pragma once

#include "mlx-tensor/cpp/rows_kernels.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace mtp_mlx::rows {

// `x @ w.T` for a few rows of `x` and a quantized `w` in MLX's layout:
// `[n, k · bits / 32]` uint32 codes, element `c` of a word in bits
// `bits·c .. bits·(c+1)` (a 4-bit byte's low nibble first), and
// `[n, k / group]` scales. In affine mode (4 or 8 bits) with biases of the
// scales' shape, `w[j, i] = scale · code + bias`; in MLX's floating-point
// modes `w[j, i] = code · scale` with uint8 scales and no biases: mxfp4
// (e2m1 codes, e8m0 scales, groups of 32), mxfp8 (e4m3fn codes, e8m0
// scales, 32) and nvfp4 (e2m1 codes, e4m3fn scales, 16).
//
// Why: MLX's CPU `quantized_matmul` runs each input row through the whole
// weight on its own (1 / 2 / 4 / 8 rows of a 1,024² 8-bit weight: 1.2 / 2.3 /
// 4.7 / 8.5 ms on this 2-core host), so a speculative verify of k + 1 rows
// cost k + 1 plain steps and speculation never paid on a quantized model
// here. In the floating-point modes it also decodes every code again for
// every row (mxfp8, a 1,536 x 512 weight: 1 / 8 rows 2.6 / 12.6 ms). This
// dequantizes a block of weight rows once into f32 and hands the block to
// the dense kernels (cpp/rows_kernels.h), which multiply it into every input row: the same
// fixed summation order per (row, feature) whatever the row count, so a
// verify row equals the one-row step's product bit for bit.
constexpr int kQuantBlock = 8;

// How a weight's codes and scales decode (what the builder parsed `mode` into).
enum class QMode { Affine, Mxfp4, Mxfp8, Nvfp4 };

// Element strides of a 2-D operand.
using Strides2 = std::array<int64_t, 2>;

// Packed weight row `j`'s `words` 32-bit words as contiguous bytes, for the
// decoders: in place where the words are contiguous, else copied into
// `scratch` (which the next call may overwrite).
inline const uint8_t* row_bytes(const uint32_t* w, Strides2 ws, int j, int words, std::vector<uint32_t>& scratch) {
  const uint32_t* wj = w + j * ws[0];
  if (ws[1] != 1) {
    scratch.resize(words);
    for (int i = 0; i < words; ++i) scratch[i] = wj[i * ws[1]];
    wj = scratch.data();
  }
  return reinterpret_cast<const uint8_t*>(wj);
}

// Holds on the portable decode made on this thread (tests, through
// `rows_cpu_hold_portable`). Per thread and read when a primitive is built
// (its task runs later, on MLX's stream thread): tests running at once on
// other threads keep the decoder their host takes.
inline int& portable_holds() {
  thread_local int holds = 0;
  return holds;
}

// Whether a quantized primitive built now on this thread decodes on the
// portable path where AVX2 is there too: `MTP_CPU_QROWS_PORTABLE=1` (read
// once), or a hold on this thread. This lets an AVX2 host test the portable
// decoders (tests/it/rows_matmul.rs).
inline bool portable_wanted() {
  static const bool from_env = [] {
    const char* v = std::getenv("MTP_CPU_QROWS_PORTABLE");
    return v != nullptr && std::string(v) == "1";
  }();
  return from_env || portable_holds() > 0;
}

// Rows `j0..j1` of a floating-point-mode weight as f32 rows of `k`
// (cpp/rows_decode_fp.cc); `mode` is not `Affine`. `portable`: the
// portable path even where AVX2 is there.
void dequant_rows_fp(QMode mode, const uint32_t* w, Strides2 ws, const uint8_t* scales, Strides2 ss, int j0, int j1,
                     int k, bool portable, float* out);

// Rows `j0..j1` of an affine weight as f32 rows of `k` (the builder admits
// 4 or 8 bits and groups of 32, 64 or 128 only), for f32, bf16 and f16
// scales and biases (cpp/rows_decode_affine.cc). `portable`: the portable
// path even where AVX2 is there.
template <typename T>
void dequant_rows(const uint32_t* w, Strides2 ws, const T* scales, Strides2 ss, const T* biases, Strides2 bs, int j0,
                  int j1, int k, int group, int bits, bool portable, float* out);

// `x @ w.T` over the decoded blocks of a quantized `w`, for f32, bf16 and
// f16 (cpp/rows_quant.cc). `scales` are `T` in affine mode, uint8 in the
// others; `biases` affine only.
template <typename T>
void quant_rows_matmul_t(const T* xp, const std::vector<int64_t>& x_rows, int64_t x_col, const uint32_t* w, Strides2 ws,
                         const void* scales, Strides2 ss, const T* biases, Strides2 bs, T* op, int rows, int n, int k,
                         int group, int bits, QMode mode, bool portable);

// What the quantized primitives share: the codes' group size, bits and mode,
// and the decoder chosen when built (`portable_wanted`), which make two of
// them equivalent when they match.
template <typename Self>
class QuantPrimitive : public CpuPrimitive {
 public:
  QuantPrimitive(mx::Stream s, int group, int bits, QMode mode)
      : CpuPrimitive(s), group_(group), bits_(bits), mode_(mode), portable_(portable_wanted()) {}

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const Self*>(&other);
    if (o == nullptr) return false;
    const QuantPrimitive& q = *o;
    return q.group_ == group_ && q.bits_ == bits_ && q.mode_ == mode_ && q.portable_ == portable_;
  }

 protected:
  int group_;
  int bits_;
  QMode mode_;
  bool portable_;
};

// The quantization a rows builder (`what`) takes: `mode_name` parsed, with
// its group size, bits and biases checked.
QMode quant_mode(const char* what, const std::string& name, int32_t group_size, int32_t bits, bool has_biases);

// Checks a rows builder's x and packed weight (`w` `[..., n, k · bits / 32]`,
// scales and biases `[..., n, k / group]`: the last two axes) against each
// other and their dtypes.
void check_quant_operands(const char* what, const mx::array& x, const mx::array& w, const mx::array& scales,
                          const mx::array* biases, int32_t group_size, int32_t bits, const std::string& name);

}  // namespace mtp_mlx::rows
