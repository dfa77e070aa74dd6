//! Cutting one file into parts that each fit one device call, and the manifest that joins them again.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

/// Room kept in every part folder for `gpu.sh`, `MANIFEST` and `SHA256SUMS`.
pub(crate) const PART_OVERHEAD: u64 = 64 * 1024;

/// Byte ranges `[start, end)` of `total` bytes in chunks of at most `chunk` bytes.
pub(crate) fn ranges(total: u64, chunk: u64) -> Vec<(u64, u64)> {
    assert!(chunk > 0, "chunk size must be positive");
    (0..total.div_ceil(chunk))
        .map(|i| (i * chunk, ((i + 1) * chunk).min(total)))
        .collect()
}

/// Hex sha256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Writes `file` as `out/p1 .. out/pN`, each folder holding one chunk
/// (`<name>.00`, `.01`, ...) plus `extra` files (name, bytes) and a
/// `SHA256SUMS` of every chunk; every folder stays within `part_bytes`.
/// Returns the part folders in order.
pub(crate) fn write_parts(
    file: &Path,
    out: &Path,
    part_bytes: u64,
    extra: &[(&str, Vec<u8>)],
) -> Result<Vec<PathBuf>> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let name = file
        .file_name()
        .context("bundle file has no name")?
        .to_string_lossy()
        .into_owned();
    let extra_bytes: u64 = extra.iter().map(|(_, b)| b.len() as u64).sum();
    assert!(
        extra_bytes < PART_OVERHEAD / 2,
        "part extras ({extra_bytes} bytes) exceed the room kept for them ({PART_OVERHEAD})"
    );
    let chunk = part_bytes.saturating_sub(PART_OVERHEAD).max(1);
    let ranges = ranges(bytes.len() as u64, chunk);
    let sums: String = ranges
        .iter()
        .enumerate()
        .map(|(i, &(a, b))| {
            format!(
                "{}  {name}.{i:02}\n",
                sha256_hex(&bytes[a as usize..b as usize])
            )
        })
        .collect();
    let mut dirs = Vec::with_capacity(ranges.len());
    for (i, &(a, b)) in ranges.iter().enumerate() {
        let dir = out.join(format!("p{}", i + 1));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(
            dir.join(format!("{name}.{i:02}")),
            &bytes[a as usize..b as usize],
        )?;
        std::fs::write(dir.join("SHA256SUMS"), &sums)?;
        for (n, content) in extra {
            std::fs::write(dir.join(n), content)?;
        }
        dirs.push(dir);
    }
    Ok(dirs)
}

/// Total bytes of the files directly inside `dir`.
pub(crate) fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        total += e?.metadata()?.len();
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn ranges_cover_the_file_in_order_within_the_limit(total in 0u64..10_000_000, chunk in 1u64..3_000_000) {
            let r = ranges(total, chunk);
            prop_assert_eq!(r.len() as u64, total.div_ceil(chunk));
            let mut at = 0;
            for &(a, b) in &r {
                prop_assert_eq!(a, at);
                prop_assert!(b > a && b - a <= chunk);
                at = b;
            }
            prop_assert_eq!(at, total);
        }
    }

    #[test]
    fn parts_stay_under_the_limit_and_rejoin_to_the_original() {
        let tmp = std::env::temp_dir().join(format!("xtask-split-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).unwrap();
        // 2.5 parts' worth of non-repeating bytes.
        let part = 3 * PART_OVERHEAD;
        let data: Vec<u8> = (0..(5 * PART_OVERHEAD) as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let file = tmp.join("bundle.tar.xz");
        std::fs::write(&file, &data).unwrap();
        let script = b"#!/bin/sh\n".repeat(100);
        let dirs = write_parts(&file, &tmp.join("out"), part, &[("gpu.sh", script)]).unwrap();
        assert_eq!(dirs.len(), 3, "5 overheads in chunks of 2 overheads");
        let mut joined = Vec::new();
        for (i, d) in dirs.iter().enumerate() {
            let size = dir_bytes(d).unwrap();
            assert!(size <= part, "{} holds {size} > {part} bytes", d.display());
            assert!(d.join("gpu.sh").is_file() && d.join("SHA256SUMS").is_file());
            joined.extend(std::fs::read(d.join(format!("bundle.tar.xz.{i:02}"))).unwrap());
        }
        assert_eq!(sha256_hex(&joined), sha256_hex(&data));
        let sums = std::fs::read_to_string(dirs[0].join("SHA256SUMS")).unwrap();
        assert_eq!(sums.lines().count(), 3);
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
