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
#include "mlx-tensor/cpp/shim.h"
#include "mlx-tensor/cpp/cpu_primitive.h"
#include "mlx-tensor/cpp/kv_holds.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx/types/half_types.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MTP_X86 1
#endif

namespace mtp_mlx {

namespace {

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
mx::cpu::CommandEncoder& start_eval(const mx::Stream& s, const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(s);
  for (const auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(out);
  return enc;
}

// Where each row of `x` viewed as `[rows, x.shape(-1)]` starts: its leading
// axes, any strides.
std::vector<int64_t> row_offsets(const mx::array& x) {
  std::vector<int64_t> rows(x.size() / x.shape(-1));
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = row_offset(x.shape(), x.strides(), static_cast<int64_t>(r));
  return rows;
}


// A fixed set of worker threads that, with the caller, run the tasks
// 0..count of one job; `run` returns when every task has finished and every
// worker that joined the job has left it (so none holds a stale job).
class Pool {
 public:
  static Pool& get() {
    // Leaked on purpose: a worker may still be parked at process exit.
    static Pool* pool = new Pool();
    return *pool;
  }

  // Threads a job runs on: the workers and the caller.
  int threads() const { return workers_ + 1; }

  void run(int count, const std::function<void(int)>& task) {
    if (count <= 1 || workers_ == 0) {
      for (int i = 0; i < count; ++i) task(i);
      return;
    }
    std::lock_guard<std::mutex> one_job(job_lock_);
    {
      std::lock_guard<std::mutex> g(mutex_);
      task_ = &task;
      count_ = count;
      next_.store(0);
      done_.store(0);
      ++generation_;
      posted_.store(generation_, std::memory_order_release);
    }
    wake_.notify_all();
    work(&task, count);
    std::unique_lock<std::mutex> g(mutex_);
    finished_.wait(g, [&] { return done_.load() == count_ && joined_ == 0; });
    task_ = nullptr;
  }

 private:
  Pool() {
    unsigned hw = std::thread::hardware_concurrency();
    workers_ = static_cast<int>(std::clamp(hw, 1u, 8u)) - 1;
    for (int i = 0; i < workers_; ++i) std::thread([this] { loop(); }).detach();
  }

  // Takes tasks of the current job until none are left.
  void work(const std::function<void(int)>* task, int count) {
    for (int i = next_.fetch_add(1); i < count; i = next_.fetch_add(1)) {
      (*task)(i);
      if (done_.fetch_add(1) + 1 == count) {
        std::lock_guard<std::mutex> g(mutex_);
        finished_.notify_all();
      }
    }
  }

  void loop() {
    unsigned long seen = 0;
    const auto spin = std::chrono::microseconds(spin_us());
    for (;;) {
      const std::function<void(int)>* task;
      int count;
      if (spin.count() > 0) {
        // The clock is read every 64 polls: reading it each time showed as
        // 3 % of a 24l run's samples.
        const auto until = std::chrono::steady_clock::now() + spin;
        for (unsigned polls = 1; posted_.load(std::memory_order_acquire) == seen; ++polls) {
#ifdef MTP_X86
          _mm_pause();
#endif
          if (polls % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
        }
      }
      {
        std::unique_lock<std::mutex> g(mutex_);
        wake_.wait(g, [&] { return generation_ != seen && task_ != nullptr; });
        seen = generation_;
        task = task_;
        count = count_;
        ++joined_;
      }
      work(task, count);
      {
        std::lock_guard<std::mutex> g(mutex_);
        --joined_;
      }
      finished_.notify_all();
    }
  }

  int workers_ = 0;
  std::mutex job_lock_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable finished_;
  const std::function<void(int)>* task_ = nullptr;
  int count_ = 0;
  int joined_ = 0;
  unsigned long generation_ = 0;
  std::atomic<unsigned long> posted_{0};

  // How long a worker that finished a job polls for the next one before it
  // sleeps on the condition variable (`MTP_POOL_SPIN_US`, 0: never polls).
  // A forward posts a job per product and attention, tens of microseconds
  // apart; woken from sleep, the worker joined each one late. tiny-mtp f32
  // on 2 Zen 4 cores, eleven alternating pairs of processes, 100 µs against
  // none, medians: plain 233.5 against 223.0 tokens/s, depth 3 341.3 against
  // 343.9 (no gain: the verify's jobs are longer); the 24l shape
  // (bandwidth-bound) within the noise either way.
  static long spin_us() {
    const char* v = std::getenv("MTP_POOL_SPIN_US");
    return v == nullptr ? 100 : std::max(0L, std::strtol(v, nullptr, 10));
  }
  std::atomic<int> next_{0};
  std::atomic<int> done_{0};
};


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

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return yes;
}

// Whether AVX-512VL (with AVX2) is there, and whether the blocks may use
// it: `MTP_ROWS_CPU_AVX512=0` sets the start value, `rows_cpu_set_wide` the
// current one (to time the two paths against each other in one process).
bool has_avx512vl() {
  static const bool yes = has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return yes;
}

std::atomic<bool>& wide_wanted() {
  static std::atomic<bool> wanted{[] {
    const char* v = std::getenv("MTP_ROWS_CPU_AVX512");
    return !(v != nullptr && std::string(v) == "0");
  }()};
  return wanted;
}

bool use_wide() { return has_avx512vl() && wide_wanted().load(std::memory_order_relaxed); }

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


// ---------------------------------------------------------------------------
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
// the dense kernels above, which multiply it into every input row: the same
// fixed summation order per (row, feature) whatever the row count, so a
// verify row equals the one-row step's product bit for bit.
constexpr int kQuantBlock = 8;

// How a weight's codes and scales decode (what the builder parsed `mode` into).
enum class QMode { Affine, Mxfp4, Mxfp8, Nvfp4 };

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

// Element strides of a 2-D operand.
using Strides2 = std::array<int64_t, 2>;

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
  std::vector<uint32_t> packed;
  for (int j = j0; j < j1; ++j) {
    const uint32_t* wj = w + j * ws[0];
    if (ws[1] != 1) {
      packed.resize(words);
      for (int i = 0; i < words; ++i) packed[i] = wj[i * ws[1]];
      wj = packed.data();
    }
    dequant_row_fp<MODE, GROUP>(reinterpret_cast<const uint8_t*>(wj), scales + j * ss[0], ss[1], k, e4m3,
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
  std::vector<uint32_t> packed;
  for (int j = j0; j < j1; ++j) {
    const uint32_t* wj = w + j * ws[0];
    if (ws[1] != 1) {
      packed.resize(words);
      for (int i = 0; i < words; ++i) packed[i] = wj[i * ws[1]];
      wj = packed.data();
    }
    dequant_row_fp_avx2<MODE, GROUP>(reinterpret_cast<const uint8_t*>(wj), scales + j * ss[0], ss[1], k, e4m3,
                                     out + static_cast<size_t>(j - j0) * k);
  }
}
#endif

// Rows `j0..j1` of a floating-point-mode weight as f32 rows of `k` (the
// builder admits each mode with its own group size only).
template <QMode MODE, int GROUP>
void dequant_rows_fp(const uint32_t* w, Strides2 ws, const uint8_t* scales, Strides2 ss, int j0, int j1, int k,
                     float* out) {
#ifdef MTP_X86
  if (has_avx2()) return dequant_rows_fp_avx2<MODE, GROUP>(w, ws, scales, ss, j0, j1, k, out);
#endif
  dequant_rows_fp_path<MODE, GROUP>(w, ws, scales, ss, j0, j1, k, out);
}

template <int BITS, int GROUP, typename T>
inline __attribute__((always_inline)) void dequant_rows_path(const uint32_t* w, Strides2 ws, const T* scales,
                                                             Strides2 ss, const T* biases, Strides2 bs, int j0, int j1,
                                                             int k, float* out) {
  const int words = k * BITS / 32;
  std::vector<uint32_t> packed;
  for (int j = j0; j < j1; ++j) {
    const uint32_t* wj = w + j * ws[0];
    if (ws[1] != 1) {
      packed.resize(words);
      for (int i = 0; i < words; ++i) packed[i] = wj[i * ws[1]];
      wj = packed.data();
    }
    dequant_row<BITS, GROUP>(reinterpret_cast<const uint8_t*>(wj), scales + j * ss[0], ss[1], biases + j * bs[0],
                             bs[1], k, out + static_cast<size_t>(j - j0) * k);
  }
}

#ifdef MTP_X86
template <int BITS, int GROUP, typename T>
__attribute__((target("avx2,fma,f16c"))) void dequant_rows_avx2(const uint32_t* w, Strides2 ws, const T* scales,
                                                                  Strides2 ss, const T* biases, Strides2 bs, int j0,
                                                                  int j1, int k, float* out) {
  dequant_rows_path<BITS, GROUP>(w, ws, scales, ss, biases, bs, j0, j1, k, out);
}
#endif

template <int BITS, int GROUP, typename T>
void dequant_rows_for(const uint32_t* w, Strides2 ws, const T* scales, Strides2 ss, const T* biases, Strides2 bs,
                      int j0, int j1, int k, float* out) {
#ifdef MTP_X86
  if (has_avx2()) return dequant_rows_avx2<BITS, GROUP>(w, ws, scales, ss, biases, bs, j0, j1, k, out);
#endif
  dequant_rows_path<BITS, GROUP>(w, ws, scales, ss, biases, bs, j0, j1, k, out);
}

// Rows `j0..j1` of the quantized weight as f32 rows of `k` (the builder
// admits 4 or 8 bits and groups of 32, 64 or 128 only).
template <typename T>
void dequant_rows(const uint32_t* w, Strides2 ws, const T* scales, Strides2 ss, const T* biases, Strides2 bs, int j0,
                  int j1, int k, int group, int bits, float* out) {
  const auto by_group = [&](auto bits_tag) {
    constexpr int B = decltype(bits_tag)::value;
    switch (group) {
      case 32: return dequant_rows_for<B, 32>(w, ws, scales, ss, biases, bs, j0, j1, k, out);
      case 64: return dequant_rows_for<B, 64>(w, ws, scales, ss, biases, bs, j0, j1, k, out);
      default: return dequant_rows_for<B, 128>(w, ws, scales, ss, biases, bs, j0, j1, k, out);
    }
  };
  if (bits == 8) return by_group(std::integral_constant<int, 8>{});
  by_group(std::integral_constant<int, 4>{});
}

// `scales` are `T` in affine mode, uint8 in the others; `biases` affine only.
template <typename T>
void quant_rows_matmul_t(const T* xp, const std::vector<int64_t>& x_rows, int64_t x_col, const uint32_t* w, Strides2 ws,
                         const void* scales, Strides2 ss, const T* biases, Strides2 bs, T* op, int rows, int n, int k,
                         int group, int bits, QMode mode) {
  const auto dequant = [&](int j0, int j1, float* block) {
    const auto* fp_scales = static_cast<const uint8_t*>(scales);
    switch (mode) {
      case QMode::Mxfp4: return dequant_rows_fp<QMode::Mxfp4, 32>(w, ws, fp_scales, ss, j0, j1, k, block);
      case QMode::Mxfp8: return dequant_rows_fp<QMode::Mxfp8, 32>(w, ws, fp_scales, ss, j0, j1, k, block);
      case QMode::Nvfp4: return dequant_rows_fp<QMode::Nvfp4, 16>(w, ws, fp_scales, ss, j0, j1, k, block);
      case QMode::Affine: break;
    }
    dequant_rows(w, ws, static_cast<const T*>(scales), ss, biases, bs, j0, j1, k, group, bits, block);
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

// What the quantized primitives share: the codes' group size, bits and mode,
// which make two of them equivalent when they match.
template <typename Self>
class QuantPrimitive : public CpuPrimitive {
 public:
  QuantPrimitive(mx::Stream s, int group, int bits, QMode mode)
      : CpuPrimitive(s), group_(group), bits_(bits), mode_(mode) {}

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const Self*>(&other);
    if (o == nullptr) return false;
    const QuantPrimitive& q = *o;
    return q.group_ == group_ && q.bits_ == bits_ && q.mode_ == mode_;
  }

 protected:
  int group_;
  int bits_;
  QMode mode_;
};

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
    enc.dispatch([=]() {
      by_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        quant_rows_matmul_t(static_cast<const T*>(xp), x_rows, x_col, wp, ws, sp, ss, static_cast<const T*>(bp), bs,
                            static_cast<T*>(op), rows, n, k, group, bits, mode);
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
                                chunk_out.data(), count, n, k, group, bits, mode);
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

// ---------------------------------------------------------------------------
// Attention for query rows on the CPU: `softmax(q kᵀ · scale + causal) v`
// for `q: [1, Hq, L, D]` over `k, v: [1, Hkv, S, D]` (query `i` sees keys
// `0..=S-L+i`), as an MLX primitive of our own.
//
// Why: MLX's CPU backend runs its fused attention as separate ops: a batched
// GEMM through BLAS (which copies the cache's strided key slice into a dense
// one and packs it, every call), a scalar exponential per score, a softmax
// and a second GEMM. On tiny-mtp a decode step at 640 keys cost 2.2 ms more
// than at 2 keys, for 0.65 M multiply-adds; for a prefill chunk it builds the
// whole `rows x keys` score matrix per head (a 1,208-token prompt on the 24l
// shape: 22.6 s to the first token, 9.6 s here). This reads each key and value
// row in place: on AVX2 once for all the query rows and heads of its KV head
// (once per block of rows when the work is split over threads), else once
// per query row.
//
// Each (query head, row) output is computed in one fixed order over the keys,
// its dot products in 8-lane partials summed in a fixed tree, the same
// whatever the row count (a call takes one path, AVX2 or portable, for all
// its rows), so row `i` of an `L`-row call equals the one-row call at its
// position bit for bit.
// Accumulation and the softmax are f32; the output is rounded to q's dtype.

// Query rows one task takes at most: a prefill chunk's rows go in blocks of
// this many, each reading the keys and values once for its rows (a block's
// scores, `rows x group x keys` floats, stay small).
constexpr int kAttnBlockRows = 16;
constexpr int kAttnMaxDim = 256;
// Below this many multiply-adds one thread does the whole call.
constexpr size_t kAttnParallel = size_t(1) << 16;

// A 4-D view: element (h, t, d) at `p + h*s1 + t*s2 + d*s3`.
template <typename T>
struct View4 {
  const T* p;
  int64_t s1, s2, s3;
  const T* row(int h, int t) const { return p + h * s1 + t * s2; }
};

// Widens `D` elements with stride `s3` into `out`.
template <typename T>
inline void widen_row(const T* src, int64_t s3, int d, float* out) {
  for (int i = 0; i < d; ++i) out[i] = widen(src[i * s3]);
}

// Dot product of a dense f32 `q` and a row of `T`, in 8 lane partials then a
// fixed tree (the tail after, in order).
template <typename T>
inline float dot_portable(const float* q, const T* k, int d) {
  float a[8] = {};
  const int d8 = d - d % 8;
  for (int c = 0; c < d8; c += 8) {
    for (int l = 0; l < 8; ++l) a[l] = std::fma(q[c + l], widen(k[c + l]), a[l]);
  }
  float s = lane_tree(a);
  for (int c = d8; c < d; ++c) s = std::fma(q[c], widen(k[c]), s);
  return s;
}

template <typename T>
inline void axpy_portable(float p, const T* v, int d, float* out) {
  for (int c = 0; c < d; ++c) out[c] = std::fma(p, widen(v[c]), out[c]);
}

// Score floats per (row, head) pair of `attend_group_avx2` over `keys_max`
// keys: whole blocks of eight.
inline int score_stride(int keys_max) { return (keys_max + 7) / 8 * 8; }

#ifdef MTP_X86
// `e^x` on eight lanes, for softmax's `x <= 0`: Cephes' single-precision
// range reduction and polynomial (about one ulp), `x` floored at -87.3 so the
// power of two stays a normal number (what lies below is ~1e-38 of the
// largest term, which is 1).
__attribute__((target("avx2,fma,f16c"))) inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// Lane `i` of the result: the sum of `a[i]`'s eight lanes, in the same tree
// for every `i` (pairs, then pairs of pairs, then the two halves).
__attribute__((target("avx2,fma,f16c"))) inline __m256 sum_lanes8(const __m256 a[8]) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// `a` with lanes `n..8` replaced by `fill` (`n` in 0..=8).
__attribute__((target("avx2,fma,f16c"))) inline __m256 keep_lanes(__m256 a, int n, float fill) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane));
  return _mm256_blendv_ps(_mm256_set1_ps(fill), a, keep);
}

// One (row, head) pair's output over its `keys` weights `e` (the softmax's
// numerators) and value rows, `NB` 8-lane blocks of it from lane `c` on,
// held in registers over the keys: `out = inv · Σ_j e_j v_j`, `j` in order.
template <typename T, int NB>
__attribute__((target("avx2,fma,f16c"))) inline void weigh_values(const float* e, const View4<T>& v, int g, int keys,
                                                                   int c, float inv, float* out) {
  __m256 acc[NB];
#pragma GCC unroll 8
  for (int b = 0; b < NB; ++b) acc[b] = _mm256_setzero_ps();
  for (int j = 0; j < keys; ++j) {
    const __m256 w = _mm256_set1_ps(e[j]);
    const T* vr = v.row(g, j) + c;
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) acc[b] = _mm256_fmadd_ps(w, load8(vr + 8 * b), acc[b]);
  }
  const __m256 s = _mm256_set1_ps(inv);
#pragma GCC unroll 8
  for (int b = 0; b < NB; ++b) _mm256_storeu_ps(out + c + 8 * b, _mm256_mul_ps(acc[b], s));
}

// The query heads `group` of KV head `g` at `rows` consecutive query rows, on
// AVX2, over dense key and value rows (`D` a multiple of 8): row `r` sees
// the first `first_keys + r` keys (causal). `q` holds row `r`, head `h` at
// `(r * group + h) * d`; `out` likewise; `scores` has `score_stride(...)`
// floats per (row, head) pair. Each pair's result depends on nothing but its
// own query and keys: scores go eight keys at a time (each key's dot
// product one FMA chain over `D`, its lanes summed by `sum_lanes8`), each
// block of keys read from memory once for every pair that sees it; the
// exponentials eight at a time (`exp8`), summed in 8-lane partials then a
// fixed tree; the values weighed key by key in order, in registers (value
// rows read again for each pair come from L2: reading a block of them for
// every pair before the next, so they came from L1, measured no faster). So a
// row's result is bit for bit the one a one-row call at its position gives.
template <typename T>
__attribute__((target("avx2,fma,f16c"))) void attend_group_avx2(const float* q, int rows, int group,
                                                                 const View4<T>& k, const View4<T>& v, int g,
                                                                 int first_keys, int d, float scale, float* scores,
                                                                 float* out) {
  const int blocks = d / 8;
  const int pairs = rows * group;
  const int keys_max = first_keys + rows - 1;
  const int stride = score_stride(keys_max);
  const auto keys_of = [&](int p) { return first_keys + p / group; };
  std::vector<float> mx(static_cast<size_t>(pairs) * 8, -INFINITY);
  const __m256 sc = _mm256_set1_ps(scale);
  for (int j0 = 0; j0 < keys_max; j0 += 8) {
    // The block's key rows; past the last key, the last again (masked below).
    const T* kr[8];
    for (int i = 0; i < 8; ++i) kr[i] = k.row(g, std::min(j0 + i, keys_max - 1));
    // The first row that sees key `j0`.
    const int first = std::max(0, j0 - first_keys + 1);
    for (int p = first * group; p < pairs; ++p) {
      const float* qh = q + static_cast<size_t>(p) * d;
      __m256 acc[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
      for (int b = 0; b < blocks; ++b) {
        const __m256 qv = _mm256_loadu_ps(qh + 8 * b);
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qv, load8(kr[i] + 8 * b), acc[i]);
      }
      __m256 s = _mm256_mul_ps(sum_lanes8(acc), sc);
      const int seen = keys_of(p) - j0;
      if (seen < 8) s = keep_lanes(s, seen, -INFINITY);
      _mm256_storeu_ps(scores + static_cast<size_t>(p) * stride + j0, s);
      float* m = mx.data() + static_cast<size_t>(p) * 8;
      _mm256_storeu_ps(m, _mm256_max_ps(_mm256_loadu_ps(m), s));
    }
  }
  std::vector<float> inv(static_cast<size_t>(pairs));
  for (int p = 0; p < pairs; ++p) {
    const float* m8 = mx.data() + static_cast<size_t>(p) * 8;
    const float m = *std::max_element(m8, m8 + 8);
    float* sp = scores + static_cast<size_t>(p) * stride;
    const int keys = keys_of(p);
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sum8 = _mm256_setzero_ps();
    for (int j0 = 0; j0 < keys; j0 += 8) {
      __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sp + j0), mv));
      if (keys - j0 < 8) e = keep_lanes(e, keys - j0, 0.0f);
      _mm256_storeu_ps(sp + j0, e);
      sum8 = _mm256_add_ps(sum8, e);
    }
    alignas(32) float a[8];
    _mm256_store_ps(a, sum8);
    inv[p] = 1.0f / lane_tree(a);
  }
  // Values: each pair's weighted sum over its keys, in registers, then scaled.
  for (int p = 0; p < pairs; ++p) {
    const float* sp = scores + static_cast<size_t>(p) * stride;
    float* op = out + static_cast<size_t>(p) * d;
    for (int c = 0; c < blocks; c += 8) {
      switch (std::min(8, blocks - c)) {
        case 1: weigh_values<T, 1>(sp, v, g, keys_of(p), 8 * c, inv[p], op); break;
        case 2: weigh_values<T, 2>(sp, v, g, keys_of(p), 8 * c, inv[p], op); break;
        case 3: weigh_values<T, 3>(sp, v, g, keys_of(p), 8 * c, inv[p], op); break;
        case 4: weigh_values<T, 4>(sp, v, g, keys_of(p), 8 * c, inv[p], op); break;
        case 5: weigh_values<T, 5>(sp, v, g, keys_of(p), 8 * c, inv[p], op); break;
        case 6: weigh_values<T, 6>(sp, v, g, keys_of(p), 8 * c, inv[p], op); break;
        case 7: weigh_values<T, 7>(sp, v, g, keys_of(p), 8 * c, inv[p], op); break;
        default: weigh_values<T, 8>(sp, v, g, keys_of(p), 8 * c, inv[p], op); break;
      }
    }
  }
}
#endif

