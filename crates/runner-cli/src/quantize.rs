//! `mtp-runner quantize`: arguments and output around `runner::quantize_folder`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use mlx_tensor::ops::QuantMode;
use runner::{QuantizeOptions, QuantizeReport, quantize_folder_cancellable};
use serde::Serialize;

/// Examples shown after `quantize --help`.
pub(crate) const AFTER_HELP: &str = "EXAMPLES:
  mtp-runner quantize --model models/tiny-mtp --out /tmp/tiny-mtp-4bit
  mtp-runner quantize --model DIR --out DIR-8bit --bits 8 --group-size 32
  mtp-runner quantize --model DIR --out DIR-4bit --keep-mtp-precision
  mtp-runner quantize --model DIR --out DIR-mxfp4 --mode mxfp4

The output is mlx-lm's format (uint32-packed `weight`, `scales`, `biases`; a
`quantization` block in config.json) and also loads in mlx-lm. The
floating-point modes (mxfp4, mxfp8, nvfp4: mlx_lm.convert's --q-mode) store
uint8 scales and no biases, and fix their bits and group size.
--keep-mtp-precision leaves the MTP head's matrices unquantized (marked false
in the block): use it when drafts from a quantized head are accepted less often.";

/// `quantize` options.
#[derive(Debug, Args)]
pub(crate) struct QuantizeArgs {
    /// Model folder to quantize (config.json, *.safetensors, tokenizer files).
    #[arg(long, short)]
    pub model: PathBuf,
    /// New folder to write (must not exist or be empty).
    #[arg(long, short)]
    pub out: PathBuf,
    /// Quantization mode: affine, or a floating-point mode (mxfp4, mxfp8,
    /// nvfp4) with its own bits and group size.
    #[arg(long, default_value = "affine", value_parser = parse_mode)]
    pub mode: QuantMode,
    /// Bits per weight: 4 or 8 [default: 4, or the mode's].
    #[arg(long)]
    pub bits: Option<u32>,
    /// Weights sharing one scale and bias: 32, 64 or 128 [default: 64, or the mode's].
    #[arg(long)]
    pub group_size: Option<u32>,
    /// Keep the MTP head's matrices unquantized.
    #[arg(long)]
    pub keep_mtp_precision: bool,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The `--json` summary.
#[derive(Debug, Serialize)]
struct Summary<'a> {
    out: String,
    mode: &'static str,
    bits: u32,
    group_size: u32,
    keep_mtp_precision: bool,
    quantized: usize,
    other_precision: &'a [(String, u32, u32)],
    kept: &'a [String],
    copied: &'a [String],
    source_bytes: u64,
    written_bytes: u64,
}

/// Runs `quantize`.
pub(crate) fn run(a: QuantizeArgs) -> Result<u8> {
    let defaults = QuantizeOptions::for_mode(a.mode);
    let opts = QuantizeOptions {
        bits: a.bits.unwrap_or(defaults.bits),
        group_size: a.group_size.unwrap_or(defaults.group_size),
        keep_mtp_precision: a.keep_mtp_precision,
        ..defaults
    };
    // Ctrl-C sets the flag, checked between tensors: the staging folder is
    // removed and nothing appears at --out (exit 130).
    let interrupt = crate::signal::Interrupt::install()?;
    interrupt.cooperative();
    crate::output::check_stdout_open()?;
    let r: QuantizeReport = quantize_folder_cancellable(&a.model, &a.out, &opts, interrupt.flag())
        .with_context(|| format!("quantizing {} into {}", a.model.display(), a.out.display()))?;
    let mut out = Vec::new();
    if a.json {
        let s = Summary {
            out: a.out.display().to_string(),
            mode: opts.mode.name(),
            bits: opts.bits,
            group_size: opts.group_size,
            keep_mtp_precision: a.keep_mtp_precision,
            quantized: r.quantized.len(),
            other_precision: &r.other_precision,
            kept: &r.kept,
            copied: &r.copied,
            source_bytes: r.source_bytes,
            written_bytes: r.written_bytes,
        };
        serde_json::to_writer_pretty(&mut out, &s)?;
        writeln!(out)?;
    } else {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        // Modules packed otherwise (MoE routers), counted per (bits, group).
        let mut other = std::collections::BTreeMap::<(u32, u32), usize>::new();
        for (_, b, g) in &r.other_precision {
            *other.entry((*b, *g)).or_default() += 1;
        }
        let other: String = other
            .iter()
            .map(|((b, g), n)| format!("; {n} of them at {b} bits, group {g}"))
            .collect();
        writeln!(
            out,
            "wrote {}: {} matrices {} at {} bits (group {}{other}), {} kept unquantized; {:.1} MiB → {:.1} MiB",
            a.out.display(),
            r.quantized.len(),
            opts.mode.name(),
            opts.bits,
            opts.group_size,
            r.kept.len(),
            mib(r.source_bytes),
            mib(r.written_bytes)
        )?;
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&out)
        .and_then(|()| stdout.flush())
        .map_err(crate::output::write_error)?;
    Ok(0)
}

/// `--mode`: one of MLX's quantization modes, by the name config.json uses.
fn parse_mode(s: &str) -> std::result::Result<QuantMode, String> {
    QuantMode::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = QuantMode::ALL.iter().map(|m| m.name()).collect();
        format!("unknown mode `{s}`; use one of {}", names.join(", "))
    })
}
