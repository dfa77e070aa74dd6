//! [`Vars`]: a prefix-pushing view over [`Weights`] (candle's `VarBuilder::pp`),
//! so a family's loader reads like its tensor names.
//!
//! `vb.pp("layers").pp(3).pp("self_attn")` names `model.layers.3.self_attn`
//! under a `model` root; every tensor a view takes is removed from the
//! weights, so what is left after a load is exactly what the family did not
//! use (see [`Weights::remaining`]).

use std::fmt::Display;

use mlx_tensor::{Array, Dtype};

use super::Weights;
use crate::error::Result;
use crate::quant::QuantizedTensor;

/// A view of the weights under one name prefix.
#[derive(Debug)]
pub struct Vars<'w> {
    w: &'w mut Weights,
    prefix: String,
}

impl<'w> Vars<'w> {
    /// The view of `w` under `prefix` (`""` for the top level).
    pub fn new(w: &'w mut Weights, prefix: &str) -> Vars<'w> {
        Vars {
            w,
            prefix: prefix.to_owned(),
        }
    }

    /// The child view `{prefix}.{part}`, borrowing this one while it lives.
    pub fn pp(&mut self, part: impl Display) -> Vars<'_> {
        let prefix = self.path(&part.to_string());
        Vars { w: self.w, prefix }
    }

    /// The full name of `name` under this view.
    pub fn path(&self, name: &str) -> String {
        match (self.prefix.is_empty(), name.is_empty()) {
            (true, _) => name.to_owned(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}.{name}", self.prefix),
        }
    }

    /// This view's prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// True when `name` is present under this view (and not yet taken).
    pub fn contains(&self, name: &str) -> bool {
        self.w.contains(&self.path(name))
    }

    /// The stored shape of `name`, from the header (taken or not).
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.w.stored_shape(&self.path(name))
    }

    /// Takes `name`, checking its shape.
    pub fn take(&mut self, name: &str, shape: &[usize]) -> Result<Array> {
        self.w.take(&self.path(name), &dims(shape))
    }

    /// Takes `name` if present, checking its shape.
    pub fn take_optional(&mut self, name: &str, shape: &[usize]) -> Result<Option<Array>> {
        self.w.take_optional(&self.path(name), &dims(shape))
    }

    /// Takes this module's quantized `[out, input]` triple; `None` when it is stored dense.
    pub fn take_quantized(&mut self, out: usize, input: usize) -> Result<Option<QuantizedTensor>> {
        self.w.take_quantized(&self.prefix, out, input)
    }

    /// Takes this module's quantized `[lead.., out, input]` stack; `None` when it is stored dense.
    pub fn take_quantized_stack(
        &mut self,
        lead: &[usize],
        out: usize,
        input: usize,
    ) -> Result<Option<QuantizedTensor>> {
        self.w.take_quantized_stack(&self.prefix, lead, out, input)
    }

    /// The compute dtype.
    pub fn dtype(&self) -> Dtype {
        self.w.dtype()
    }

    /// True when the weights are header placeholders (validation without data).
    pub fn is_dry(&self) -> bool {
        self.w.is_dry()
    }
}

fn dims(shape: &[usize]) -> Vec<i32> {
    shape.iter().map(|&d| d as i32).collect()
}
