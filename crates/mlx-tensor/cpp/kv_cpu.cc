// A KV cache write on the CPU that writes in place whenever the only other
// users of the buffer are our own queued attention tasks reading rows below
// the write.
//
// Why: MLX's `slice_update` donates its input buffer to its output only when
// nothing else shares the buffer's data. Its CPU encoder queues each node's
// work on the stream's thread and holds the node's input data until that
// work has run; when the host builds a draft chain (several lazy steps in
// one graph) faster than that thread runs it, step i's attention still holds
// the buffer when step i + 1 writes, and the write copies the whole buffer
// (the MTP head's, at every draft step). `KvWriteCpu` counts those holders
// through `kv_holds.h` instead: if every user of the buffer's data other
// than the buffer itself is a recorded attention read of rows below the
// write, the rows it writes are read by no one and it writes in place; for
// any other user (a snapshot's view, a second handle on the buffer) it
// copies, as MLX does.
#include "mlx-tensor/cpp/shim.h"
#include "mlx-tensor/cpp/cpu_primitive.h"
#include "mlx-tensor/cpp/kv_holds.h"

#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

// MLX tells whether an array's descriptor has other users only through
// `is_donatable()`, which also asks that its data have none; the write
// needs the first question alone. An explicit instantiation may name a
// private member (a C++ rule, not an MLX API): `array_desc_` is the
// descriptor's shared pointer in the MLX headers we build against.
namespace mtp_mlx_private {
auto array_desc_member();
template <auto Member>
struct DescMember {
  friend auto array_desc_member() { return Member; }
};
template struct DescMember<&mx::array::array_desc_>;
}  // namespace mtp_mlx_private

namespace mtp_mlx {
namespace {

// Handles on `a`'s descriptor (the graph's and the caller's).
long desc_users(const mx::array& a) { return (a.*mtp_mlx_private::array_desc_member()).use_count(); }

struct Hold {
  const void* data;
  int64_t offset;
  mx::Strides strides;
  mx::Shape shape;
  int rows;
};

std::mutex holds_mu;
std::unordered_map<uint64_t, Hold> holds;
uint64_t next_ticket = 1;

// Whether `out = buf` with rows `[slot, ...)` overwritten may reuse `buf`'s
// storage: `buf` is row-contiguous and owns its data, no other handle or
// node uses its descriptor, and every other user of its data is a recorded
// read of rows below `slot` through the same layout.
//
// Race-free against the stream thread: a read is recorded before its task
// holds the data and released before it lets go, so the records never
// outnumber the holds they stand for; a count read first and records read
// after can only err towards copying.
bool writable_in_place(const mx::array& buf, int slot) {
  if (!buf.flags().row_contiguous || !buf.data_shared_ptr()->is_owned() || desc_users(buf) != 1) {
    return false;
  }
  const long users = buf.data_shared_ptr().use_count();
  if (users == 1) return true;
  const void* data = buf.data_shared_ptr().get();
  long recorded = 0;
  std::lock_guard<std::mutex> lock(holds_mu);
  for (const auto& [ticket, h] : holds) {
    if (h.data != data) continue;
    const bool below = h.offset == buf.offset() && h.strides == buf.strides() && h.shape[0] == buf.shape(0) &&
                       h.shape[1] == buf.shape(1) && h.shape[3] == buf.shape(3) && h.rows <= slot;
    if (!below) return false;
    ++recorded;
  }
  return users == 1 + recorded;
}

// Copies `[B, H, R, D]` elements of `size` bytes between strided layouts
// (strides in elements).
void copy_rows(const char* src, const mx::Strides& ss, char* dst, const mx::Strides& ds, const mx::Shape& shape,
               size_t size) {
  const bool rows_dense = ss[3] == 1 && ds[3] == 1;
  for (int b = 0; b < shape[0]; ++b) {
    for (int h = 0; h < shape[1]; ++h) {
      for (int r = 0; r < shape[2]; ++r) {
        const char* s = src + (b * ss[0] + h * ss[1] + r * ss[2]) * static_cast<int64_t>(size);
        char* d = dst + (b * ds[0] + h * ds[1] + r * ds[2]) * static_cast<int64_t>(size);
        if (rows_dense) {
          std::memcpy(d, s, shape[3] * size);
        } else {
          for (int i = 0; i < shape[3]; ++i) std::memcpy(d + i * ds[3] * size, s + i * ss[3] * size, size);
        }
      }
    }
  }
}

class KvWriteCpu : public CpuPrimitive {
 public:
  KvWriteCpu(mx::Stream s, int slot) : CpuPrimitive(s), slot_(slot) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& buf = inputs[0];
    const mx::array& upd = inputs[1];
    mx::array& out = outputs[0];
    const bool in_place = writable_in_place(buf, slot_);
    if (in_place) {
      out.copy_shared_buffer(buf);
    } else {
      out.set_data(mx::allocator::malloc(out.nbytes()));
    }
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.set_input_array(buf);
    enc.set_input_array(upd);
    enc.set_output_array(out);
    const char* bp = buf.data<char>();
    const char* up = upd.data<char>();
    char* op = out.data<char>();
    const mx::Strides bs = buf.strides(), us = upd.strides(), os = out.strides();
    const mx::Shape bshape = buf.shape(), ushape = upd.shape();
    const size_t size = out.itemsize();
    const int64_t at = slot_ * os[2] * static_cast<int64_t>(size);
    enc.dispatch([=]() {
      if (!in_place) copy_rows(bp, bs, op, os, bshape, size);
      copy_rows(up, us, op + at, os, ushape, size);
    });
  }

