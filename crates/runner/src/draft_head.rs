//! How the MTP head drafts, chosen at load: the precision of its weights
//! ([`DraftQuant`]) and the vocabulary it drafts over ([`DraftVocab`]).
//! Neither changes the output (see `MtpHead::quantized` and
//! `MtpHead::with_draft_vocab`): only how often drafts are accepted and what
//! a draft step costs.

use crate::error::{Error, Result};
use crate::quant::QuantParams;

/// `Auto`'s reading of the variable `var`: its value parsed by `parse` when
/// set, `None` when unset; a value `parse` refuses is an error naming the
/// variable and `accepted`.
fn from_env<T>(
    var: &'static str,
    accepted: &str,
    parse: impl Fn(&str) -> Result<T>,
) -> Result<Option<T>> {
    match std::env::var(var) {
        Ok(v) => parse(&v).map(Some).map_err(|_| Error::InvalidOption {
            option: var,
            message: format!("`{v}` is not {accepted}"),
        }),
        Err(_) => Ok(None),
    }
}

/// What `--draft-quant` and `MTP_DRAFT_QUANT` accept.
const QUANT_VALUES: &str = "one of auto, off, q8, q4";

/// What `--draft-vocab` and `MTP_DRAFT_VOCAB` accept.
const VOCAB_VALUES: &str = "auto, off or a token count of at least 1";

/// The precision of the MTP head's drafting weights (its unembedding,
/// projection and block; the trunk keeps its own), chosen at load: see
/// `MtpHead::quantized` for why any choice keeps the output exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DraftQuant {
    /// `MTP_DRAFT_QUANT` (`off`, `q8`, `q4`) when set, else [`DraftQuant::default_for`].
    #[default]
    Auto,
    /// The head drafts with the weights as loaded.
    Off,
    /// Affine quantization to this many bits (4 or 8), groups of 64.
    Bits(u32),
}

/// The group size of a quantized draft head (MLX's and mlx-lm's default).
pub(crate) const DRAFT_GROUP_SIZE: u32 = 64;

impl DraftQuant {
    /// Reads `off`, `q8` or `q4` (`auto` for [`DraftQuant::Auto`]).
    pub fn parse(s: &str) -> Result<DraftQuant> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DraftQuant::Auto),
            "off" | "none" => Ok(DraftQuant::Off),
            "q8" | "8" => Ok(DraftQuant::Bits(8)),
            "q4" | "4" => Ok(DraftQuant::Bits(4)),
            other => Err(Error::InvalidOption {
                option: "draft-quant",
                message: format!("`{other}` is not {QUANT_VALUES}"),
            }),
        }
    }

    /// The choice without `MTP_DRAFT_QUANT`: what pays on `device` for a
    /// model loaded in `dtype` (see docs/gpu.md, "draft head precision").
    pub fn default_for(device: mlx_tensor::Device, dtype: mlx_tensor::Dtype) -> DraftQuant {
        let _ = (device, dtype);
        DraftQuant::Off
    }

    /// The parameters to quantize with, or `None` for full precision:
    /// `Auto` resolved through `MTP_DRAFT_QUANT` (an unreadable value is an
    /// error naming the variable) and then [`DraftQuant::default_for`].
    pub fn resolve(
        self,
        device: mlx_tensor::Device,
        dtype: mlx_tensor::Dtype,
    ) -> Result<Option<QuantParams>> {
        let chosen = match self {
            DraftQuant::Auto => match from_env("MTP_DRAFT_QUANT", QUANT_VALUES, DraftQuant::parse)?
            {
                None | Some(DraftQuant::Auto) => DraftQuant::default_for(device, dtype),
                Some(q) => q,
            },
            q => q,
        };
        match chosen {
            DraftQuant::Bits(bits @ (4 | 8)) => {
                Ok(Some(QuantParams::affine(DRAFT_GROUP_SIZE, bits)))
            }
            DraftQuant::Bits(bits) => Err(Error::InvalidOption {
                option: "draft-quant",
                message: format!("{bits} bits: a draft head is quantized to 4 or 8 bits"),
            }),
            _ => Ok(None),
        }
    }
}

