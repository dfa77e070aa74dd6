// What the few-rows CPU kernels share (cpp/rows_dense.cc, cpp/rows_quant.cc,
// cpp/rows_gather.cc, cpp/attention_cpu.cc): their limits, the start of an
// `eval_cpu`, and the dense blocks that multiply f32 input rows into weight
// rows (portable, AVX2 and AVX-512VL, equal lane for lane) over the pool.
//
// Everything here is `inline` or a template in a named namespace, so each
// file that includes it shares one copy (one `wide_wanted` switch, one CPU
// check) and the arithmetic is the same whichever file instantiates it.
#pragma once

#include "mlx-tensor/cpp/shim.h"
#include "mlx-tensor/cpp/cpu_primitive.h"
#include "mlx-tensor/cpp/cpu_pool.h"  // also defines MTP_X86 on x86-64

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx/types/half_types.h"

namespace mtp_mlx::rows {

// The most rows a product takes: a verify of up to 31 drafts. The kernels
// keep the accumulators of at most `kGroupRows` rows at once; more rows go
// as groups of that many over the same task's weight rows, which the later
// groups read from cache (a task's 64 weight rows of a 1,024-wide f32 layer
// are 256 KiB). Each row's sums have the same order whatever the group, so
// row `i` of a 17-row verify equals the one-row step's product bit for bit.
constexpr int kMaxRows = 32;
constexpr int kGroupRows = 8;
// Output features per task handed to a thread.
constexpr int kTaskFeatures = 64;
// Below this many weight elements one thread does the whole product (waking
// another costs more than it saves).
constexpr size_t kParallelElements = size_t(1) << 18;

// The start of each primitive's `eval_cpu`: allocates `out` and hands every
// input and `out` to the CPU encoder of `s`, which it returns.
inline mx::cpu::CommandEncoder& start_eval(const mx::Stream& s, const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(s);
  for (const auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  return enc;
}

// Where each row of `x` viewed as `[rows, x.shape(-1)]` starts: its leading
// axes, any strides.
inline std::vector<int64_t> row_offsets(const mx::array& x) {
  std::vector<int64_t> rows(x.size() / x.shape(-1));
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = row_offset(x.shape(), x.strides(), static_cast<int64_t>(r));
  return rows;
}

// Eight lane partials summed in one fixed tree (every kernel here that sums
// lanes uses it, so a sum's order never depends on its neighbours).
inline float lane_tree(const float a[8]) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// One (row, feature) sum from its eight lane partials: a fixed tree over the
// lanes, then the `K % 8` tail in order. Both kernels end every sum here.
template <typename W>
inline float finish(const float a[8], const float* xr, const W* wf, int k8, int k) {
  float s = lane_tree(a);
  for (int c = k8; c < k; ++c) s = std::fma(xr[c], widen(wf[c]), s);
  return s;
}

// The portable kernel: eight lanes per row, one partial sum per lane, summed
// in a fixed tree; the `K % 8` tail after it, in order.
template <typename W>
void features_portable(const float* x, int rows, int k, const W* w, int n0, int n1, float* out, int n) {
  const int k8 = k - k % 8;
  for (int j = n0; j < n1; ++j) {
    const W* wj = w + static_cast<size_t>(j) * k;
    float acc[kGroupRows][8] = {};
    for (int c = 0; c < k8; c += 8) {
      float wv[8];
      for (int l = 0; l < 8; ++l) wv[l] = widen(wj[c + l]);
      for (int r = 0; r < rows; ++r) {
        const float* xr = x + static_cast<size_t>(r) * k + c;
        for (int l = 0; l < 8; ++l) acc[r][l] = std::fma(xr[l], wv[l], acc[r][l]);
      }
    }
    for (int r = 0; r < rows; ++r) {
      out[static_cast<size_t>(r) * n + j] = finish(acc[r], x + static_cast<size_t>(r) * k, wj, k8, k);
    }
  }
}

#ifdef MTP_X86
#define MTP_AVX2 __attribute__((target("avx2,fma,f16c"), always_inline))
MTP_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
MTP_AVX2 inline __m256 load8(const mx::bfloat16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
MTP_AVX2 inline __m256 load8(const mx::float16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// `J` output features from `j` on, `ROWS` input rows: one accumulator per
// (row, feature) pair, each summed over `K` in 8-lane blocks exactly as
// `features_portable` sums it, so `J` (how many chains are in flight to hide
// the FMA latency) never changes a result. Always inlined: in an AVX-512VL
// caller the same AVX2 instructions may use all 32 vector registers.
template <typename W, int ROWS, int J>
MTP_AVX2 inline void block_avx2(const float* x, int k, const W* w, int j, float* out, int n, int prefetch = 0) {
  const int k8 = k - k % 8;
  __m256 acc[J][ROWS];
#pragma GCC unroll 8
  for (int f = 0; f < J; ++f) {
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) acc[f][r] = _mm256_setzero_ps();
  }
  const W* wj = w + static_cast<size_t>(j) * k;
  // The `prefetch` weight rows after this block's, a cache line each time
  // this block's loads reach a new one: more rows stream in at once than the
  // accumulators allow, and the next block starts from cache. Into L2 only
  // (T1): fetched into L1 as well (T0), the next rows evicted the input rows
  // the FMAs reread (5 rows of a 1,024-wide input are 20 KiB of a 32 KiB L1),
  // and 3 / 5 rows cost 25.2 / 27.6 ms against 18.6 / 19.7 with T1 and 19.1
  // for one row (48 [3072, 1024] f32 weights, `examples/gemm.rs`, three
  // alternating runs on 2 Zen 4 cores, AVX2 blocks).
  const W* next = wj + static_cast<size_t>(J) * k;
  constexpr int kLine = 64 / static_cast<int>(sizeof(W));
  for (int c = 0; c < k8; c += 8) {
    if (c % kLine == 0) {
      for (int f = 0; f < prefetch; ++f) {
        _mm_prefetch(reinterpret_cast<const char*>(next + static_cast<size_t>(f) * k + c), _MM_HINT_T1);
      }
    }
    __m256 wv[J];
#pragma GCC unroll 8
    for (int f = 0; f < J; ++f) wv[f] = load8(wj + static_cast<size_t>(f) * k + c);
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) {
      __m256 xv = _mm256_loadu_ps(x + static_cast<size_t>(r) * k + c);
#pragma GCC unroll 8
      for (int f = 0; f < J; ++f) acc[f][r] = _mm256_fmadd_ps(xv, wv[f], acc[f][r]);
    }
  }
  for (int f = 0; f < J; ++f) {
    const W* wf = wj + static_cast<size_t>(f) * k;
    for (int r = 0; r < ROWS; ++r) {
      alignas(32) float a[8];
      _mm256_store_ps(a, acc[f][r]);
      out[static_cast<size_t>(r) * n + j + f] = finish(a, x + static_cast<size_t>(r) * k, wf, k8, k);
    }
  }
}

// The same arithmetic as `features_portable`, lane for lane, on AVX2: the
// two give equal results, so the choice between them never shows. Features
// go `J` at a time (eight to ten chains in flight), the remainder one by one.
// Six to eight rows go as two groups (four rows, then the rest) over the
// same pair of weight rows, the second pass reading them from cache: one
// group of eight would need more accumulators than AVX2 has registers.
// From two rows on, a block of two (four) weight rows is too few streams to keep
// memory busy, so each block prefetches the next one's rows (48 distinct
// [3072, 1024] f32 weights, as the gemm example's `--weights 48` reads
// them, medians of six alternating runs on 2 Zen 3 cores: 4 / 5 / 8 rows
// 30.5 / 32.4 / 43.2 ms without, 25.5 / 25.5 / 33.0 with; one and two rows
// stream eight and four weight rows at once and gained nothing). Did not
// pay (session 23, same weights, three alternating runs): blocks of four
// weight rows with the input rows in passes of two (later passes reading
// the block from L1), 3 / 5 rows 24.1 / 28.6 ms against 24.9 / 26.8 (the
// prefetch was still into L1 then, see `block_avx2`). Session 24: prefetch
// distances of 4-8 lines along the block's own rows, or 4-8 next rows instead
// of `J`, cost 5-30 % more than `J` next rows; two rows prefetching too
// (into L2) took 20.2 against 21.6 ms (medians of five alternating runs; one
// row 19.5), one row prefetching its next eight rows was within the noise.
template <typename W, int ROWS>
__attribute__((target("avx2,fma,f16c"))) void features_avx2(const float* x, int k, const W* w, int n0, int n1,
                                                             float* out, int n) {
  constexpr int J = ROWS == 1 ? 8 : ROWS == 2 ? 4 : 2;
  // Weight rows of the next block to prefetch (none past this task's end).
  const auto ahead = [&](int j) { return ROWS >= 2 ? std::min(J, n1 - j - J) : 0; };
  int j = n0;
  if constexpr (ROWS <= 5) {
    for (; j + J <= n1; j += J) block_avx2<W, ROWS, J>(x, k, w, j, out, n, ahead(j));
    for (; j < n1; ++j) block_avx2<W, ROWS, 1>(x, k, w, j, out, n);
  } else {
    const float* x_rest = x + static_cast<size_t>(4) * k;
    float* out_rest = out + static_cast<size_t>(4) * n;
    for (; j + J <= n1; j += J) {
      block_avx2<W, 4, J>(x, k, w, j, out, n, ahead(j));
      block_avx2<W, ROWS - 4, J>(x_rest, k, w, j, out_rest, n);
    }
    for (; j < n1; ++j) {
      block_avx2<W, 4, 1>(x, k, w, j, out, n);
      block_avx2<W, ROWS - 4, 1>(x_rest, k, w, j, out_rest, n);
    }
  }
}

// The same blocks where AVX-512VL gives AVX2 code 32 vector registers
// instead of 16 (the arithmetic stays 8-lane AVX2, lane for lane the
// portable kernel's, so results do not depend on which path ran): from
// three rows on, four weight rows at a time fit their `4 x ROWS`
// accumulators, where AVX2 holds two (and splits six to eight rows into two
// passes). The same work from L2 (two 1 MiB weights, 2 Zen 4 cores; a
// stand-alone copy of these blocks) took 12.4 / 17.0 ms at 5 / 8 rows
// against 21.8 / 33.0 with the AVX2 blocks, so the weights' stream, not the
// FMAs, bounds a verify. From memory (48 [3072, 1024] weights, three
// alternating runs): f32 8 rows 26.2 against 31.0 ms, bf16 5 rows 14.4
// against 16.3; f32 3 and 5 rows within the noise of AVX2 (about one row's
// 19 ms either way). One row keeps eight weight rows at a time and two rows
// four, as on AVX2 (sixteen and eight did not pay).
template <typename W, int ROWS>
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl"))) void features_avx512vl(const float* x, int k, const W* w,
                                                                                 int n0, int n1, float* out, int n) {
  constexpr int J = ROWS == 1 ? 8 : 4;
  const auto ahead = [&](int j) { return ROWS >= 2 ? std::min(J, n1 - j - J) : 0; };
  int j = n0;
  for (; j + J <= n1; j += J) block_avx2<W, ROWS, J>(x, k, w, j, out, n, ahead(j));
  for (; j < n1; ++j) block_avx2<W, ROWS, 1>(x, k, w, j, out, n);
}

inline bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return yes;
}

