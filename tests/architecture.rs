//! Dependencies go one way: the PostgreSQL side (`pg`) and the sinks (`sink`) know
//! nothing of the relay or of each other, the relay knows nothing of the configuration
//! file (`config` composes the sections each part owns and hands the relay its
//! settings), the operator commands (`ops`: check, init, slot, cleanup, backfill) use
//! the relay, `pg` and the sinks while none of those names them, and the shared
//! vocabulary (`event`, `lsn`) is a leaf. Checked on the
//! source text: every `crate::<module>` a file names (outside comments) must be one its
//! layer may use, the top-level modules import each other without cycles, and no two
//! files import each other (through `crate::` or `super::` paths) beyond the pairs
//! `KNOWN_PAIRS` still lists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layer (a directory or a file under `src/`) and the top-level modules it may name.
/// (`Lsn` is the crate-root re-export of `lsn::Lsn`.)
const RULES: &[(&str, &[&str])] = &[
    ("pg", &["pg", "lsn", "Lsn"]),
    ("sink", &["sink", "event", "metrics", "lsn", "Lsn"]),
    (
        "relay",
        &["relay", "pg", "sink", "event", "metrics", "lsn", "Lsn"],
    ),
    (
        "ops",
        &[
            "ops", "relay", "pg", "sink", "event", "metrics", "lsn", "Lsn",
        ],
    ),
    ("metrics.rs", &[]),
    ("event.rs", &["lsn", "Lsn"]),
    ("lsn.rs", &[]),
];

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).expect("reading src") {
            rust_files(&entry.expect("dir entry").path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_owned());
    }
}

