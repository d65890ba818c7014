//! Pure: what the PostgreSQL side of a preflight found ([`PgFacts`], gathered by
//! `gather`) → findings, each problem with its fix. The wording of the fixes
//! reuses the relay's own (the `SetupError` messages, the lost-slot message, the
//! `CREATE PUBLICATION` and state-table statements), so `check` and `run` say the same.
//! The slot, its WAL and the record table are judged in `slot`, the
//! table-less outbox in `messages`; this module calls them in turn, and they
//! read the same facts ([`super::facts`]) without calling back.

use crate::pg::diagnose::SetupError;
use crate::pg::slot::{create_publication_sql, FAILOVER_SLOTS_SINCE};
use crate::pg::sql::{quote_ident, QualifiedName};
use crate::relay::router::Placement;

use super::facts::{
    not_checked, ColumnFacts, OutboxTarget, PgFacts, ServerSettings, TableFacts, Target,
};
use super::Finding;

/// Oldest supported PostgreSQL (`server_version_num`).
pub const SUPPORTED_SINCE: u32 = 130_000;

// pg_type OIDs the router treats specially (see relay::router::pgtext).
const BYTEA: u32 = 17;
const INT8: u32 = 20;
const INT2: u32 = 21;
const INT4: u32 = 23;
const TEXT: u32 = 25;
const JSON: u32 = 114;
const BPCHAR: u32 = 1042;
const VARCHAR: u32 = 1043;
const TIMESTAMP: u32 = 1114;
const TIMESTAMPTZ: u32 = 1184;
const JSONB: u32 = 3802;

/// Every PostgreSQL finding.
pub fn findings(facts: &PgFacts, target: &Target<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    server(&facts.server, target.spec.decode_on_standby, &mut out);
    replication_role(facts, &mut out);
    super::messages::version(facts, target.spec, &mut out);
    if !target.spec.outbox() {
        super::messages::table_less(facts, target.spec, &mut out);
        super::slot::findings(facts, target, &mut out);
        return out;
    }
    let mut tables = Vec::with_capacity(target.spec.tables.len());
    for (index, name) in target.spec.tables.iter().enumerate() {
        // `outbox.table` with one table, `outbox[2].table` in a list, as the file says.
        let key = target
            .outboxes
            .get(index)
            .map_or_else(|| format!("outbox[{index}]"), |o| o.key.clone());
        let first = out.len();
        let table = match facts.tables.get(index) {
            Some(Ok(table)) => table.as_ref(),
            Some(Err(e)) => {
                out.push(not_checked(&format!("{key}.table"), e));
                None
            }
            None => None,
        };
        if let Some(columns) = target.outboxes.get(index) {
            let outbox = Outbox {
                key: &key,
                name,
                columns,
            };
            outbox_table(table, &outbox, &target.config_hint, &mut out);
            // A pattern's table: its findings name it (the key names the entry).
            if columns.pattern {
                for finding in &mut out[first..] {
                    finding.message = format!("{name}: {}", finding.message);
                }
            }
        }
        tables.push((name, table));
    }
    publication(facts, &tables, target, &mut out);
    super::slot::findings(facts, target, &mut out);
    out
}

/// One outbox table as the findings name it.
struct Outbox<'a> {
    /// The configuration key it comes from: `outbox` or `outbox[2]`.
    key: &'a str,
    name: &'a QualifiedName,
    columns: &'a OutboxTarget<'a>,
}

