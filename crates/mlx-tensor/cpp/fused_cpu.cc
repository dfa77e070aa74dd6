// A decoder layer's small elementwise stages on the CPU, each as one MLX
// primitive of our own: RMSNorm, the attention heads' preparation (per-head
// RMSNorm, RoPE, the move to heads-first; once for q, once for k) and SwiGLU.
//
// Why: MLX's CPU backend has no fused RMSNorm or RoPE; `fast::rms_norm` and
// `fast::rope` fall back to their decompositions there (a norm is about
// nine graph nodes, a RoPE about twenty, its angles recomputed every call),
// and each node costs the host ~5 us to schedule and run on the CPU stream
// (`examples/dispatch-probe.rs`: 5.1-6.2 us per node for a chain of adds on
// a [1, 4096] array). A 24-layer decode step was 3,306 nodes, ~17 ms of a
// ~60 ms step; tiny-mtp's 840 nodes were over half of its ~7.6 ms step.
//
// Every row is computed alone by the same code whatever the row count, so a
// verify row equals the plain step's row bit for bit (greedy parity needs
// it). Numerics follow MLX's ops and our CUDA heads kernel: the norm's
// `x * rsqrt(mean(x^2) + eps)` is rounded to the dtype, then multiplied by
// the weight and rounded again; RoPE rotates in f32 with MLX's angle
// (`scale * position * base^(-2i/dims)`, or `1 / period` from a table) and
// rounds once; SwiGLU is `g / (1 + exp(-g)) * u` in f32, rounded once.

#include "mlx-tensor/cpp/shim.h"
#include "mlx-tensor/cpp/cpu_primitive.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx/types/half_types.h"

namespace mtp_mlx {

namespace {


// `v` rounded to `T` and back.
template <typename T>
inline float round_to(float v) {
  T t;
  narrow(v, &t);
  return widen(t);
}



// In place over `x[0..d]`: `x * rsqrt(mean(x^2) + eps)` rounded to `T`, times
// `w` rounded to `T`. The sum of squares runs in order.
template <typename T>
void norm_row(float* x, int d, const T* w, float eps) {
  float ss = 0.0f;
  for (int i = 0; i < d; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  for (int i = 0; i < d; ++i) x[i] = round_to<T>(widen(w[i]) * round_to<T>(x[i] * inv));
}

class RmsNormCpu : public CpuPrimitive {
 public:
  RmsNormCpu(mx::Stream s, float eps) : CpuPrimitive(s), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& x = inputs[0];
    const mx::array& w = inputs[1];
    mx::array& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.set_input_array(x);
    enc.set_input_array(w);
    enc.set_output_array(out);
    const mx::Shape shape = x.shape();
    const mx::Strides strides = x.strides();
    const int d = shape.back();
    const int64_t sd = strides.back(), sw = w.strides()[0];
    const int64_t rows = static_cast<int64_t>(x.size() / d);
    const void* xp = x.data<void>();
    const void* wp = w.data<void>();
    void* op = out.data<void>();
    const float eps = eps_;
    const mx::Dtype dtype = out.dtype();
    enc.dispatch([=]() {
      by_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* xs = static_cast<const T*>(xp);
        const T* ws = static_cast<const T*>(wp);
        T* o = static_cast<T*>(op);
        std::vector<float> row(d);
        std::vector<T> wd(d);
        for (int i = 0; i < d; ++i) wd[i] = ws[i * sw];
        for (int64_t r = 0; r < rows; ++r) {
          const T* src = xs + row_offset(shape, strides, r);
          for (int i = 0; i < d; ++i) row[i] = widen(src[i * sd]);
          norm_row(row.data(), d, wd.data(), eps);
          for (int i = 0; i < d; ++i) narrow(row[i], o + r * d + i);
        }
      });
    });
  }


  const char* name() const override { return "RmsNormCpu"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const RmsNormCpu*>(&other);
    return o != nullptr && o->eps_ == eps_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  float eps_;
};

// What `HeadsCpu` does to each head besides the move.
struct HeadsParams {
  bool norm;
  float eps;
  int offset;
  // Features rotated from the head's start (pairs `i`, `i + rot / 2`); the rest pass through.
  int rot;
  float log2_base, scale;
  bool freqs;
  // YaRN's attention scale on the rotated features (1: none).
  float mscale;
};

// `x` `[1, L, H, D]` (any strides) to `[1, H, L, D]`, each head through the
// optional RMSNorm, then RoPE.
class HeadsCpu : public CpuPrimitive {
 public:
  HeadsCpu(mx::Stream s, HeadsParams p) : CpuPrimitive(s), p_(p) {}

