//! How the MTP head drafts, chosen at load: the precision of its weights
//! ([`DraftQuant`]) and the vocabulary it drafts over ([`DraftVocab`]).
//! Neither changes the output (see `MtpHead::quantized` and
//! `MtpHead::with_draft_vocab`): only how often drafts are accepted and what
//! a draft step costs.

use crate::error::{Error, Result};
use crate::quant::{DraftQuant, QuantParams};

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
                    message: format!("`{s}` is not auto, off or a token count of at least 1"),
                }),
            },
        }
    }

    /// The token count to draft over, or `None` for the whole vocabulary:
    /// `Auto` resolved through `MTP_DRAFT_VOCAB` (an unreadable value is an
    /// error naming the variable).
    pub fn resolve(self) -> Result<Option<usize>> {
        let chosen = match self {
            DraftVocab::Auto => match std::env::var("MTP_DRAFT_VOCAB") {
                Ok(v) => DraftVocab::parse(&v).map_err(|_| Error::InvalidOption {
                    option: "MTP_DRAFT_VOCAB",
                    message: format!("`{v}` is not auto, off or a token count of at least 1"),
                })?,
                Err(_) => DraftVocab::Off,
            },
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
