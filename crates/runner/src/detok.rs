//! Streaming detokenization that never splits a UTF-8 character.
//!
//! Decoding token by token is wrong twice over: byte-level BPE spreads one
//! character over several tokens, and SentencePiece decoders strip a leading
//! space from a lone token. So the running token list is decoded over a small
//! window (`prefix..`) and compared with the window's previous text; only a
//! complete extension is emitted, and text ending in U+FFFD (an incomplete
//! byte sequence) waits for the next token.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Incremental decoder over one generation's tokens.
#[derive(Debug, Clone, Default)]
pub struct StreamDetokenizer {
    tokens: Vec<u32>,
    /// Start of the decode window; text before it has been emitted.
    prefix: usize,
    /// End of what has been emitted, in tokens.
    read: usize,
}

impl StreamDetokenizer {
    /// A decoder with no tokens.
    pub fn new() -> StreamDetokenizer {
        StreamDetokenizer::default()
    }

    /// Adds a token; returns the text that is now complete (maybe empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.tokens.push(id);
        let before = tok.decode(&self.tokens[self.prefix..self.read])?;
        let now = tok.decode(&self.tokens[self.prefix..])?;
        if now.len() > before.len()
            && !now.ends_with('\u{FFFD}')
            && now.is_char_boundary(before.len())
        {
            let text = now[before.len()..].to_owned();
            self.prefix = self.read;
            self.read = self.tokens.len();
            Ok(text)
        } else {
            Ok(String::new())
        }
    }

    /// Everything not yet emitted (at the end of generation), incomplete bytes included.
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String> {
        let before = tok.decode(&self.tokens[self.prefix..self.read])?;
        let now = tok.decode(&self.tokens[self.prefix..])?;
        self.prefix = self.tokens.len();
        self.read = self.tokens.len();
        Ok(
            if now.len() > before.len() && now.is_char_boundary(before.len()) {
                now[before.len()..].to_owned()
            } else {
                String::new()
            },
        )
    }

    /// The tokens pushed so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
}
