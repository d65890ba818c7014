//! The set-up SQL `outbox-relay init` prints (or applies): pure. One script, safe to run
//! again (every object is created only when missing):
//!
//! ```text
//! outbox table     Debezium's default shape; or partitioned by created_at (monthly
//!                  range partitions for this month and the next, and a DEFAULT one)
//! state table      the relay's record of its slot (crate::pg::state)
//! publication      inserts only; published via the root when partitioned
//! relay role       LOGIN REPLICATION; SELECT on the outbox; its state table
//! app role         may only INSERT into the outbox (the seed lesson: an application
//!                  can publish events but never rewrite or delete them)
//! messages         with [messages]: pg_logical_emit_message executable by the app role
//!                  only (PUBLIC may execute it by default); with [outbox] enabled =
//!                  false no outbox table, and a publication without tables
//! ```
//!
//! Roles are created without passwords: set them with `ALTER ROLE … PASSWORD` (or
//! `\password` in psql), never in a script kept in version control.

use crate::pg::sql::{quote_ident, quote_literal, QualifiedName};
use crate::pg::state;

/// What to set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitSpec {
    /// The outbox tables; none for a messages-only relay (`[outbox] enabled = false`).
    pub tables: Vec<QualifiedName>,
    pub state_table: QualifiedName,
    pub publication: String,
    pub partitioned: bool,
    pub relay_role: String,
    pub app_role: String,
    /// The table-less outbox is relayed (`[messages]`).
    pub messages: bool,
    /// Schema-per-tenant patterns (`tenant_*.outbox`): their tables are made by each
    /// tenant's provisioning, not here; the script says what that must grant.
    pub patterns: Vec<String>,
}

impl InitSpec {
    /// The schemas of the outbox tables, each once, in the tables' order.
    fn schemas(&self) -> Vec<&str> {
        let mut schemas: Vec<&str> = Vec::new();
        for table in &self.tables {
            if !schemas.contains(&table.schema.as_str()) {
                schemas.push(&table.schema);
            }
        }
        schemas
    }
}

/// The whole script.
pub fn setup_sql(spec: &InitSpec) -> String {
    let relay = quote_ident(&spec.relay_role);
    let app = quote_ident(&spec.app_role);
    let mut sql = String::new();
    if spec.tables.is_empty() {
        return table_less_sql(spec) + &patterns_sql(spec);
    }
    let shown: Vec<String> = spec.tables.iter().map(ToString::to_string).collect();
    let tables: Vec<String> = spec.tables.iter().map(QualifiedName::quoted).collect();
    let tables = tables.join(", ");
    sql.push_str(&format!(
        "-- outbox-relay set-up for {}: safe to run again.\n\n",
        shown.join(", ")
    ));
    for schema in spec.schemas().into_iter().filter(|s| *s != "public") {
        sql.push_str(&format!(
            "CREATE SCHEMA IF NOT EXISTS {};\n",
            quote_ident(schema)
        ));
    }
    for table in &spec.tables {
        sql.push_str(&outbox_table_sql(table, spec.partitioned));
    }
    sql.push_str(&format!(
        "\n-- The relay's record of its slot (a lost slot is never silently replaced).\n{};\n",
        state::create_table_sql(&spec.state_table)
    ));
    let via_root = if spec.partitioned {
        ", publish_via_partition_root = true"
    } else {
        ""
    };
    sql.push_str(&format!(
        "\n-- Inserts only: deletes (cleanup) and updates never reach the stream.\n\
         DO $$ BEGIN\n  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = {}) THEN\n    \
         CREATE PUBLICATION {} FOR TABLE {tables} WITH (publish = 'insert'{via_root});\n  END IF;\nEND $$;\n",
        quote_literal(&spec.publication),
        quote_ident(&spec.publication),
    ));
    let usage = |role: &str| -> String {
        spec.schemas()
            .iter()
            .map(|schema| format!("GRANT USAGE ON SCHEMA {} TO {role};\n", quote_ident(schema)))
            .collect()
    };
    // The state table's schema needs its own USAGE only when it is another schema.
    let state_schema_usage = if spec.schemas().contains(&spec.state_table.schema.as_str()) {
        String::new()
    } else {
        format!(
            "GRANT USAGE ON SCHEMA {} TO {relay};\n",
            quote_ident(&spec.state_table.schema)
        )
    };
    sql.push_str(&format!(
        "\n-- The relay: streams the WAL (REPLICATION), reads the outbox, keeps its record\n\
         -- (DELETE for `slot drop --forget`).\n\
         {}\n\
         {}\
         GRANT SELECT ON {tables} TO {relay};\n\
         {state_schema_usage}\
         GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {relay};\n{}",
        create_role_sql(&spec.relay_role, "LOGIN REPLICATION"),
        usage(&relay),
        spec.state_table.quoted(),
        takeover_grant_sql(&spec.relay_role),
    ));
    sql.push_str(&format!(
        "\n-- The application: may INSERT into the outbox, nothing else (no UPDATE, DELETE\n\
         -- or TRUNCATE: events, once written, are history).\n\
         {}\n\
         {}\
         GRANT INSERT ON {tables} TO {app};\n",
        create_role_sql(&spec.app_role, "LOGIN"),
        usage(&app),
    ));
    if spec.messages {
        sql.push_str(&emit_message_grants_sql(&spec.app_role));
    }
    sql.push_str(&patterns_sql(spec));
    sql.push_str(&format!(
        "\n-- Set the passwords (not kept in this script):\n\
         --   ALTER ROLE {relay} PASSWORD '...';\n\
         --   ALTER ROLE {app} PASSWORD '...';\n"
    ));
    sql
}

