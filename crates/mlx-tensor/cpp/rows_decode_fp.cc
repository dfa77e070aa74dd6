// The floating-point modes' decoder (mxfp4, mxfp8, nvfp4): rows of a
// weight's codes and uint8 scales into f32 rows, on AVX2 or portably (the
// same values lane for lane), for the quantized rows kernels.
#include "mlx-tensor/cpp/rows_quant.h"

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace mtp_mlx::rows {

namespace {

// e2m1 (fp4: sign, 2 exponent bits, 1 mantissa bit) for each nibble.
constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// e4m3fn (fp8: sign, 4 exponent bits biased by 7, 3 mantissa bits,
// subnormals at exponent 0, no infinities, 0x7f and 0xff NaN) for each byte.
const float* e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) {
      const int e = (b >> 3) & 15, m = b & 7;
      const float v = (b & 0x7f) == 0x7f ? NAN : e == 0 ? std::ldexp(static_cast<float>(m), -9)
                                                        : std::ldexp(static_cast<float>(8 + m), e - 10);
      t[b] = (b & 0x80) != 0 ? -v : v;
    }
    return t;
  }();
  return table.data();
}

// An e8m0 scale: `2^(s - 127)` as f32 bits `s << 23`, with MLX's two
// special cases: 0 is 2^-127 (a subnormal, not zero) and 255 is infinity
// (what MLX 0.32's dequantize gives, not the OCP spec's NaN).
inline float e8m0(uint8_t s) {
  const uint32_t bits = s == 0 ? 0x400000u : static_cast<uint32_t>(s) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// One weight row of a floating-point mode into f32: `code · scale` per
// group, from the tables above. Every such product is exact in f32 (at most
// 4 + 4 significant bits, powers of two for e8m0), so it is MLX's
// `dequantize` bit for bit whatever the order of the arithmetic.
template <QMode MODE, int GROUP>
inline __attribute__((always_inline)) void dequant_row_fp(const uint8_t* __restrict bytes, const uint8_t* scales,
                                                          int64_t s1, int k, const float* __restrict e4m3,
                                                          float* __restrict o) {
  for (int g = 0, c0 = 0; c0 < k; ++g, c0 += GROUP) {
    const uint8_t s = scales[g * s1];
    const float sc = MODE == QMode::Nvfp4 ? e4m3[s] : e8m0(s);
    float* __restrict og = o + c0;
    if constexpr (MODE == QMode::Mxfp8) {
      const uint8_t* __restrict q = bytes + c0;
      for (int c = 0; c < GROUP; ++c) og[c] = e4m3[q[c]] * sc;
    } else {
      const uint8_t* __restrict q = bytes + c0 / 2;
      for (int i = 0; i < GROUP / 2; ++i) {
        og[2 * i] = kE2m1[q[i] & 0xF] * sc;
        og[2 * i + 1] = kE2m1[q[i] >> 4] * sc;
      }
    }
  }
}

template <QMode MODE, int GROUP>
inline __attribute__((always_inline)) void dequant_rows_fp_path(const uint32_t* w, Strides2 ws, const uint8_t* scales,
                                                                Strides2 ss, int j0, int j1, int k, float* out) {
  constexpr int kBits = MODE == QMode::Mxfp8 ? 8 : 4;
  const int words = k * kBits / 32;
  const float* e4m3 = e4m3_table();
  std::vector<uint32_t> scratch;
  for (int j = j0; j < j1; ++j) {
    dequant_row_fp<MODE, GROUP>(row_bytes(w, ws, j, words, scratch), scales + j * ss[0], ss[1], k, e4m3,
                                out + static_cast<size_t>(j - j0) * k);
  }
}

#ifdef MTP_X86
// `dequant_row_fp` on AVX2, eight codes at a time: the same values lane for
// lane (each decoded code is the table's, times the same scale), so which
// path ran never shows. fp4 codes go through a register permute of the
// eight magnitudes and a sign flip, fp8 codes through their bits: a normal
// code's exponent and mantissa moved into an f32's and rebiased (+120), a
// subnormal's mantissa times 2^-9, 0x7f NaN. The table loads, which GCC
// left scalar, took 1.18 / 0.66 / 1.03 ms for one row of a 4,096 x 1,024
// weight in mxfp4 / mxfp8 / nvfp4, these 0.71 / 0.96 / 0.76 (one run of
// 7 rounds each on 2 shared EPYC cores; medians of 15 later: 0.61 / 0.77 /
// 0.68): fp4 gains, fp8 is within this host's noise.
template <QMode MODE, int GROUP>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void dequant_row_fp_avx2(
    const uint8_t* bytes, const uint8_t* scales, int64_t s1, int k, const float* e4m3, float* o) {
  static_assert(GROUP % 8 == 0, "eight codes at a time");
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256 magnitudes = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  for (int g = 0, c0 = 0; c0 < k; ++g, c0 += GROUP) {
    const uint8_t s = scales[g * s1];
    const __m256 sc = _mm256_set1_ps(MODE == QMode::Nvfp4 ? e4m3[s] : e8m0(s));
    float* og = o + c0;
    for (int c = 0; c < GROUP; c += 8) {
      __m256 v;
      if constexpr (MODE == QMode::Mxfp8) {
        const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + c0 + c)));
        const __m256i em = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
        const __m256 normal = _mm256_castsi256_ps(
            _mm256_add_epi32(_mm256_slli_epi32(em, 20), _mm256_set1_epi32(120 << 23)));
        const __m256 subnormal = _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(1.0f / 512.0f));
        v = _mm256_blendv_ps(normal, subnormal, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), em)));
        v = _mm256_blendv_ps(v, _mm256_set1_ps(NAN),
                             _mm256_castsi256_ps(_mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7f))));
        v = _mm256_xor_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24)));
      } else {
        uint32_t word;
        std::memcpy(&word, bytes + (c0 + c) / 2, sizeof word);
        // Lane `l`: nibble `l` of the word, code `c + l` (low nibble first).
        const __m256i nib = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shifts);
        // The permute reads the low three bits of each lane: the magnitude.
        v = _mm256_permutevar8x32_ps(magnitudes, nib);
        v = _mm256_xor_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(8)), 28)));
      }
      _mm256_storeu_ps(og + c, _mm256_mul_ps(v, sc));
    }
  }
}

