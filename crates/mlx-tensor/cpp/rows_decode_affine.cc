// The affine mode's decoder (4- or 8-bit codes, `scale · code + bias` per
// group): rows of a weight into f32 rows, in an AVX2 build or a portable one
// of the same loops, for the quantized rows kernels.
#include "mlx-tensor/cpp/rows_quant.h"

#include <cstdint>
#include <type_traits>
#include <vector>

// `code · scale + bias` rounds the product and then the sum, as MLX's
// `dequantize` does, on both paths: GCC's C++ default (`-ffp-contract=fast`;
// clang's `on` within an expression) would fuse the two into one FMA in the
// AVX2 build, rounded once, and about a third of the f32 weights would
// differ from the portable path's and MLX's in the last bit
// (tests/it/rows_matmul.rs holds both to MLX's).
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

namespace mtp_mlx::rows {

namespace {

// One weight row's codes, contiguous, into f32: `code · scale + bias` per
// group. Byte `c` of a little-endian 8-bit row is code `c`; a 4-bit row's
// byte `i` holds codes `2i` (low nibble) and `2i + 1`. The group size is a
// template value: with a trip count known at compile time GCC's -O2
// vectorizes the inner loops (with a runtime one it left them scalar, 0.8 ns
// an element against 0.1). `__restrict`: a uint8_t pointer may alias anything.
template <int BITS, int GROUP, typename T>
inline __attribute__((always_inline)) void dequant_row(const uint8_t* __restrict bytes, const T* scales, int64_t s1,
                                                       const T* biases, int64_t b1, int k, float* __restrict o) {
  for (int g = 0, c0 = 0; c0 < k; ++g, c0 += GROUP) {
    const float sc = widen(scales[g * s1]), bi = widen(biases[g * b1]);
    float* __restrict og = o + c0;
    if constexpr (BITS == 8) {
      const uint8_t* __restrict q = bytes + c0;
      for (int c = 0; c < GROUP; ++c) og[c] = static_cast<float>(q[c]) * sc + bi;
    } else {
      const uint8_t* __restrict q = bytes + c0 / 2;
      for (int i = 0; i < GROUP / 2; ++i) {
        og[2 * i] = static_cast<float>(q[i] & 0xF) * sc + bi;
        og[2 * i + 1] = static_cast<float>(q[i] >> 4) * sc + bi;
      }
    }
  }
}

template <int BITS, int GROUP, typename T>
inline __attribute__((always_inline)) void dequant_rows_path(const uint32_t* w, Strides2 ws, const T* scales,
                                                             Strides2 ss, const T* biases, Strides2 bs, int j0, int j1,
                                                             int k, float* out) {
  const int words = k * BITS / 32;
  std::vector<uint32_t> scratch;
  for (int j = j0; j < j1; ++j) {
    dequant_row<BITS, GROUP>(row_bytes(w, ws, j, words, scratch), scales + j * ss[0], ss[1], biases + j * bs[0],
                             bs[1], k, out + static_cast<size_t>(j - j0) * k);
  }
}

#ifdef MTP_X86
// The same loops built for AVX2: the portable path's values bit for bit
// (no FMA contraction in this file, above).
template <int BITS, int GROUP, typename T>
__attribute__((target("avx2,fma,f16c"))) void dequant_rows_avx2(const uint32_t* w, Strides2 ws, const T* scales,
                                                                  Strides2 ss, const T* biases, Strides2 bs, int j0,
                                                                  int j1, int k, float* out) {
  dequant_rows_path<BITS, GROUP>(w, ws, scales, ss, biases, bs, j0, j1, k, out);
}
#endif

template <int BITS, int GROUP, typename T>
void dequant_rows_for(const uint32_t* w, Strides2 ws, const T* scales, Strides2 ss, const T* biases, Strides2 bs,
                      int j0, int j1, int k, bool portable, float* out) {
#ifdef MTP_X86
  if (has_avx2() && !portable) return dequant_rows_avx2<BITS, GROUP>(w, ws, scales, ss, biases, bs, j0, j1, k, out);
#endif
  dequant_rows_path<BITS, GROUP>(w, ws, scales, ss, biases, bs, j0, j1, k, out);
}

}  // namespace


// Declared in cpp/rows_quant.h.
template <typename T>
void dequant_rows(const uint32_t* w, Strides2 ws, const T* scales, Strides2 ss, const T* biases, Strides2 bs, int j0,
                  int j1, int k, int group, int bits, bool portable, float* out) {
  const auto by_group = [&](auto bits_tag) {
    constexpr int B = decltype(bits_tag)::value;
    switch (group) {
      case 32: return dequant_rows_for<B, 32>(w, ws, scales, ss, biases, bs, j0, j1, k, portable, out);
      case 64: return dequant_rows_for<B, 64>(w, ws, scales, ss, biases, bs, j0, j1, k, portable, out);
      default: return dequant_rows_for<B, 128>(w, ws, scales, ss, biases, bs, j0, j1, k, portable, out);
    }
  };
  if (bits == 8) return by_group(std::integral_constant<int, 8>{});
  by_group(std::integral_constant<int, 4>{});
}

template void dequant_rows(const uint32_t*, Strides2, const float*, Strides2, const float*, Strides2, int, int, int,
                           int, int, bool, float*);
template void dequant_rows(const uint32_t*, Strides2, const mx::bfloat16_t*, Strides2, const mx::bfloat16_t*, Strides2,
                           int, int, int, int, int, bool, float*);
template void dequant_rows(const uint32_t*, Strides2, const mx::float16_t*, Strides2, const mx::float16_t*, Strides2,
                           int, int, int, int, int, bool, float*);

}  // namespace mtp_mlx::rows

#if !defined(__clang__)
#pragma GCC pop_options
#endif
