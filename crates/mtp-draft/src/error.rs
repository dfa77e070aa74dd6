//! The crate's error type: bad input from the caller and failures from below.

/// Errors a draft session reports instead of panicking.
///
/// Broken bookkeeping inside the session (a gap in the committed stream, a
/// draft cache that will not rewind to the committed offset) is a bug and
/// panics with both numbers; everything a caller can get wrong is here.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A committed run whose token and hidden counts disagree.
    #[error(
        "committed run at position {position}: {tokens} tokens but {hiddens} hidden rows; \
         pass one target hidden row per token"
    )]
    RunMismatch {
        /// Slot of the run's first token.
        position: usize,
        /// Tokens in the run.
        tokens: usize,
        /// Rows of the hiddens.
        hiddens: usize,
    },
    /// An array of the wrong rank or an empty run.
    #[error("{what} has shape {shape:?}; expected {expected}")]
    BadShape {
        /// Which argument.
        what: &'static str,
        /// Its shape.
        shape: Vec<i32>,
        /// What was expected, in words.
        expected: &'static str,
    },
    /// A head returned rows that do not match its input.
    #[error(
        "draft head returned {what} with shape {shape:?} for {rows} input rows; expected {expected}"
    )]
    HeadOutput {
        /// Which output.
        what: &'static str,
        /// Its shape.
        shape: Vec<i32>,
        /// Input rows of the call.
        rows: usize,
        /// What was expected, in words.
        expected: &'static str,
    },
    /// The head's own forward failed (for example a weight it could not load).
    #[error("draft head: {0}")]
    Head(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// An MLX call failed.
    #[error(transparent)]
    Mlx(#[from] mlx_tensor::Error),
    /// A draft cache failed.
    #[error(transparent)]
    Cache(#[from] kvcache::Error),
    /// Building or sampling a draft distribution failed.
    #[error(transparent)]
    Sampler(#[from] sampler::Error),
}

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
