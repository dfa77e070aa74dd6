//! Greedy speculation-parity helpers shared by the parity tests of every
//! bundled MTP model: held-out prompts, one checked generation, and the
//! parity sweep over draft depths.

use super::Generate;
use std::path::PathBuf;

use runner::DepthPolicy;
use runner::{
    FinishReason, GenerateOptions, Generation, LoadedModel, SamplingOptions, Session, SpecStats,
};
use serde_json::Value;

/// Tokens per parity case (what issue 6 asks for).
pub(crate) const PARITY_TOKENS: usize = 128;

/// The depths every parity sweep covers: fixed 1–4 and auto.
pub(crate) fn depths() -> [DepthPolicy; 5] {
    [
        DepthPolicy::Fixed(1),
        DepthPolicy::Fixed(2),
        DepthPolicy::Fixed(3),
        DepthPolicy::Fixed(4),
        DepthPolicy::default(),
    ]
}

/// The 20 held-out prompts as ids; documents start after `<|endoftext|>` (id 0), as in training.
pub(crate) fn heldout_prompts(m: &LoadedModel) -> Vec<Vec<u32>> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/heldout_prompts.json");
    let text = std::fs::read_to_string(&path).expect("held-out prompt fixture present");
    let v: Value = serde_json::from_str(&text).unwrap();
    let prompts: Vec<Vec<u32>> = v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let mut ids = vec![0];
            ids.extend(m.tokenizer.encode(p.as_str().unwrap(), false).unwrap());
            ids
        })
        .collect();
    assert_eq!(prompts.len(), 20, "held-out prompts in {}", path.display());
    prompts
}

/// Greedy options with `max_tokens` and `depth`.
pub(crate) fn greedy(max_tokens: usize, depth: DepthPolicy) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: SamplingOptions::greedy(),
        depth,
        ..GenerateOptions::default()
    }
}

/// Runs one generation in `s` and checks the cache bookkeeping: every cache's offset
/// equals the committed tokens ([`Session::offset`] panics otherwise), and the committed
/// tokens are the earlier ones, the prompt and the generated ids that were forwarded.
pub(crate) fn run(
    s: &mut Session<'_>,
    m: &LoadedModel,
    prompt: &[u32],
    opts: &GenerateOptions,
) -> Generation {
    let before = s.committed().to_vec();
    let g = s.run(&m.tokenizer, prompt, opts).unwrap();
    let committed = s.committed();
    assert_eq!(s.offset(), committed.len());
    // A speculative session re-runs its last committed token, so compare content only.
    let head = before.len() + prompt.len();
    assert_eq!(&committed[..before.len()], &before[..]);
    assert_eq!(&committed[before.len()..head], prompt);
    let forwarded = &committed[head..];
    let n = g.token_ids.len();
    if s.is_speculative() {
        // The last emitted token is forwarded by the next round; an end-of-sequence
        // token is never committed.
        let want = match g.finish {
            FinishReason::Eos => n,
            _ => n.saturating_sub(1),
        };
        assert_eq!(
            forwarded,
            &g.token_ids[..want],
            "committed generated tokens"
        );
    } else {
        // The pipelined plain loop forwards an end-of-sequence token it read late.
        match g.finish {
            FinishReason::Eos => assert!(
                forwarded.starts_with(&g.token_ids) && forwarded.len() <= n + 1,
                "plain committed {forwarded:?} vs generated {:?}",
                g.token_ids
            ),
            _ => assert_eq!(forwarded, &g.token_ids[..n.saturating_sub(1)]),
        }
    }
    g
}

/// Asserts that `got`, a greedy speculative generation, is `plain` token for
/// token with the same finish (`case` names it in the messages), and returns
/// its speculation figures.
pub(crate) fn same_as_plain<'g>(
    case: &str,
    got: &'g Generation,
    plain: &Generation,
) -> &'g SpecStats {
    assert_eq!(
        got.token_ids, plain.token_ids,
        "{case}: speculative output differs from plain"
    );
    assert_eq!(got.finish, plain.finish, "{case}: finish");
    got.speculation
        .as_ref()
        .unwrap_or_else(|| panic!("{case}: a speculative generation reports speculation"))
}

/// [`run`] on a fresh plain session.
pub(crate) fn plain(m: &LoadedModel, prompt: &[u32], opts: &GenerateOptions) -> Generation {
    run(&mut Session::new(m.model.as_ref()), m, prompt, opts)
}

