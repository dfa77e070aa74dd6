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
#include "mlx-tensor/cpp/rows_kernels.h"
#include "mlx-tensor/cpp/kv_holds.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace mtp_mlx {

using namespace rows;

namespace {

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