/// The top-level modules `line` names as `crate::<module>`.
fn named_modules(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or_default();
    code.match_indices("crate::")
        .map(|(at, _)| {
            code[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

#[test]
fn layers_depend_only_on_what_they_may() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut violations = Vec::new();
    for (layer, allowed) in RULES {
        let mut files = Vec::new();
        rust_files(&src.join(layer), &mut files);
        assert!(!files.is_empty(), "no source files for layer {layer}");
        for file in files {
            let text = std::fs::read_to_string(&file).expect("reading a source file");
            for (number, line) in text.lines().enumerate() {
                for module in named_modules(line) {
                    if !module.is_empty() && !allowed.contains(&module.as_str()) {
                        violations.push(format!(
                            "{}:{}: {layer} names crate::{module} ({})",
                            file.strip_prefix(&src).unwrap_or(&file).display(),
                            number + 1,
                            line.trim()
                        ));
                    }
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "dependencies against the layering:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_check_sees_a_forbidden_import() {
    assert_eq!(named_modules("use crate::relay::ack::Ticket;"), ["relay"]);
    assert_eq!(
        named_modules("let x = crate::pg::Lsn(0); // crate::sink in a comment"),
        ["pg"]
    );
    assert!(named_modules("/// see crate::relay::watch").is_empty());
}

/// Top-level module of a file under `src/` (`relay/run.rs` → `relay`, `config.rs` →
/// `config`); `None` for the crate roots.
fn top_level_module(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_owned())
}

/// A cycle in `graph`, as the path that closes it, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn top_level_modules_import_each_other_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let Some(from) = top_level_module(&src, &file) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).expect("reading a source file");
        let targets = graph.entry(from.clone()).or_default();
        for line in text.lines() {
            for module in named_modules(line) {
                // `Lsn` is the crate root's re-export of `lsn::Lsn`.
                let module = if module == "Lsn" {
                    "lsn".to_owned()
                } else {
                    module
                };
                if !module.is_empty() && module != from {
                    targets.insert(module);
                }
            }
        }
    }
    assert!(graph.contains_key("config") && graph.contains_key("relay"));
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle between modules: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_cycle_check_sees_a_cycle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("config", vec!["relay"]),
        ("relay", vec!["pg", "config"]),
        ("pg", vec![]),
    ]
    .into_iter()
    .map(|(node, to)| (node.to_owned(), to.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        find_cycle(&graph),
        Some(vec![
            "config".to_owned(),
            "relay".to_owned(),
            "config".to_owned()
        ])
    );
}

/// Pairs of files that still import each other (issue 20 part 5: untie them). A new
/// pair fails [`files_do_not_import_each_other`]; so does a pair here that is untied,
/// so the list only shrinks. Empty now: keep it so.
const KNOWN_PAIRS: &[(&str, &str)] = &[];

/// Module path of a file under `src/` (`pg/pgoutput.rs` → `pg::pgoutput`,
/// `relay/check/mod.rs` → `relay::check`); `None` for the crate roots.
fn module_path(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?.with_extension("");
    let mut parts: Vec<String> = relative
        .components()
        .filter_map(|c| c.as_os_str().to_str().map(str::to_owned))
        .collect();
    if parts.last().is_some_and(|last| last == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && matches!(parts[0].as_str(), "lib" | "main") {
        return None;
    }
    Some(parts.join("::"))
}

/// The modules of `modules` that `code` (one line, comments cut) names: through
/// `crate::a::b::…` (the longest prefix that is a module) or `super::x` (a sibling of
/// `module`).
fn named_files(code: &str, module: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let path_at = |at: usize| -> Vec<String> {
        code[at..]
            .split("::")
            .map(|part| {
                part.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|part| !part.is_empty())
            .collect()
    };
    let mut named = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let parts = path_at(at + "crate::".len());
        if let Some(found) = (1..=parts.len())
            .rev()
            .map(|k| parts[..k].join("::"))
            .find(|candidate| modules.contains(candidate))
        {
            named.insert(found);
        }
    }
    let parent = module.rsplit_once("::").map_or("", |(parent, _)| parent);
    for (at, _) in code.match_indices("super::") {
        let preceded = code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        if preceded {
            continue;
        }
        if let Some(sibling) = path_at(at + "super::".len()).first() {
            let candidate = if parent.is_empty() {
                sibling.clone()
            } else {
                format!("{parent}::{sibling}")
            };
            if modules.contains(&candidate) {
                named.insert(candidate);
            }
        }
    }
    named.remove(module);
    named
}

#[test]
fn files_do_not_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let by_module: BTreeMap<String, PathBuf> = files
        .iter()
        .filter_map(|file| Some((module_path(&src, file)?, file.clone())))
        .collect();
    let modules: BTreeSet<String> = by_module.keys().cloned().collect();
    let mut graph: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &by_module {
        let text = std::fs::read_to_string(file).expect("reading a source file");
        let targets = graph.entry(module).or_default();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or_default();
            targets.extend(named_files(code, module, &modules));
        }
    }
    let mut pairs = BTreeSet::new();
    for (from, targets) in &graph {
        for to in targets {
            if graph
                .get(to.as_str())
                .is_some_and(|back| back.contains(*from))
            {
                let (a, b) = if *from < to.as_str() {
                    (from.to_string(), to.clone())
                } else {
                    (to.clone(), from.to_string())
                };
                pairs.insert((a, b));
            }
        }
    }
    let known: BTreeSet<(String, String)> = KNOWN_PAIRS
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    let new: Vec<_> = pairs.difference(&known).collect();
    let untied: Vec<_> = known.difference(&pairs).collect();
    assert!(
        new.is_empty() && untied.is_empty(),
        "files importing each other, not in KNOWN_PAIRS: {new:?}; in KNOWN_PAIRS but untied (remove them): {untied:?}"
    );
}

#[test]
fn the_file_check_sees_crate_and_super_paths() {
    let modules: BTreeSet<String> = ["pg", "pg::pgoutput", "pg::pgoutput_reader", "sink"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        named_files(
            "use crate::pg::pgoutput_reader::Reader; use super::pgoutput::decode;",
            "pg::pgoutput_values",
            &modules
        ),
        ["pg::pgoutput", "pg::pgoutput_reader"]
            .into_iter()
            .map(str::to_owned)
            .collect()
    );
    // A path to an item of a directory module names the directory's module.
    assert_eq!(
        named_files("crate::sink::SinkError", "pg::slot", &modules),
        ["sink".to_owned()].into_iter().collect()
    );
}
