//! What the CLI prints: the `--json` object and the human-readable summaries.

use serde::Serialize;

use runner::{FinishReason, Generation, ModelInfo};

/// The final `--json` object of `generate`.
#[derive(Debug, Serialize)]
pub(crate) struct GenerateReport<'a> {
    /// Generated text (cut before a stop string).
    pub text: &'a str,
    /// Generated token ids (without a final EOS).
    pub token_ids: &'a [u32],
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens generated (an EOS that ended generation counts).
    pub generated_tokens: usize,
    /// Prompt tokens per second (time to first token).
    pub prefill_tps: f64,
    /// Generated tokens per second after the first.
    pub decode_tps: f64,
    /// MLX peak memory in bytes.
    pub peak_memory_bytes: usize,
    /// `eos`, `length`, `stop` or `cancelled`.
    pub finish_reason: &'static str,
    /// Seconds to the first token.
    pub prefill_seconds: f64,
    /// Seconds after the first token.
    pub decode_seconds: f64,
    /// Speculative decoding figures (`method` is `off` for plain decoding).
    pub speculation: SpeculationReport,
}

/// The `speculation` object of the `--json` output.
#[derive(Debug, Serialize)]
pub(crate) struct SpeculationReport {
    /// `mtp` or `off`.
    pub method: String,
    /// Rounds (plain steps inside a speculative run count as rounds of depth 0).
    pub rounds: usize,
    /// Draft tokens proposed.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// accepted / drafted.
    pub acceptance_rate: f64,
    /// Acceptance of draft position 1, 2, ...
    pub per_position_acceptance: Vec<f64>,
    /// Tokens committed per round.
    pub mean_accepted_length: f64,
    /// The draft depth of each round.
    pub depth_over_time: Vec<usize>,
    /// Rounds per draft depth: entry `d` counts the rounds drafted `d` deep.
    pub depth_histogram: Vec<usize>,
    /// Where a drafted round's time goes (absent without drafted rounds).
    pub round_costs: Option<RoundCosts>,
}

/// Mean costs of a drafted round, in milliseconds (see [`runner::Phases`]
/// for what each phase covers with and without `MTP_PROFILE_ROUNDS=1`).
#[derive(Debug, Serialize)]
pub(crate) struct RoundCosts {
    /// Whether each round synced per phase (device times per phase).
    pub profiled: bool,
    /// Drafted rounds measured.
    pub rounds: usize,
    /// Wall time of a round.
    pub round_ms: f64,
    /// Drafting, all steps.
    pub draft_ms: f64,
    /// Drafting per draft step.
    pub draft_step_ms: f64,
    /// The verify forward (unprofiled: building its graph).
    pub verify_ms: f64,
    /// Waiting for the device (profiled: unembedding, sampling, acceptance).
    pub wait_ms: f64,
    /// Rewinds and bookkeeping after the sync.
    pub commit_ms: f64,
    /// Blocking host syncs per round.
    pub syncs_per_round: f64,
    /// A plain step of the same run (depth-0 rounds), when there were any.
    pub plain_step_ms: Option<f64>,
}

impl RoundCosts {
    /// The means of `t`, `None` without drafted rounds.
    pub(crate) fn new(t: &runner::RoundTimes) -> Option<RoundCosts> {
        let m = t.means_ms()?;
        Some(RoundCosts {
            profiled: t.profiled,
            rounds: t.rounds,
            round_ms: m.round,
            draft_ms: m.draft,
            draft_step_ms: m.draft_step,
            verify_ms: m.verify,
            wait_ms: m.wait,
            commit_ms: m.commit,
            syncs_per_round: m.syncs,
            plain_step_ms: m.plain_step,
        })
    }
}

impl SpeculationReport {
    /// The report of `g`'s speculation (`method` `off` without one).
    pub(crate) fn new(g: &Generation) -> Self {
        match &g.speculation {
            Some(s) => SpeculationReport {
                method: s.method.as_str().to_owned(),
                rounds: s.rounds,
                drafted: s.drafted,
                accepted: s.accepted,
                acceptance_rate: s.acceptance_rate(),
                per_position_acceptance: s.per_position_acceptance(),
                mean_accepted_length: s.mean_accepted_length(),
                depth_over_time: s.depth_over_time.clone(),
                depth_histogram: s.depth_histogram(),
                round_costs: RoundCosts::new(&s.times),
            },
            None => SpeculationReport {
                method: "off".into(),
                rounds: g.stats.generated_tokens,
                drafted: 0,
                accepted: 0,
                acceptance_rate: 0.0,
                per_position_acceptance: Vec::new(),
                mean_accepted_length: if g.stats.generated_tokens > 0 {
                    1.0
                } else {
                    0.0
                },
                depth_over_time: Vec::new(),
                depth_histogram: Vec::new(),
                round_costs: None,
            },
        }
    }
}

impl<'a> GenerateReport<'a> {
    /// The report of `g`.
    pub(crate) fn new(g: &'a Generation) -> Self {
        let s = &g.stats;
        GenerateReport {
            text: &g.text,
            token_ids: &g.token_ids,
            prompt_tokens: s.prompt_tokens,
            generated_tokens: s.generated_tokens,
            prefill_tps: s.prefill_tps(),
            decode_tps: s.decode_tps(),
            peak_memory_bytes: s.peak_memory_bytes,
            finish_reason: finish_name(g.finish),
            prefill_seconds: s.prefill_time.as_secs_f64(),
            decode_seconds: s.decode_time.as_secs_f64(),
            speculation: SpeculationReport::new(g),
        }
    }
}