// One (query head, row): `keys` visible keys of KV head `g`, portable (any
// strides and head width).
template <typename T>
void attend_one(const float* q, const View4<T>& k, const View4<T>& v, int g, int keys, int d, float scale,
                float* scores, float* vrow, float* out) {
  const bool dense = k.s3 == 1 && v.s3 == 1;
  float mx = -INFINITY;
  for (int j = 0; j < keys; ++j) {
    const T* kr = k.row(g, j);
    float s;
    if (dense) {
      s = dot_portable(q, kr, d);
    } else {
      widen_row(kr, k.s3, d, vrow);
      s = dot_portable(q, vrow, d);
    }
    s *= scale;
    scores[j] = s;
    mx = std::max(mx, s);
  }
  float sum = 0.0f;
  for (int j = 0; j < keys; ++j) {
    const float e = std::exp(scores[j] - mx);
    scores[j] = e;
    sum += e;
  }
  for (int c = 0; c < d; ++c) out[c] = 0.0f;
  for (int j = 0; j < keys; ++j) {
    const T* vr = v.row(g, j);
    if (dense) {
      axpy_portable(scores[j], vr, d, out);
    } else {
      widen_row(vr, v.s3, d, vrow);
      axpy_portable(scores[j], vrow, d, out);
    }
  }
  const float inv = 1.0f / sum;
  for (int c = 0; c < d; ++c) out[c] *= inv;
}

