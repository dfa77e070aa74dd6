//! The one integration-test binary of `sampler`: a module per area, so the
//! crate's tests build and link once (`cargo test -p sampler --test it [filter]`).

mod support;

mod acceptance;
mod filters;
mod options;
mod penalties;
mod properties;
mod residual;
mod statistics;
