//! Writing a model folder that is never seen half-written.
//!
//! [`StagedDir::claim`] checks that the output folder is absent or empty and
//! claims it by creating a staging sibling, `.NAME.partial`, with one
//! `mkdir` (atomic: of two runs into the same folder exactly one gets it, the
//! other fails with [`Error::OutputBusy`]). Everything is written into the
//! staging folder; [`StagedDir::commit`] flushes the files to disk and
//! renames the folder into place in one step, and a `StagedDir` dropped
//! without a commit (an error, an interruption) removes what it wrote. A
//! reader therefore sees either no folder (or the empty one it passed) or the
//! complete one, never a folder that lacks its last files.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// An output folder being written in a staging sibling.
#[derive(Debug)]
pub(crate) struct StagedDir {
    /// Where the folder will appear.
    out: PathBuf,
    /// The staging sibling everything is written into.
    staging: PathBuf,
    /// Set by a commit; a drop without it removes `staging`.
    committed: bool,
}

impl StagedDir {
    /// Claims `out`, which must be absent or an empty folder, by creating its
    /// staging sibling.
    pub(crate) fn claim(out: &Path) -> Result<StagedDir> {
        check_out(out)?;
        let bad = |message: String| Error::InvalidOption {
            option: "--out",
            message,
        };
        let name = out
            .file_name()
            .ok_or_else(|| bad(format!("{} does not name a folder", out.display())))?;
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        if !parent.is_dir() {
            return Err(bad(format!(
                "the parent folder {} does not exist; create it first",
                parent.display()
            )));
        }
        let staging = parent.join(format!(".{}.partial", name.to_string_lossy()));
        match std::fs::create_dir(&staging) {
            Ok(()) => Ok(StagedDir {
                out: out.to_owned(),
                staging,
                committed: false,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(Error::OutputBusy {
                out: out.to_owned(),
                staging,
            }),
            Err(source) => Err(Error::Write {
                path: staging,
                source,
            }),
        }
    }

    /// The staging folder to write into.
    pub(crate) fn path(&self) -> &Path {
        &self.staging
    }

    /// Writes `bytes` to `path` (inside [`StagedDir::path`]), naming `path`
    /// in the error.
    pub(crate) fn write(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        std::fs::write(path, bytes).map_err(|source| Error::Write {
            path: path.to_owned(),
            source,
        })
    }

    /// Copies `from` to `to` (inside [`StagedDir::path`]): a failed read
    /// names `from`, a failed write names `to`.
    pub(crate) fn copy(&self, from: &Path, to: &Path) -> Result<u64> {
        let mut src = crate::files::open_regular(from)?;
        let mut dst = std::fs::File::create(to).map_err(|source| Error::Write {
            path: to.to_owned(),
            source,
        })?;
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0u64;
        loop {
            let n = std::io::Read::read(&mut src, &mut buf).map_err(|source| Error::Io {
                path: from.to_owned(),
                source,
            })?;
            if n == 0 {
                return Ok(total);
            }
            std::io::Write::write_all(&mut dst, &buf[..n]).map_err(|source| Error::Write {
                path: to.to_owned(),
                source,
            })?;
            total += n as u64;
        }
    }

    /// Flushes every file to disk, then renames the staging folder to the
    /// output folder. Fails (and cleans up) when the output folder was
    /// filled by someone else meanwhile.
    pub(crate) fn commit(mut self) -> Result<()> {
        let entries = std::fs::read_dir(&self.staging).map_err(|source| Error::Write {
            path: self.staging.clone(),
            source,
        })?;
        for entry in entries {
            let path = entry
                .map_err(|source| Error::Write {
                    path: self.staging.clone(),
                    source,
                })?
                .path();
            // A delayed-allocation file system reports a full disk here.
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|source| Error::Write { path, source })?;
        }
        match std::fs::rename(&self.staging, &self.out) {
            Ok(()) => {
                self.committed = true;
                Ok(())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::DirectoryNotEmpty | std::io::ErrorKind::AlreadyExists
                ) =>
            {
                Err(Error::InvalidOption {
                    option: "--out",
                    message: format!(
                        "{} was filled by another run while this one was writing; nothing of \
                         this run was kept: pass a new folder",
                        self.out.display()
                    ),
                })
            }
            Err(source) => Err(Error::Write {
                path: self.out.clone(),
                source,
            }),
        }
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: an error here leaves only the hidden staging folder.
            let _ = std::fs::remove_dir_all(&self.staging);
        }
    }
}

/// `out` must be absent or an empty folder, so nothing is overwritten.
fn check_out(out: &Path) -> Result<()> {
    let bad = |message: String| Error::InvalidOption {
        option: "--out",
        message,
    };
    let meta = match std::fs::symlink_metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(Error::Write {
                path: out.to_owned(),
                source,
            });
        }
        Ok(m) => m,
    };
    if !meta.is_dir() {
        return Err(bad(format!(
            "{} exists and is not a folder; pass a new folder path",
            out.display()
        )));
    }
    let mut entries = std::fs::read_dir(out).map_err(|source| Error::Write {
        path: out.to_owned(),
        source,
    })?;
    if entries.next().is_some() {
        return Err(bad(format!(
            "{} exists and is not empty; pass a new folder or empty it first",
            out.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_visible_before_the_commit() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("model-q4");
        let staged = StagedDir::claim(&out).unwrap();
        staged
            .write(&staged.path().join("config.json"), b"{}")
            .unwrap();
        assert!(!out.exists(), "nothing is visible before the commit");
        staged.commit().unwrap();
        assert!(out.join("config.json").is_file());
    }
}
