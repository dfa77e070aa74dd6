//! docs/bench/README.md and its PNG plots, drawn from the rows of docs/bench/results.json.
//!
//! One section per machine and device (rows grouped by their `machine` and
//! `device` stamps): plain vs speculative decoding per method and depth, ours
//! vs mlx-lm on the same weights, acceptance per draft position, and the decode
//! step against its floor. Each plot's title names the machine, the date and
//! the command that reruns it. Text is drawn with a bundled font
//! (xtask/assets/DejaVuSans.ttf through `ab_glyph`), so no system fonts are needed.

mod scale;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use serde_json::Value;

/// Redraws README.md and the plots in the folder of `results`.
pub(crate) fn render(results: &Path) -> Result<()> {
    let rows = crate::bench::read_rows(results)?;
    let dir = results.parent().context("results file has no folder")?;
    let md = render_into(&rows, dir)?;
    let pngs = linked_pngs(&md, dir);
    std::fs::write(dir.join("README.md"), &md)?;
    eprintln!(
        "xtask: report: {} rows -> {} and {} plots",
        rows.len(),
        dir.join("README.md").display(),
        pngs.len()
    );
    Ok(())
}

/// One machine and device's rows.
struct Group<'a> {
    machine: String,
    device: String,
    rows: Vec<&'a Value>,
}

impl Group<'_> {
    fn title(&self) -> String {
        let name = self.rows[0]["device_name"].as_str().unwrap_or("?");
        format!("{} — MLX {} `{name}`", self.machine, self.device)
    }

    fn slug(&self) -> String {
        let name = self.rows[0]["device_name"].as_str().unwrap_or("device");
        let s: String = format!("{}-{name}", self.device)
            .to_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        s.split('-')
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .join("-")
    }

    /// Latest date, commits and load averages of the group, for captions.
    fn when(&self) -> String {
        let dates: Vec<&str> = self
            .rows
            .iter()
            .filter_map(|r| r["date"].as_str())
            .collect();
        let mut commits: Vec<&str> = self
            .rows
            .iter()
            .filter_map(|r| r["commit"].as_str())
            .collect();
        commits.sort_unstable();
        commits.dedup();
        let load = self
            .rows
            .iter()
            .filter_map(|r| r["load_avg_1m"].as_f64())
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
        format!(
            "{}, commit {}{}",
            dates.iter().max().copied().unwrap_or("?"),
            commits.join("/"),
            load.map(|l| format!(", load avg up to {l:.1}"))
                .unwrap_or_default()
        )
    }

    fn rerun(&self) -> &str {
        self.rows[0]["command"]
            .as_str()
            .map(|c| {
                if c.starts_with("cargo xtask bench ") {
                    "cargo xtask bench"
                } else {
                    c
                }
            })
            .unwrap_or("cargo xtask bench")
    }

    fn suite(&self, suite: &str) -> impl Iterator<Item = &Value> {
        self.rows
            .iter()
            .copied()
            .filter(move |r| r["suite"] == suite)
    }
}

/// The README text; PNGs are written into `dir`.
pub(crate) fn render_into(rows: &[Value], dir: &Path) -> Result<String> {
    let mut groups: BTreeMap<(String, String), Vec<&Value>> = BTreeMap::new();
    for r in rows {
        let key = (
            r["machine"]
                .as_str()
                .unwrap_or("unknown machine")
                .to_owned(),
            r["device"].as_str().unwrap_or("?").to_owned(),
        );
        groups.entry(key).or_default().push(r);
    }
    let mut md = String::from(
        "# Benchmarks\n\n\
         Written by `cargo xtask bench` from [results.json](results.json) (every row names its machine, \
         device, date, commit and the command to rerun it). GPU rows come from the H200 through \
         `cargo xtask gpu-bundle` and `cargo xtask bench --merge results-gpu.json` ([docs/gpu.md](../gpu.md)). \
         Model: `models/tiny-mtp` (26.7 M parameters, Qwen3 + 1 MTP layer), f32 compute, greedy, 128 tokens, \
         prompt \"Once upon a time\"; draft model `models/tiny-draft`. The spec table adds MTP rows on \
         `tiny-mtp` quantized to q8/q4, on `models/tiny-hybrid-mtp` (Qwen3.5: Gated DeltaNet + gated \
         attention) and on `models/tiny-moe-mtp` (Qwen3.5-MoE, 8.2 M parameters, 8 experts top-2), dense \
         and quantized to q4 by `mtp-runner quantize`. Speculation is lossless: every \
         speculative row emits the plain row's tokens (`cargo xtask gpu-check` enforces it on a GPU). \
         Each section's caption gives the load average: rows taken on a busy shared machine differ run to run \
         by up to 2-3×, so compare rows of one section, not single cells. In the floor table a ratio below 1 \
         means the probes under-rate the device (single ops reach less bandwidth than a whole step does), \
         so that floor is no lower bound there.\n",
    );
    for ((machine, device), rows) in groups {
        let g = Group {
            machine,
            device,
            rows,
        };
        section(&mut md, &g, dir)?;
    }
    md.push_str(scale::HOW_BUILT);
    Ok(md)
}