/// The JSON name of a finish reason.
pub(crate) fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Eos => "eos",
        FinishReason::Length => "length",
        FinishReason::Stop => "stop",
        FinishReason::Cancelled => "cancelled",
    }
}

/// One line of statistics for stderr.
pub(crate) fn stats_line(g: &Generation) -> String {
    let s = &g.stats;
    format!(
        "prompt: {} tokens, {:.1} tokens/s | generation: {} tokens, {:.1} tokens/s | peak memory: {:.1} MiB | finish: {}",
        s.prompt_tokens,
        s.prefill_tps(),
        s.generated_tokens,
        s.decode_tps(),
        s.peak_memory_bytes as f64 / (1 << 20) as f64,
        finish_name(g.finish)
    ) + &match &g.speculation {
        Some(sp) => format!(
            " | mtp: {} rounds, acceptance {:.2}, {:.2} tokens/round",
            sp.rounds,
            sp.acceptance_rate(),
            sp.mean_accepted_length()
        ),
        None => String::new(),
    }
}

/// `info` as text.
pub(crate) fn info_text(i: &ModelInfo) -> String {
    let dtypes: Vec<String> = i
        .dtypes
        .iter()
        .map(|(d, n)| format!("{d} ({n} tensors)"))
        .collect();
    format!(
        "architecture:   {} (family {}, model_type {})\n\
         parameters:     {} ({:.2} M)\n\
         dtypes:         {}\n\
         layers:         {}\n\
         hidden size:    {}\n\
         vocab size:     {}\n\
         context length: {}\n\
         tensor layout:  {}{}\n\
         MTP head:       {}{}",
        i.architecture,
        i.family,
        i.model_type,
        i.parameter_count,
        i.parameter_count as f64 / 1e6,
        dtypes.join(", "),
        i.layers,
        i.hidden_size,
        i.vocab_size,
        i.context_length,
        i.tensor_layout,
        match i.skipped {
            (0, _) => String::new(),
            (n, p) => format!(
                " (vision tower left out: {n} tensors, {:.2} M parameters)",
                p as f64 / 1e6
            ),
        },
        match (i.mtp_head, i.mtp_layers_declared) {
            (true, n) if n > i.mtp_layers_present => format!(
                "found, {} layout, but only {} of the {n} layers declared in config.json \
                 are in the checkpoint (drafting uses layer 0)",
                i.mtp_layout.unwrap_or("?"),
                i.mtp_layers_present
            ),
            (true, n) => format!(
                "found, {} layout ({n} layer(s) declared in config.json)",
                i.mtp_layout.unwrap_or("?")
            ),
            (false, 0) => "none".to_owned(),
            (false, n) => format!("declared ({n} layer(s)) but no MTP tensors in the checkpoint"),
        },
        match i.mtp_note {
            Some(note) => format!("\n                {note}"),
            None => String::new(),
        }
    )
}

/// `info` as JSON.
#[derive(Debug, Serialize)]
pub(crate) struct InfoReport<'a> {
    /// `architectures[0]`.
    pub architecture: &'a str,
    /// Registered family.
    pub family: &'a str,
    /// `model_type`.
    pub model_type: &'a str,
    /// Elements over all tensors.
    pub parameter_count: usize,
    /// Tensor counts by dtype.
    pub dtypes: &'a std::collections::BTreeMap<String, usize>,
    /// MTP tensors present.
    pub mtp_head: bool,
    /// MTP layers declared in config.json.
    pub mtp_layers_declared: usize,
    /// MTP layers in the checkpoint.
    pub mtp_layers_present: usize,
    /// The MTP head's tensor layout, when there is one.
    pub mtp_layout: Option<&'static str>,
    /// Why a declared MTP head is absent (an mlx-lm conversion dropped it).
    pub mtp_note: Option<&'static str>,
    /// How the checkpoint wraps its text model.
    pub tensor_layout: &'static str,
    /// Vision-tower tensors left out.
    pub skipped_tensors: usize,
    /// Context length.
    pub context_length: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Vocabulary rows.
    pub vocab_size: usize,
}

impl<'a> InfoReport<'a> {
    /// The report of `i`.
    pub(crate) fn new(i: &'a ModelInfo) -> Self {
        InfoReport {
            architecture: &i.architecture,
            family: &i.family,
            model_type: &i.model_type,
            parameter_count: i.parameter_count,
            dtypes: &i.dtypes,
            mtp_head: i.mtp_head,
            mtp_layers_declared: i.mtp_layers_declared,
            mtp_layers_present: i.mtp_layers_present,
            mtp_layout: i.mtp_layout,
            mtp_note: i.mtp_note,
            tensor_layout: i.tensor_layout,
            skipped_tensors: i.skipped.0,
            context_length: i.context_length,
            layers: i.layers,
            hidden_size: i.hidden_size,
            vocab_size: i.vocab_size,
        }
    }
}