fn server(server: &ServerSettings, decode_on_standby: bool, out: &mut Vec<Finding>) {
    let seventeen = "failover slots (a slot that survives a promotion, [postgres] failover_slot) need PostgreSQL 17";
    out.push(if server.version_num >= SUPPORTED_SINCE {
        let features = if server.version_num >= FAILOVER_SLOTS_SINCE {
            "failover slots available".to_owned()
        } else {
            format!("{seventeen}, so after a failover the slot must be recreated")
        };
        Finding::ok(
            "postgres.version",
            format!(
                "PostgreSQL {} is supported (13 and later); {features}",
                server.version
            ),
        )
    } else {
        Finding::problem(
            "postgres.version",
            format!(
                "PostgreSQL {} is not supported: the relay needs 13 or later ({seventeen})",
                server.version
            ),
            "upgrade PostgreSQL to 13 or later",
        )
    });
    out.push(match (server.in_recovery, decode_on_standby) {
        (false, _) => Finding::ok("postgres.primary", "the server is a primary"),
        (true, false) => Finding::problem(
            "postgres.primary",
            "the server is in recovery (a standby): the relay streams from a primary and would wait here until this server is promoted",
            "point [postgres] url at the primary, or list every host with target_session_attrs=read-write; or, on PostgreSQL 16+, decode on this standby: set [postgres] primary_url to its primary",
        ),
        (true, true) => standby(server),
    });
    out.push(if server.wal_level == "logical" {
        Finding::ok("postgres.wal_level", "wal_level = logical")
    } else {
        Finding::problem(
            "postgres.wal_level",
            format!(
                "wal_level = {}: logical replication needs wal_level = logical",
                server.wal_level
            ),
            "ALTER SYSTEM SET wal_level = logical (or set it in postgresql.conf), then restart PostgreSQL",
        )
    });
}

/// A standby the relay is to decode on (`[postgres] primary_url`): PostgreSQL 16+, and
/// what keeps its slot valid.
fn standby(server: &ServerSettings) -> Finding {
    const ID: &str = "postgres.primary";
    if server.version_num < 160_000 {
        return Finding::problem(
            ID,
            format!(
                "the server is a standby and [postgres] primary_url asks to decode on it, which needs PostgreSQL 16 or later (it runs {})",
                server.version
            ),
            "upgrade the standby to 16 or later, or remove primary_url (the relay then waits for a promotion)",
        );
    }
    let mut missing = Vec::new();
    let mut fixes = Vec::new();
    if !server.hot_standby_feedback {
        missing.push("hot_standby_feedback is off");
        fixes.push(
            "ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf(); (on the standby)",
        );
    }
    if server.primary_slot_name.is_empty() {
        missing.push("no primary_slot_name (no physical slot on the primary)");
        fixes.push("SELECT pg_create_physical_replication_slot('standby1') on the primary, then ALTER SYSTEM SET primary_slot_name = 'standby1'; SELECT pg_reload_conf(); on the standby");
    }
    if missing.is_empty() {
        return Finding::ok(
            ID,
            format!(
                "the server is a standby (PostgreSQL {}) and the relay decodes on it ([postgres] primary_url); hot_standby_feedback is on and it replays through physical slot {:?}",
                server.version, server.primary_slot_name
            ),
        );
    }
    Finding::problem(
        ID,
        format!(
            "the relay decodes on this standby, but {}: the primary's vacuum can remove catalog rows the slot still needs, and PostgreSQL then invalidates the slot (a recovery conflict) and the relay stops with a lost slot",
            missing.join(" and ")
        ),
        fixes.join("; "),
    )
}

fn replication_role(facts: &PgFacts, out: &mut Vec<Finding>) {
    let server = &facts.server;
    let user = &server.user;
    let attribute = server.rolreplication || server.superuser;
    out.push(match (&facts.replication_session, attribute) {
        (Ok(()), true) => Finding::ok(
            "postgres.replication_role",
            format!(
                "role {user:?} has {} and opened a replication session",
                if server.superuser { "superuser" } else { "REPLICATION" }
            ),
        ),
        (session, _) => {
            let mut message = SetupError::NoReplicationPrivilege { user: user.clone() }
                .to_string();
            if attribute {
                message = format!("role {user:?} has REPLICATION, but a replication session failed");
            }
            if let Err(e) = session {
                message.push_str(&format!(" (replication session: {e})"));
            }
            Finding::problem(
                "postgres.replication_role",
                message,
                if attribute {
                    "allow the role's replication connections in pg_hba.conf (database = the outbox's database) and check the error above".to_owned()
                } else {
                    format!("ALTER ROLE {} WITH REPLICATION", quote_ident(user))
                },
            )
        }
    });
}