fn f(v: &Value, digits: usize) -> String {
    v.as_f64()
        .map_or_else(|| "–".to_owned(), |x| format!("{x:.digits$}"))
}

// Long: one report section's tables and plots, in the order they print.
fn section(md: &mut String, g: &Group<'_>, dir: &Path) -> Result<()> {
    let slug = g.slug();
    let _ = write!(
        md,
        "\n## {}\n\n{}. Rerun: `{}`.\n",
        g.title(),
        g.when(),
        g.rerun()
    );
    // Plain vs speculative.
    let spec: Vec<&Value> = g
        .suite("spec")
        .filter(|r| r["summary"].is_null() && r["engine"] == "mtp-runner")
        .collect();
    if !spec.is_empty() {
        let _ = writeln!(
            md,
            "\n### Plain vs speculative decoding (ours)\n\n\
             | model | method | depth | tokens/s | × plain | acceptance | mean accepted | acceptance per position |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- |"
        );
        for r in &spec {
            let model = r["model"].as_str().unwrap_or("tiny-mtp");
            let plain = spec
                .iter()
                .find(|p| p["method"] == "off" && p["model"] == r["model"])
                .and_then(|p| p["tokens_per_s"].as_f64());
            let speedup = match (r["tokens_per_s"].as_f64(), plain) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "–".into(),
            };
            let per_pos = r["per_position_acceptance"]
                .as_array()
                .map(|a| a.iter().map(|x| f(x, 2)).collect::<Vec<_>>().join(", "))
                .unwrap_or_default();
            let _ = writeln!(
                md,
                "| {model} | {} | {} | {} | {speedup} | {} | {} | {per_pos} |",
                r["method"].as_str().unwrap_or("?"),
                r["depth"]
                    .as_str()
                    .map_or_else(|| r["depth"].to_string(), str::to_owned),
                f(&r["tokens_per_s"], 1),
                f(&r["acceptance_rate"], 2),
                f(&r["mean_accepted_length"], 2),
            );
        }
        let png = format!("spec-{slug}.png");
        plot_depth(&spec, &dir.join(&png), g)?;
        let _ = writeln!(
            md,
            "\n![tokens/s against draft depth, {}]({png})",
            g.title()
        );
        let png = format!("acceptance-{slug}.png");
        if plot_acceptance(&spec, &dir.join(&png), g)? {
            let _ = writeln!(
                md,
                "\n![acceptance per draft position, {}]({png})",
                g.title()
            );
        }
    }
    // Ours vs mlx-lm.
    let mut race: Vec<(String, f64, f64)> = Vec::new();
    if let Some(s) = g.suite("decode").find(|r| r["summary"] == true)
        && let (Some(a), Some(b)) = (
            s["ours_decode_tps"].as_f64(),
            s["mlx_lm_decode_tps"].as_f64(),
        )
    {
        race.push(("plain decode".into(), a, b));
    }
    for s in g.suite("spec").filter(|r| r["summary"] == true) {
        if let (Some(a), Some(b)) = (
            s["ours_tokens_per_s"].as_f64(),
            s["mlx_lm_tokens_per_s"].as_f64(),
        ) {
            race.push((format!("draft-model d{}", s["depth"]), a, b));
        }
    }
    if !race.is_empty() {
        let _ = writeln!(
            md,
            "\n### Ours vs mlx-lm, same weights, same run\n\n| case | ours tokens/s | mlx-lm tokens/s | ours / mlx-lm |\n| --- | --- | --- | --- |"
        );
        for (case, a, b) in &race {
            let _ = writeln!(md, "| {case} | {a:.1} | {b:.1} | {:.2} |", a / b);
        }
        let png = format!("vs-mlx-lm-{slug}.png");
        plot_race(&race, &dir.join(&png), g)?;
        let _ = writeln!(md, "\n![ours vs mlx-lm, {}]({png})", g.title());
    }
    // The floor.
    let floor: Vec<&Value> = g.suite("floor").collect();
    if !floor.is_empty() {
        let _ = writeln!(md, "\n### Decode step against its floor\n");
        for r in floor.iter().filter(|r| r["kind"] == "bandwidth") {
            let _ = writeln!(
                md,
                "- bandwidth `{}` over {:.0} MiB: {} GB/s",
                r["op"].as_str().unwrap_or("?"),
                r["bytes"].as_f64().unwrap_or(0.0) / f64::from(1 << 20),
                f(&r["gb_per_s"], 1)
            );
        }
        for r in floor.iter().filter(|r| r["kind"] == "overhead") {
            let _ = writeln!(
                md,
                "- launch overhead: eval round trip {} µs, {} µs per extra op in a graph",
                f(&r["round_trip_us"], 1),
                f(&r["per_op_us"], 2)
            );
        }
        for r in floor.iter().filter(|r| r["kind"] == "decode") {
            let _ = writeln!(
                md,
                "\n| weight bytes | ops per step | bytes ÷ bandwidth ms | ops × per-op ms | floor ms | measured step ms | step ÷ floor |\n\
                 | --- | --- | --- | --- | --- | --- | --- |\n\
                 | {:.1} MB | {} | {} | {} | {} | {} | **{}** |",
                r["weight_bytes"].as_f64().unwrap_or(0.0) / 1e6,
                r["ops_per_step"],
                f(&r["bytes_ms"], 3),
                f(&r["ops_ms"], 3),
                f(&r["floor_ms"], 3),
                f(&r["step_ms"], 3),
                f(&r["ratio"], 2)
            );
        }
    }
    scale::section(md, g, dir, &slug)?;
    Ok(())
}

