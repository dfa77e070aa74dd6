// The base of our CPU-only MLX primitives (cpp/rows_cpu.cc, cpp/fused_cpu.cc):
// their builders refuse a GPU default device, and `eval_gpu` says so too.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/primitives.h"

namespace mtp_mlx {

class CpuPrimitive : public mlx::core::Primitive {
 public:
  using mlx::core::Primitive::Primitive;

  void eval_gpu(const std::vector<mlx::core::array>&, std::vector<mlx::core::array>&) override {
    throw std::runtime_error(std::string(name()) + " runs on the CPU only");
  }
};

}  // namespace mtp_mlx
