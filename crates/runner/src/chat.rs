//! Chat prompts: the model's Jinja chat template rendered with minijinja.
//!
//! The environment has no loader (templates cannot include files) and runs on
//! a fuel budget, so a hostile or broken template ends in an error, not a hang
//! or an unbounded string.

use minijinja::{Environment, Error as JinjaError, ErrorKind, context};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// Instructions a template may execute before it is stopped.
const FUEL: u64 = 5_000_000;
/// Longest rendered prompt accepted, in bytes.
const MAX_OUTPUT: usize = 16 << 20;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message with the given role.
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_owned(),
            content: content.to_owned(),
        }
    }
}

/// Renders `template` for `messages`.
pub fn render_template(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let mut env = Environment::new();
    env.set_fuel(Some(FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_template("chat", template)
        .map_err(|e| Error::ChatTemplate(format!("does not compile: {e}")))?;
    let t = env
        .get_template("chat")
        .map_err(|e| Error::ChatTemplate(e.to_string()))?;
    let out = t
        .render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token,
            eos_token => eos_token,
        })
        .map_err(|e| Error::ChatTemplate(format!("render failed: {e}")))?;
    if out.len() > MAX_OUTPUT {
        return Err(Error::ChatTemplate(format!(
            "rendered prompt is {} bytes, more than the {MAX_OUTPUT}-byte limit",
            out.len()
        )));
    }
    Ok(out)
}

/// Renders the tokenizer's chat template for `messages`, ready for generation.
pub fn apply_chat_template(tok: &Tokenizer, messages: &[Message]) -> Result<String> {
    let template = tok.chat_template()?;
    render_template(
        template,
        messages,
        true,
        tok.bos().map(|(_, s)| s).unwrap_or(""),
        tok.eos_text().unwrap_or(""),
    )
}
