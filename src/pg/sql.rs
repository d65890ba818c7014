//! Quoting for SQL and replication commands: identifiers and literals are never pasted raw.

/// Quote an identifier: `my "table"` → `"my ""table"""`.
pub fn quote_ident(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for ch in name.chars() {
        if ch == '"' {
            out.push('"');
        }
        out.push(ch);
    }
    out.push('"');
    out
}

/// Quote a string literal: `it's` → `'it''s'`. Backslashes are doubled and the literal
/// written in `E''` form so the result is correct whatever `standard_conforming_strings` says.
pub fn quote_literal(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 3);
    if value.contains('\\') {
        out.push('E');
    }
    out.push('\'');
    for ch in value.chars() {
        match ch {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            _ => out.push(ch),
        }
    }
    out.push('\'');
    out
}

/// A table name, optionally schema-qualified (`public.outbox`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QualifiedName {
    pub schema: String,
    pub name: String,
}

impl QualifiedName {
    /// Parse `schema.table` or `table` (schema `public`). Double-quoted parts keep dots
    /// and case: `"My.Schema"."Out box"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let parts = split_qualified(text)?;
        match parts.as_slice() {
            [name] => Ok(QualifiedName {
                schema: "public".into(),
                name: name.clone(),
            }),
            [schema, name] => Ok(QualifiedName {
                schema: schema.clone(),
                name: name.clone(),
            }),
            _ => Err(format!(
                "table name {text:?} must be `table` or `schema.table`"
            )),
        }
    }

    /// `"schema"."name"`, for SQL.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

impl std::fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

fn split_qualified(text: &str) -> Result<Vec<String>, String> {
    let mut parts = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        let mut part = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        part.push('"');
                    }
                    Some('"') => break,
                    Some(c) => part.push(c),
                    None => return Err(format!("unclosed quote in table name {text:?}")),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' {
                    break;
                }
                if c == '"' {
                    return Err(format!("stray quote in table name {text:?}"));
                }
                // Unquoted identifiers fold to lower case, as in SQL.
                part.extend(c.to_lowercase());
                chars.next();
            }
        }
        if part.is_empty() {
            return Err(format!("empty part in table name {text:?}"));
        }
        parts.push(part);
        match chars.next() {
            None => return Ok(parts),
            Some('.') => continue,
            Some(c) => return Err(format!("unexpected {c:?} in table name {text:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote_ident("outbox"), "\"outbox\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal("a\\b"), "E'a\\\\b'");
    }

    #[test]
    fn qualified_names() {
        let q = QualifiedName::parse("public.outbox").unwrap();
        assert_eq!((q.schema.as_str(), q.name.as_str()), ("public", "outbox"));
        let q = QualifiedName::parse("Outbox").unwrap();
        assert_eq!((q.schema.as_str(), q.name.as_str()), ("public", "outbox"));
        let q = QualifiedName::parse("\"My.Schema\".\"Out\"\"box\"").unwrap();
        assert_eq!(
            (q.schema.as_str(), q.name.as_str()),
            ("My.Schema", "Out\"box")
        );
        assert_eq!(q.quoted(), "\"My.Schema\".\"Out\"\"box\"");
        for bad in ["", "a.", ".a", "a.b.c", "\"a", "a\"b"] {
            assert!(QualifiedName::parse(bad).is_err(), "{bad:?}");
        }
    }
}
