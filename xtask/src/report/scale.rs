//! The `spec-scale` part of a machine's report section: tables per shape, tokens/s against depth per shape, and the plain step against its floor.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;
use serde_json::Value;

#[path = "../../../crates/runner/examples/support/pricing.rs"]
mod pricing;

use super::{COLORS, Group, auto_x, canvas, depth_chart, depth_x, f, legend, line, pe};

/// How the spec-scale shapes are built and why they compute what their
/// sources compute: the last section of docs/bench/README.md.
pub(super) const HOW_BUILT: &str = "\n## How the spec-scale shapes are built\n\n\
`cargo xtask upscale` widens a trained model with zeros so that the bigger model computes the same \
function: a step moves a real model's bytes and launches its kernels while drafts are accepted as the \
trained model's are. The dense shapes (`24l`, `1.7b`, `8b`, `0.6b`; rules in `xtask/src/upscale/widen.rs`) \
widen models/tiny-mtp: zero channels, heads, MLP units and layers, RMSNorm weights × sqrt(H/H') with \
`rms_norm_eps` × H/H', query heads kept on their KV head.\n\n\
The `moe` shape (rules in `xtask/src/upscale/moe.rs`) widens models/tiny-moe-mtp (Qwen3.5-MoE: Gated \
DeltaNet and gated attention, 8 experts top-2 with a sigmoid-gated shared expert, a MoE MTP layer) to \
Qwen3.5-35B-A3B's per-token widths: hidden 2048, 40 layers in the source's linear, linear, full pattern \
(the 34 new ones all zero), gated attention 64 query / 8 KV heads of 64 (the real 16 / 2 of 256 in \
projection widths), Gated DeltaNet 32 key / 64 value heads of 64 (the real 16 / 32 of 128), 8 experts × \
8 copies = 64 with top-16 of width 256 (as many expert bytes per token as the real top-8 of 512), shared \
expert 512, vocabulary 248,320: 6.6 B parameters, 13.2 GB in bf16, 2.9 B read per token. Why it is exact:\n\n\
- **Residual stream × a = sqrt(H'/H).** The embedding and every projection that writes the residual \
(`o_proj`, `out_proj`, the experts' and shared expert's `down_proj`, `mtp.fc`) are × a, the (now untied) \
`lm_head` × 1/a, and the zero-centred norm gains `1 + w` over H' are ÷ a (the final norm and `mtp.norm` \
keep theirs). An RMSNorm over H' with zero new channels then sees the source's mean square with the \
source's `rms_norm_eps`, so every norm that runs over `head_dim` or the DeltaNet's value width (q/k norms, \
the gated RMSNorm) sees unchanged inputs: nothing depends on a changed eps.\n\
- **Head widths stay, head counts grow.** The DeltaNet scales its L2-normalised queries by 1/sqrt(Dk) and \
attention's softmax scale and rotary width depend on `head_dim`, so a wider head would compute something \
else. A query head (query and gate rows, `o_proj` columns) and a DeltaNet value head (its v rows and conv \
channels, z/a/b rows, `A_log`, `dt_bias`, `out_proj` columns) move so that each keeps its key head. New \
heads' rows are zero: their L2-normalised q and k are exactly 0, their recurrent state stays 0, their \
output and gated norm are 0, and their output columns are zero.\n\
- **Experts duplicated, top-k × m.** Each expert becomes m = 8 copies with its router row copied: the \
softmax gives each copy p/m, so the top-16 are exactly the copies of the source's top-2 (unless its 2nd and \
3rd probabilities tie), and with or without `norm_topk_prob` the copies' weights sum to the source's \
weight: the same output up to float summation order. Expert and shared-expert widths grow with zero \
units. A verify of k + 1 rows then reads up to (k + 1) · 16 experts (all 64 from k + 1 = 4 on, as the \
source has only 8 experts of top-2), so its cost grows with the depth as a real MoE's does: the round-cost \
table above shows the verify per fixed depth (`round-profile` rows: device time, every phase synced).\n\
- **New layers add exactly 0**: every mixer's output projection and every expert's `down_proj` is zero \
and nothing before them is infinite (a zero router is a uniform softmax, a zero `A_log` a finite decay). \
Padding vocabulary rows get logits thousands below every real one through a bias channel, as in the \
dense shapes.\n\n\
Checked by `runner/tests/it/upscale_moe.rs` on a small variant (hidden 512, 8 layers, 32 experts top-8, \
f32): logits within 1.3e-5 (trunk) and 1.5e-5 (MTP head) of tiny-moe-mtp's, greedy plain and MTP \
(depth 3 and auto) token for token, acceptance per draft position equal at depth 3, and the two zero \
layers leaving every logit bit-identical. In bf16 the weights × a round once more unless a is a power of \
two (H'/H a power of 4): for `moe` (a = 2·sqrt(2)) this is one extra bf16 rounding of those weights (the \
small variant at a = sqrt(2): max logit change 0.05 of |logit| ≤ 19, same argmax; at a = 2: 1.6e-5). \
mlx-lm runs `moe` plain only: no draft model shares its vocabulary.\n";