/// Registers the bundled font once (plotters' `ab_glyph` backend has no system fonts).
fn font() -> Result<()> {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            include_bytes!("../assets/DejaVuSans.ttf"),
        )
        .is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(anyhow!(
            "the bundled font xtask/assets/DejaVuSans.ttf does not parse"
        ))
    }
}

/// Plotters' errors carry the backend's type; keep their text.
fn pe<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];

/// A 1000×560 canvas with a two-line title (what, machine, date, rerun); returns the plot area.
fn canvas<'a>(
    path: &'a Path,
    what: &str,
    g: &Group<'_>,
) -> Result<DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>> {
    font()?;
    let root = BitMapBackend::new(path, (1000, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(pe)?;
    let (top, rest) = root.split_vertically(64);
    top.draw(&Text::new(
        format!("{what} — {}", g.title()),
        (12, 8),
        ("sans-serif", 19).into_font(),
    ))
    .map_err(pe)?;
    top.draw(&Text::new(
        format!("{}. Rerun: {}", g.when(), g.rerun()),
        (12, 36),
        ("sans-serif", 14).into_font().color(&RGBColor(90, 90, 90)),
    ))
    .map_err(pe)?;
    Ok(rest)
}

/// Where `auto` sits on a depth axis: one past the deepest fixed depth among
/// `rows` (at least 4, so older runs keep their axis).
fn auto_x(rows: &[&Value]) -> f64 {
    rows.iter()
        .filter_map(|r| r["depth"].as_u64())
        .fold(4, u64::max) as f64
        + 1.0
}

/// x position of a depth: fixed depths as numbers, `auto` at `auto_at`.
fn depth_x(d: &Value, auto_at: f64) -> Option<f64> {
    match d {
        Value::String(s) if s == "auto" => Some(auto_at),
        other => other.as_f64(),
    }
}

/// The axes of a tokens/s-against-depth plot on `area`: depths 1 up to
/// `auto_at - 1`, then `auto`, across; tokens/s up to `ymax`.
fn depth_chart<'a, 'b>(
    area: &'a DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    ymax: f64,
    auto_at: f64,
) -> Result<Chart<'a, 'b>> {
    let mut chart = ChartBuilder::on(area)
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0.5f64..auto_at + 0.5, 0f64..ymax)
        .map_err(pe)?;
    let auto = auto_at.round() as i64;
    chart
        .configure_mesh()
        .x_desc("draft tokens per round (depth)")
        .y_desc("decode tokens/s")
        .x_labels(auto as usize)
        .x_label_formatter(&|x| match x.round() as i64 {
            n if n == auto => "auto".into(),
            n => n.to_string(),
        })
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(pe)?;
    Ok(chart)
}

/// tokens/s against draft depth, one line per method, plain as a flat line.
fn plot_depth(spec: &[&Value], path: &Path, g: &Group<'_>) -> Result<()> {
    let base: Vec<&&Value> = spec.iter().filter(|r| r["model"].is_null()).collect();
    let ymax = base
        .iter()
        .filter_map(|r| r["tokens_per_s"].as_f64())
        .fold(1.0f64, f64::max)
        * 1.15;
    let area = canvas(path, "tokens/s against draft depth", g)?;
    let auto_at = auto_x(spec);
    let mut chart = depth_chart(&area, ymax, auto_at)?;
    let mut methods: Vec<&str> = base.iter().filter_map(|r| r["method"].as_str()).collect();
    methods.dedup();
    for (i, m) in methods.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut pts: Vec<(f64, f64)> = base
            .iter()
            .filter(|r| r["method"] == *m)
            .filter_map(|r| Some((depth_x(&r["depth"], auto_at)?, r["tokens_per_s"].as_f64()?)))
            .collect();
        if *m == "off" {
            let y = pts.first().map_or(0.0, |p| p.1);
            pts = vec![(0.5, y), (auto_at + 0.5, y)];
        }
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let label = if *m == "off" { "plain" } else { m };
        line(&mut chart, &pts, color, label)?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    area.present().map_err(pe)?;
    Ok(())
}

/// The chart type of every plot here.
type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A labelled line through `pts` with a dot on each point.
fn line(chart: &mut Chart<'_, '_>, pts: &[(f64, f64)], color: RGBColor, label: &str) -> Result<()> {
    chart
        .draw_series(LineSeries::new(pts.to_vec(), color.stroke_width(2)))
        .map_err(pe)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    chart
        .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
        .map_err(pe)?;
    Ok(())
}

/// The series legend, boxed, at `pos`.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>, pos: SeriesLabelPosition) -> Result<()> {
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(pos)
        .draw()
        .map_err(pe)
}

