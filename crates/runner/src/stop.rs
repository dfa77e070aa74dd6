//! Stop strings: cut the output at the first match and hold back any text
//! that could still become the start of one.

/// Tracks emitted text against a set of stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released (a possible stop-string prefix).
    pending: String,
}

/// What to do with a piece of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopStep {
    /// Emit this text and continue.
    Continue(String),
    /// Emit this text (everything before the stop string) and stop.
    Stop(String),
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    /// Feeds new text; returns what may be emitted now.
    pub fn push(&mut self, text: &str) -> StopStep {
        if self.stops.is_empty() {
            return StopStep::Continue(text.to_owned());
        }
        self.pending.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let out = self.pending[..at].to_owned();
            self.pending.clear();
            return StopStep::Stop(out);
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if i > keep && self.pending.ends_with(&s[..i]) {
                    keep = i;
                }
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_owned();
        self.pending.drain(..cut);
        StopStep::Continue(out)
    }

    /// Releases held-back text at the end of generation.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}
