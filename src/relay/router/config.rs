//! The router's section of the configuration, `[outbox]`: which table is the outbox,
//! which of its columns carry what, and how the topic is named. Defaults are
//! Debezium's Outbox Event Router's, so a team can switch relays without touching
//! consumers. [`OutboxConfig::build`] checks the section and builds the [`Router`]
//! once; the composed configuration ([`crate::config`]) keeps the result.

use serde::Deserialize;

use super::Router;
use crate::pg::source::TablePattern;
use crate::pg::sql::QualifiedName;

/// Debezium's default outbox table and columns.
pub const DEFAULT_TABLE: &str = "public.outbox";
pub const DEFAULT_ID_COLUMN: &str = "id";
pub const DEFAULT_ROUTE_BY_COLUMN: &str = "aggregatetype";
pub const DEFAULT_TYPE_COLUMN: &str = "type";
pub const DEFAULT_PAYLOAD_COLUMN: &str = "payload";
/// Debezium's default topic template.
pub const DEFAULT_TOPIC: &str = "outbox.event.${routedByValue}";
/// Debezium's default `route.topic.regex`: the whole route-by value.
pub const DEFAULT_TOPIC_REGEX: &str = "(?<routedByValue>.*)";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// Relay the outbox table; `false` for a table-less deployment (`[messages]` only).
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
    #[serde(default = "default_table")]
    pub table: String,
    #[serde(default = "default_id_column")]
    pub id_column: String,
    /// Column whose value becomes the record key; Debezium's default would be `aggregateid`.
    #[serde(default = "default_id_column")]
    pub key_column: String,
    #[serde(default = "default_route_by_column")]
    pub route_by_column: String,
    /// The event type's column, for logs and dead letters; `""`: the table has none.
    #[serde(default = "default_type_column")]
    pub type_column: String,
    #[serde(default = "default_payload_column")]
    pub payload_column: String,
    /// Column giving the record timestamp; the transaction's commit time when unset.
    #[serde(default)]
    pub timestamp_column: Option<String>,
    /// Topic template; `${routedByValue}` is replaced by the route-by column's value
    /// (or by the named group `routedByValue` of `topic_regex`).
    #[serde(default = "default_topic")]
    pub topic: String,
    /// Debezium's `route.topic.regex`, applied to the route-by value.
    #[serde(default = "default_topic_regex")]
    pub topic_regex: String,
    /// Extra columns, as Debezium's `table.fields.additional.placement`:
    /// `"column:header[:alias]"`, `"column:envelope[:alias]"` or `"column:partition"`.
    #[serde(default)]
    pub additional: Vec<String>,
    /// A NULL or empty payload becomes a tombstone (null value).
    #[serde(default)]
    pub tombstone_on_empty_payload: bool,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            enabled: true,
            table: default_table(),
            id_column: default_id_column(),
            key_column: default_id_column(),
            route_by_column: default_route_by_column(),
            type_column: default_type_column(),
            payload_column: default_payload_column(),
            timestamp_column: None,
            topic: default_topic(),
            topic_regex: default_topic_regex(),
            additional: Vec::new(),
            tombstone_on_empty_payload: false,
        }
    }
}

/// The checked `[outbox]` section (or one `[[outbox]]` entry): the outbox table's name
/// and the router built from it.
#[derive(Debug, Clone)]
pub struct OutboxSettings {
    /// The table; for a pattern, its schema is the glob (`tenant_*.outbox`).
    pub table: QualifiedName,
    /// `table = "tenant_*.outbox"`: every table of that name in the schemas the glob
    /// matches, found when the relay starts and while it runs.
    pub pattern: Option<TablePattern>,
    pub router: Router,
}

impl OutboxSettings {
    /// `table` is this entry's: its own table, or one its pattern matches.
    pub fn covers(&self, table: &QualifiedName) -> bool {
        match &self.pattern {
            Some(pattern) => pattern.matches(&table.schema, &table.name),
            None => &self.table == table,
        }
    }
}

/// The `outbox` key of the file: one `[outbox]` table, or a list of `[[outbox]]`
/// entries (several outbox tables through one slot), each with the keys `[outbox]` has
/// (shared values in `[outbox_defaults]`, merged into every entry before this is read:
/// `crate::config::outboxes`).
#[derive(Debug, Clone)]
pub enum OutboxSection {
    One(Box<OutboxConfig>),
    Many(Vec<OutboxConfig>),
}

impl Default for OutboxSection {
    fn default() -> Self {
        OutboxSection::One(Box::default())
    }
}

impl<'de> Deserialize<'de> for OutboxSection {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> serde::de::Visitor<'de> for Either {
            type Value = OutboxSection;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an [outbox] table or a list of [[outbox]] entries")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                OutboxConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(|one| OutboxSection::One(Box::new(one)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<Self::Value, A::Error> {
                Vec::<OutboxConfig>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                    .map(OutboxSection::Many)
            }
        }
        deserializer.deserialize_any(Either)
    }
}

impl OutboxSection {
    /// `false` for a single `[outbox]` with `enabled = false` (messages only).
    pub fn enabled(&self) -> bool {
        match self {
            OutboxSection::One(one) => one.enabled,
            OutboxSection::Many(_) => true,
        }
    }

    /// Every entry with its key path (`outbox`, or `outbox[2]` in a list).
    pub fn entries(&self) -> Vec<(String, &OutboxConfig)> {
        match self {
            OutboxSection::One(one) => vec![("outbox".to_owned(), one.as_ref())],
            OutboxSection::Many(many) => many
                .iter()
                .enumerate()
                .map(|(i, entry)| (format!("outbox[{i}]"), entry))
                .collect(),
        }
    }

