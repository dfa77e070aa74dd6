//! mtp-draft (filled by its issue).
#![warn(missing_docs)]