/// Acceptance rate at each draft position (depth 4 rows); false when there are none.
fn plot_acceptance(spec: &[&Value], path: &Path, g: &Group<'_>) -> Result<bool> {
    let lines: Vec<(String, Vec<f64>)> = spec
        .iter()
        .filter(|r| r["model"].is_null() && r["depth"] == 4)
        .filter_map(|r| {
            let v: Vec<f64> = r["per_position_acceptance"]
                .as_array()?
                .iter()
                .filter_map(Value::as_f64)
                .collect();
            (!v.is_empty()).then(|| (r["method"].as_str().unwrap_or("?").to_owned(), v))
        })
        .collect();
    if lines.is_empty() {
        return Ok(false);
    }
    let n = lines.iter().map(|l| l.1.len()).max().unwrap_or(1);
    let area = canvas(path, "acceptance per draft position (depth 4)", g)?;
    let mut chart = ChartBuilder::on(&area)
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0.5f64..n as f64 + 0.5, 0f64..1.05f64)
        .map_err(pe)?;
    chart
        .configure_mesh()
        .x_desc("draft position")
        .y_desc("acceptance (accepted / drafted at that position)")
        .x_labels(n)
        .x_label_formatter(&|x| format!("{}", x.round() as i64))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(pe)?;
    for (i, (name, v)) in lines.iter().enumerate() {
        let color = COLORS[(i + 1) % COLORS.len()];
        let pts: Vec<(f64, f64)> = v
            .iter()
            .enumerate()
            .map(|(k, &y)| (k as f64 + 1.0, y))
            .collect();
        line(&mut chart, &pts, color, name)?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    area.present().map_err(pe)?;
    Ok(true)
}

