//! Safetensors through MLX's own loader (lazy: tensors are read on first eval).

use std::collections::BTreeMap;
use std::path::Path;

use crate::array::List;
use crate::error::check;
use crate::ffi::sys;
use crate::{Array, Result};

/// The tensors and metadata of one safetensors file.
#[derive(Debug, Default)]
pub struct Safetensors {
    /// Tensors by name, sorted.
    pub tensors: BTreeMap<String, Array>,
    /// The header's `__metadata__` entries.
    pub metadata: BTreeMap<String, String>,
}

/// Loads a safetensors file. MLX validates the header; its errors name the file.
#[track_caller]
pub fn load_safetensors(path: &Path) -> Result<Safetensors> {
    let f = check(sys::load_safetensors(&path.to_string_lossy()))?;
    let f = f.as_ref().expect("loader returns a live handle");
    let mut out = Safetensors::default();
    for i in 0..sys::tf_len(f) {
        let name = check(sys::tf_name(f, i))?;
        let arr = check(sys::tf_array(f, i)).map(Array::wrap)?;
        out.tensors.insert(name, arr);
    }
    for i in 0..sys::tf_meta_len(f) {
        out.metadata.insert(
            check(sys::tf_meta_key(f, i))?,
            check(sys::tf_meta_value(f, i))?,
        );
    }
    Ok(out)
}

/// Writes tensors to a safetensors file (evaluating them first).
#[track_caller]
pub fn save_safetensors<'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = (&'a str, &'a Array)>,
) -> Result<()> {
    let (names, arrays): (Vec<String>, Vec<&Array>) =
        tensors.into_iter().map(|(n, a)| (n.to_owned(), a)).unzip();
    let list = List::new(arrays);
    check(sys::save_safetensors(
        &path.to_string_lossy(),
        &names,
        list.raw(),
    ))
}
