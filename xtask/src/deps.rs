//! The layering check: the real crate graph (from `cargo metadata`) against the table in docs/ARCHITECTURE.md.
//!
//! The table sits between `<!-- xtask:deps:begin -->` and `<!-- xtask:deps:end -->`,
//! one row per workspace crate: `| crate | dep, dep |` or `| crate | (none) |`.
//! Every kind of dependency counts (normal, build and dev): a dev-dependency
//! on a sibling couples the crates as surely as a normal one. A crate's
//! dev-dependency on itself (to enable test features) is not an edge.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::cmd;

/// Crate name → the workspace crates it depends on (or may depend on).
pub(crate) type Graph = BTreeMap<String, BTreeSet<String>>;

const BEGIN: &str = "<!-- xtask:deps:begin -->";
const END: &str = "<!-- xtask:deps:end -->";
const DOC: &str = "docs/ARCHITECTURE.md";

/// `cargo xtask deps`: fails listing every violation.
pub(crate) fn run() -> Result<()> {
    let path = cmd::root().join(DOC);
    let md =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let allowed =
        parse_table(&md).with_context(|| format!("parsing the dependency table of {DOC}"))?;
    let json = cmd::output(
        "cargo metadata",
        cmd::cargo().args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ]),
    )?;
    let actual = graph_from_metadata(&json).context("reading `cargo metadata` output")?;
    let problems = check(&allowed, &actual);
    if !problems.is_empty() {
        bail!(
            "the crate graph does not match {DOC}:\n  - {}\nFix the dependency, or change the table if the layering really changed.",
            problems.join("\n  - ")
        );
    }
    eprintln!("xtask: deps: {} crates match {DOC}", actual.len());
    Ok(())
}

/// Parses the marked table into the allowed graph.
pub(crate) fn parse_table(md: &str) -> Result<Graph> {
    let start = md
        .find(BEGIN)
        .with_context(|| format!("no `{BEGIN}` marker"))?;
    let end = md.find(END).with_context(|| format!("no `{END}` marker"))?;
    if end < start {
        bail!("`{END}` comes before `{BEGIN}`");
    }
    let mut graph = Graph::new();
    for (i, line) in md[start + BEGIN.len()..end].lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if !line.starts_with('|') || cells.len() != 2 {
            bail!(
                "table line {}: expected `| crate | deps |`, got `{line}`",
                i + 1
            );
        }
        let (name, deps) = (cells[0].trim_matches('`'), cells[1]);
        if name == "crate" || name.chars().all(|c| c == '-' || c == ':') {
            continue; // header and separator
        }
        let deps: BTreeSet<String> = if deps.is_empty() || deps == "(none)" {
            BTreeSet::new()
        } else {
            deps.split(',')
                .map(|d| d.trim().trim_matches('`').to_owned())
                .collect()
        };
        if deps.iter().any(String::is_empty) {
            bail!("table line {}: empty name in `{}`", i + 1, cells[1]);
        }
        if graph.insert(name.to_owned(), deps).is_some() {
            bail!("crate `{name}` has two rows");
        }
    }
    if graph.is_empty() {
        bail!("the table between the markers has no rows");
    }
    Ok(graph)
}

#[derive(Deserialize)]
struct Metadata {
    packages: Vec<Package>,
}

#[derive(Deserialize)]
struct Package {
    name: String,
    dependencies: Vec<Dependency>,
}

#[derive(Deserialize)]
struct Dependency {
    name: String,
}

/// The workspace-internal graph from `cargo metadata --no-deps` JSON (all dependency kinds).
pub(crate) fn graph_from_metadata(json: &str) -> Result<Graph> {
    let meta: Metadata = serde_json::from_str(json)?;
    let members: BTreeSet<&str> = meta.packages.iter().map(|p| p.name.as_str()).collect();
    Ok(meta
        .packages
        .iter()
        .map(|p| {
            let deps = p
                .dependencies
                .iter()
                // A dev-dependency on itself (to turn on test features) is no edge.
                .filter(|d| members.contains(d.name.as_str()) && d.name != p.name)
                .map(|d| d.name.clone())
                .collect();
            (p.name.clone(), deps)
        })
        .collect())
}

/// Every way `actual` departs from `allowed`, one message each; empty when they agree.
pub(crate) fn check(allowed: &Graph, actual: &Graph) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, deps) in actual {
        let Some(ok) = allowed.get(name) else {
            problems.push(format!("crate `{name}` has no row in the table"));
            continue;
        };
        for d in deps.difference(ok) {
            problems.push(format!(
                "`{name}` depends on `{d}`, which its row does not allow"
            ));
        }
    }
    for (name, deps) in allowed {
        if !actual.contains_key(name) {
            problems.push(format!(
                "the table has a row for `{name}`, which is not a workspace crate"
            ));
        }
        for d in deps {
            if !allowed.contains_key(d) {
                problems.push(format!("`{name}` may depend on `{d}`, which has no row"));
            }
        }
    }
    if let Some(cycle) = find_cycle(allowed) {
        problems.push(format!("the table allows a cycle: {}", cycle.join(" -> ")));
    }
    problems
}

