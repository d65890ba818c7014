//! What the relay needs on the source: the slot, the publication, the outbox tables and
//! the options that decide how they are set up. A plain value that names nothing of the
//! crate but [`crate::pg::sql`]'s table name: the preparation ([`crate::pg::slot`]) and
//! the diagnosis of its failures ([`crate::pg::diagnose`]) both take it, so it lives
//! apart from both, and the import between them runs one way (slot to diagnose, for
//! [`SetupError`](crate::pg::diagnose::SetupError)).

use crate::pg::sql::QualifiedName;

/// What the relay needs on the source.
#[derive(Debug, Clone)]
pub struct SourceSpec {
    pub slot: String,
    pub publication: String,
    /// The outbox tables, in the configuration's order (followed, once resolved
    /// against the catalog, by the tables of `patterns` found there:
    /// [`crate::pg::slot::resolve_tables`]); empty for a table-less deployment
    /// (messages only), whose publication publishes no table.
    pub tables: Vec<QualifiedName>,
    /// Schema-per-tenant outboxes: every table of a name in the schemas a glob matches.
    /// Tables that appear while the relay runs are added to the publication and relayed.
    pub patterns: Vec<TablePattern>,
    /// Where the relay records its slot ([`crate::pg::state`]).
    pub state_table: QualifiedName,
    /// Make the slot a failover slot where the server supports it (PostgreSQL 17+).
    pub failover: bool,
    /// Ask pgoutput for logical decoding messages (`messages 'true'`, PostgreSQL 14+).
    pub messages: bool,
    /// `[postgres] primary_url` is set: a server in recovery is decoded on (PostgreSQL
    /// 16+), not waited on.
    pub decode_on_standby: bool,
}

impl SourceSpec {
    /// Outbox tables are relayed; `false`: a table-less deployment (messages only).
    pub fn outbox(&self) -> bool {
        !self.tables.is_empty() || !self.patterns.is_empty()
    }

    /// `table` is one of a pattern's (and so added to the publication by the relay).
    pub fn from_pattern(&self, table: &QualifiedName) -> bool {
        self.patterns
            .iter()
            .any(|p| p.matches(&table.schema, &table.name))
    }

    /// The tables as messages name them: `a.outbox, b.outbox` (and the patterns:
    /// `tenant_*.outbox`).
    pub fn tables_shown(&self) -> String {
        let names: Vec<String> = self
            .tables
            .iter()
            .map(ToString::to_string)
            .chain(self.patterns.iter().map(ToString::to_string))
            .collect();
        names.join(", ")
    }
}

/// One outbox table as the source found it: the stream names it by its relation id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRelation {
    pub table: QualifiedName,
    /// Its `pg_class` OID when the relay prepared the source.
    pub oid: u32,
    /// A partitioned table, published through its root.
    pub partitioned: bool,
}

/// Every table of one name in the schemas a glob matches (`tenant_*.outbox`): the
/// schema-per-tenant outbox. `*` stands for any run of characters (none too); nothing
/// else is special.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablePattern {
    /// The schema glob, as written (`tenant_*`).
    pub schema: String,
    /// The table's name in each schema.
    pub name: String,
}

impl TablePattern {
    /// The schema glob as a SQL `LIKE` pattern with `\` as its escape: `tenant\_%`.
    pub fn schema_like(&self) -> String {
        let mut like = String::with_capacity(self.schema.len() + 4);
        for ch in self.schema.chars() {
            match ch {
                '*' => like.push('%'),
                '%' | '_' | '\\' => {
                    like.push('\\');
                    like.push(ch);
                }
                other => like.push(other),
            }
        }
        like
    }

    /// `schema.name` is one of the pattern's tables.
    pub fn matches(&self, schema: &str, name: &str) -> bool {
        name == self.name && glob(self.schema.as_bytes(), schema.as_bytes())
    }
}

impl std::fmt::Display for TablePattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

/// `*` matches any run of bytes; everything else itself. Iterative, with one
/// backtracking point: linear in practice, never recursive.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|b| *b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_matches_its_schemas_and_names_them_for_like() {
        let pattern = TablePattern {
            schema: "tenant_*".into(),
            name: "outbox".into(),
        };
        assert!(pattern.matches("tenant_1", "outbox"));
        assert!(pattern.matches("tenant_", "outbox"));
        assert!(!pattern.matches("tenant_1", "outbox2"));
        assert!(!pattern.matches("tenant", "outbox"));
        assert!(!pattern.matches("xtenant_1", "outbox"));
        assert_eq!(pattern.schema_like(), "tenant\\_%");
        let inner = TablePattern {
            schema: "a*b*c".into(),
            name: "o".into(),
        };
        assert!(inner.matches("abc", "o"));
        assert!(inner.matches("axxbyyc", "o"));
        assert!(!inner.matches("axxbyy", "o"));
        assert_eq!(inner.to_string(), "a*b*c.o");
        let odd = TablePattern {
            schema: "50%_*".into(),
            name: "o".into(),
        };
        assert_eq!(odd.schema_like(), "50\\%\\_%");
        assert!(!odd.matches("50x_1", "o"));
    }
}
