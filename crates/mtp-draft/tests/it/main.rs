//! The one integration-test binary of `mtp-draft`: a module per area, so the
//! crate's tests build and link once (`cargo test -p mtp-draft --test it [filter]`).

mod common;

mod pairing_props;
mod sampling;
mod scenarios;
mod timeline;
