//! The one integration-test binary of `runner-cli`: a module per area, so the
//! crate's tests build and link once (`cargo test -p runner-cli --test it [filter]`).

mod common;

mod chat_cli;
mod cli;
mod drafters_cli;
mod quantize;
mod robust_cli;
mod serve;
mod spec_cli;
