//! Writes a random-weight checkpoint.
fn main() {}
