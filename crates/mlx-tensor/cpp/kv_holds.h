// Pending reads of KV cache buffers by our CPU tasks (cpp/kv_cpu.cc).
//
// MLX's CPU encoder runs a node's work later, on the stream's thread, and
// keeps its inputs' data alive until then. A cache write (`KvWriteCpu`)
// encoded while an earlier attention task that reads the same buffer is
// still queued therefore sees the buffer shared and copies all of it,
// although that task reads only rows below the write. An attention task of
// ours records what it reads here when it is encoded and drops the record
// when it has run, so the write can tell such holders from any other.
#pragma once

#include <cstdint>

#include "mlx/array.h"

namespace mtp_mlx {

// Records that a task about to be encoded reads rows `[0, rows)` along axis
// 2 of `buf` (`[B, H, S, D]`, any strides); returns the record's ticket.
uint64_t hold_kv_rows(const mlx::core::array& buf, int rows);

// Drops the record `ticket` (from the task, once it has read the rows).
void release_kv_rows(uint64_t ticket);

}  // namespace mtp_mlx