fn outbox_table(
    table: Option<&TableFacts>,
    outbox: &Outbox<'_>,
    config_hint: &str,
    out: &mut Vec<Finding>,
) {
    let Outbox { key, name, columns } = outbox;
    let table_id = format!("{key}.table");
    let Some(table) = table else {
        out.push(Finding::problem(
            &table_id,
            format!("the outbox table {name} does not exist in this database"),
            format!(
                "create it: `outbox-relay init {config_hint}` prints the SQL (the table, the publication, the roles; --apply runs it), sql/outbox.sql has the default shape; or set {} to the right name",
                in_file(&table_id)
            ),
        ));
        return;
    };
    match table.relkind.as_str() {
        "r" => out.push(Finding::ok(&table_id, format!("{name} exists"))),
        "p" => out.push(Finding::ok(
            &table_id,
            format!("{name} exists, partitioned (its rows are published under its name through publish_via_partition_root)"),
        )),
        other => {
            out.push(Finding::problem(
                &table_id,
                format!("{name} is not a table (pg_class.relkind {other:?})"),
                format!("point {} at a table or a partitioned table", in_file(&table_id)),
            ));
            return;
        }
    }
    let cols = columns.columns;
    let column = |name: &str| table.columns.iter().find(|c| c.name == name);
    let quoted = name.quoted();
    let mut each = |setting: &str, name: &str, rule: ColumnRule| {
        let key_of_setting = setting.split(' ').next().unwrap_or(setting);
        out.push(column_finding(
            &format!("{key}.{key_of_setting}"),
            &format!("{key}.{setting}"),
            name,
            column(name),
            rule,
            &quoted,
        ));
    };
    each("id_column", cols.id, ColumnRule::Id);
    each("key_column", cols.key, ColumnRule::Present);
    each("route_by_column", cols.route_by, ColumnRule::RouteBy);
    if let Some(event_type) = cols.event_type {
        each("type_column", event_type, ColumnRule::Type);
    }
    each("payload_column", cols.payload, ColumnRule::Payload);
    if let Some(timestamp) = cols.timestamp {
        each("timestamp_column", timestamp, ColumnRule::Timestamp);
    }
    for field in columns.additional {
        let rule = match field.placement {
            Placement::Partition => ColumnRule::Partition,
            Placement::Header | Placement::Envelope => ColumnRule::Present,
        };
        let setting = format!("additional[{}] = {:?}", field.index, field.spec);
        each(&setting, &field.column, rule);
    }
}

