//! docs/bench/README.md and its PNG plots, drawn from the rows of docs/bench/results.json.

use std::path::Path;

use anyhow::Result;

/// Redraws the report beside `results`.
pub fn render(results: &Path) -> Result<()> {
    let rows = crate::bench::read_rows(results)?;
    eprintln!("xtask: report: {} rows (plots not drawn yet)", rows.len());
    Ok(())
}