/// Shapes in size order; unknown ones after.
fn shape_rank(s: &str) -> usize {
    ["tiny", "24l", "1.7b", "8b", "moe"]
        .iter()
        .position(|x| *x == s)
        .unwrap_or(9)
}

fn s<'a>(r: &'a Value, k: &str) -> &'a str {
    r[k].as_str().unwrap_or("?")
}

fn depth_text(d: &Value) -> String {
    d.as_str().map_or_else(|| d.to_string(), str::to_owned)
}

/// The plain row of the same shape, dtype and engine.
fn plain_of<'a>(rows: &[&'a Value], r: &Value) -> Option<&'a Value> {
    rows.iter().copied().find(|p| {
        p["method"] == "off"
            && p["shape"] == r["shape"]
            && p["dtype"] == r["dtype"]
            && p["engine"] == r["engine"]
    })
}

/// The rows of `all` whose `kind` is `kind`.
fn of_kind<'a>(all: &[&'a Value], kind: &str) -> Vec<&'a Value> {
    all.iter().copied().filter(|r| r["kind"] == kind).collect()
}

/// Auto's choices priced at the fixed cases' costs with scale-bench's own
/// function (its `priced` field, from session 31 on; this recomputes it from
/// the decode rows of older runs): auto's timed tokens over the seconds its
/// rounds would have taken at each fixed case's seconds a round (plain's
/// a token; depths without a case on the line through the two deepest drafting cases),
/// over the best fixed depth's tokens/s. The timing noise between the cases
/// of a run (whose rounds ran at different moments of a drifting host)
/// mostly drops out; what is left is how well auto chose its depths,
/// against fixed rows that keep their own noise. `None` without the rows
/// it needs.
fn priced_at_fixed_costs(all: &[&Value], vs: &Value) -> Option<f64> {
    let decode: Vec<&Value> = of_kind(all, "decode")
        .into_iter()
        .filter(|r| {
            r["engine"] == "mtp-runner" && r["shape"] == vs["shape"] && r["dtype"] == vs["dtype"]
        })
        .collect();
    // Timed tokens (after each request's first) and their decode seconds.
    let timed = |r: &Value| -> Option<(f64, f64)> {
        let t = r["generated_tokens"].as_f64()? - r["prompts"].as_f64()?;
        Some((t, t / r["tokens_per_s"].as_f64().filter(|&x| x > 0.0)?))
    };
    let rounds = |r: &Value| -> Option<Vec<f64>> {
        r["depth_histogram"]
            .as_array()?
            .iter()
            .map(Value::as_f64)
            .collect()
    };
    // (depth, seconds a round) of each fixed case, plain's a token.
    let mut at: Vec<(usize, f64)> = Vec::new();
    let mut best = f64::NAN;
    for r in &decode {
        let Some(d) = r["depth"].as_u64().and_then(|d| usize::try_from(d).ok()) else {
            continue;
        };
        let (t, secs) = timed(r)?;
        let n = if d == 0 { t } else { rounds(r)?.iter().sum() };
        at.push((d, secs / n));
        if d > 0 {
            best = best.max(r["tokens_per_s"].as_f64()?);
        }
    }
    at.sort_by_key(|x| x.0);
    at.dedup_by_key(|x| x.0);
    let auto = decode.iter().find(|r| r["depth"] == "auto")?;
    let secs = pricing::priced_seconds(&at, &rounds(auto)?)?;
    let ratio = timed(auto)?.0 / secs / best;
    ratio.is_finite().then_some(ratio)
}

