//! The tidy check: house-style rules a reviewer should not have to repeat,
//! checked over the source tree (run by `cargo xtask ci` and `cargo test -p xtask`).
//!
//! - every `.rs` file opens with a `//!` line saying what it holds;
//! - no logic on cache kinds spelled as strings (`kind() == "..."`);
//! - no workspace dependency that no crate uses, and no crate dependency
//!   that the crate's code never names;
//! - no function in a crate's `src/` longer than [`MAX_FN_LINES`] lines
//!   unless a `// Long: <reason>` line sits right above it (with its docs);
//! - no cycle between the top-level modules of `runner` and `runner-cli`
//!   (a module that uses another through `crate::` depends on it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::cmd;

/// Longest function body (lines, signature to closing brace) without a reason.
pub(crate) const MAX_FN_LINES: usize = 80;

/// Crates whose top-level modules must not form a cycle.
const ACYCLIC: &[&str] = &["runner", "runner-cli"];

/// Module cycles that are known and owned by another change (checked to
/// still exist, so the entry is dropped once the cycle is gone).
const KNOWN_CYCLES: &[(&str, &str)] = &[];

/// `cargo xtask tidy`: fails listing every violation.
pub(crate) fn run() -> Result<()> {
    let problems = check(&cmd::root())?;
    if !problems.is_empty() {
        bail!("tidy:\n  - {}", problems.join("\n  - "));
    }
    eprintln!("xtask: tidy: clean");
    Ok(())
}

/// Every violation under the workspace at `root`.
pub(crate) fn check(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let crates = crate_dirs(root)?;
    for dir in crates.iter().chain(std::iter::once(&root.join("xtask"))) {
        for file in rust_files(dir)? {
            let text = read(&file)?;
            let name = rel(root, &file);
            if !opens_with_doc(&text) {
                problems.push(format!("{name}: does not open with a `//!` line"));
            }
            let in_src = file.starts_with(dir.join("src"));
            if in_src {
                for line in kind_string_logic(&text) {
                    problems.push(format!("{name}:{line}: logic on a `kind()` string"));
                }
                for (line, fn_name, len) in long_functions(&text) {
                    problems.push(format!(
                        "{name}:{line}: fn `{fn_name}` is {len} lines (over {MAX_FN_LINES}) \
                         without a `// Long: <reason>` line above it"
                    ));
                }
            }
        }
    }
    problems.extend(unused_dependencies(root, &crates)?);
    for krate in ACYCLIC {
        let dir = root.join("crates").join(krate);
        let graph = module_graph(&dir.join("src"))?;
        let mut known: BTreeSet<&str> = BTreeSet::new();
        for cycle in cycles(&graph) {
            match KNOWN_CYCLES.iter().find(|(k, c)| k == krate && *c == cycle) {
                Some((_, c)) => {
                    known.insert(c);
                }
                None => problems.push(format!("{krate}: module cycle {cycle}")),
            }
        }
        for (_, c) in KNOWN_CYCLES.iter().filter(|(k, _)| k == krate) {
            if !known.contains(c) {
                problems.push(format!(
                    "{krate}: the known cycle `{c}` is gone: drop it from KNOWN_CYCLES"
                ));
            }
        }
    }
    Ok(problems)
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn rel(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The folders of the workspace's crates (`crates/*` with a `Cargo.toml`).
fn crate_dirs(root: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .context("listing crates/")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// Every `.rs` file under `dir`, skipping build output.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Whether the first line is a `//!` doc line.
pub(crate) fn opens_with_doc(text: &str) -> bool {
    text.lines().next().is_some_and(|l| l.starts_with("//!"))
}

/// Lines (from 1) that compare a `kind()` with a string literal.
pub(crate) fn kind_string_logic(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let code = l.split("//").next().unwrap_or("");
            code.contains("kind() == \"") || code.contains("kind() != \"")
        })
        .map(|(i, _)| i + 1)
        .collect()
}

/// `text` with comments, string and char literals blanked out (same
/// length and line breaks), so braces can be counted.
// Long: one small lexer, a branch per kind of literal or comment.
pub(crate) fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&b, i) {
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: Vec<char> = std::iter::once('"')
                .chain((0..hashes).map(|_| '#'))
                .collect();
            j += 1;
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            let end = (j + close.len()).min(b.len());
            out.extend(b[i..end].iter().map(|&c| blank(c)));
            i = end;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}'), else a lifetime.
            let len = match (next, b.get(i + 2)) {
                (Some('\\'), _) => b[i + 2..].iter().position(|&c| c == '\'').map(|p| p + 3),
                (Some(_), Some('\'')) => Some(3),
                _ => None,
            };
            match len {
                Some(n) => {
                    out.extend(std::iter::repeat_n(' ', n));
                    i += n;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(b: &[char], i: usize) -> bool {
    i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_')
}

/// `(line, name, lines)` of every function over [`MAX_FN_LINES`] lines
/// without a `// Long:` reason in the comment lines right above it.
pub(crate) fn long_functions(text: &str) -> Vec<(usize, String, usize)> {
    let code = code_only(text);
    let lines: Vec<&str> = text.lines().collect();
    let code_lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in code_lines.iter().enumerate() {
        let Some(name) = fn_name(line) else {
            continue;
        };
        let Some(len) = body_lines(&code_lines[i..]) else {
            continue;
        };
        if len <= MAX_FN_LINES {
            continue;
        }
        let reason = lines[..i]
            .iter()
            .rev()
            .map(|l| l.trim_start())
            .take_while(|l| l.starts_with("//") || l.starts_with("#["))
            .any(|l| l.starts_with("// Long:"));
        if !reason {
            out.push((i + 1, name, len));
        }
    }
    out
}

/// The name of the function a line declares, if it does.
fn fn_name(line: &str) -> Option<String> {
    let mut words = line.split_whitespace().peekable();
    while let Some(w) = words.next() {
        if w == "fn" {
            let name: String = words
                .next()?
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            return (!name.is_empty()).then_some(name);
        }
        let modifier = w.starts_with("pub")
            || matches!(w, "const" | "async" | "unsafe" | "extern" | "default")
            || w.starts_with('"');
        if !modifier {
            return None;
        }
    }
    None
}

/// Lines from a function's signature to its closing brace, or `None` for
/// a declaration without a body.
fn body_lines(code: &[&str]) -> Option<usize> {
    let mut depth = 0usize;
    let mut opened = false;
    for (i, line) in code.iter().enumerate() {
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => {
                    depth = depth.saturating_sub(1);
                    if opened && depth == 0 {
                        return Some(i + 1);
                    }
                }
                ';' if !opened && depth == 0 => return None,
                _ => {}
            }
        }
    }
    None
}

