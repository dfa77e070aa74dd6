//! `/metrics`: counters, gauges and histograms in the Prometheus text format,
//! named like vLLM's (`mtp_runner:` for `vllm:`), speculation counters
//! included (`spec_decode_num_drafts`, `..._num_draft_tokens`,
//! `..._num_accepted_tokens`, `..._num_accepted_tokens_per_pos`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use super::engine::{Finish, Outcome};

/// Seconds buckets of the latency histograms.
const SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Tokens-per-second buckets.
const RATES: &[f64] = &[
    1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0,
];

/// A histogram with fixed upper bounds.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    /// `counts[i]`: observations in bucket `i` alone (the last is above every bound).
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i] += 1;
        self.sum += v;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, help, "histogram");
        let mut total = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            total += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {total}");
        }
        total += self.counts[self.bounds.len()];
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}");
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {total}");
    }
}

/// Speculation totals of one drafter.
#[derive(Debug, Default)]
struct Spec {
    drafts: u64,
    draft_tokens: u64,
    accepted_tokens: u64,
    accepted_per_pos: Vec<u64>,
}

/// Reads one total of a [`Spec`].
type SpecField = fn(&Spec) -> u64;

#[derive(Debug)]
struct State {
    /// Responses by (route, status).
    requests: BTreeMap<(String, u16), u64>,
    /// Generations by finish reason (and `error`).
    finished: BTreeMap<&'static str, u64>,
    prompt_tokens: u64,
    cached_tokens: u64,
    generation_tokens: u64,
    ttft: Histogram,
    latency: Histogram,
    decode_tps: Histogram,
    spec: BTreeMap<String, Spec>,
}

/// Every figure `/metrics` shows.
#[derive(Debug)]
pub(super) struct Metrics {
    /// Requests in the queue (not yet running).
    pub waiting: AtomicI64,
    /// Requests generating now (0 or 1).
    pub running: AtomicI64,
    state: Mutex<State>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            waiting: AtomicI64::new(0),
            running: AtomicI64::new(0),
            state: Mutex::new(State {
                requests: BTreeMap::new(),
                finished: BTreeMap::new(),
                prompt_tokens: 0,
                cached_tokens: 0,
                generation_tokens: 0,
                ttft: Histogram::new(SECONDS),
                latency: Histogram::new(SECONDS),
                decode_tps: Histogram::new(RATES),
                spec: BTreeMap::new(),
            }),
        }
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    header(out, name, help, "counter");
    let _ = writeln!(out, "{name} {v}");
}

impl Metrics {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves only figures behind: keep them.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One HTTP response.
    pub(super) fn record_request(&self, route: &str, status: u16) {
        *self
            .state()
            .requests
            .entry((route.to_owned(), status))
            .or_default() += 1;
    }

    /// One finished generation.
    pub(super) fn record_outcome(&self, o: &Outcome) {
        let mut s = self.state();
        let reason = match o.finish {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Cancelled => "cancelled",
        };
        *s.finished.entry(reason).or_default() += 1;
        s.prompt_tokens += o.prompt_tokens as u64;
        s.cached_tokens += o.cached_tokens as u64;
        s.generation_tokens += o.completion_tokens as u64;
        s.ttft.observe(o.time_to_first_token.as_secs_f64());
        s.latency.observe(o.latency.as_secs_f64());
        if o.completion_tokens > 1 {
            s.decode_tps.observe(o.decode_tps);
        }
        if let Some(c) = &o.spec_counts {
            let e = s.spec.entry(c.method.clone()).or_default();
            e.drafts += c.drafts;
            e.draft_tokens += c.draft_tokens;
            e.accepted_tokens += c.accepted_tokens;
            if e.accepted_per_pos.len() < c.accepted_per_pos.len() {
                e.accepted_per_pos.resize(c.accepted_per_pos.len(), 0);
            }
            for (t, n) in e.accepted_per_pos.iter_mut().zip(&c.accepted_per_pos) {
                *t += n;
            }
        }
    }

