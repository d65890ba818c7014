//! Dependencies go one way: the PostgreSQL side (`pg`) and the sinks (`sink`) know
//! nothing of the relay or of each other, and the shared vocabulary (`event`, `lsn`) is
//! a leaf. Checked on the source text: every `crate::<module>` a file names (outside
//! comments) must be one its layer may use.

use std::path::{Path, PathBuf};

/// Layer (a directory or a file under `src/`) and the top-level modules it may name.
/// (`Lsn` is the crate-root re-export of `lsn::Lsn`.)
const RULES: &[(&str, &[&str])] = &[
    ("pg", &["pg", "lsn", "Lsn"]),
    ("sink", &["sink", "event", "lsn", "Lsn"]),
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