/// Dependencies declared but never named: `[workspace.dependencies]`
/// entries no crate takes, and crate dependencies its code never names.
fn unused_dependencies(root: &Path, crates: &[PathBuf]) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let workspace = read(&root.join("Cargo.toml"))?;
    let declared = section_names(&workspace, "workspace.dependencies");
    let mut taken = BTreeSet::new();
    for dir in crates.iter().chain(std::iter::once(&root.join("xtask"))) {
        let manifest = read(&dir.join("Cargo.toml"))?;
        let package = package_name(&manifest).unwrap_or_default();
        let kinds = [
            ("dependencies", &["src"][..]),
            (
                "dev-dependencies",
                &["src", "tests", "examples", "benches"][..],
            ),
            ("build-dependencies", &["build.rs"][..]),
        ];
        for (section, places) in kinds {
            for dep in section_names(&manifest, section) {
                taken.insert(dep.clone());
                if dep == package {
                    continue;
                }
                let ident = dep.replace('-', "_");
                let mut used = false;
                for place in places {
                    let p = dir.join(place);
                    let files = if p.is_file() {
                        vec![p]
                    } else if p.is_dir() {
                        rust_files(&p)?
                    } else {
                        Vec::new()
                    };
                    for f in files {
                        if names_crate(&read(&f)?, &ident) {
                            used = true;
                            break;
                        }
                    }
                    if used {
                        break;
                    }
                }
                if !used {
                    problems.push(format!(
                        "{}: {section} `{dep}` is never named in {}",
                        rel(root, &dir.join("Cargo.toml")),
                        places.join(", ")
                    ));
                }
            }
        }
    }
    for dep in declared {
        if !taken.contains(&dep) {
            problems.push(format!(
                "Cargo.toml: [workspace.dependencies] `{dep}` is used by no crate"
            ));
        }
    }
    Ok(problems)
}

/// Whether Rust code names crate `ident` (`ident::`, `use ident`, `extern crate ident`).
pub(crate) fn names_crate(text: &str, ident: &str) -> bool {
    let code = code_only(text);
    code.match_indices(ident).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let boundary = !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        let after = &code[i + ident.len()..];
        boundary
            && (after.starts_with("::")
                || code[..i].trim_end().ends_with("use")
                || code[..i].trim_end().ends_with("crate"))
    })
}

/// The package name of a manifest.
fn package_name(manifest: &str) -> Option<String> {
    section_lines(manifest, "package")
        .find_map(|l| l.strip_prefix("name"))
        .and_then(|rest| rest.split('"').nth(1))
        .map(str::to_owned)
}

/// The keys (dependency names) of a `[section]` of a manifest.
pub(crate) fn section_names(manifest: &str, section: &str) -> Vec<String> {
    section_lines(manifest, section)
        .filter_map(|l| {
            let key = l.split(['=', '.']).next()?.trim();
            (!key.is_empty() && !key.starts_with('#')).then(|| key.trim_matches('"').to_owned())
        })
        .collect()
}