  // Long: unpacks the strided input, the optional norm weight and period
  // table, then one loop over rows and heads that reads, normalises, rotates
  // and writes each head.
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& enc = mx::cpu::get_command_encoder(stream());
    const mx::array& x = inputs[0];
    mx::array& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    enc.set_input_array(x);
    if (p_.norm) enc.set_input_array(inputs[1]);
    if (p_.freqs) enc.set_input_array(inputs[2]);
    enc.set_output_array(out);
    const int l = x.shape(1), heads = x.shape(2), d = x.shape(3);
    const int64_t s1 = x.strides()[1], s2 = x.strides()[2], s3 = x.strides()[3];
    const void* xp = x.data<void>();
    const void* wp = p_.norm ? inputs[1].data<void>() : nullptr;
    const int64_t ws = p_.norm ? inputs[1].strides()[0] : 0;
    const float* fr = p_.freqs ? inputs[2].data<float>() : nullptr;
    const int64_t fs = p_.freqs ? inputs[2].strides()[0] : 0;
    void* op = out.data<void>();
    const HeadsParams p = p_;
    const mx::Dtype dtype = out.dtype();
    enc.dispatch([=]() {
      by_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const int half = p.rot / 2;
        // Per-pair inverse frequencies, then per row the cosines and sines.
        std::vector<float> inv_freq(half), cs(half), sn(half), row(d);
        for (int i = 0; i < half; ++i) {
          inv_freq[i] = fr != nullptr ? static_cast<float>(1.0 / static_cast<double>(fr[i * fs]))
                                      : std::exp2(-(static_cast<float>(i) / static_cast<float>(half)) * p.log2_base);
        }
        std::vector<T> w(p.norm ? d : 0);
        for (int i = 0; i < static_cast<int>(w.size()); ++i) w[i] = static_cast<const T*>(wp)[i * ws];
        const T* in = static_cast<const T*>(xp);
        T* o_all = static_cast<T*>(op);
        for (int r = 0; r < l; ++r) {
          const float pos = p.scale * static_cast<float>(p.offset + r);
          for (int i = 0; i < half; ++i) {
            const float theta = pos * inv_freq[i];
            cs[i] = std::cos(theta);
            sn[i] = std::sin(theta);
          }
          for (int h = 0; h < heads; ++h) {
            const T* src = in + r * s1 + h * s2;
            for (int i = 0; i < d; ++i) row[i] = widen(src[i * s3]);
            if (p.norm) norm_row(row.data(), d, w.data(), p.eps);
            T* o = o_all + (static_cast<int64_t>(h) * l + r) * d;
            for (int i = 0; i < half; ++i) {
              const float a = row[i], b = row[i + half];
              float r0 = a * cs[i] - b * sn[i];
              float r1 = b * cs[i] + a * sn[i];
              if (p.mscale != 1.0f) {
                r0 *= p.mscale;
                r1 *= p.mscale;
              }
              narrow(r0, o + i);
              narrow(r1, o + i + half);
            }
            for (int i = p.rot; i < d; ++i) narrow(row[i], o + i);
          }
        }
      });
    });
  }


  const char* name() const override { return "HeadsCpu"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const HeadsCpu*>(&other);
    return o != nullptr && std::memcmp(&o->p_, &p_, sizeof(HeadsParams)) == 0;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const mx::Shape& x = inputs[0].shape();
    return {{1, x[2], x[1], x[3]}};
  }

 private:
  HeadsParams p_;
};

class SwigluCpu : public CpuPrimitive {
 public:
  explicit SwigluCpu(mx::Stream s) : CpuPrimitive(s) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& gu = inputs[0];
    mx::array& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.set_input_array(gu);
    enc.set_output_array(out);
    const mx::Shape shape = gu.shape();
    const mx::Strides strides = gu.strides();
    const int half = shape.back() / 2;
    const int64_t sd = strides.back();
    const int64_t rows = static_cast<int64_t>(out.size() / half);
    const void* gp = gu.data<void>();
    void* op = out.data<void>();
    const mx::Dtype dtype = out.dtype();
    enc.dispatch([=]() {
      by_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* g = static_cast<const T*>(gp);
        T* o = static_cast<T*>(op);
        for (int64_t r = 0; r < rows; ++r) {
          const T* row = g + row_offset(shape, strides, r);
          for (int j = 0; j < half; ++j) {
            const float a = widen(row[j * sd]);
            const float b = widen(row[(j + half) * sd]);
            narrow(a / (1.0f + std::exp(-a)) * b, o + r * half + j);
          }
        }
      });
    });
  }


  const char* name() const override { return "SwigluCpu"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const SwigluCpu*>(&other) != nullptr;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape s = inputs[0].shape();
    s.back() /= 2;
    return {s};
  }
};