  const char* name() const override { return "KvWriteCpu"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const KvWriteCpu*>(&other);
    return o != nullptr && o->slot_ == slot_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override { return {inputs[0].shape()}; }

 private:
  int slot_;
};

}  // namespace

uint64_t hold_kv_rows(const mx::array& buf, int rows) {
  std::lock_guard<std::mutex> lock(holds_mu);
  const uint64_t ticket = next_ticket++;
  holds.emplace(ticket, Hold{buf.data_shared_ptr().get(), buf.offset(), buf.strides(), buf.shape(), rows});
  return ticket;
}

void release_kv_rows(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(holds_mu);
  holds.erase(ticket);
}

ArrPtr kv_write_cpu(const Arr& buffer, const Arr& update, int32_t slot) {
  const mx::Stream s = mx::default_stream(mx::default_device());
  if (s.device != mx::Device::cpu) {
    throw std::invalid_argument("kv_write_cpu runs on the CPU; the default device is a GPU");
  }
  const mx::array &b = buffer.a, &u = update.a;
  if (b.ndim() != 4 || u.ndim() != 4) {
    throw std::invalid_argument("kv_write_cpu takes a buffer and an update of rank 4 [B, H, S, D]; got ranks " +
                                std::to_string(b.ndim()) + " and " + std::to_string(u.ndim()));
  }
  if (u.shape(0) != b.shape(0) || u.shape(1) != b.shape(1) || u.shape(3) != b.shape(3) || u.dtype() != b.dtype()) {
    throw std::invalid_argument("kv_write_cpu: the update [" + std::to_string(u.shape(0)) + ", " +
                                std::to_string(u.shape(1)) + ", L, " + std::to_string(u.shape(3)) +
                                "] must match the buffer [" + std::to_string(b.shape(0)) + ", " +
                                std::to_string(b.shape(1)) + ", S, " + std::to_string(b.shape(3)) +
                                "] in B, H, D and dtype");
  }
  if (slot < 0 || static_cast<int64_t>(slot) + u.shape(2) > b.shape(2)) {
    throw std::invalid_argument("kv_write_cpu: rows " + std::to_string(slot) + ".." +
                                std::to_string(static_cast<int64_t>(slot) + u.shape(2)) + " do not fit a buffer of " +
                                std::to_string(b.shape(2)) + " rows");
  }
  return std::make_unique<Arr>(
      mx::array(b.shape(), b.dtype(), std::make_shared<KvWriteCpu>(s, slot), std::vector<mx::array>{b, u}));
}

}  // namespace mtp_mlx