fn section_lines<'a>(manifest: &'a str, section: &str) -> impl Iterator<Item = &'a str> {
    let header = format!("[{section}]");
    manifest
        .lines()
        .map(str::trim)
        .skip_while(move |l| *l != header)
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// Top-level module → the top-level modules it names through `crate::`
/// (the crate root itself is not a node: a facade re-exports everything).
fn module_graph(src: &Path) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let mut modules = BTreeSet::new();
    for entry in std::fs::read_dir(src)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "rs") {
            let stem = path.file_stem().unwrap_or_default().to_string_lossy();
            if stem != "lib" && stem != "main" {
                modules.insert(stem.into_owned());
            }
        }
    }
    let mut graph = BTreeMap::new();
    for m in &modules {
        let mut files = vec![src.join(format!("{m}.rs"))];
        if src.join(m).is_dir() {
            files.extend(rust_files(&src.join(m))?);
        }
        let mut deps = BTreeSet::new();
        for f in files {
            let code = code_only(&read(&f)?);
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                    group
                        .split('}')
                        .next()
                        .unwrap_or("")
                        .split(',')
                        .map(|s| s.trim().split("::").next().unwrap_or(""))
                        .collect()
                } else {
                    vec![rest.split("::").next().unwrap_or("")]
                };
                for n in names {
                    let n: String = n
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if modules.contains(&n) && &n != m {
                        deps.insert(n);
                    }
                }
            }
        }
        graph.insert(m.clone(), deps);
    }
    Ok(graph)
}

/// Every cycle of `graph` found by a depth-first search, each written
/// `a -> b` from its smallest module (`a -> b -> c` for three).
pub(crate) fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for start in graph.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        while let Some((node, path)) = stack.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if next == start {
                    // Report each cycle once, from its smallest module.
                    if path.iter().all(|p| p >= start) {
                        found.insert(path.join(" -> "));
                    }
                } else if !path.contains(next) && next > start {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next.clone(), p));
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_is_tidy() {
        let problems = check(&cmd::root()).unwrap();
        assert!(
            problems.is_empty(),
            "tidy:\n  - {}",
            problems.join("\n  - ")
        );
    }

    #[test]
    fn a_file_without_a_doc_line_fails() {
        assert!(opens_with_doc("//! Holds things.\nfn a() {}\n"));
        assert!(!opens_with_doc("// A plain comment.\n"));
        assert!(!opens_with_doc("use std::fs;\n//! Late.\n"));
    }

    #[test]
    fn kind_strings_are_found() {
        let text = "fn a(c: &dyn Cache) -> bool {\n    c.kind() == \"KvCache\"\n}\n";
        assert_eq!(kind_string_logic(text), vec![2]);
        assert!(kind_string_logic("if e.kind() != ErrorKind::BrokenPipe {}\n").is_empty());
    }

    fn function(lines: usize, above: &str) -> String {
        let body: String = (0..lines - 2)
            .map(|i| format!("    let x{i} = \"}}\";\n"))
            .collect();
        format!("{above}fn big() {{\n{body}}}\n")
    }

    #[test]
    fn long_functions_need_a_reason() {
        assert!(long_functions(&function(MAX_FN_LINES, "")).is_empty());
        let long = long_functions(&function(MAX_FN_LINES + 1, "/// Docs.\n"));
        assert_eq!(long, vec![(2, "big".to_owned(), MAX_FN_LINES + 1)]);
        let excused = function(
            MAX_FN_LINES + 1,
            "// Long: one match over every op.\n#[inline]\n",
        );
        assert!(long_functions(&excused).is_empty());
        // Declarations without bodies and braces in strings and chars are not bodies.
        assert!(
            long_functions("trait T {\n    fn f(&self);\n}\nconst C: char = '{';\n").is_empty()
        );
    }

    #[test]
    fn crate_names_are_found_in_code_only() {
        assert!(names_crate("use serde::Deserialize;\n", "serde"));
        assert!(names_crate("let v = serde_json::json!(1);\n", "serde_json"));
        assert!(!names_crate("let v = serde_json::json!(1);\n", "serde"));
        assert!(!names_crate(
            "// serde::Deserialize\nlet s = \"serde::x\";\n",
            "serde"
        ));
    }

    #[test]
    fn manifest_sections_list_their_keys() {
        let m = "[package]\nname = \"x\"\n\n[dependencies]\na.workspace = true\nb-c = { version = \"1\" }\n# c = 1\n\n[dev-dependencies]\nd = \"1\"\n";
        assert_eq!(section_names(m, "dependencies"), vec!["a", "b-c"]);
        assert_eq!(section_names(m, "dev-dependencies"), vec!["d"]);
        assert_eq!(package_name(m).as_deref(), Some("x"));
    }

    #[test]
    fn cycles_are_reported_once() {
        let g = |edges: &[(&str, &str)]| {
            let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (a, b) in edges {
                g.entry((*a).into()).or_default().insert((*b).into());
                g.entry((*b).into()).or_default();
            }
            g
        };
        assert!(cycles(&g(&[("a", "b"), ("b", "c")])).is_empty());
        let found = cycles(&g(&[("b", "a"), ("a", "b"), ("c", "a"), ("b", "c")]));
        assert_eq!(
            found.into_iter().collect::<Vec<_>>(),
            vec!["a -> b", "a -> b -> c"]
        );
    }
}