// Whether AVX-512VL (with AVX2) is there, and whether the blocks may use
// it: `MTP_ROWS_CPU_AVX512=0` sets the start value, `rows_cpu_set_wide` the
// current one (to time the two paths against each other in one process).
inline bool has_avx512vl() {
  static const bool yes = has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return yes;
}

inline std::atomic<bool>& wide_wanted() {
  static std::atomic<bool> wanted{[] {
    const char* v = std::getenv("MTP_ROWS_CPU_AVX512");
    return !(v != nullptr && std::string(v) == "0");
  }()};
  return wanted;
}

inline bool use_wide() { return has_avx512vl() && wide_wanted().load(std::memory_order_relaxed); }

// The `ROWS` blocks of one path: AVX-512VL's 32 registers (`WIDE`) or AVX2's 16.
template <bool WIDE, typename W, int ROWS>
void features_path(const float* x, int k, const W* w, int n0, int n1, float* out, int n) {
  if constexpr (WIDE) {
    features_avx512vl<W, ROWS>(x, k, w, n0, n1, out, n);
  } else {
    features_avx2<W, ROWS>(x, k, w, n0, n1, out, n);
  }
}

template <bool WIDE, typename W>
void features_x86(const float* x, int rows, int k, const W* w, int n0, int n1, float* out, int n) {
  switch (rows) {
    case 1: return features_path<WIDE, W, 1>(x, k, w, n0, n1, out, n);
    case 2: return features_path<WIDE, W, 2>(x, k, w, n0, n1, out, n);
    case 3: return features_path<WIDE, W, 3>(x, k, w, n0, n1, out, n);
    case 4: return features_path<WIDE, W, 4>(x, k, w, n0, n1, out, n);
    case 5: return features_path<WIDE, W, 5>(x, k, w, n0, n1, out, n);
    case 6: return features_path<WIDE, W, 6>(x, k, w, n0, n1, out, n);
    case 7: return features_path<WIDE, W, 7>(x, k, w, n0, n1, out, n);
    default: return features_path<WIDE, W, 8>(x, k, w, n0, n1, out, n);
  }
}
#endif

