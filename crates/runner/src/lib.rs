//! runner (filled by its issue).
#![warn(missing_docs)]