    /// Check every entry and build its router: the outbox tables in the file's order
    /// (none for a messages-only relay), or every problem with its key path
    /// (`outbox[2].topic: …` for an entry of a list).
    pub fn build(&self) -> Result<Vec<OutboxSettings>, Vec<String>> {
        let mut problems = Vec::new();
        let mut built: Vec<OutboxSettings> = Vec::new();
        match self {
            OutboxSection::One(one) => match one.build() {
                Ok(settings) if one.enabled => built.push(settings),
                Ok(_) => {}
                Err(one_problems) => problems.extend(one_problems),
            },
            OutboxSection::Many(many) => {
                if many.is_empty() {
                    problems.push("outbox: the list of [[outbox]] entries is empty; give at least one table (or one [outbox] section)".to_owned());
                }
                for (index, entry) in many.iter().enumerate() {
                    let path = format!("outbox[{index}]");
                    if !entry.enabled {
                        problems.push(format!("{path}.enabled: an entry of a list of [[outbox]] tables cannot be disabled; remove the entry instead"));
                    }
                    match entry.build() {
                        Ok(settings) => {
                            // A table listed twice, or listed and matched by a pattern:
                            // which entry's rules would it follow?
                            let overlap = |b: &OutboxSettings| {
                                b.table == settings.table
                                    || (settings.pattern.is_none() && b.covers(&settings.table))
                                    || (b.pattern.is_none() && settings.covers(&b.table))
                            };
                            if let Some(earlier) = built.iter().position(overlap) {
                                problems.push(format!(
                                    "{path}.table: {} is also outbox[{earlier}]'s table (or matched by its pattern, or matching this one); each outbox table is listed once",
                                    settings.table
                                ));
                            } else {
                                built.push(settings);
                            }
                        }
                        Err(entry_problems) => {
                            problems.extend(entry_problems.into_iter().map(|p| {
                                match p.strip_prefix("outbox.") {
                                    Some(rest) => format!("{path}.{rest}"),
                                    None => p,
                                }
                            }))
                        }
                    }
                }
            }
        }
        if problems.is_empty() {
            Ok(built)
        } else {
            Err(problems)
        }
    }
}

impl OutboxConfig {
    /// Check the section and build its router; every problem, each with its key path.
    pub fn build(&self) -> Result<OutboxSettings, Vec<String>> {
        let mut problems = Vec::new();
        let table = QualifiedName::parse(&self.table)
            .map_err(|e| problems.push(format!("outbox.table: {e}")))
            .ok();
        for (path, value) in [
            ("outbox.id_column", &self.id_column),
            ("outbox.key_column", &self.key_column),
            ("outbox.route_by_column", &self.route_by_column),
            ("outbox.payload_column", &self.payload_column),
            ("outbox.topic", &self.topic),
        ] {
            if value.is_empty() {
                problems.push(format!("{path}: must not be empty"));
            }
        }
        let router = Router::try_new(self)
            .map_err(|router_problems| problems.extend(router_problems))
            .ok();
        // An unquoted `*` in the schema makes the entry a pattern; in the table's name
        // it is refused (a typo would otherwise name a table nobody writes to).
        let quoted_schema = self.table.trim_start().starts_with('"');
        let pattern = match &table {
            Some(table) if !quoted_schema && table.schema.contains('*') => {
                if table.name.contains('*') {
                    problems.push(format!(
                        "outbox.table: {:?}: only the schema may be a pattern (`tenant_*.outbox`), not the table's name",
                        self.table
                    ));
                }
                Some(TablePattern {
                    schema: table.schema.clone(),
                    name: table.name.clone(),
                })
            }
            Some(table) if !self.table.contains('"') && table.name.contains('*') => {
                problems.push(format!(
                    "outbox.table: {:?}: only the schema may be a pattern (`tenant_*.outbox`), not the table's name",
                    self.table
                ));
                None
            }
            _ => None,
        };
        match (table, router) {
            (Some(table), Some(router)) if problems.is_empty() => Ok(OutboxSettings {
                table,
                pattern,
                router,
            }),
            _ => Err(problems),
        }
    }
}

fn enabled_by_default() -> bool {
    true
}
fn default_table() -> String {
    DEFAULT_TABLE.into()
}
fn default_id_column() -> String {
    DEFAULT_ID_COLUMN.into()
}
fn default_route_by_column() -> String {
    DEFAULT_ROUTE_BY_COLUMN.into()
}
fn default_type_column() -> String {
    DEFAULT_TYPE_COLUMN.into()
}
fn default_payload_column() -> String {
    DEFAULT_PAYLOAD_COLUMN.into()
}
fn default_topic() -> String {
    DEFAULT_TOPIC.into()
}
fn default_topic_regex() -> String {
    DEFAULT_TOPIC_REGEX.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_build_debeziums_router() {
        let built = OutboxConfig::default().build().unwrap();
        assert_eq!(built.table, QualifiedName::parse(DEFAULT_TABLE).unwrap());
        assert_eq!(built.router.constant_topic(), None);
    }

    #[test]
    fn every_problem_comes_back_with_its_path() {
        let config = OutboxConfig {
            table: "a.b.c".into(),
            id_column: String::new(),
            topic_regex: "(".into(),
            ..OutboxConfig::default()
        };
        let all = config.build().unwrap_err().join("\n");
        for path in ["outbox.table", "outbox.id_column", "outbox.topic_regex"] {
            assert!(all.contains(path), "missing {path} in {all}");
        }
    }
}
