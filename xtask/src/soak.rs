//! `cargo xtask soak [args]`: the runner's `soak` example in release (chat
//! turns with MTP speculation until 20,000 tokens by default), its JSON
//! summary on stdout; the arguments pass through (`--model DIR`, `--tokens
//! N`, `--turn-tokens N`, `--cycle-tokens N`, `--prefix-cache-mib N`,
//! `--temperature T`, `--warmup-cycles N`, `--draft-tokens N`).

use anyhow::Result;

use crate::cmd;

/// Builds and runs the example, its output streamed.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut c = cmd::release_example("runner", "soak", args);
    cmd::run("soak", &mut c)
}