/// The vocabulary the MTP head drafts over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DraftVocab {
    /// `MTP_DRAFT_VOCAB` (`off` or a count) when set, else [`DraftVocab::Off`].
    #[default]
    Auto,
    /// The whole vocabulary.
    Off,
    /// The `n` lowest token ids, plus the special tokens (end-of-sequence
    /// and added tokens) wherever they lie. Byte-level BPE vocabularies
    /// (Qwen, DeepSeek, GLM, MiMo) number their tokens in merge order, so the
    /// lowest ids are the most frequent pieces of the tokenizer's corpus.
    Top(usize),
}

impl DraftVocab {
    /// Reads `auto`, `off` or a token count of at least 1.
    pub fn parse(s: &str) -> Result<DraftVocab> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "auto" => Ok(DraftVocab::Auto),
            "off" => Ok(DraftVocab::Off),
            _ => match s.parse::<usize>() {
                Ok(n) if n > 0 => Ok(DraftVocab::Top(n)),
                _ => Err(Error::InvalidOption {
                    option: "draft-vocab",
                    message: format!("`{s}` is not {VOCAB_VALUES}"),
                }),
            },
        }
    }

    /// The token count to draft over, or `None` for the whole vocabulary:
    /// `Auto` resolved through `MTP_DRAFT_VOCAB` (an unreadable value is an
    /// error naming the variable).
    pub fn resolve(self) -> Result<Option<usize>> {
        let chosen = match self {
            DraftVocab::Auto => from_env("MTP_DRAFT_VOCAB", VOCAB_VALUES, DraftVocab::parse)?
                .unwrap_or(DraftVocab::Off),
            v => v,
        };
        Ok(match chosen {
            DraftVocab::Top(n) => Some(n),
            _ => None,
        })
    }
}

/// What load asks of the MTP head (see [`crate::Model::adapt_draft_head`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DraftHeadSetup {
    /// Affine-quantize the drafting weights to these parameters.
    pub quant: Option<QuantParams>,
    /// Draft over these token ids only (distinct, ascending).
    pub vocab: Option<Vec<u32>>,
}

impl DraftHeadSetup {
    /// Resolves `quant` and `vocab` for a model of `vocab_size` tokens
    /// whose special tokens are `special`, on `device` in `dtype`. A count
    /// that covers the whole vocabulary drafts over all of it.
    pub(crate) fn resolve(
        quant: DraftQuant,
        vocab: DraftVocab,
        vocab_size: usize,
        special: &[u32],
        device: mlx_tensor::Device,
        dtype: mlx_tensor::Dtype,
    ) -> Result<DraftHeadSetup> {
        Ok(DraftHeadSetup {
            quant: quant.resolve(device, dtype)?,
            vocab: vocab
                .resolve()?
                .and_then(|n| draft_ids(vocab_size, n, special)),
        })
    }

    /// True when the head is drafted with its weights as loaded.
    pub fn is_plain(&self) -> bool {
        self.quant.is_none() && self.vocab.is_none()
    }
}

