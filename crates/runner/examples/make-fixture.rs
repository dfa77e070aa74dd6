//! Writes a random-weight checkpoint folder for tests and demos.
//!
//! `cargo run -p runner --features testing --example make-fixture -- --arch qwen3 --out DIR [--tied|--untied] [--seed N] [--bf16] [--mtp]`
use std::path::PathBuf;

use runner::testing::{Arch, Fixture, write_checkpoint};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut fx = Fixture::new(Arch::Qwen3);
    let mut out = None;
    let mut seed = 0u64;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--arch" => {
                let name = args.next().ok_or("--arch needs a value")?;
                let arch = Arch::parse(&name).ok_or(format!(
                    "unknown --arch {name}: llama, llama3, mistral, qwen2, qwen3"
                ))?;
                fx = Fixture {
                    arch,
                    ..Fixture::new(arch)
                };
            }
            "--out" => out = Some(PathBuf::from(args.next().ok_or("--out needs a value")?)),
            "--seed" => seed = args.next().ok_or("--seed needs a value")?.parse()?,
            "--tied" => fx.tied = true,
            "--untied" => fx.tied = false,
            "--bf16" => fx.dtype = mlx_tensor::Dtype::Bfloat16,
            "--mtp" => fx.mtp = true,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let out = out.ok_or("--out DIR is required")?;
    write_checkpoint(&out, &fx, seed)?;
    tracing::info!(dir = %out.display(), "fixture written");
    Ok(())
}
