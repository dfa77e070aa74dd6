//! [`Conversation`]: a multi-turn chat over one session, each turn reusing
//! the cached prefix of the whole history.
//!
//! Every turn renders the chat template over the full history, tokenizes it,
//! puts the session at the longest prefix it can reuse (the live caches,
//! else a stored entry of the [`PrefixCache`]) and generates from there. The
//! reply's text need not re-tokenize to the tokens generated: the session
//! rewinds to where they differ, replaying from a restore point below when
//! its recurrent layers cannot go back there directly. The
//! assistant turn ends at the template's end-of-turn token (for ChatML
//! `<|im_end|>`), which is treated as an end-of-sequence token and stripped.

use std::sync::atomic::AtomicBool;

use crate::chat::{Message, apply_chat_template};
use crate::error::Result;
use crate::generate::{GenerateOptions, Generation};
use crate::prefix::{PrefixCache, ReuseSource};
use crate::session::Session;
use crate::tokenizer::Tokenizer;

/// End-of-turn tokens of common chat templates, used as extra
/// end-of-sequence ids when the template and the vocabulary both have them.
pub(crate) const END_OF_TURN: &[&str] = &["<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"];

/// The figures of one turn.
#[derive(Debug, Clone)]
pub struct Turn {
    /// The turn's number, from 1.
    pub index: usize,
    /// The whole prompt the template rendered (history and this user message).
    pub prompt: Vec<u32>,
    /// Prompt tokens reused from the caches (not forwarded again).
    pub reused_tokens: usize,
    /// Of those, the tokens forwarded again because the caches could not
    /// rewind to them directly (recurrent layers, when the reply's text
    /// re-tokenizes differently from the tokens generated).
    pub replayed_tokens: usize,
    /// Where they came from.
    pub source: ReuseSource,
    /// The assistant's reply.
    pub generation: Generation,
}

/// A chat over one session (see the module docs).
#[derive(Debug)]
pub struct Conversation<'m> {
    session: Session<'m>,
    cache: PrefixCache,
    /// The template's tokenizer plus the end-of-turn ids as end of sequence.
    tok: Tokenizer,
    messages: Vec<Message>,
    turns: usize,
}

impl<'m> Conversation<'m> {
    /// A conversation over `session` (plain or speculative) with `tok`'s chat
    /// template, an optional system message and a prefix cache of `budget`
    /// bytes (0 keeps only the live session).
    ///
    /// # Errors
    /// [`crate::Error::NoChatTemplate`] when the tokenizer has no template.
    pub fn new(
        session: Session<'m>,
        tok: &Tokenizer,
        system: Option<&str>,
        budget: usize,
    ) -> Result<Conversation<'m>> {
        let template = tok.chat_template()?;
        let ends: Vec<u32> = END_OF_TURN
            .iter()
            .filter(|t| template.contains(*t))
            .filter_map(|t| tok.inner().token_to_id(t))
            .collect();
        Ok(Conversation {
            session,
            cache: PrefixCache::new(budget),
            tok: tok.with_extra_eos(&ends),
            messages: system
                .map(|s| vec![Message::new("system", s)])
                .unwrap_or_default(),
            turns: 0,
        })
    }

    /// The history so far.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The session.
    pub fn session(&self) -> &Session<'m> {
        &self.session
    }

    /// The prefix cache.
    pub fn prefix_cache(&self) -> &PrefixCache {
        &self.cache
    }

    /// The tokenizer generation uses (end-of-turn ids included).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    /// The prompt the next turn would send for `user`: the template over
    /// the history plus that message, with the assistant's opening.
    pub fn prompt_for(&self, user: &str) -> Result<Vec<u32>> {
        let mut msgs = self.messages.clone();
        msgs.push(Message::new("user", user));
        let text = apply_chat_template(&self.tok, &msgs)?;
        self.tok.encode(&text, false)
    }

    /// Starts over: forgets the history (the caches stay, so a new
    /// conversation with the same system message reuses its prefix).
    pub fn reset(&mut self) {
        self.messages.retain(|m| m.role == "system");
        self.turns = 0;
    }

    /// One turn: the user says `user`, the assistant replies (streamed to
    /// `on_text`). A cancelled reply is kept in the history as far as it got.
    pub fn say(
        &mut self,
        user: &str,
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        on_text: impl FnMut(&str),
    ) -> Result<Turn> {
        let prompt = self.prompt_for(user)?;
        let reuse = self.cache.prepare(&mut self.session, &prompt)?;
        let generation =
            self.session
                .generate(&self.tok, &prompt[reuse.tokens..], opts, cancel, on_text)?;
        self.messages.push(Message::new("user", user));
        self.messages
            .push(Message::new("assistant", &generation.text));
        if self.cache.budget() > 0 {
            self.cache.store(&self.session)?;
        }
        self.turns += 1;
        Ok(Turn {
            index: self.turns,
            prompt,
            reused_tokens: reuse.tokens,
            replayed_tokens: reuse.replayed,
            source: reuse.source,
            generation,
        })
    }
}