/// The table of auto against the best fixed depth with its interval over
/// the run's request blocks (`auto-vs-best` rows; nothing without them).
fn auto_vs_best(md: &mut String, all: &[&Value]) {
    let mut rows: Vec<&Value> = of_kind(all, "auto-vs-best");
    if rows.is_empty() {
        return;
    }
    rows.sort_by_key(|r| (shape_rank(s(r, "shape")), s(r, "dtype").to_owned()));
    let _ = writeln!(
        md,
        "\nAuto against the best fixed depth of the same run (ours): tokens/s over tokens/s, and a 90 % \
         interval from resampling the run's request blocks (one prompt run by every case in turn), \
         picking the best depth again in each resample: the spread that the run's timing noise alone \
         gives the ratio. The last column prices each of auto's rounds at the seconds a round of the \
         fixed case of its depth (plain's a token) and divides auto's tokens over that time by the \
         best fixed depth's tokens/s, with its interval where the run gives one: the timing noise \
         between the cases (run at different moments of a drifting host) mostly drops out, and what \
         is left is how well auto chose (the fixed rows' own noise stays).\n\n\
         | shape | dtype | auto ÷ best fixed | best fixed depth | 90 % interval | request blocks | \
         at the fixed rounds' costs |\n\
         | --- | --- | --- | --- | --- | --- | --- |"
    );
    for r in rows {
        // scale-bench's own figure with its interval (from 31 on), else
        // one priced from the run's decode rows.
        let priced = match (r["priced"].as_f64(), r["priced_interval90"].as_array()) {
            (Some(p), Some(i)) => format!("{p:.3} ({}–{})", f(&i[0], 3), f(&i[1], 3)),
            _ => {
                priced_at_fixed_costs(all, r).map_or_else(|| "–".to_owned(), |p| format!("{p:.3}"))
            }
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {}–{} | {} | {priced} |",
            s(r, "shape"),
            s(r, "dtype"),
            f(&r["ratio"], 3),
            depth_text(&r["best_depth"]),
            f(&r["interval90"][0], 3),
            f(&r["interval90"][1], 3),
            r["blocks"],
        );
    }
}

/// Appends the spec-scale tables and plots of `g` (nothing when it has no such rows).
// Long: one report section: its tables in order.
pub(super) fn section(md: &mut String, g: &Group<'_>, dir: &Path, slug: &str) -> Result<()> {
    let all: Vec<&Value> = g.suite("spec-scale").collect();
    let mut decode: Vec<&Value> = of_kind(&all, "decode");
    if decode.is_empty() {
        return Ok(());
    }
    decode.sort_by_key(|r| {
        (
            shape_rank(s(r, "shape")),
            s(r, "shape").to_owned(),
            s(r, "dtype").to_owned(),
        )
    });
    let tokens = decode[0]["tokens"].as_u64().unwrap_or(0);
    let prompts = decode[0]["prompts"].as_u64().unwrap_or(0);
    let _ = writeln!(
        md,
        "\n### Speculation at scale (`spec-scale`)\n\n\
         Function-preserving upscales of tiny-mtp (`cargo xtask upscale`: the same outputs at a bigger \
         shape, so a step moves a real model's bytes while drafts are accepted as tiny-mtp's are), built in \
         the run; {prompts} held-out code prompts × {tokens} tokens, greedy; tokens/s = tokens after each \
         run's first ÷ total decode time. `greedy = plain` is enforced in f32 for ours and reported in bf16. \
         mlx-lm's draft model is tiny-draft (upscaled to the 0.6b shape for the 151,936-row vocabularies).\n\n\
         | shape | dtype | engine | method | depth | tokens/s | × plain | mean accepted | acceptance | greedy = plain | TTFT ms |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for r in &decode {
        let speedup = match (
            r["tokens_per_s"].as_f64(),
            plain_of(&decode, r).and_then(|p| p["tokens_per_s"].as_f64()),
        ) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
            _ => "–".into(),
        };
        let equal = match &r["greedy_equal_plain"] {
            Value::Bool(true) => "yes".to_owned(),
            Value::Bool(false) => format!("**no** (at {})", r["first_divergence"]),
            _ => "–".to_owned(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {speedup} | {} | {} | {equal} | {} |",
            s(r, "shape"),
            s(r, "dtype"),
            s(r, "engine"),
            s(r, "method"),
            depth_text(&r["depth"]),
            f(&r["tokens_per_s"], 1),
            f(&r["mean_accepted_length"], 2),
            f(&r["acceptance_rate"], 2),
            f(&r["ttft_ms"], 1),
        );
    }
    auto_vs_best(md, &all);
    let ttft: Vec<&Value> = of_kind(&all, "ttft");
    if !ttft.is_empty() {
        let _ = writeln!(
            md,
            "\nTime to first token: fresh plain requests in the process that ran the table above, a \
             1,000-token prompt and then another length (a second length that costs far more per token \
             than the first means the prefill rebuilt something for the new shape).\n\n\
             | shape | dtype | engine | request | prompt tokens | TTFT ms | ms per prompt token |\n\
             | --- | --- | --- | --- | --- | --- | --- |"
        );
        for r in &ttft {
            let per = match (r["ttft_ms"].as_f64(), r["prompt_tokens"].as_f64()) {
                (Some(t), Some(n)) if n > 0.0 => format!("{:.3}", t / n),
                _ => "–".into(),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {per} |",
                s(r, "shape"),
                s(r, "dtype"),
                s(r, "engine"),
                r["request"],
                r["prompt_tokens"],
                f(&r["ttft_ms"], 1)
            );
        }
    }
    round_costs(md, &all, &decode);
    let notes: Vec<String> = all
        .iter()
        .filter(|r| r["kind"] == "skipped" || r["kind"] == "error")
        .map(|r| {
            format!(
                "- {} {} {} {} {}: {} ({})",
                s(r, "kind"),
                s(r, "shape"),
                r["dtype"].as_str().unwrap_or(""),
                r["engine"].as_str().unwrap_or(""),
                r["method"]
                    .as_str()
                    .map(|m| format!("{m} {}", depth_text(&r["depth"])))
                    .unwrap_or_default(),
                r["reason"]
                    .as_str()
                    .or_else(|| r["error"].as_str())
                    .unwrap_or(""),
                s(r, "kind"),
            )
        })
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(md, "\nNot measured in this run:\n\n{}", notes.join("\n"));
    }
    let mut shapes: Vec<&str> = decode.iter().map(|r| s(r, "shape")).collect();
    shapes.dedup();
    for shape in shapes {
        let rows: Vec<&Value> = decode
            .iter()
            .copied()
            .filter(|r| s(r, "shape") == shape)
            .collect();
        let png = format!("spec-scale-{slug}-{}.png", shape.replace('.', "_"));
        plot_depth(&rows, shape, &dir.join(&png), g)?;
        let _ = writeln!(
            md,
            "\n![spec-scale {shape}: tokens/s against depth, {}]({png})",
            g.title()
        );
    }
    floor(md, g, &all, &decode, dir, slug)
}