// At most `kGroupRows` rows.
template <typename W>
void features_group(const float* x, int rows, int k, const W* w, int n0, int n1, float* out, int n) {
#ifdef MTP_X86
  if (use_wide()) return features_x86<true>(x, rows, k, w, n0, n1, out, n);
  if (has_avx2()) return features_x86<false>(x, rows, k, w, n0, n1, out, n);
#endif
  features_portable(x, rows, k, w, n0, n1, out, n);
}

// Features `n0..n1` of `rows` rows (`x` `[rows, k]` dense, `out` `[rows, n]`),
// in groups of `kGroupRows` rows (see `kMaxRows`).
template <typename W>
void features(const float* x, int rows, int k, const W* w, int n0, int n1, float* out, int n) {
  for (int g = 0; g < rows; g += kGroupRows) {
    features_group(x + static_cast<size_t>(g) * k, std::min(kGroupRows, rows - g), k, w, n0, n1,
                   out + static_cast<size_t>(g) * n, n);
  }
}

// Copies a 2-D array of `T` with element strides into a dense buffer of `D`
// (`T` itself, or f32 through `widen`).
template <typename D, typename T>
void dense_copy(const T* src, int rows, int cols, int64_t s0, int64_t s1, D* dst) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const T v = src[r * s0 + c * s1];
      if constexpr (std::is_same_v<D, T>) {
        dst[static_cast<size_t>(r) * cols + c] = v;
      } else {
        dst[static_cast<size_t>(r) * cols + c] = widen(v);
      }
    }
  }
}


