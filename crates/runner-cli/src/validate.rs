//! Option checks that run before any weight is loaded: conflicting flags and
//! out-of-range sampling values fail in milliseconds, not after a load.

use anyhow::{Context, Result};

use crate::Usage;
use crate::args::{DecodeArgs, SpeculativeArg};

/// Fails with a [`Usage`] error naming the flags when `a` contradicts itself
/// or a sampling value is out of range (with generation_config.json's
/// defaults, read without the weights).
pub(crate) fn decode_args(a: &DecodeArgs) -> Result<()> {
    conflicts(a)?;
    // FIFOs, devices, dangling links and git-lfs pointers fail here, before
    // anything (the generation_config.json read below included) opens them.
    for dir in std::iter::once(&a.model).chain(a.draft_model.as_ref()) {
        runner::check_model_folder(dir)
            .with_context(|| format!("checking the model folder {}", dir.display()))?;
    }
    // A folder without generation_config.json means all defaults; a broken one is
    // reported by the load that follows, which names the file.
    let g = runner::GenerationConfig::load(&a.model).unwrap_or_default();
    crate::sampling(a, &g)
        .validate()
        .map_err(|e| Usage(format!("{e}")))?;
    Ok(())
}

/// Flags that contradict each other.
fn conflicts(a: &DecodeArgs) -> Result<()> {
    if a.temperature == Some(0.0) {
        let filters = [
            ("--top-k", a.top_k.is_some()),
            ("--top-p", a.top_p.is_some()),
            ("--min-p", a.min_p.is_some()),
        ];
        if let Some((flag, _)) = filters.iter().find(|(_, given)| *given) {
            return Err(Usage(format!(
                "{flag} has no effect with --temperature 0 (greedy decoding takes the most likely \
                 token): drop {flag}, or pass a temperature above 0 to sample"
            ))
            .into());
        }
    }
    if a.draft_model.is_some()
        && matches!(
            a.speculative,
            SpeculativeArg::Off | SpeculativeArg::Mtp | SpeculativeArg::Ngram
        )
    {
        let name = a.speculative.name();
        return Err(Usage(format!(
            "--draft-model is not used with --speculative {name}: pass --speculative draft-model \
             (or auto) to draft with it, or drop --draft-model"
        ))
        .into());
    }
    if a.stop.iter().any(String::is_empty) {
        return Err(Usage(
            "--stop '' would stop before the first token: pass a non-empty stop string, or drop \
             --stop"
                .into(),
        )
        .into());
    }
    if a.speculative == SpeculativeArg::DraftModel && a.draft_model.is_none() {
        return Err(Usage(
            "--speculative draft-model needs --draft-model DIR (a smaller model with the same \
             tokenizer)"
                .into(),
        )
        .into());
    }
    Ok(())
}

/// Bytes of `--prefix-cache-mib`, or a usage error when they overflow.
pub(crate) fn prefix_cache_bytes(mib: usize) -> Result<usize> {
    mib.checked_mul(1 << 20).ok_or_else(|| {
        Usage(format!(
            "--prefix-cache-mib {mib} is more memory than this machine can address; pass a few \
             hundred MiB (default 256) or 0 to turn the cache off"
        ))
        .into()
    })
}

/// `bytes` as text, or a usage error naming `what` and the first bad byte.
pub(crate) fn utf8(bytes: Vec<u8>, what: &str) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        Usage(format!(
            "{what} is not UTF-8 (invalid byte 0x{:02x} at offset {at}); convert it first, for \
             example with `iconv -t UTF-8`",
            e.as_bytes()[at]
        ))
        .into()
    })
}
