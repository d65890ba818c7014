//! Messages for a file that is not valid TOML or does not fit the configuration's
//! shape, which never quote the file.
//!
//! The toml crate's own rendering of an error shows the offending line of the file,
//! and a line like `url = "postgres://relay:secret@…"` or `"sasl.password" = "…"`
//! holds a secret. These messages give the line and column, the key path and the
//! parser's reason instead, and the shape errors of serde leave out the string values
//! they would quote (`invalid type: string "…"`). A key set from the environment is
//! named by its variable.

use super::env::{shown_key as shown, Override};

/// A syntax error of `text`: `line 3, column 7, in postgres.url: <reason>`.
pub fn syntax_error(text: &str, error: &toml::de::Error) -> String {
    let reason = error.message().trim_end().replace('\n', "; ");
    let Some(start) = error.span().map(|span| span.start) else {
        return reason;
    };
    let (line, column) = line_and_column(text, start);
    let place = match text.lines().nth(line - 1).map(line_key) {
        Some(LineKey::Header(header)) => format!(", in the header [{}]", shown(&header)),
        Some(LineKey::Key(key)) => format!(", key {}", shown(&key)),
        _ => String::new(),
    };
    format!("line {line}, column {column}{place}: {reason}")
}

/// A deserialization error of the (merged) tree: the key path, where it is in `text`
/// or the variable that set it, and the reason without quoted string values.
pub fn shape_error(text: &str, error: &toml::de::Error, overrides: &[Override]) -> String {
    // Deserializing a tree gives no position, but names the path in its `Display`,
    // on a last line "in `postgres.url`".
    let rendered = error.to_string();
    let path = rendered
        .lines()
        .last()
        .and_then(|line| line.strip_prefix("in `"))
        .and_then(|line| line.strip_suffix('`'))
        .map(split_path)
        .unwrap_or_default();
    // A secret key's value is never quoted, whatever its type (serde quotes integers,
    // floats and booleans too): its message is built from the key alone. Secret keys
    // are strings, so any error of one is of its type.
    let reason = if is_secret_key(&path) {
        "must be a string (the value is not shown: it is a secret)".to_owned()
    } else {
        without_strings(error.message().trim_end())
    };
    // The key an unknown-field error is about sits below the path.
    let mut key = path.clone();
    if let Some(field) = quoted_after(&reason, "unknown field `") {
        key.push(field);
    }
    let shown_key = if key.is_empty() {
        String::new()
    } else if key.len() == path.len() && reason.starts_with("missing field") {
        format!("[{}]", shown(&key))
    } else {
        shown(&key)
    };
    let from_env = overrides
        .iter()
        .find(|o| o.key == shown(&key) || o.key == shown(&path));
    let place = match (from_env, find_key(text, &key)) {
        (Some(set), _) => format!(" (set by {})", set.variable),
        (None, Some((line, column))) => format!(" (line {line}, column {column})"),
        (None, None) => String::new(),
    };
    // A required key may come from the file or the environment: say both.
    let hint = match quoted_after(&reason, "missing field `") {
        Some(field) => {
            let variable: Vec<String> = path
                .iter()
                .chain([&field])
                .map(|part| part.to_ascii_uppercase())
                .collect();
            let (table, key) = match shown(&path) {
                top if top.is_empty() => (field.clone(), "<KEY>".to_owned()),
                table => (table, field.clone()),
            };
            if path.is_empty() {
                format!(
                    "; add a [{table}] section, or set its keys as {}{}__{key}",
                    super::env::PREFIX,
                    variable.join("__")
                )
            } else {
                format!(
                    "; set {key} in [{table}], or as {}{}",
                    super::env::PREFIX,
                    variable.join("__")
                )
            }
        }
        None => String::new(),
    };
    if shown_key.is_empty() {
        format!("{reason}{place}{hint}")
    } else {
        format!("{shown_key}{place}: {reason}{hint}")
    }
}

/// Whether the value at `path` is a secret: `[postgres]` url and password, and the
/// secret properties of `[kafka.properties]`.
fn is_secret_key(path: &[String]) -> bool {
    match path {
        [section, key] if section == "postgres" => {
            key == "url" || key == "password" || key == "primary_url"
        }
        [kafka, properties, key] if kafka == "kafka" && properties == "properties" => {
            crate::sink::kafka_config::is_secret_property(key)
        }
        _ => false,
    }
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .map_or(0, |tail| tail.chars().count())
        + 1;
    (line, column)
}

/// A dotted path as the error gives it, with a librdkafka property kept whole
/// (`kafka.properties.sasl.password`).
fn split_path(dotted: &str) -> Vec<String> {
    let parts: Vec<&str> = dotted.split('.').collect();
    match parts.as_slice() {
        ["kafka", map @ ("properties" | "property_files"), rest @ ..] if !rest.is_empty() => {
            vec!["kafka".into(), (*map).to_owned(), rest.join(".")]
        }
        _ => parts.iter().map(|p| (*p).to_owned()).collect(),
    }
}