// The frame of a few-rows product for element type `T`: `x`'s rows (any
// strides) widened to a dense f32 copy, the `n` output features split into
// tasks over the pool, each running `body(x, n0, n1, out)` to write the f32
// products of features `n0..n1` into `out` `[rows, n]`, then the products
// rounded into `op` (an f32 output is written in place).
template <typename T, typename Body>
void rows_product(const T* xp, const std::vector<int64_t>& x_rows, int64_t x_col, T* op, int rows, int n, int k,
                  Body&& body) {
  std::vector<float> x(static_cast<size_t>(rows) * k);
  for (int r = 0; r < rows; ++r) dense_copy(xp + x_rows[r], 1, k, 0, x_col, x.data() + static_cast<size_t>(r) * k);
  std::vector<float> acc;
  float* out;
  if constexpr (std::is_same_v<T, float>) {
    out = op;
  } else {
    acc.resize(static_cast<size_t>(rows) * n);
    out = acc.data();
  }
  const size_t elements = static_cast<size_t>(n) * k;
  const int tasks = elements < kParallelElements ? 1 : (n + kTaskFeatures - 1) / kTaskFeatures;
  const int per_task = tasks == 1 ? n : kTaskFeatures;
  Pool::get().run(tasks, [&](int t) {
    const int n0 = t * per_task, n1 = std::min(n, n0 + per_task);
    body(x.data(), n0, n1, out);
  });
  if constexpr (!std::is_same_v<T, float>) {
    for (size_t i = 0; i < acc.size(); ++i) narrow(acc[i], op + i);
  }
}

}  // namespace mtp_mlx::rows