/// What each tenant's provisioning must do for a pattern's tables: nothing is created
/// here (the schemas do not exist yet).
fn patterns_sql(spec: &InitSpec) -> String {
    if spec.patterns.is_empty() {
        return String::new();
    }
    let publication = quote_ident(&spec.publication);
    let relay = quote_ident(&spec.relay_role);
    let app = quote_ident(&spec.app_role);
    format!(
        "\n-- Tables of {}: each tenant's provisioning creates its table and, in the same\n\
         -- transaction, publishes it and grants the roles (the relay adds a new table to the\n\
         -- publication itself only when its role owns the table):\n\
         --   CREATE TABLE <schema>.<table> (LIKE <an outbox> INCLUDING ALL);\n\
         --   ALTER PUBLICATION {publication} ADD TABLE <schema>.<table>;\n\
         --   GRANT USAGE ON SCHEMA <schema> TO {relay}, {app};\n\
         --   GRANT SELECT ON <schema>.<table> TO {relay};\n\
         --   GRANT INSERT ON <schema>.<table> TO {app};\n",
        spec.patterns.join(", ")
    )
}

/// Takeover from a silent relay: a waiting instance reads the streaming walsender's
/// `reply_time` in `pg_stat_replication`, which only `pg_read_all_stats` shows for
/// another session ([`crate::relay::takeover`]). Granting a role it already has is a
/// notice, so the script stays safe to repeat.
fn takeover_grant_sql(relay_role: &str) -> String {
    format!(
        "-- Takeover from a relay whose host vanished: see the walsender's reply_time.\n\
         GRANT pg_read_all_stats TO {};\n",
        quote_ident(relay_role)
    )
}