    /// A request cancelled before it ran (its client left while it waited).
    pub(super) fn record_cancelled_in_queue(&self) {
        *self.state().finished.entry("cancelled").or_default() += 1;
    }

    /// A generation that failed.
    pub(super) fn record_failed(&self) {
        *self.state().finished.entry("error").or_default() += 1;
    }

    /// The Prometheus text exposition.
    // Long: one block per Prometheus metric family.
    pub(super) fn render(&self) -> String {
        let s = self.state();
        let mut out = String::new();
        header(
            &mut out,
            "mtp_runner:http_requests_total",
            "HTTP responses by route and status.",
            "counter",
        );
        for ((route, status), n) in &s.requests {
            let _ = writeln!(
                out,
                "mtp_runner:http_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        header(
            &mut out,
            "mtp_runner:request_success_total",
            "Generations by finish reason (error: failed).",
            "counter",
        );
        for (reason, n) in &s.finished {
            let _ = writeln!(
                out,
                "mtp_runner:request_success_total{{finished_reason=\"{reason}\"}} {n}"
            );
        }
        let gauge = |out: &mut String, name: &str, help: &str, v: i64| {
            header(out, name, help, "gauge");
            let _ = writeln!(out, "{name} {}", v.max(0));
        };
        gauge(
            &mut out,
            "mtp_runner:num_requests_waiting",
            "Requests in the queue.",
            self.waiting.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "mtp_runner:num_requests_running",
            "Requests generating now.",
            self.running.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "mtp_runner:prompt_tokens_total",
            "Prompt tokens of finished generations.",
            s.prompt_tokens,
        );
        counter(
            &mut out,
            "mtp_runner:prompt_tokens_cached_total",
            "Of those, tokens reused from the prefix cache.",
            s.cached_tokens,
        );
        counter(
            &mut out,
            "mtp_runner:generation_tokens_total",
            "Generated tokens.",
            s.generation_tokens,
        );
        s.ttft.render(
            &mut out,
            "mtp_runner:time_to_first_token_seconds",
            "From entering the queue to the first token.",
        );
        s.latency.render(
            &mut out,
            "mtp_runner:e2e_request_latency_seconds",
            "From entering the queue to the end of generation.",
        );
        s.decode_tps.render(
            &mut out,
            "mtp_runner:request_decode_tokens_per_second",
            "Per request, generated tokens per second after the first.",
        );
        render_spec(&s, &mut out);
        out
    }
}

/// The `spec_decode_*` counters, by drafter.
fn render_spec(s: &State, out: &mut String) {
    let spec: [(&str, &str, SpecField); 3] = [
        (
            "mtp_runner:spec_decode_num_drafts_total",
            "Speculative rounds that drafted tokens, by drafter.",
            |e| e.drafts,
        ),
        (
            "mtp_runner:spec_decode_num_draft_tokens_total",
            "Draft tokens proposed, by drafter.",
            |e| e.draft_tokens,
        ),
        (
            "mtp_runner:spec_decode_num_accepted_tokens_total",
            "Draft tokens accepted, by drafter.",
            |e| e.accepted_tokens,
        ),
    ];
    for (name, help, get) in spec {
        header(out, name, help, "counter");
        for (method, e) in &s.spec {
            let _ = writeln!(out, "{name}{{method=\"{method}\"}} {}", get(e));
        }
    }
    let name = "mtp_runner:spec_decode_num_accepted_tokens_per_pos_total";
    header(
        out,
        name,
        "Draft tokens accepted at each draft position (from 0), by drafter.",
        "counter",
    );
    for (method, e) in &s.spec {
        for (pos, n) in e.accepted_per_pos.iter().enumerate() {
            let _ = writeln!(out, "{name}{{method=\"{method}\",position=\"{pos}\"}} {n}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_with_inf_and_count() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 9.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        for line in [
            "x_bucket{le=\"1\"} 2",
            "x_bucket{le=\"2\"} 3",
            "x_bucket{le=\"+Inf\"} 4",
            "x_sum 12",
            "x_count 4",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} in\n{out}");
        }
    }
}