mx::Stream cpu_stream(const char* what) {
  const mx::Stream s = mx::default_stream(mx::default_device());
  if (s.device != mx::Device::cpu) {
    throw std::invalid_argument(std::string(what) + " runs on the CPU; the default device is a GPU");
  }
  return s;
}

}  // namespace

ArrPtr rms_norm_cpu(const Arr& x, const Arr& w, float eps) {
  const mx::Stream s = cpu_stream("rms_norm_cpu");
  const mx::array &xa = x.a, &wa = w.a;
  if (xa.ndim() < 1 || wa.ndim() != 1 || xa.shape().back() != wa.shape(0) || wa.shape(0) < 1) {
    throw std::invalid_argument("rms_norm_cpu takes x [..., D] and a weight [D]");
  }
  if (!float_dtype(xa.dtype()) || wa.dtype() != xa.dtype()) {
    throw std::invalid_argument("rms_norm_cpu takes an f32, bf16 or f16 x and a weight of its dtype");
  }
  return std::make_unique<Arr>(
      mx::array(xa.shape(), xa.dtype(), std::make_shared<RmsNormCpu>(s, eps), std::vector<mx::array>{xa, wa}));
}

ArrPtr heads_cpu(const Arr& x, bool has_norm, const Arr& norm, float eps, int32_t offset, int32_t rot_dims,
                 float log2_base, float scale, bool has_freqs, const Arr& freqs, float mscale) {
  const mx::Stream s = cpu_stream("heads_cpu");
  const mx::array& xa = x.a;
  if (xa.ndim() != 4 || xa.shape(0) != 1) {
    throw std::invalid_argument("heads_cpu takes x [1, L, H, D]");
  }
  const int d = xa.shape(3);
  const mx::Dtype dt = xa.dtype();
  if (!float_dtype(dt)) {
    throw std::invalid_argument("heads_cpu takes an f32, bf16 or f16 x");
  }
  if (rot_dims < 2 || rot_dims > d || rot_dims % 2 != 0) {
    throw std::invalid_argument("heads_cpu rotates an even number of features, 2 to the head width " +
                                std::to_string(d) + "; got " + std::to_string(rot_dims));
  }
  if (offset < 0) {
    throw std::invalid_argument("heads_cpu: negative offset " + std::to_string(offset));
  }
  if (has_norm && (norm.a.ndim() != 1 || norm.a.shape(0) != d || norm.a.dtype() != dt)) {
    throw std::invalid_argument("heads_cpu: the norm weight must be [" + std::to_string(d) + "] in x's dtype");
  }
  if (has_freqs && (freqs.a.ndim() != 1 || freqs.a.shape(0) != rot_dims / 2 || freqs.a.dtype() != mx::float32)) {
    throw std::invalid_argument("heads_cpu: the period table must be f32 [" + std::to_string(rot_dims / 2) + "]");
  }
  // Inputs the primitive does not read are passed as x (MLX needs arrays).
  std::vector<mx::array> inputs{xa, has_norm ? norm.a : xa, has_freqs ? freqs.a : xa};
  const HeadsParams p{has_norm, eps, offset, rot_dims, log2_base, scale, has_freqs, mscale};
  return std::make_unique<Arr>(mx::array({1, xa.shape(2), xa.shape(1), d}, dt, std::make_shared<HeadsCpu>(s, p),
                                         std::move(inputs)));
}

ArrPtr swiglu_cpu(const Arr& gu) {
  const mx::Stream s = cpu_stream("swiglu_cpu");
  const mx::array& a = gu.a;
  if (a.ndim() < 1 || a.shape().back() < 2 || a.shape().back() % 2 != 0 || !float_dtype(a.dtype())) {
    throw std::invalid_argument("swiglu_cpu takes an f32, bf16 or f16 [..., 2 * I] gate-and-up array");
  }
  mx::Shape shape = a.shape();
  shape.back() /= 2;
  return std::make_unique<Arr>(mx::array(shape, a.dtype(), std::make_shared<SwigluCpu>(s), std::vector<mx::array>{a}));
}

}  // namespace mtp_mlx
