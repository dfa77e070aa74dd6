//! The crate's error type: bad options, mismatched shapes and MLX failures.

/// Errors from building distributions, sampling and speculative acceptance.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A sampling option is outside its allowed range (or NaN).
    #[error("sampling option `{name}` = {value} is invalid: it must be {allowed}")]
    InvalidOption {
        /// The option's field name in [`crate::Options`].
        name: &'static str,
        /// The value given.
        value: f32,
        /// The allowed range, in words.
        allowed: &'static str,
    },
    /// A token id appears twice in [`crate::Options::logit_bias`].
    #[error("sampling option `logit_bias` names token {token} twice: give each token one bias")]
    DuplicateBias {
        /// The repeated token id.
        token: u32,
    },
    /// A token id of [`crate::Options::logit_bias`] is outside the vocabulary.
    #[error(
        "sampling option `logit_bias` names token {token}, outside the vocabulary of {vocab} \
         tokens"
    )]
    BiasOutsideVocabulary {
        /// The token id.
        token: u32,
        /// The logits' width.
        vocab: usize,
    },
    /// The penalty history keeps fewer tokens than the options' window asks for.
    #[error(
        "the penalty history keeps the last {history} tokens but repeat_last_n is \
         {repeat_last_n}; build it with History::new({repeat_last_n})"
    )]
    HistoryTooShort {
        /// Tokens the history keeps.
        history: usize,
        /// `Options::repeat_last_n`.
        repeat_last_n: usize,
    },
    /// An array has a shape this operation cannot take.
    #[error("{what} has shape {shape:?}, expected {expected}")]
    Shape {
        /// Which argument.
        what: &'static str,
        /// Its shape.
        shape: Vec<i32>,
        /// The expected layout, in words.
        expected: String,
    },
    /// Two distributions (or a distribution and its tokens) disagree on a size.
    #[error("{what}: {left} vs {right}")]
    Mismatch {
        /// What was compared.
        what: &'static str,
        /// The first size.
        left: usize,
        /// The second size.
        right: usize,
    },
    /// A row range outside the distribution.
    #[error("rows {start}..{end} are outside a distribution of {rows} rows")]
    RowRange {
        /// First row asked for.
        start: usize,
        /// One past the last row asked for.
        end: usize,
        /// Rows the distribution has.
        rows: usize,
    },
    /// `concatenate` was given no distributions.
    #[error("cannot concatenate an empty list of distributions")]
    EmptyConcatenate,
    /// MLX failed; the inner error names the Rust call site.
    #[error(transparent)]
    Mlx(#[from] mlx_tensor::Error),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