template <QMode MODE, int GROUP>
__attribute__((target("avx2,fma,f16c"))) void dequant_rows_fp_avx2(const uint32_t* w, Strides2 ws,
                                                                     const uint8_t* scales, Strides2 ss, int j0,
                                                                     int j1, int k, float* out) {
  constexpr int kBits = MODE == QMode::Mxfp8 ? 8 : 4;
  const int words = k * kBits / 32;
  const float* e4m3 = e4m3_table();
  std::vector<uint32_t> scratch;
  for (int j = j0; j < j1; ++j) {
    dequant_row_fp_avx2<MODE, GROUP>(row_bytes(w, ws, j, words, scratch), scales + j * ss[0], ss[1], k, e4m3,
                                     out + static_cast<size_t>(j - j0) * k);
  }
}
#endif

// Rows `j0..j1` of a floating-point-mode weight as f32 rows of `k` (the
// builder admits each mode with its own group size only).
template <QMode MODE, int GROUP>
void dequant_rows_fp_for(const uint32_t* w, Strides2 ws, const uint8_t* scales, Strides2 ss, int j0, int j1, int k,
                         bool portable, float* out) {
#ifdef MTP_X86
  if (has_avx2() && !portable) return dequant_rows_fp_avx2<MODE, GROUP>(w, ws, scales, ss, j0, j1, k, out);
#endif
  dequant_rows_fp_path<MODE, GROUP>(w, ws, scales, ss, j0, j1, k, out);
}

}  // namespace

void dequant_rows_fp(QMode mode, const uint32_t* w, Strides2 ws, const uint8_t* scales, Strides2 ss, int j0, int j1,
                     int k, bool portable, float* out) {
  switch (mode) {
    case QMode::Mxfp4: return dequant_rows_fp_for<QMode::Mxfp4, 32>(w, ws, scales, ss, j0, j1, k, portable, out);
    case QMode::Mxfp8: return dequant_rows_fp_for<QMode::Mxfp8, 32>(w, ws, scales, ss, j0, j1, k, portable, out);
    case QMode::Nvfp4: return dequant_rows_fp_for<QMode::Nvfp4, 16>(w, ws, scales, ss, j0, j1, k, portable, out);
    case QMode::Affine: break;
  }
  // A bug, not bad input: `quant_rows_matmul_t` sends affine weights to
  // `dequant_rows`. This runs on MLX's stream thread, where an exception
  // would not reach the caller.
  std::abort();
}

}  // namespace mtp_mlx::rows
