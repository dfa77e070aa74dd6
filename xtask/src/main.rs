//! `cargo xtask`: the one entry point for CI checks, benchmarks and fixtures.
fn main() -> anyhow::Result<()> {
    Ok(())
}