// `merged`: the output is `[1, L, Hq * D]` (a row's heads side by side, what
// the output projection takes), else `[1, Hq, L, D]`.
template <typename T>
void attention_rows(View4<T> q, View4<T> k, View4<T> v, T* op, int hq, int hkv, int l, int s, int d, float scale,
                    bool merged) {
  const int group = hq / hkv;
  const size_t work = static_cast<size_t>(hq) * l * s * d;
#ifdef MTP_X86
  // One path for the whole call, so every row of it takes the same one.
  const bool fast = has_avx2() && d % 8 == 0 && k.s3 == 1 && v.s3 == 1;
#else
  const bool fast = false;
#endif
  auto write = [&](int h, int i, const float* out) {
    T* o = op + (merged ? static_cast<size_t>(i) * hq + h : static_cast<size_t>(h) * l + i) * d;
    for (int c = 0; c < d; ++c) narrow(out[c], o + c);
  };
  const bool parallel = work >= kAttnParallel;
  // The fast path: a task per KV head and block of consecutive rows, its
  // group of query heads together; up to `kAttnBlockRows` rows go in one
  // block unless the call is split over threads and its KV heads are too few
  // to occupy them all (every block reads the keys and values again).
  const int want_blocks = parallel ? std::clamp((Pool::get().threads() + hkv - 1) / hkv, 1, l) : 1;
  const int block_rows = std::min(kAttnBlockRows, (l + want_blocks - 1) / want_blocks);
  const int row_blocks = (l + block_rows - 1) / block_rows;
  auto group_task = [&](int t) {
    const int g = t / row_blocks, i0 = (t % row_blocks) * block_rows;
    const int rows = std::min(block_rows, l - i0);
    const int first_keys = s - l + i0 + 1;
    const size_t pairs = static_cast<size_t>(rows) * group;
    std::vector<float> qrows(pairs * d), out(pairs * d);
    std::vector<float> scores(pairs * static_cast<size_t>(score_stride(first_keys + rows - 1)));
    for (int r = 0; r < rows; ++r) {
      for (int h = 0; h < group; ++h) {
        widen_row(q.row(g * group + h, i0 + r), q.s3, d, qrows.data() + (static_cast<size_t>(r) * group + h) * d);
      }
    }
#ifdef MTP_X86
    attend_group_avx2<T>(qrows.data(), rows, group, k, v, g, first_keys, d, scale, scores.data(), out.data());
#endif
    for (int r = 0; r < rows; ++r) {
      for (int h = 0; h < group; ++h) write(g * group + h, i0 + r, out.data() + (static_cast<size_t>(r) * group + h) * d);
    }
  };
  // The portable path: a task per (query head, row).
  auto head_task = [&](int t) {
    const int h = t / l, i = t % l;
    const int keys = s - l + i + 1;
    std::vector<float> scores(static_cast<size_t>(keys));
    float qrow[kAttnMaxDim], vrow[kAttnMaxDim], out[kAttnMaxDim];
    widen_row(q.row(h, i), q.s3, d, qrow);
    attend_one<T>(qrow, k, v, h / group, keys, d, scale, scores.data(), vrow, out);
    write(h, i, out);
  };
  const int tasks = fast ? hkv * row_blocks : hq * l;
  const std::function<void(int)> task = fast ? std::function<void(int)>(group_task) : std::function<void(int)>(head_task);
  if (parallel) {
    Pool::get().run(tasks, task);
  } else {
    for (int t = 0; t < tasks; ++t) task(t);
  }
}