/// The text between `prefix` and the next backtick.
fn quoted_after(text: &str, prefix: &str) -> Option<String> {
    let rest = &text[text.find(prefix)? + prefix.len()..];
    Some(rest[..rest.find('`')?].to_owned())
}

/// `text` with every string value serde quotes (`string "…"`, Rust-escaped) left out.
fn without_strings(text: &str) -> String {
    const MARK: &str = "string \"";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        out.push_str("string (value not shown)");
        let mut escaped = false;
        let mut end = rest.len();
        for (index, c) in rest[at + MARK.len()..].char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = at + MARK.len() + index + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// What a line of a TOML file starts: a table header or a key.
enum LineKey {
    Header(Vec<String>),
    Key(Vec<String>),
    Other,
}

/// The header or key a line starts with (its value is not looked at).
fn line_key(line: &str) -> LineKey {
    let line = line.trim_start();
    if let Some(inner) = line.strip_prefix("[[") {
        return LineKey::Header(dotted_key(inner).0);
    }
    if let Some(inner) = line.strip_prefix('[') {
        return LineKey::Header(dotted_key(inner).0);
    }
    match dotted_key(line) {
        (key, true) if !key.is_empty() => LineKey::Key(key),
        _ => LineKey::Other,
    }
}

/// A dotted key at the start of `text` (bare or quoted parts), and whether an `=`
/// follows it.
fn dotted_key(text: &str) -> (Vec<String>, bool) {
    let mut parts = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ' ' || *c == '\t') {
            chars.next();
        }
        let mut part = String::new();
        match chars.peek() {
            Some(&quote @ ('"' | '\'')) => {
                chars.next();
                let mut escaped = false;
                for c in chars.by_ref() {
                    match c {
                        _ if escaped => {
                            part.push(c);
                            escaped = false;
                        }
                        '\\' if quote == '"' => escaped = true,
                        _ if c == quote => break,
                        _ => part.push(c),
                    }
                }
            }
            _ => {
                while let Some(&c) = chars.peek() {
                    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                        part.push(c);
                        chars.next();
                    } else {
                        break;
                    }
                }
            }
        }
        parts.push(part);
        while chars.peek().is_some_and(|c| *c == ' ' || *c == '\t') {
            chars.next();
        }
        match chars.next() {
            Some('.') => continue,
            Some('=') => return (parts, true),
            _ => return (parts, false),
        }
    }
}