/// A key as the file writes it: `[outbox] table` for the single section,
/// `outbox[2].table` for an entry of a list.
fn in_file(id: &str) -> String {
    match id.strip_prefix("outbox.") {
        Some(key) => format!("[outbox] {key}"),
        None => id.to_owned(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ColumnRule {
    Id,
    RouteBy,
    Type,
    Payload,
    Timestamp,
    Partition,
    Present,
}

fn column_finding(
    id: &str,
    setting: &str,
    name: &str,
    column: Option<&ColumnFacts>,
    rule: ColumnRule,
    table: &str,
) -> Finding {
    let Some(column) = column else {
        let message = format!("the outbox table has no column {name:?} ({setting})");
        if rule == ColumnRule::Type {
            return Finding::warning(
                id,
                format!("{message}: the event type is then unknown to logs and dead letters"),
                format!("add the column or set {}", in_file(id)),
            );
        }
        return Finding::problem(
            id,
            format!("{message}: every row would be an invalid event (a dead letter, or the relay stops)"),
            format!("add the column or change {setting}"),
        );
    };
    let described = format!("column {name:?} ({})", column.type_name);
    match rule {
        ColumnRule::Id if !column.not_null => Finding::problem(
            id,
            format!("{described} may be NULL: an event without an id cannot be deduplicated and is refused"),
            format!("ALTER TABLE {table} ALTER COLUMN {} SET NOT NULL (or make it the primary key)", quote_ident(name)),
        ),
        ColumnRule::RouteBy if !column.not_null => Finding::warning(
            id,
            format!("{described} may be NULL: a row without it has no topic and is an invalid event"),
            format!("ALTER TABLE {table} ALTER COLUMN {} SET NOT NULL", quote_ident(name)),
        ),
        ColumnRule::Payload => match column.type_oid {
            JSON | JSONB => Finding::ok(id, format!("{described}: sent as JSON")),
            BYTEA => Finding::ok(id, format!("{described}: sent as raw bytes")),
            TEXT | VARCHAR | BPCHAR => Finding::ok(id, format!("{described}: sent as UTF-8 text")),
            _ => Finding::warning(
                id,
                format!("{described}: not json, jsonb, text or bytea, so the record value is its text form"),
                format!("use jsonb (ALTER TABLE {table} ALTER COLUMN {} TYPE jsonb USING ...) or text, json, bytea", quote_ident(name)),
            ),
        },
        ColumnRule::Timestamp if !matches!(column.type_oid, TIMESTAMPTZ | TIMESTAMP) => {
            Finding::problem(
                id,
                format!("{described} is not a timestamp: every row would have an unusable record timestamp"),
                "point outbox.timestamp_column at a timestamptz (or timestamp) column, or unset it to use the commit time",
            )
        }
        ColumnRule::Partition => match column.type_oid {
            INT2 | INT4 => Finding::ok(id, format!("{described} gives the partition")),
            INT8 => Finding::warning(
                id,
                format!("{described}: a value beyond 32 bits is an invalid event"),
                format!("use an integer column: ALTER TABLE {table} ALTER COLUMN {} TYPE integer", quote_ident(name)),
            ),
            _ => Finding::problem(
                id,
                format!("{described} gives the partition but is not an integer: every row would be an invalid event unless it holds digits"),
                "place an integer column as the partition",
            ),
        },
        _ => Finding::ok(id, described),
    }
}

fn publication(
    facts: &PgFacts,
    tables: &[(&QualifiedName, Option<&TableFacts>)],
    target: &Target<'_>,
    out: &mut Vec<Finding>,
) {
    const ID: &str = "postgres.publication";
    let spec = target.spec;
    let name = &spec.publication;
    let quoted = quote_ident(name);
    let partitioned = tables
        .iter()
        .any(|(_, table)| table.is_some_and(|t| t.relkind == "p"));
    let all_names = spec.tables_shown();
    let publication = match &facts.publication {
        Ok(publication) => publication,
        Err(e) => return out.push(not_checked(ID, e)),
    };
    let missing_tables: Vec<String> = tables
        .iter()
        .filter(|(_, table)| table.is_none())
        .map(|(name, _)| name.to_string())
        .collect();
    let Some(publication) = publication else {
        let create = create_publication_sql(spec, partitioned);
        if !missing_tables.is_empty() {
            return out.push(Finding::warning(
                ID,
                format!(
                    "publication {name:?} does not exist; it can be created once the outbox table(s) {} exist",
                    missing_tables.join(", ")
                ),
                format!("after creating the tables: {create} (the relay runs it itself when its role owns the tables and has CREATE on the database)"),
            ));
        }
        let owned = tables
            .iter()
            .all(|(_, table)| table.is_some_and(|t| t.owned))
            || facts.server.superuser;
        let may_create = facts.server.may_create_in_database || facts.server.superuser;
        out.push(if owned && may_create {
            Finding::ok(ID, format!("publication {name:?} does not exist; the relay will create it: {create}"))
        } else {
            let missing = match (owned, may_create) {
                (false, false) => "does not own every outbox table and has no CREATE on the database",
                (false, true) => "does not own every outbox table",
                _ => "has no CREATE on the database",
            };
            Finding::problem(
                ID,
                format!("publication {name:?} does not exist and the relay's role {missing}, so it cannot create it"),
                format!("run `{create}` as the owner of {all_names}"),
            )
        });
        return;
    };
    if !missing_tables.is_empty() {
        // No outbox to add to the publication yet: the fix is creating it, which the
        // outbox table's finding gives; ADD TABLE or SET TABLE of a missing table fails.
        // A warning: the problem itself is the table finding's.
        return out.push(Finding::warning(
            ID,
            format!(
                "publication {name:?} exists, but the outbox table(s) {} it must publish do not",
                missing_tables.join(", ")
            ),
            format!(
                "create the outbox tables first (`outbox-relay init {}` prints the SQL), then check again",
                target.config_hint
            ),
        ));
    }
    let mut problems = Vec::new();
    let mut fixes = Vec::new();
    if !publication.inserts {
        problems.push("does not publish inserts".to_owned());
        fixes.push(format!(
            "ALTER PUBLICATION {quoted} SET (publish = 'insert')"
        ));
    }
    let ours = |s: &str, t: &str| spec.tables.iter().any(|n| n.schema == s && n.name == t);
    let unpublished: Vec<&QualifiedName> = spec
        .tables
        .iter()
        .filter(|n| {
            !publication
                .tables
                .iter()
                .any(|(s, t)| *s == n.schema && *t == n.name)
        })
        .collect();
    if partitioned && !publication.via_root {
        let partitioned_names: Vec<String> = tables
            .iter()
            .filter(|(_, table)| table.is_some_and(|t| t.relkind == "p"))
            .map(|(name, _)| name.to_string())
            .collect();
        problems.push(format!("publishes the partitioned outbox {} under its partitions' names (publish_via_partition_root = false), so the relay would not see its rows as events", partitioned_names.join(", ")));
        fixes.push(format!(
            "ALTER PUBLICATION {quoted} SET (publish_via_partition_root = true)"
        ));
    } else if !publication.all_tables && !unpublished.is_empty() {
        let names: Vec<String> = unpublished.iter().map(ToString::to_string).collect();
        let quoted_names: Vec<String> = unpublished.iter().map(|n| n.quoted()).collect();
        problems.push(format!(
            "does not include the outbox table{} {} (rows written to {} before it is added are not in the stream: `outbox-relay backfill` sends those still in the table)",
            if names.len() == 1 { "" } else { "s" },
            names.join(", "),
            if names.len() == 1 { "it" } else { "them" },
        ));
        fixes.push(format!(
            "ALTER PUBLICATION {quoted} ADD TABLE {}",
            quoted_names.join(", ")
        ));
    }
    // Published under its partitions' names, the outbox's rows show up as the
    // partitions: those are not other tables (the via-root problem covers them).
    let others: Vec<String> = if partitioned && !publication.via_root {
        Vec::new()
    } else {
        publication
            .tables
            .iter()
            .filter(|(s, t)| !ours(s, t))
            .map(|(s, t)| format!("{s}.{t}"))
            .collect()
    };
    let all_quoted: Vec<String> = spec.tables.iter().map(QualifiedName::quoted).collect();
    if publication.all_tables {
        problems.push("publishes every table (FOR ALL TABLES): an insert into any other table stops the relay unacknowledged".to_owned());
        fixes.push(format!(
            "use a publication of the outbox tables alone: {}",
            create_publication_sql(spec, partitioned)
        ));
    } else if !others.is_empty() {
        problems.push(format!(
            "also publishes {}: an insert there stops the relay unacknowledged",
            others.join(", ")
        ));
        fixes.push(format!(
            "ALTER PUBLICATION {quoted} SET TABLE {}",
            all_quoted.join(", ")
        ));
    }
    out.push(if problems.is_empty() {
        Finding::ok(
            ID,
            format!(
                "publication {name:?} publishes inserts into {all_names}{}",
                if partitioned {
                    " (partitioned tables through their root)"
                } else {
                    ""
                }
            ),
        )
    } else {
        Finding::problem(
            ID,
            format!("publication {name:?} {}", problems.join("; ")),
            fixes.join("; "),
        )
    });
}