/// A messages-only set-up: state table, a publication without tables (pgoutput needs
/// one to start), the relay role, the app role that may emit messages.
fn table_less_sql(spec: &InitSpec) -> String {
    let relay = quote_ident(&spec.relay_role);
    let app = quote_ident(&spec.app_role);
    // Only patterns: their tables come later, with each tenant (patterns_sql).
    let (what, writes, grants) = if spec.patterns.is_empty() {
        (
            "without an outbox table (messages only)",
            "writes events with pg_logical_emit_message",
            emit_message_grants_sql(&spec.app_role),
        )
    } else {
        (
            "for outbox tables that tenants' provisioning creates",
            "writes events into the tenants' outbox tables",
            if spec.messages {
                emit_message_grants_sql(&spec.app_role)
            } else {
                String::new()
            },
        )
    };
    format!(
        "-- outbox-relay set-up {what}: safe to run again.\n\n\
         -- The relay's record of its slot (a lost slot is never silently replaced).\n{};\n\n\
         -- No table: pgoutput needs a publication to start; messages are not filtered by it.\n\
         DO $$ BEGIN\n  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = {}) THEN\n    \
         CREATE PUBLICATION {} WITH (publish = 'insert');\n  END IF;\nEND $$;\n\n\
         -- The relay: streams the WAL (REPLICATION), keeps its record.\n{}\n\
         GRANT USAGE ON SCHEMA {} TO {relay};\n\
         GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {relay};\n{}\n\
         -- The application: {writes}.\n{}\n{}\n\
         -- Set the passwords (not kept in this script):\n\
         --   ALTER ROLE {relay} PASSWORD '...';\n\
         --   ALTER ROLE {app} PASSWORD '...';\n",
        state::create_table_sql(&spec.state_table),
        quote_literal(&spec.publication),
        quote_ident(&spec.publication),
        create_role_sql(&spec.relay_role, "LOGIN REPLICATION"),
        quote_ident(&spec.state_table.schema),
        spec.state_table.quoted(),
        takeover_grant_sql(&spec.relay_role),
        create_role_sql(&spec.app_role, "LOGIN"),
        grants,
    )
}

/// `pg_logical_emit_message` is executable by PUBLIC by default: any role could make the
/// relay publish. Every form of it (PostgreSQL 17 added a `flush` argument) is taken
/// from PUBLIC and given to the app role.
fn emit_message_grants_sql(app_role: &str) -> String {
    format!(
        "\n-- Only the application may write events as messages (PUBLIC may by default).\n\
         DO $$\nDECLARE\n  f regprocedure;\nBEGIN\n  \
         FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p\n           \
         WHERE p.proname = 'pg_logical_emit_message' AND p.pronamespace = 'pg_catalog'::regnamespace LOOP\n    \
         EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);\n    \
         EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, {});\n  \
         END LOOP;\nEND $$;\n",
        quote_literal(app_role)
    )
}

fn create_role_sql(role: &str, attributes: &str) -> String {
    format!(
        "DO $$ BEGIN\n  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = {}) THEN\n    \
         CREATE ROLE {} {attributes};\n  END IF;\nEND $$;",
        quote_literal(role),
        quote_ident(role)
    )
}

