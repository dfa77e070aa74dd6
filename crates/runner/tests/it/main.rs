//! The one integration-test binary of `runner`: a module per area, so the
//! crate's tests build and link once (`cargo test -p runner --test it [filter]`).

mod common;
// The upscale widening code is xtask's own file (tests/it/upscale.rs).
#[path = "../../../../xtask/src/upscale/widen.rs"]
#[allow(dead_code)]
mod widen;
// And its Qwen3.5-MoE rules, which use `widen` (tests/it/upscale_moe.rs).
#[path = "../../../../xtask/src/upscale/moe.rs"]
#[allow(dead_code)]
mod widen_moe;
#[path = "../fixtures/hybrid/writer.rs"]
mod writer;

mod attention_paths;
mod bad_input;
mod cancel;
mod config_keys;
mod draft_head;
mod drafters;
mod families;
mod formats;
mod fp8;
mod hybrid_chat;
mod hybrid_draft;
mod hybrid_forward;
mod hybrid_parity;
mod hybrid_prefix;
mod hybrid_rewind;
mod hybrid_spec;
mod loading;
mod moe;
mod moe_families;
mod moe_model;
mod moe_quant;
mod mtp_layouts;
mod parity;
mod prefix_chat;
mod quantized;
mod reference;
mod robust_cancel;
mod robust_fuzz;
mod robust_seed;
mod robust_template;
mod shape_buckets;
mod soak;
mod spec_memory;
mod spec_parity;
mod spec_plain_stretch;
mod spec_sampling;
mod spec_syncs;
mod streaming;
mod strict_loading;
mod upscale;
mod upscale_moe;