/// Paired bars: ours and mlx-lm's tokens/s per case.
fn plot_race(race: &[(String, f64, f64)], path: &Path, g: &Group<'_>) -> Result<()> {
    let ymax = race.iter().map(|r| r.1.max(r.2)).fold(1.0f64, f64::max) * 1.15;
    let area = canvas(path, "ours vs mlx-lm, same weights", g)?;
    let mut chart = ChartBuilder::on(&area)
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..race.len() as f64, 0f64..ymax)
        .map_err(pe)?;
    let names: Vec<String> = race.iter().map(|r| r.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc("tokens/s")
        .x_labels(race.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 {
                names.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(pe)?;
    for (k, (label, color)) in [("mtp-runner", COLORS[0]), ("mlx-lm", COLORS[4])]
        .into_iter()
        .enumerate()
    {
        chart
            .draw_series(race.iter().enumerate().map(|(i, r)| {
                let v = if k == 0 { r.1 } else { r.2 };
                let x0 = i as f64 + 0.1 + 0.4 * k as f64;
                Rectangle::new([(x0, 0.0), (x0 + 0.38, v)], color.filled())
            }))
            .map_err(pe)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], color.filled()));
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    area.present().map_err(pe)?;
    Ok(())
}

/// The PNGs a report in `dir` links to.
pub(crate) fn linked_pngs(md: &str, dir: &Path) -> Vec<PathBuf> {
    md.lines()
        .filter_map(|l| l.strip_prefix("![")?.split_once("](")?.1.strip_suffix(')'))
        .map(|p| dir.join(p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn auto_sits_one_past_the_deepest_fixed_depth() {
        let rows: Vec<Value> = [json!(0), json!("auto"), json!(6), json!(2)]
            .into_iter()
            .map(|d| json!({ "depth": d }))
            .collect();
        let refs: Vec<&Value> = rows.iter().collect();
        assert_eq!(auto_x(&refs), 7.0);
        assert_eq!(auto_x(&refs[..2]), 5.0, "older runs keep auto at 5");
        assert_eq!(depth_x(&json!("auto"), 7.0), Some(7.0));
        assert_eq!(depth_x(&json!(6), 7.0), Some(6.0));
    }

    fn sample() -> Vec<Value> {
        let stamp = |mut v: Value, suite: &str| {
            v["suite"] = suite.into();
            v["machine"] = "Test CPU".into();
            v["device"] = "cpu".into();
            v["device_name"] = "Test CPU".into();
            v["date"] = "2025-11-30T00:00:00Z".into();
            v["commit"] = "abc1234".into();
            v["command"] = "cargo xtask bench spec".into();
            v
        };
        let mut rows = vec![stamp(
            json!({"engine": "mtp-runner", "method": "off", "depth": 0, "tokens_per_s": 100.0,
                   "acceptance_rate": 0.0, "mean_accepted_length": 1.0, "per_position_acceptance": []}),
            "spec",
        )];
        for (m, base) in [("mtp", 150.0), ("draft-model", 120.0)] {
            for d in [json!(1), json!(2), json!(3), json!(4), json!("auto")] {
                rows.push(stamp(
                    json!({"engine": "mtp-runner", "method": m, "depth": d, "tokens_per_s": base,
                           "acceptance_rate": 0.6, "mean_accepted_length": 2.1,
                           "per_position_acceptance": [0.9, 0.7, 0.5, 0.3]}),
                    "spec",
                ));
            }
        }
        rows.push(stamp(
            json!({"bench": "decode", "summary": true, "ours_decode_tps": 110.0, "mlx_lm_decode_tps": 100.0}),
            "decode",
        ));
        rows.push(stamp(
            json!({"bench": "floor", "kind": "decode", "weight_bytes": 1.0e8, "ops_per_step": 900,
                   "bytes_ms": 1.0, "ops_ms": 2.0, "floor_ms": 3.0, "step_ms": 6.0, "ratio": 2.0}),
            "floor",
        ));
        rows
    }

    #[test]
    fn report_has_tables_and_writes_non_empty_pngs() {
        let dir = std::env::temp_dir().join(format!("xtask-report-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let md = render_into(&sample(), &dir).unwrap();
        for want in [
            "## Test CPU",
            "| model | method | depth | tokens/s | × plain |",
            "| tiny-mtp | mtp | 4 | 150.0 | 1.50 | 0.60 | 2.10 | 0.90, 0.70, 0.50, 0.30 |",
            "| plain decode | 110.0 | 100.0 | 1.10 |",
            "| **2.00** |",
            "2025-11-30T00:00:00Z, commit abc1234",
            "Rerun: `cargo xtask bench`",
            "## How the spec-scale shapes are built",
        ] {
            assert!(md.contains(want), "missing {want:?} in\n{md}");
        }
        let pngs = linked_pngs(&md, &dir);
        assert_eq!(
            pngs.len(),
            3,
            "spec, acceptance and vs-mlx-lm plots: {pngs:?}"
        );
        for p in pngs {
            let bytes = std::fs::read(&p).unwrap();
            assert!(
                bytes.len() > 5_000,
                "{} is {} bytes",
                p.display(),
                bytes.len()
            );
            assert_eq!(&bytes[..4], b"\x89PNG", "{} is not a PNG", p.display());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn spec_scale_rows_show_round_costs_per_depth() {
        let dir = std::env::temp_dir().join(format!("xtask-report-scale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let row = |kind: &str, method: &str, depth: u64, verify: f64| {
            let mut v = json!({"bench": "spec-scale", "kind": kind, "engine": "mtp-runner",
            "shape": "moe", "dtype": "bf16", "method": method, "depth": depth,
            "tokens_per_s": 50.0, "step_ms": 4.0, "mean_accepted_length": 2.0,
            "acceptance_rate": 0.5, "tokens": 256, "prompts": 3, "greedy_equal_plain": true,
            "round_costs": if method == "off" { Value::Null } else {
                json!({"round_ms": verify + 2.0, "draft_ms": 1.5, "verify_ms": verify})
            }});
            v["suite"] = "spec-scale".into();
            v["machine"] = "Test GPU".into();
            v["device"] = "gpu".into();
            v["device_name"] = "Test GPU".into();
            v["date"] = "2025-11-30T00:00:00Z".into();
            v["commit"] = "abc1234".into();
            v["command"] = "cargo xtask bench spec-scale".into();
            v
        };
        let rows = vec![
            row("decode", "off", 0, 0.0),
            row("decode", "mtp", 1, 5.0),
            row("round-profile", "mtp", 1, 6.0),
            row("round-profile", "mtp", 3, 10.0),
        ];
        let mut rows = rows;
        // Auto's rounds priced at the fixed cases' costs. Every case: 30
        // timed tokens (33 over 3 requests) at 50 tokens/s, 0.6 s; plain
        // 0.02 s a token, depth 1 0.06 s a round (10 rounds), depth 3 0.1
        // (6 rounds), depths 2 and 4 on their line (0.08, 0.12). Auto's
        // rounds: 0.02 + 2 · 0.06 + 0.1 + 0.12 = 0.36 s for 30 tokens,
        // over the best fixed depth's 50 tokens/s: 1.667.
        for r in rows.iter_mut() {
            r["generated_tokens"] = 33.into();
            r["depth_histogram"] = json!([0, 10]);
        }
        let mut d3 = row("decode", "mtp", 3, 9.0);
        d3["generated_tokens"] = 33.into();
        d3["depth_histogram"] = json!([0, 0, 0, 6]);
        rows.push(d3);
        let mut auto = row("decode", "mtp", 0, 0.0);
        auto["depth"] = "auto".into();
        auto["depth_histogram"] = json!([1, 2, 0, 1, 1]);
        auto["generated_tokens"] = 33.into();
        rows.push(auto);
        let mut vs = row("auto-vs-best", "mtp", 0, 0.0);
        vs["depth"] = "auto".into();
        vs["ratio"] = 0.9612.into();
        vs["best_depth"] = 3.into();
        vs["interval90"] = json!([0.93, 0.991]);
        vs["blocks"] = 40.into();
        // Without scale-bench's own priced figure (runs before session
        // 31): priced here from the decode rows. With it: shown with its
        // interval (an f32 row, whose decode rows are absent).
        let mut own = vs.clone();
        own["dtype"] = "f32".into();
        own["priced"] = 0.981.into();
        own["priced_interval90"] = json!([0.97, 0.99]);
        rows.push(vs);
        rows.push(own);
        let md = render_into(&rows, &dir).unwrap();
        for want in [
            "| moe | bf16 | 0.961 | 3 | 0.930–0.991 | 40 | 1.667 |",
            "| moe | f32 | 0.961 | 3 | 0.930–0.991 | 40 | 0.981 (0.970–0.990) |",
            "| shape | dtype | rows | depth | round ms | draft ms | verify ms | verify ÷ plain step |",
            "| moe | bf16 | decode | 1 | 7.00 | 1.50 | 5.00 | 1.25 |",
            "| moe | bf16 | round-profile | 1 | 8.00 | 1.50 | 6.00 | 1.50 |",
            "| moe | bf16 | round-profile | 3 | 12.00 | 1.50 | 10.00 | 2.50 |",
        ] {
            assert!(md.contains(want), "missing {want:?} in\n{md}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