class AttentionRows : public CpuPrimitive {
 public:
  // `keys`: the rows of k and v attended over (negative: all of them).
  AttentionRows(mx::Stream st, float scale, bool merged, int keys)
      : CpuPrimitive(st), scale_(scale), merged_(merged), keys_(keys) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& q = inputs[0];
    const mx::array& k = inputs[1];
    const mx::array& v = inputs[2];
    mx::array& out = outputs[0];
    auto& enc = start_eval(stream(), inputs, out);
    const int hq = q.shape(1), l = q.shape(2), d = q.shape(3), hkv = k.shape(1);
    const int s = keys_ >= 0 ? keys_ : k.shape(2);
    // Recorded so a cache write encoded before this task has run can still
    // write rows at and after `s` in place (cpp/kv_cpu.cc).
    const uint64_t k_hold = hold_kv_rows(k, s);
    const uint64_t v_hold = v.data_shared_ptr() == k.data_shared_ptr() ? 0 : hold_kv_rows(v, s);
    auto view = [](const mx::array& a) {
      return std::array<int64_t, 3>{a.strides()[1], a.strides()[2], a.strides()[3]};
    };
    const auto qs = view(q), ks = view(k), vs = view(v);
    const void* qp = q.data<void>();
    const void* kp = k.data<void>();
    const void* vp = v.data<void>();
    void* op = out.data<void>();
    const mx::Dtype dtype = out.dtype();
    const float scale = scale_;
    const bool merged = merged_;
    enc.dispatch([=]() {
      by_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* qt = static_cast<const T*>(qp);
        const T* kt = static_cast<const T*>(kp);
        const T* vt = static_cast<const T*>(vp);
        attention_rows<T>(View4<T>{qt, qs[0], qs[1], qs[2]}, View4<T>{kt, ks[0], ks[1], ks[2]},
                          View4<T>{vt, vs[0], vs[1], vs[2]}, static_cast<T*>(op), hq, hkv, l, s, d, scale, merged);
      });
      release_kv_rows(k_hold);
      if (v_hold != 0) release_kv_rows(v_hold);
    });
  }


  const char* name() const override { return "AttentionRows"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const AttentionRows*>(&other);
    return o != nullptr && o->scale_ == scale_ && o->merged_ == merged_ && o->keys_ == keys_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {out_shape(inputs[0].shape(), merged_)};
  }

  static mx::Shape out_shape(const mx::Shape& q, bool merged) {
    return merged ? mx::Shape{1, q[2], q[1] * q[3]} : q;
  }

 private:
  float scale_;
  bool merged_;
  int keys_;
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

