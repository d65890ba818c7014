//! The docs say what the program does, where a program can tell: every configuration key
//! the code accepts is in docs/configuration.md and every key documented there is
//! accepted; every relative link and anchor in README.md, docs/ and deploy/README.md
//! resolves; every subcommand is documented. Pure: reads files, runs `--help`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use outbox_relay::config::Config;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The documents whose links are checked.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![root().join("README.md"), root().join("deploy/README.md")];
    let mut in_docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("a readable entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    docs
}

/// Lines outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// GitHub's anchor of a heading: lower case, punctuation other than `-` and `_` removed,
/// spaces as `-`; a repeated anchor gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in prose_lines(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let count = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *count == 0 {
            slug.clone()
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    out
}

/// The targets of the inline links `[text](target)` of a document's prose, inline code
/// left out.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(text) {
        // Inline code spans hold examples, not links.
        let mut prose = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                prose.push_str(part);
            }
        }
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push(after[..end].trim().to_owned());
            rest = &after[end..];
        }
    }
    targets
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let linked = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().expect("a document's folder").join(file)
            };
            let shown = format!(
                "{}: ({target})",
                doc.strip_prefix(root()).unwrap().display()
            );
            if !linked.exists() {
                broken.push(format!("{shown}: no file {}", linked.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                if linked.extension().is_some_and(|ext| ext == "md")
                    && !anchors(&read(&linked)).contains(anchor)
                {
                    broken.push(format!("{shown}: no heading with anchor #{anchor}"));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the link reader broken?"
    );
    assert!(
        broken.is_empty(),
        "broken links:\n  {}",
        broken.join("\n  ")
    );
}

/// The sections of the configuration file, as `[section]` headings in
/// docs/configuration.md name them.
const SECTIONS: [&str; 8] = [
    "postgres",
    "outbox",
    "messages",
    "sink",
    "kafka",
    "dead_letter",
    "relay",
    "metrics",
];

/// The keys serde accepts in a section, from its own `unknown field` message (every
/// section denies unknown fields and lists what it expected).
fn accepted_keys(section: &str) -> BTreeSet<String> {
    let mut text = String::from("[postgres]\nurl = \"postgres://u@h/d\"\n");
    if section != "postgres" {
        text.push_str(&format!("[{section}]\n"));
    }
    text.push_str("zz_not_a_key = 1\n");
    let error = toml::from_str::<Config>(&text).expect_err("an unknown key is refused");
    let message = error.message().to_owned();
    let expected = message
        .split_once("expected one of ")
        .or_else(|| message.split_once("expected "))
        .unwrap_or_else(|| panic!("[{section}]: no list of expected keys in {message:?}"))
        .1;
    expected
        .split(',')
        .map(|key| key.trim().trim_matches('`').to_owned())
        .filter(|key| !key.is_empty())
        .collect()
}

/// The keys docs/configuration.md documents per section: the first column of the table
/// under each `## \`[section]\`` heading, before its first subsection
/// (`[kafka.properties]` is the key `properties`).
fn documented_keys() -> BTreeMap<String, BTreeSet<String>> {
    let text = read(&root().join("docs/configuration.md"));
    let mut keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut section: Option<String> = None;
    for line in prose_lines(&text) {
        // A subsection's tables (TLS parameters, librdkafka properties) are not keys.
        if line.starts_with("### ") {
            section = None;
            continue;
        }
        if let Some(heading) = line.strip_prefix("## ") {
            section = heading
                .strip_prefix("`[")
                .and_then(|h| h.split_once("]`"))
                .map(|(name, _)| name.to_owned());
            continue;
        }
        let (Some(section), Some(row)) = (&section, line.strip_prefix("| `")) else {
            continue;
        };
        let Some((key, _)) = row.split_once('`') else {
            continue;
        };
        let key = key
            .strip_prefix(&format!("[{section}."))
            .and_then(|k| k.strip_suffix(']'))
            .unwrap_or(key);
        keys.entry(section.clone())
            .or_default()
            .insert(key.to_owned());
    }
    keys
}

#[test]
fn every_configuration_key_is_documented_and_every_documented_key_is_accepted() {
    let documented = documented_keys();
    let mut problems = Vec::new();
    for section in SECTIONS {
        let accepted = accepted_keys(section);
        assert!(
            !accepted.is_empty(),
            "[{section}]: no keys read from the code"
        );
        let in_docs = documented.get(section).cloned().unwrap_or_default();
        for key in accepted.difference(&in_docs) {
            problems.push(format!(
                "{section}.{key}: accepted, not in docs/configuration.md"
            ));
        }
        for key in in_docs.difference(&accepted) {
            problems.push(format!(
                "{section}.{key}: in docs/configuration.md, refused by the code"
            ));
        }
    }
    for section in documented.keys() {
        if !SECTIONS.contains(&section.as_str()) {
            problems.push(format!(
                "[{section}]: documented, not a section this test knows"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "configuration docs out of step:\n  {}",
        problems.join("\n  ")
    );
}

/// The subcommands `--help` lists (the part of its output under "Commands:").
fn subcommands(args: &[&str]) -> Vec<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(args)
        .arg("--help")
        .output()
        .expect("the relay binary runs");
    let help = String::from_utf8(output.stdout).expect("help is UTF-8");
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_subcommand_is_documented() {
    let mut docs = read(&root().join("README.md"));
    for doc in documents() {
        docs.push_str(&read(&doc));
    }
    let mut commands = Vec::new();
    for command in subcommands(&[]) {
        let nested = subcommands(&[command.as_str()]);
        if nested.is_empty() {
            commands.push(command);
        } else {
            commands.extend(nested.into_iter().map(|sub| format!("{command} {sub}")));
        }
    }
    assert!(commands.len() >= 7, "only {commands:?} read from --help");
    let missing: Vec<&String> = commands
        .iter()
        .filter(|command| !docs.contains(&format!("outbox-relay {command}")))
        .collect();
    assert!(
        missing.is_empty(),
        "subcommands no document names as `outbox-relay <command>`: {missing:?}"
    );
}