/// A cycle in `g` as a path that starts and ends at the same crate, if any.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit<'a>(
        g: &'a Graph,
        n: &'a str,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| *p == n) {
            let mut cycle: Vec<String> = path[at..].iter().map(|s| (*s).to_owned()).collect();
            cycle.push(n.to_owned());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n);
        for d in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(g, d, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n);
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|n| visit(g, n, &mut Vec::new(), &mut done))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rows: &str) -> String {
        format!(
            "# Doc\n\n{BEGIN}\n| crate | may depend on (workspace crates) |\n| --- | --- |\n{rows}{END}\n"
        )
    }

    fn graph(edges: &[(&str, &[&str])]) -> Graph {
        edges
            .iter()
            .map(|(n, ds)| {
                (
                    (*n).to_owned(),
                    ds.iter().map(|d| (*d).to_owned()).collect(),
                )
            })
            .collect()
    }

    /// Parses `rows` as the table, checks `actual` against it, and expects
    /// exactly the problems that contain the given fragments (in order).
    fn check_case(rows: &str, actual: &[(&str, &[&str])], expected: &[&str]) {
        let allowed = parse_table(&table(rows)).unwrap();
        let problems = check(&allowed, &graph(actual));
        assert_eq!(problems.len(), expected.len(), "{problems:#?}");
        for (p, e) in problems.iter().zip(expected) {
            assert!(p.contains(e), "`{p}` should mention `{e}`");
        }
    }

    const LAYERED: &str = "| mlx-tensor | (none) |\n| kvcache | mlx-tensor |\n| sampler | `mlx-tensor` |\n| runner | mlx-tensor, kvcache, sampler |\n";

    #[test]
    fn checker_cases() {
        let ok: &[(&str, &[&str])] = &[
            ("mlx-tensor", &[]),
            ("kvcache", &["mlx-tensor"]),
            ("sampler", &[]),
            ("runner", &["kvcache", "sampler"]),
        ];
        check_case(LAYERED, ok, &[]);
        // Siblings must not depend on each other.
        check_case(
            LAYERED,
            &[
                ("mlx-tensor", &[]),
                ("kvcache", &["sampler"]),
                ("sampler", &[]),
                ("runner", &[]),
            ],
            &["`kvcache` depends on `sampler`"],
        );
        // A crate without a row, and a row without a crate.
        check_case(
            LAYERED,
            &[
                ("mlx-tensor", &[]),
                ("kvcache", &[]),
                ("sampler", &[]),
                ("runner", &[]),
                ("extra", &["mlx-tensor"]),
            ],
            &["`extra` has no row"],
        );
        check_case(
            LAYERED,
            &[("mlx-tensor", &[]), ("kvcache", &[]), ("sampler", &[])],
            &["row for `runner`"],
        );
        // The table itself must be layered.
        check_case(
            "| a | b |\n| b | a |\n",
            &[("a", &[]), ("b", &[])],
            &["cycle: a -> b -> a"],
        );
        check_case(
            "| a | ghost |\n",
            &[("a", &[])],
            &["`ghost`, which has no row"],
        );
    }

    #[test]
    fn parser_rejects_malformed_tables() {
        let cases = [
            ("no markers", "| a | b |".to_owned(), "marker"),
            (
                "duplicate row",
                table("| a | (none) |\n| a | (none) |\n"),
                "two rows",
            ),
            ("three cells", table("| a | b | c |\n"), "expected"),
            ("empty", table(""), "no rows"),
            ("empty dep", table("| a | b, |\n"), "empty name"),
        ];
        for (name, md, want) in cases {
            let err = parse_table(&md).unwrap_err().to_string();
            assert!(err.contains(want), "{name}: {err}");
        }
    }

    #[test]
    fn metadata_graph_keeps_only_workspace_edges() {
        let json = r#"{"packages":[
            {"name":"a","dependencies":[{"name":"b","kind":null},{"name":"serde","kind":null}]},
            {"name":"b","dependencies":[{"name":"a","kind":"dev"},{"name":"b","kind":"dev"}]}]}"#;
        let g = graph_from_metadata(json).unwrap();
        assert_eq!(g, graph(&[("a", &["b"]), ("b", &["a"])]));
    }

    #[test]
    fn the_real_table_parses_and_is_acyclic() {
        let md = std::fs::read_to_string(cmd::root().join(DOC)).unwrap();
        let g = parse_table(&md).unwrap();
        assert!(
            g.contains_key("mlx-tensor") && g["mlx-tensor"].is_empty(),
            "{g:?}"
        );
        assert_eq!(find_cycle(&g), None);
    }
}