namespace {

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

}  // namespace

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

ArrPtr attention_rows_cpu(const Arr& q, const Arr& k, const Arr& v, float scale, bool merged, int32_t keys) {
  const mx::Stream st = mx::default_stream(mx::default_device());
  if (st.device != mx::Device::cpu) {
    throw std::invalid_argument("attention_rows_cpu runs on the CPU; the default device is a GPU");
  }
  const mx::array &qa = q.a, &ka = k.a, &va = v.a;
  if (qa.ndim() != 4 || ka.ndim() != 4 || va.ndim() != 4) {
    throw std::invalid_argument("attention_rows_cpu takes q [1, Hq, L, D] and k, v [1, Hkv, S, D]");
  }
  const int hq = qa.shape(1), l = qa.shape(2), d = qa.shape(3), hkv = ka.shape(1);
  if (keys > ka.shape(2)) {
    throw std::invalid_argument("attention_rows_cpu: " + std::to_string(keys) + " live keys in a buffer of " +
                                std::to_string(ka.shape(2)) + " rows");
  }
  const int s = keys >= 0 ? keys : ka.shape(2);
  if (qa.shape(0) != 1 || ka.shape(0) != 1 || va.shape() != ka.shape() || ka.shape(3) != d) {
    throw std::invalid_argument("attention_rows_cpu: q, k and v shapes do not match (batch 1, one head width)");
  }
  if (l < 1 || d < 1 || d > kAttnMaxDim || hkv < 1 || hq % hkv != 0 || s < l) {
    throw std::invalid_argument("attention_rows_cpu takes at least one query row, a head width up to " +
                                std::to_string(kAttnMaxDim) +
                                ", query heads a multiple of the KV heads and at least as many keys as rows; got L " +
                                std::to_string(l) + ", D " + std::to_string(d) + ", heads " + std::to_string(hq) +
                                "/" + std::to_string(hkv) + ", S " + std::to_string(s));
  }
  const mx::Dtype dt = qa.dtype();
  if (ka.dtype() != dt || va.dtype() != dt || !float_dtype(dt)) {
    throw std::invalid_argument("attention_rows_cpu takes f32, bf16 or f16 operands of one dtype");
  }
  return std::make_unique<Arr>(mx::array(AttentionRows::out_shape(qa.shape(), merged), dt,
                                         std::make_shared<AttentionRows>(st, scale, merged, keys),
                                         std::vector<mx::array>{qa, ka, va}));
}

}  // namespace mtp_mlx