/// Line and column where `path` is set in `text`: its key's line, else the header of
/// the deepest table on the path.
fn find_key(text: &str, path: &[String]) -> Option<(usize, usize)> {
    if path.is_empty() {
        return None;
    }
    // A key of an array of tables (`[[outbox]]`) listed more than once: the path does
    // not say which entry, so no line is better than the wrong one.
    let entries = text
        .lines()
        .filter(|line| line.trim() == format!("[[{}]]", path[0]))
        .count();
    if entries > 1 {
        return None;
    }
    let mut table: Vec<String> = Vec::new();
    let mut best: Option<(usize, usize, usize)> = None; // (depth, line, column)
    for (index, line) in text.lines().enumerate() {
        let column = line.len() - line.trim_start().len() + 1;
        let found = match line_key(line) {
            LineKey::Header(header) => {
                table = header.clone();
                header
            }
            LineKey::Key(key) => table.iter().cloned().chain(key).collect(),
            LineKey::Other => continue,
        };
        if found.as_slice() == path {
            return Some((index + 1, column));
        }
        if path.starts_with(&found) && best.map_or(true, |(depth, _, _)| found.len() > depth) {
            best = Some((found.len(), index + 1, column));
        }
    }
    best.map(|(_, line, column)| (line, column))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Shape {
        postgres: Section,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Section {
        url: String,
        #[serde(default)]
        status_interval_ms: u64,
        #[serde(default)]
        properties: std::collections::BTreeMap<String, String>,
    }

    fn syntax(text: &str) -> String {
        let error = toml::from_str::<toml::Table>(text).unwrap_err();
        syntax_error(text, &error)
    }

    fn shape(text: &str, overrides: &[Override]) -> String {
        let table: toml::Table = toml::from_str(text).unwrap();
        let error = toml::Value::Table(table).try_into::<Shape>().unwrap_err();
        shape_error(text, &error, overrides)
    }

    #[test]
    fn syntax_errors_give_line_column_and_key_but_not_the_line() {
        let text = "[postgres]\nurl = \"postgres://relay:Zq-secret@h/d\n";
        let message = syntax(text);
        assert!(message.starts_with("line 2, column "), "{message}");
        assert!(message.contains("key url"), "{message}");
        assert!(!message.contains("Zq-secret"), "{message}");
        let text = "[kafka.properties]\n\"sasl.password\" = 'Zq-secret\n";
        let message = syntax(text);
        assert!(message.contains("line 2"), "{message}");
        assert!(message.contains("key \"sasl.password\""), "{message}");
        assert!(!message.contains("Zq-secret"), "{message}");
        let message = syntax("[postgres\nurl = \"x\"\n");
        assert!(message.contains("line 1"), "{message}");
    }

    #[test]
    fn shape_errors_name_the_key_and_its_line_without_string_values() {
        let text = "[postgres]\nurl = \"postgres://u@h/d\"\nslott = 1\n";
        let message = shape(text, &[]);
        assert!(
            message.starts_with("postgres.slott (line 3, column 1): unknown field `slott`"),
            "{message}"
        );
        let text = "\n[postgres]\n  status_interval_ms = \"Zq-secret\"\nurl = \"x\"\n";
        let message = shape(text, &[]);
        assert!(
            message.starts_with("postgres.status_interval_ms (line 3, column 3): invalid type: string (value not shown), expected u64"),
            "{message}"
        );
        let text = "[postgres]\nurl = \"x\"\nproperties = \"sasl.password=Zq-secret\"\n";
        let message = shape(text, &[]);
        assert!(message.contains("postgres.properties (line 3"), "{message}");
        assert!(!message.contains("Zq-secret"), "{message}");
        let message = shape("[postgres]\nstatus_interval_ms = 1\n", &[]);
        assert!(
            message.starts_with("[postgres] (line 1, column 1): missing field `url`"),
            "{message}"
        );
    }

    #[test]
    fn a_key_set_from_the_environment_names_the_variable() {
        let overrides = [Override {
            variable: "OUTBOX_RELAY__POSTGRES__STATUS_INTERVAL_MS".into(),
            key: "postgres.status_interval_ms".into(),
        }];
        let table: toml::Table =
            toml::from_str("[postgres]\nurl = \"x\"\nstatus_interval_ms = \"5\"\n").unwrap();
        let error = toml::Value::Table(table).try_into::<Shape>().unwrap_err();
        let message = shape_error("[postgres]\nurl = \"x\"\n", &error, &overrides);
        assert!(
            message.starts_with(
                "postgres.status_interval_ms (set by OUTBOX_RELAY__POSTGRES__STATUS_INTERVAL_MS)"
            ),
            "{message}"
        );
    }

    #[test]
    fn string_values_are_cut_out_whatever_they_hold() {
        assert_eq!(
            without_strings(r#"invalid type: string "a\"b", expected u64"#),
            "invalid type: string (value not shown), expected u64"
        );
        assert_eq!(without_strings("unknown field `x`"), "unknown field `x`");
    }

    #[test]
    fn keys_are_found_under_their_table_and_quoted() {
        let text = "[kafka]\nbrokers = \"b\"\n[kafka.properties]\n\"sasl.password\" = \"x\"\n";
        assert_eq!(
            find_key(text, &split_path("kafka.properties.sasl.password")),
            Some((4, 1))
        );
        assert_eq!(find_key(text, &split_path("kafka.brokers")), Some((2, 1)));
        assert_eq!(
            find_key(text, &split_path("kafka.create_topics")),
            Some((1, 1))
        );
        assert_eq!(find_key(text, &split_path("relay.x")), None);
    }

    /// A secret of every TOML type in every secret key: the message names the key and
    /// never the value (serde quotes integers, floats, booleans and datetimes).
    #[test]
    fn a_secret_key_of_any_type_never_shows_its_value() {
        let values = [
            "87654321",
            "8765.4321",
            "true",
            "[\"Zq-secret-a\", 87654321]",
            "{ zq = \"Zq-secret-t\" }",
            "8765-04-21T08:07:06Z",
            "8765-04-21",
        ];
        let url = "url = \"postgres://u@h/d\"\n";
        for value in values {
            for (text, key) in [
                (format!("[postgres]\nurl = {value}\n"), "postgres.url"),
                (format!("[postgres]\n{url}password = {value}\n"), "postgres.password"),
                (
                    format!("[postgres]\n{url}[sink]\ntype = \"kafka\"\n[kafka]\nbrokers = \"k:9092\"\n[kafka.properties]\n\"sasl.password\" = {value}\n"),
                    "kafka.properties.\"sasl.password\"",
                ),
                (
                    format!("[postgres]\n{url}[sink]\ntype = \"kafka\"\n[kafka]\nbrokers = \"k:9092\"\nproperties = {{ \"ssl.key.pem\" = {value} }}\n"),
                    "kafka.properties.\"ssl.key.pem\"",
                ),
            ] {
                let message = match super::super::Config::load_from("relay.toml", &text, []) {
                    Err(e) => e.to_string(),
                    // toml hands a datetime to a string as its text: a valid password.
                    Ok(_) if value.starts_with("8765-") && key != "postgres.url" => continue,
                    Ok(_) => panic!("{text} is accepted"),
                };
                for secret in ["8765", "Zq-secret", "true"] {
                    assert!(!message.contains(secret), "{text}\n{message}");
                }
                assert!(message.contains(key), "{message}");
                if !value.starts_with("8765-") {
                    assert!(message.contains("must be a string"), "{message}");
                }
            }
        }
        // A key that is no secret keeps serde's reason, value and all.
        let message = super::super::Config::load_from(
            "relay.toml",
            "[postgres]\nurl = \"postgres://u@h/d\"\nslot = 87654321\n",
            [],
        )
        .unwrap_err()
        .to_string();
        assert!(
            message.contains("invalid type: integer `87654321`"),
            "{message}"
        );
    }
}
