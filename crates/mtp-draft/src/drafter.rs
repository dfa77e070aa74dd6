//! [`Drafter`]: the long-lived owner of a model's draft head.

use crate::head::DraftHead;
use crate::session::DraftSession;

/// The drafter of one loaded model: it owns the head (and through it the
/// draft caches) and opens one [`DraftSession`] per request.
#[derive(Debug)]
pub struct Drafter<H: DraftHead> {
    head: H,
}

impl<H: DraftHead> Drafter<H> {
    /// A drafter over `head`.
    pub fn new(head: H) -> Self {
        Drafter { head }
    }

    /// Opens the drafting session of one request. With draft caches, pairing
    /// resumes from their offset (a restored prefix arrives with them already
    /// written), so rewind or restore them before opening.
    pub fn open(&mut self) -> DraftSession<'_, H> {
        DraftSession::new(&mut self.head)
    }

    /// The look-ahead that prefix-cache keys need: 1 when the head has draft
    /// caches (the pair at slot `S` holds token `S + 1`), else 0.
    pub fn lookahead(&self) -> usize {
        usize::from(self.head.cache_offset().is_some())
    }

    /// The head.
    pub fn head(&self) -> &H {
        &self.head
    }

    /// The head, for example to restore its caches from a prefix cache.
    pub fn head_mut(&mut self) -> &mut H {
        &mut self.head
    }

    /// Gives the head back.
    pub fn into_head(self) -> H {
        self.head
    }
}
