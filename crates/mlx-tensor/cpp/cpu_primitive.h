// What our CPU-only MLX primitives (cpp/rows_*.cc, cpp/attention_cpu.cc,
// cpp/fused_cpu.cc, cpp/kv_cpu.cc) share: their base (their builders refuse
// a GPU default device, and `eval_gpu` says so too), dtype dispatch, element
// widening and rounding, and row offsets through strides.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/primitives.h"
#include "mlx/dtype.h"
#include "mlx/types/half_types.h"

namespace mtp_mlx {

class CpuPrimitive : public mlx::core::Primitive {
 public:
  using mlx::core::Primitive::Primitive;

  void eval_gpu(const std::vector<mlx::core::array>&, std::vector<mlx::core::array>&) override {
    throw std::runtime_error(std::string(name()) + " runs on the CPU only");
  }
};

// Element loads widened to f32, and f32 results rounded to the element type.
inline float widen(float v) { return v; }
inline float widen(mlx::core::bfloat16_t v) { return static_cast<float>(v); }
inline float widen(mlx::core::float16_t v) { return static_cast<float>(v); }
inline void narrow(float v, float* o) { *o = v; }
inline void narrow(float v, mlx::core::bfloat16_t* o) { *o = mlx::core::bfloat16_t(v); }
inline void narrow(float v, mlx::core::float16_t* o) { *o = mlx::core::float16_t(v); }

// The element types our CPU primitives take.
inline bool float_dtype(mlx::core::Dtype d) {
  return d == mlx::core::float32 || d == mlx::core::bfloat16 || d == mlx::core::float16;
}

// Runs `f(tag)` with `tag` a value of the element type `dtype` names (one of
// `float_dtype`'s; the builders refuse the others).
template <typename F>
void by_dtype(mlx::core::Dtype dtype, F&& f) {
  if (dtype == mlx::core::float32) {
    f(float{});
  } else if (dtype == mlx::core::bfloat16) {
    f(mlx::core::bfloat16_t{});
  } else {
    f(mlx::core::float16_t{});
  }
}

// The element offset of row `r` of an array of `shape` and `strides` viewed
// as `[rows, shape.back()]` (its leading axes, any strides).
inline int64_t row_offset(const mlx::core::Shape& shape, const mlx::core::Strides& strides, int64_t r) {
  int64_t off = 0;
  for (int ax = static_cast<int>(shape.size()) - 2; ax >= 0; --ax) {
    off += (r % shape[ax]) * strides[ax];
    r /= shape[ax];
  }
  return off;
}

}  // namespace mtp_mlx