/// Debezium's default outbox shape; partitioned by `created_at` when asked.
fn outbox_table_sql(outbox: &QualifiedName, partitioned: bool) -> String {
    let table = outbox.quoted();
    let columns = "    id            uuid         NOT NULL DEFAULT gen_random_uuid(),\n    \
         aggregatetype varchar(255) NOT NULL,  -- routes the event: topic outbox.event.<aggregatetype>\n    \
         aggregateid   varchar(255) NOT NULL,  -- the aggregate's id (key_column = \"aggregateid\" keys by it)\n    \
         type          varchar(255) NOT NULL,  -- event type, e.g. OrderCreated\n    \
         payload       jsonb,                  -- the event body, written to Kafka as JSON\n    \
         created_at    timestamptz  NOT NULL DEFAULT now(),\n";
    if !partitioned {
        return format!(
            "-- The outbox, in Debezium's default shape.\nCREATE TABLE IF NOT EXISTS {table} (\n{columns}    PRIMARY KEY (id)\n);\n"
        );
    }
    let default_partition = QualifiedName {
        schema: outbox.schema.clone(),
        name: format!("{}_default", outbox.name),
    };
    format!(
        "-- The outbox, in Debezium's default shape, partitioned by month of created_at: old\n\
         -- months are dropped whole (outbox-relay cleanup) instead of deleted row by row.\n\
         CREATE TABLE IF NOT EXISTS {table} (\n{columns}    PRIMARY KEY (id, created_at)\n) PARTITION BY RANGE (created_at);\n\
         CREATE TABLE IF NOT EXISTS {} PARTITION OF {table} DEFAULT;\n\
         -- This month's and next month's partitions; create later ones ahead of time\n\
         -- (pg_partman, or a monthly job running this block).\n\
         DO $$\nDECLARE\n  month date;\nBEGIN\n  FOR i IN 0..1 LOOP\n    \
         month := date_trunc('month', now())::date + make_interval(months => i);\n    \
         EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',\n      \
         {}, {} || '_' || to_char(month, 'YYYY_MM'), {}, month, month + interval '1 month');\n  \
         END LOOP;\nEND $$;\n",
        default_partition.quoted(),
        quote_literal(&outbox.schema),
        quote_literal(&outbox.name),
        quote_literal(&table),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(partitioned: bool) -> InitSpec {
        InitSpec {
            tables: vec![QualifiedName::parse("public.outbox").unwrap()],
            state_table: QualifiedName::parse("public.outbox_relay_state").unwrap(),
            publication: "outbox_relay".into(),
            partitioned,
            relay_role: "outbox_relay".into(),
            app_role: "app_writer".into(),
            messages: false,
            patterns: Vec::new(),
        }
    }

    #[test]
    fn a_table_less_set_up_has_no_table_and_restricts_emitting_messages() {
        let mut table_less = spec(false);
        table_less.tables.clear();
        table_less.messages = true;
        let sql = setup_sql(&table_less);
        assert!(
            !sql.contains("CREATE TABLE IF NOT EXISTS \"public\".\"outbox\""),
            "{sql}"
        );
        assert!(
            sql.contains("CREATE PUBLICATION \"outbox_relay\" WITH (publish = 'insert');"),
            "{sql}"
        );
        assert!(
            sql.contains("REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC"),
            "{sql}"
        );
        assert!(sql.contains("f, 'app_writer')"), "{sql}");
        assert!(
            sql.contains("CREATE TABLE IF NOT EXISTS \"public\".\"outbox_relay_state\""),
            "{sql}"
        );
        // With the table too: both.
        let mut both = spec(false);
        both.messages = true;
        let sql = setup_sql(&both);
        assert!(sql.contains("FOR TABLE \"public\".\"outbox\""), "{sql}");
        assert!(sql.contains("REVOKE EXECUTE ON FUNCTION"), "{sql}");
    }

    #[test]
    fn the_script_sets_up_every_object_once() {
        let sql = setup_sql(&spec(false));
        for needle in [
            "CREATE TABLE IF NOT EXISTS \"public\".\"outbox\"",
            "CREATE TABLE IF NOT EXISTS \"public\".\"outbox_relay_state\"",
            "CREATE PUBLICATION \"outbox_relay\" FOR TABLE \"public\".\"outbox\" WITH (publish = 'insert');",
            "CREATE ROLE \"outbox_relay\" LOGIN REPLICATION;",
            "GRANT SELECT ON \"public\".\"outbox\" TO \"outbox_relay\";",
            "GRANT INSERT ON \"public\".\"outbox\" TO \"app_writer\";",
            "GRANT pg_read_all_stats TO \"outbox_relay\";",
        ] {
            assert!(sql.contains(needle), "{needle} in\n{sql}");
        }
        // Each statement once (the state table shares the outbox's schema).
        let statements: Vec<&str> = sql
            .lines()
            .filter(|line| line.starts_with("GRANT ") || line.starts_with("CREATE "))
            .collect();
        for (i, statement) in statements.iter().enumerate() {
            assert!(
                !statements[..i].contains(statement),
                "{statement} twice in\n{sql}"
            );
        }
        assert!(
            sql.lines()
                .filter(|line| !line.trim_start().starts_with("--"))
                .all(|line| !line.contains("PASSWORD")),
            "no password in the script's statements"
        );
        assert!(!sql.contains("UPDATE ON \"public\".\"outbox\""));
        assert!(!sql.contains("PARTITION"));
    }

    #[test]
    fn several_outboxes_are_made_published_and_granted_together() {
        let mut several = spec(false);
        several.tables = ["tenant_1.outbox", "tenant_2.outbox", "public.outbox"]
            .iter()
            .map(|name| QualifiedName::parse(name).unwrap())
            .collect();
        let sql = setup_sql(&several);
        for needle in [
            "CREATE SCHEMA IF NOT EXISTS \"tenant_1\";",
            "CREATE SCHEMA IF NOT EXISTS \"tenant_2\";",
            "CREATE TABLE IF NOT EXISTS \"tenant_1\".\"outbox\"",
            "CREATE TABLE IF NOT EXISTS \"tenant_2\".\"outbox\"",
            "CREATE TABLE IF NOT EXISTS \"public\".\"outbox\"",
            "FOR TABLE \"tenant_1\".\"outbox\", \"tenant_2\".\"outbox\", \"public\".\"outbox\" WITH",
            "GRANT USAGE ON SCHEMA \"tenant_2\" TO \"outbox_relay\";",
            "GRANT SELECT ON \"tenant_1\".\"outbox\", \"tenant_2\".\"outbox\", \"public\".\"outbox\" TO \"outbox_relay\";",
            "GRANT USAGE ON SCHEMA \"tenant_1\" TO \"app_writer\";",
            "GRANT INSERT ON \"tenant_1\".\"outbox\", \"tenant_2\".\"outbox\", \"public\".\"outbox\" TO \"app_writer\";",
        ] {
            assert!(sql.contains(needle), "{needle} in\n{sql}");
        }
        assert!(
            !sql.contains("CREATE SCHEMA IF NOT EXISTS \"public\""),
            "{sql}"
        );
        // The state table sits in public, one of the outboxes' schemas: no second USAGE.
        assert_eq!(
            sql.matches("GRANT USAGE ON SCHEMA \"public\" TO \"outbox_relay\"")
                .count(),
            1,
            "{sql}"
        );
    }

    #[test]
    fn a_pattern_is_left_to_the_tenants_provisioning_with_what_it_must_run() {
        let mut tenants = spec(false);
        tenants.tables.clear();
        tenants.patterns = vec!["tenant_*.outbox".into()];
        let sql = setup_sql(&tenants);
        assert!(
            sql.contains("for outbox tables that tenants' provisioning creates"),
            "{sql}"
        );
        assert!(
            sql.contains("CREATE PUBLICATION \"outbox_relay\" WITH (publish = 'insert');"),
            "{sql}"
        );
        assert!(sql.contains("Tables of tenant_*.outbox"), "{sql}");
        assert!(
            sql.contains("ALTER PUBLICATION \"outbox_relay\" ADD TABLE <schema>.<table>;"),
            "{sql}"
        );
        assert!(!sql.contains("pg_logical_emit_message"), "{sql}");
        // With a listed table too: its set-up, then the note.
        tenants.tables = vec![QualifiedName::parse("public.outbox").unwrap()];
        let sql = setup_sql(&tenants);
        assert!(
            sql.contains("FOR TABLE \"public\".\"outbox\" WITH"),
            "{sql}"
        );
        assert!(sql.contains("Tables of tenant_*.outbox"), "{sql}");
    }

    #[test]
    fn a_partitioned_outbox_is_published_through_its_root() {
        let sql = setup_sql(&spec(true));
        assert!(sql.contains("PARTITION BY RANGE (created_at)"), "{sql}");
        assert!(sql.contains("PRIMARY KEY (id, created_at)"), "{sql}");
        assert!(
            sql.contains("WITH (publish = 'insert', publish_via_partition_root = true)"),
            "{sql}"
        );
        assert!(
            sql.contains("\"public\".\"outbox_default\" PARTITION OF"),
            "{sql}"
        );
    }

    #[test]
    fn names_are_quoted() {
        let mut odd = spec(false);
        odd.app_role = "app\"; DROP TABLE x; --".into();
        let sql = setup_sql(&odd);
        assert!(
            sql.contains("CREATE ROLE \"app\"\"; DROP TABLE x; --\" LOGIN;"),
            "{sql}"
        );
        assert!(sql.contains("rolname = 'app\"; DROP TABLE x; --'"), "{sql}");
    }
}
