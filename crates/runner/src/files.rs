//! The files of a model folder, checked by type before any is opened.
//!
//! Opening a FIFO blocks until a writer appears, a character device can
//! stream forever, and a socket cannot be read at all; a load must never hang
//! on one, so every path a load may read is looked at with `stat` first and
//! refused unless it is a regular file (or a symlink to one). A dangling
//! symlink is a broken download, not an absent optional file. Small files are
//! sniffed for the git-lfs pointer text that a clone without git-lfs leaves in
//! place of the real content.

use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// Files of a model folder that a load, `info` or `quantize` may open (the
/// safetensors files are found by listing the folder).
pub(crate) const KNOWN: [&str; 12] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "model.safetensors.index.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
];

/// The first line of a git-lfs pointer file.
const LFS_MAGIC: &[u8] = b"version https://git-lfs.github.com/spec/v1";
/// Pointer files are about 130 bytes; larger files are never pointers.
const LFS_MAX: u64 = 1024;

/// What is at a path, found without opening it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Presence {
    /// Nothing (not even a symlink).
    Absent,
    /// A regular file, or a symlink to one, of this many bytes.
    File(u64),
}

/// Classifies `path` without opening it: [`Presence::Absent`] when nothing
/// is there, [`Presence::File`] for a regular file, and [`Error::NotAFile`]
/// for anything else (a dangling symlink included).
pub(crate) fn regular(path: &Path) -> Result<Presence> {
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let link = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Presence::Absent),
        Err(e) => return Err(io(e)),
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && link.file_type().is_symlink() => {
            let target = std::fs::read_link(path)
                .map(|t| t.display().to_string())
                .unwrap_or_else(|_| "?".into());
            return Err(Error::NotAFile {
                path: path.to_owned(),
                kind: "a dangling symlink",
                hint: format!(
                    "its target {target} does not exist; download the file again or remove the \
                     link"
                ),
            });
        }
        Err(e) => return Err(io(e)),
    };
    if meta.is_file() {
        return Ok(Presence::File(meta.len()));
    }
    let kind = kind_of(&meta.file_type());
    Err(Error::NotAFile {
        path: path.to_owned(),
        kind,
        hint: "model folders hold plain files only; replace it with the real file (it is not \
               opened, so nothing blocks on it)"
            .into(),
    })
}

#[cfg(unix)]
fn kind_of(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

#[cfg(not(unix))]
fn kind_of(t: &std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a folder"
    } else {
        "not a regular file"
    }
}

/// [`regular`], then a git-lfs pointer check of a small file.
pub(crate) fn checked(path: &Path) -> Result<Presence> {
    let p = regular(path)?;
    if let Presence::File(bytes) = p
        && bytes <= LFS_MAX
    {
        let mut head = Vec::with_capacity(LFS_MAGIC.len());
        std::fs::File::open(path)
            .and_then(|f| f.take(LFS_MAGIC.len() as u64).read_to_end(&mut head))
            .map_err(|source| Error::Io {
                path: path.to_owned(),
                source,
            })?;
        if head == LFS_MAGIC {
            return Err(Error::LfsPointer {
                path: path.to_owned(),
                bytes,
            });
        }
    }
    Ok(p)
}

/// Checks every file a load of `dir` may open: the config, generation,
/// tokenizer, chat-template and safetensors-index files and each
/// `*.safetensors` entry must be absent or a regular file that is not a
/// git-lfs pointer. A `dir` that is not a folder is left to the loader's own
/// "config.json not found" error.
pub fn check_model_folder(dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        return Ok(());
    }
    for name in KNOWN {
        checked(&dir.join(name))?;
    }
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
        path: dir.to_owned(),
        source,
    })?;
    for entry in entries {
        let entry = entry.map_err(|source| Error::Io {
            path: dir.to_owned(),
            source,
        })?;
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            checked(&path)?;
        }
    }
    Ok(())
}

/// Opens `path` for reading after [`regular`] says it is a regular file, so
/// the open cannot block on a FIFO.
pub(crate) fn open_regular(path: &Path) -> Result<std::fs::File> {
    match regular(path)? {
        Presence::Absent => Err(Error::Io {
            path: path.to_owned(),
            source: std::io::ErrorKind::NotFound.into(),
        }),
        Presence::File(_) => std::fs::File::open(path).map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        }),
    }
}