/// [`run`] on a fresh MTP session.
pub(crate) fn speculative(m: &LoadedModel, prompt: &[u32], opts: &GenerateOptions) -> Generation {
    let mut s = Session::with_mtp(m.model.as_ref()).expect("the model has an MTP head");
    run(&mut s, m, prompt, opts)
}

/// Speculation figures summed over the prompts of one depth.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Totals {
    /// Draft tokens proposed.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Tokens emitted.
    pub emitted: usize,
    /// Rounds.
    pub rounds: usize,
    /// `drafted_at[i]`: rounds that drafted position `i + 1` (the first [`POSITIONS`]).
    pub drafted_at: [usize; POSITIONS],
    /// `accepted_at[i]`: rounds that accepted position `i + 1`.
    pub accepted_at: [usize; POSITIONS],
}

/// Draft positions [`Totals`] counts one by one (the auto policy's deepest depth).
pub(crate) const POSITIONS: usize = 6;

impl Totals {
    /// Adds one generation's speculation figures (its first [`POSITIONS`] positions).
    pub(crate) fn add(&mut self, s: &runner::SpecStats) {
        self.drafted += s.drafted;
        self.accepted += s.accepted;
        self.emitted += s.emitted;
        self.rounds += s.rounds;
        for (i, (d, a)) in s.drafted_at.iter().zip(&s.accepted_at).enumerate() {
            if i < POSITIONS {
                self.drafted_at[i] += d;
                self.accepted_at[i] += a;
            }
        }
    }

    /// Accepted over drafted (0 when nothing was drafted).
    pub(crate) fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }

    /// Mean tokens emitted per round (1 when nothing was accepted).
    pub(crate) fn mean_accepted_length(&self) -> f64 {
        self.emitted as f64 / self.rounds.max(1) as f64
    }

    /// Share of the rounds drafting position `i + 1` that accepted it (and so
    /// every position before it); `None` where no round drafted it.
    pub(crate) fn through_at(&self, i: usize) -> Option<f64> {
        (self.drafted_at[i] > 0).then(|| self.accepted_at[i] as f64 / self.drafted_at[i] as f64)
    }

    /// Prints one depth's figures to stderr (shown with `--nocapture`).
    #[allow(clippy::print_stderr)]
    pub(crate) fn report(&self, depth: DepthPolicy) {
        let Totals {
            drafted,
            accepted,
            emitted,
            rounds,
            ..
        } = *self;
        let per: Vec<String> = (0..POSITIONS)
            .map_while(|i| self.through_at(i).map(|a| format!("{a:.3}")))
            .collect();
        eprintln!(
            "{depth:?}: acceptance {:.3} ({accepted}/{drafted}), mean accepted length {:.3} ({emitted}/{rounds}), accepted through position [{}]",
            self.acceptance(),
            self.mean_accepted_length(),
            per.join(", ")
        );
    }
}

/// Asserts that MTP at every depth of [`depths`] generates the plain greedy
/// tokens (and finish) for each prompt, `tokens` per prompt; returns the
/// totals per depth and the number of tokens compared.
pub(crate) fn sweep(m: &LoadedModel, prompts: &[Vec<u32>], tokens: usize) -> ([Totals; 5], usize) {
    let mut totals = [Totals::default(); 5];
    let mut compared = 0;
    for (p, prompt) in prompts.iter().enumerate() {
        let want = plain(m, prompt, &greedy(tokens, DepthPolicy::Fixed(0)));
        if want.finish == FinishReason::Length {
            assert_eq!(want.token_ids.len(), tokens);
        }
        for (d, depth) in depths().into_iter().enumerate() {
            let got = speculative(m, prompt, &greedy(tokens, depth));
            let s = same_as_plain(&format!("prompt {p} at {depth:?}"), &got, &want);
            assert_eq!(s.method.as_str(), "mtp");
            assert_eq!(s.depth_over_time.len(), s.rounds);
            if let DepthPolicy::Fixed(k) = depth {
                assert!(
                    s.depth_over_time.iter().all(|&x| x <= k),
                    "{:?}",
                    s.depth_over_time
                );
            }
            totals[d].add(s);
            compared += got.token_ids.len();
        }
    }
    (totals, compared)
}
