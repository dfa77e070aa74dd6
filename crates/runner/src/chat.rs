//! Chat prompts: the model's Jinja chat template rendered with minijinja.
//!
//! The environment has no loader (templates cannot include, import or extend
//! files; there is no network), runs on a fuel budget and writes into a
//! buffer that refuses output past [`MAX_OUTPUT`] bytes, so a hostile or
//! broken template ends in an error, not a hang or an unbounded string.
//! minijinja caps `range` (100,000 items) and string repetition (100 MB), but
//! fuel bounds only the number of steps, not the size of what they build: a
//! loop that doubles a string (`~`, `+`, `replace`, `join` of a doubled list)
//! reaches terabytes in forty steps. So the rendering runs in a bounded
//! arena: on its own thread under [`mlx_tensor::budget::run_bounded`], whose
//! heap allocations may not pass [`MAX_MEMORY`] bytes; past that the thread
//! is stopped (parked, holding at most the limit) and the render fails with
//! an error. The bound needs the binary to install
//! [`mlx_tensor::budget::Counting`] as its global allocator, which
//! `mtp-runner` does; elsewhere rendering is bounded by fuel and output only.

use minijinja::{Environment, Error as JinjaError, ErrorKind, context};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// Instructions a template may execute before it is stopped (real chat
/// templates over long conversations use a few thousand per message).
pub(crate) const FUEL: u64 = 5_000_000;
/// Longest rendered prompt accepted, in bytes (far beyond any context: a
/// token is a few bytes).
pub const MAX_OUTPUT: usize = 16 << 20;
/// Most heap memory one render may hold, in bytes: the output buffer plus
/// every value the template builds (real templates need well under 1 MiB).
pub const MAX_MEMORY: usize = 256 << 20;

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

/// Renders `template` for `messages`, bounded in steps, output and memory.
pub fn render_template(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let (template, messages) = (template.to_owned(), messages.to_vec());
    let (bos, eos) = (bos_token.to_owned(), eos_token.to_owned());
    mlx_tensor::budget::run_bounded(MAX_MEMORY, move || {
        render_unbounded(&template, &messages, add_generation_prompt, &bos, &eos)
    })
    .unwrap_or_else(|over| {
        Err(Error::ChatTemplate(format!(
            "rendering needed more than {} MiB of memory and was stopped (a loop that grows a \
             string or list?); the template in tokenizer_config.json is broken or hostile: \
             replace it with the model's original",
            over.limit >> 20
        )))
    })
}

/// [`render_template`]'s work, on the bounded thread.
fn render_unbounded(
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
    let mut out = Bounded {
        bytes: Vec::new(),
        limit: MAX_OUTPUT,
        overflowed: false,
    };
    let rendered = t.render_captured_to(
        context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token,
            eos_token => eos_token,
        },
        &mut out,
    );
    if out.overflowed {
        return Err(Error::ChatTemplate(format!(
            "rendered prompt exceeds the {MAX_OUTPUT}-byte limit; the template in \
             tokenizer_config.json is broken or hostile (replace it with the model's original)"
        )));
    }
    if let Err(e) = rendered {
        let hint = match e.kind() {
            ErrorKind::OutOfFuel => {
                "; the template runs too long (an endless or huge loop): replace it with the \
                 model's original"
            }
            ErrorKind::TemplateNotFound => {
                "; chat templates are rendered without file access, so `include`, `import` \
                 and `extends` cannot be used"
            }
            _ => "",
        };
        return Err(Error::ChatTemplate(format!("render failed: {e}{hint}")));
    }
    // Every piece minijinja writes is a whole `str`, so the bytes are UTF-8.
    String::from_utf8(out.bytes)
        .map_err(|e| Error::ChatTemplate(format!("rendered prompt is not UTF-8: {e}")))
}

/// The render target: output beyond `limit` bytes is refused while it is
/// written, so a template that emits without end stops at the limit instead
/// of growing a string first and checking after.
struct Bounded {
    bytes: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.limit {
            self.overflowed = true;
            return Err(std::io::Error::other("chat template output limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
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