/// The round costs of ours per fixed depth: where the verify grows with the
/// depth (a MoE's verify of `k + 1` rows reads up to `k + 1` tokens' experts).
fn round_costs(md: &mut String, all: &[&Value], decode: &[&Value]) {
    let mut rows: Vec<&Value> = all
        .iter()
        .copied()
        .filter(|r| {
            (r["kind"] == "decode" || r["kind"] == "round-profile")
                && r["method"] == "mtp"
                && r["depth"].is_u64()
                && r["round_costs"].is_object()
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    rows.sort_by_key(|r| {
        (
            shape_rank(s(r, "shape")),
            s(r, "shape").to_owned(),
            s(r, "dtype").to_owned(),
            s(r, "kind").to_owned(),
            r["depth"].as_u64(),
        )
    });
    let _ = writeln!(
        md,
        "\nRound costs per fixed depth (ours), ms: a drafted round's mean wall time and its phases. \
         `decode` rows time the phases on the host in the pipelined run; `round-profile` rows sync \
         every phase, so their verify is the device time of one forward over depth + 1 rows (on a \
         MoE that reads up to depth + 1 tokens' experts, so it grows with the depth).\n\n\
         | shape | dtype | rows | depth | round ms | draft ms | verify ms | verify ÷ plain step |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for r in rows {
        let c = &r["round_costs"];
        let ratio = match (
            c["verify_ms"].as_f64(),
            plain_of(decode, r).and_then(|p| p["step_ms"].as_f64()),
        ) {
            (Some(v), Some(p)) if p > 0.0 => format!("{:.2}", v / p),
            _ => "–".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {ratio} |",
            s(r, "shape"),
            s(r, "dtype"),
            s(r, "kind"),
            r["depth"],
            f(&c["round_ms"], 2),
            f(&c["draft_ms"], 2),
            f(&c["verify_ms"], 2),
        );
    }
}

/// tokens/s against depth for one shape: a line per (engine, dtype, method), plain flat.
fn plot_depth(rows: &[&Value], shape: &str, path: &Path, g: &Group<'_>) -> Result<()> {
    let ymax = rows
        .iter()
        .filter_map(|r| r["tokens_per_s"].as_f64())
        .fold(1.0f64, f64::max)
        * 1.15;
    let area = canvas(
        path,
        &format!("spec-scale {shape}: tokens/s against draft depth"),
        g,
    )?;
    let auto_at = auto_x(rows);
    let mut chart = depth_chart(&area, ymax, auto_at)?;
    let mut series: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| {
            (
                s(r, "engine").to_owned(),
                s(r, "dtype").to_owned(),
                s(r, "method").to_owned(),
            )
        })
        .collect();
    series.sort();
    series.dedup();
    for (i, (engine, dtype, method)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut pts: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| {
                s(r, "engine") == engine && s(r, "dtype") == dtype && s(r, "method") == method
            })
            .filter_map(|r| Some((depth_x(&r["depth"], auto_at)?, r["tokens_per_s"].as_f64()?)))
            // A speculative session held at depth 0 (`--depths 0`) is off the axis.
            .filter(|p| p.0 >= 0.5)
            .collect();
        if method == "off" {
            let y = pts.first().map_or(0.0, |p| p.1);
            pts = vec![(0.5, y), (auto_at + 0.5, y)];
        }
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let label = format!(
            "{engine} {dtype} {}",
            if method == "off" { "plain" } else { method }
        );
        line(&mut chart, &pts, color, &label)?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    area.present().map_err(pe)?;
    Ok(())
}

/// The plain step against weight bytes ÷ the best measured read bandwidth.
// Long: the floor plot: axes, series and labels in order.
fn floor(
    md: &mut String,
    g: &Group<'_>,
    all: &[&Value],
    decode: &[&Value],
    dir: &Path,
    slug: &str,
) -> Result<()> {
    let gbs = all
        .iter()
        .filter(|r| {
            r["kind"] == "bandwidth" && ["sum", "gemv", "rows"].iter().any(|op| r["op"] == *op)
        })
        .filter_map(|r| r["gb_per_s"].as_f64())
        .fold(0.0f64, f64::max);
    if gbs <= 0.0 {
        return Ok(());
    }
    // (label, floor ms, step ms)
    let mut pts: Vec<(String, f64, f64)> = Vec::new();
    let _ = writeln!(
        md,
        "\nPlain decode step against the physical floor: weight bytes (MLX active memory of the loaded \
         weights; ours includes the MTP head) ÷ the best measured read bandwidth ({gbs:.1} GB/s).\n\n\
         | shape | dtype | engine | weight bytes | floor ms | step ms | step ÷ floor |\n\
         | --- | --- | --- | --- | --- | --- | --- |"
    );
    for r in decode.iter().filter(|r| r["method"] == "off") {
        let wb = r["weight_bytes"].as_f64().or_else(|| {
            all.iter()
                .find(|l| {
                    l["kind"] == "load"
                        && l["shape"] == r["shape"]
                        && l["dtype"] == r["dtype"]
                        && l["engine"] == r["engine"]
                })
                .and_then(|l| l["weight_bytes"].as_f64())
        });
        let (Some(wb), Some(step)) = (wb, r["step_ms"].as_f64()) else {
            continue;
        };
        let fl = wb / (gbs * 1e9) * 1e3;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.1} MB | {fl:.3} | {step:.3} | **{:.2}** |",
            s(r, "shape"),
            s(r, "dtype"),
            s(r, "engine"),
            wb / 1e6,
            step / fl
        );
        pts.push((
            format!("{} {} {}", s(r, "shape"), s(r, "dtype"), s(r, "engine")),
            fl,
            step,
        ));
    }
    if pts.is_empty() {
        return Ok(());
    }
    let png = format!("spec-scale-floor-{slug}.png");
    let path = dir.join(&png);
    let lo = pts
        .iter()
        .map(|p| p.1.min(p.2))
        .fold(f64::INFINITY, f64::min)
        / 2.0;
    let hi = pts.iter().map(|p| p.1.max(p.2)).fold(0.0f64, f64::max) * 2.0;
    let area = canvas(&path, "plain step against its floor", g)?;
    let mut chart = ChartBuilder::on(&area)
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d((lo..hi).log_scale(), (lo..hi).log_scale())
        .map_err(pe)?;
    chart
        .configure_mesh()
        .x_desc("floor ms (weight bytes ÷ bandwidth)")
        .y_desc("measured plain step ms")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(pe)?;
    chart
        .draw_series(LineSeries::new(
            vec![(lo, lo), (hi, hi)],
            BLACK.mix(0.5).stroke_width(1),
        ))
        .map_err(pe)?
        .label("step = floor")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.5)));
    for (i, (label, x, y)) in pts.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(std::iter::once(Circle::new((*x, *y), 6, color.filled())))
            .map_err(pe)?
            .label(label.clone())
            .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(pe)?;
    area.present().map_err(pe)?;
    let _ = writeln!(
        md,
        "\n![spec-scale plain step against its floor, {}]({png})",
        g.title()
    );
    Ok(())
}