/// The ids `0..n` and every `special` id below `vocab_size`, ascending; `None`
/// when that is the whole vocabulary.
fn draft_ids(vocab_size: usize, n: usize, special: &[u32]) -> Option<Vec<u32>> {
    let mut ids: Vec<u32> = (0..n.min(vocab_size) as u32).collect();
    ids.extend(
        special
            .iter()
            .copied()
            .filter(|&s| (s as usize) >= n && (s as usize) < vocab_size),
    );
    ids.sort_unstable();
    ids.dedup();
    (ids.len() < vocab_size).then_some(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_tensor::{Device, Dtype};

    /// `DraftQuant::parse(input)` is `want`, or an `InvalidOption` on
    /// `draft-quant` naming the input and every accepted value.
    fn check(input: &str, want: Option<DraftQuant>) {
        match (DraftQuant::parse(input), want) {
            (Ok(got), Some(want)) => assert_eq!(got, want, "parse({input:?})"),
            (Err(e), None) => {
                let Error::InvalidOption { option, message } = &e else {
                    panic!("parse({input:?}): not InvalidOption: {e:?}");
                };
                assert_eq!(*option, "draft-quant", "parse({input:?})");
                let named = format!("`{}`", input.trim().to_ascii_lowercase());
                assert!(message.contains(&named), "parse({input:?}): {message}");
                for accepted in ["auto", "off", "q8", "q4"] {
                    assert!(message.contains(accepted), "parse({input:?}): {message}");
                }
            }
            (got, want) => panic!("parse({input:?}) = {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn draft_quant_parses_its_names_and_rejects_the_rest() {
        check("auto", Some(DraftQuant::Auto));
        check("off", Some(DraftQuant::Off));
        check("q8", Some(DraftQuant::Bits(8)));
        check("q4", Some(DraftQuant::Bits(4)));
        check("  Q4\n", Some(DraftQuant::Bits(4)));
        check("AUTO", Some(DraftQuant::Auto));
        check(" Off ", Some(DraftQuant::Off));
        check("q3", None);
        check("", None);
        check("eight", None);
        check("q16", None);
        check("Q2", None);
    }

    #[test]
    fn explicit_draft_quant_resolves_to_group_64_at_4_or_8_bits() {
        for device in [Device::Cpu, Device::Gpu] {
            for dtype in [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
                let resolve = |q: DraftQuant| q.resolve(device, dtype);
                for bits in [4, 8] {
                    assert_eq!(
                        resolve(DraftQuant::Bits(bits)).unwrap(),
                        Some(QuantParams::affine(64, bits)),
                        "{bits} bits on {device:?} {dtype:?}"
                    );
                }
                assert_eq!(resolve(DraftQuant::Off).unwrap(), None);
                // MLX implements 3, 2, 5 and 6 bits too; a draft head takes 4 or 8 only.
                for bits in [0, 2, 3, 16] {
                    match resolve(DraftQuant::Bits(bits)) {
                        Err(Error::InvalidOption { option, message }) => {
                            assert_eq!(option, "draft-quant");
                            assert!(
                                message.contains(&format!("{bits} bits"))
                                    && message.contains("4 or 8"),
                                "{message}"
                            );
                        }
                        other => panic!("Bits({bits}) resolved to {other:?}"),
                    }
                }
            }
        }
    }

    /// Without `MTP_DRAFT_QUANT`, `Auto` is [`DraftQuant::default_for`]. Read
    /// only: tests share the process environment, so none sets the variable
    /// (the CLI tests run the binary with it set), and when the caller's
    /// environment sets it there is nothing to check here.
    #[test]
    fn auto_draft_quant_without_the_variable_is_the_backend_default() {
        if std::env::var_os("MTP_DRAFT_QUANT").is_some() {
            return;
        }
        for device in [Device::Cpu, Device::Gpu] {
            for dtype in [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
                let default = DraftQuant::default_for(device, dtype);
                assert_ne!(default, DraftQuant::Auto, "{device:?} {dtype:?}");
                assert_eq!(
                    DraftQuant::Auto.resolve(device, dtype).unwrap(),
                    default.resolve(device, dtype).unwrap(),
                    "{device:?} {dtype:?}"
                );
            }
        }
    }

    #[test]
    fn draft_vocab_parses_auto_off_and_counts() {
        assert_eq!(DraftVocab::parse("auto").unwrap(), DraftVocab::Auto);
        assert_eq!(DraftVocab::parse(" OFF ").unwrap(), DraftVocab::Off);
        assert_eq!(DraftVocab::parse("32768").unwrap(), DraftVocab::Top(32768));
        for bad in ["0", "", "-3", "32k", "all"] {
            let e = DraftVocab::parse(bad).unwrap_err();
            let Error::InvalidOption { option, message } = &e else {
                panic!("{bad:?}: {e:?}");
            };
            assert_eq!(*option, "draft-vocab");
            assert!(message.contains(&format!("`{}`", bad.trim())), "{message}");
        }
        assert_eq!(DraftVocab::Top(5).resolve().unwrap(), Some(5));
        assert_eq!(DraftVocab::Off.resolve().unwrap(), None);
    }

    #[test]
    fn draft_ids_are_the_lowest_ids_and_the_special_ones() {
        assert_eq!(draft_ids(10, 4, &[9, 2, 12]), Some(vec![0, 1, 2, 3, 9]));
        // Covering the whole vocabulary means no subset.
        assert_eq!(draft_ids(10, 10, &[]), None);
        assert_eq!(draft_ids(10, 9, &[9]), None);
        assert_eq!(draft_ids(10, 50, &[]), None);
    }
}
