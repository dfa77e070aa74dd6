//! The `mtp-runner` binary.
fn main() -> anyhow::Result<()> {
    Ok(())
}
