//! The one integration-test binary of `kvcache`: a module per area, so the
//! crate's tests build and link once (`cargo test -p kvcache --test it [filter]`).

mod common;

mod errors;
mod kv;
mod props;
mod recurrent;
mod rollback;
mod rotating;
