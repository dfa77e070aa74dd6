//! [`Output`]: generated ids into the result, once for every decoder:
//! end-of-sequence and budget checks, streaming detokenization, stop
//! strings, the text callback.

use std::time::Instant;

use super::{FinishReason, Generation};
use crate::detok::StreamDetokenizer;
use crate::error::Result;
use crate::models::Model;
use crate::stats::Stats;
use crate::stop::{StopMatcher, StopStep};
use crate::tokenizer::Tokenizer;

/// Whether generation goes on after a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    Go,
    Done,
}

/// See the module docs.
pub(super) struct Output<'t, F: FnMut(&str)> {
    tok: &'t Tokenizer,
    eos: Vec<u32>,
    detok: StreamDetokenizer,
    stop: StopMatcher,
    on_text: F,
    pub(super) result: Generation,
    /// Tokens taken so far (an end-of-sequence token included).
    pub(super) generated: usize,
    pub(super) max_tokens: usize,
    pub(super) t_first: Option<Instant>,
}

impl<'t, F: FnMut(&str)> Output<'t, F> {
    pub(super) fn new(
        tok: &'t Tokenizer,
        model: &dyn Model,
        stop: &[String],
        max_tokens: usize,
        on_text: F,
    ) -> Self {
        let mut eos = tok.eos_ids().to_vec();
        eos.extend(
            model
                .eos_ids()
                .iter()
                .filter(|x| !tok.eos_ids().contains(x)),
        );
        Output {
            tok,
            eos,
            detok: StreamDetokenizer::new(),
            stop: StopMatcher::new(stop),
            on_text,
            result: Generation {
                token_ids: Vec::new(),
                text: String::new(),
                finish: FinishReason::Length,
                stats: Stats::default(),
                speculation: None,
            },
            generated: 0,
            max_tokens,
            t_first: None,
        }
    }

    /// Whether `id` ends the sequence.
    pub(super) fn is_eos(&self, id: u32) -> bool {
        self.eos.contains(&id)
    }

    /// Tokens the budget still allows after the next one.
    pub(super) fn left_after_next(&self) -> usize {
        self.max_tokens.saturating_sub(self.generated + 1)
    }

    /// Notes the time of the first generated token.
    pub(super) fn first_token(&mut self) {
        if self.t_first.is_none() {
            self.t_first = Some(Instant::now());
        }
    }

    fn emit(&mut self, text: &str) {
        if !text.is_empty() {
            self.result.text.push_str(text);
            (self.on_text)(text);
        }
    }

    /// Takes one generated id.
    pub(super) fn push(&mut self, id: u32) -> Result<Flow> {
        self.generated += 1;
        if self.is_eos(id) {
            self.result.finish = FinishReason::Eos;
            return Ok(Flow::Done);
        }
        self.result.token_ids.push(id);
        let piece = self.detok.push(self.tok, id)?;
        match self.stop.push(&piece) {
            StopStep::Continue(t) => self.emit(&t),
            StopStep::Stop(t) => {
                self.emit(&t);
                self.result.finish = FinishReason::Stop;
                return Ok(Flow::Done);
            }
        }
        if self.generated >= self.max_tokens {
            self.result.finish = FinishReason::Length;
            return Ok(Flow::Done);
        }
        Ok(Flow::Go)
    }

    /// Flushes held-back text at the end.
    pub(super) fn finish(&mut self) -> Result<()> {
        if self.result.finish == FinishReason::Stop {
            return Ok(());
        }
        let rest = self.detok.flush(self.tok)?;
        let mut tail = match self.stop.push(&rest) {
            StopStep::Continue(t) => t,
            StopStep::Stop(t) => {
                self.result.finish = FinishReason::Stop;
                t
            }
        };
        if self.result.finish != FinishReason::Stop {
            tail.push_str(&self.stop.flush());
        }
        self.emit(&tail);
        Ok(())
    }
}
