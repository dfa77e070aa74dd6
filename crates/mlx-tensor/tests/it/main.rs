//! The one integration-test binary of `mlx-tensor`: a module per area, so the
//! crate's tests build and link once (`cargo test -p mlx-tensor --test it [filter]`).

mod common;

mod attention_rows;
mod dtype;
mod errors;
mod eval;
mod fast;
mod fused_cpu;
mod gather;
mod gather_rows;
mod io;
mod kv_write;
mod memory;
mod ops_elementwise;
mod ops_index;
mod ops_reduce;
mod ops_shape;
mod quantize;
mod random;
mod rows_matmul;
mod views;
