//! The pure parts of the preflight on facts written by hand: a healthy set-up gives no
//! problem, and each fault gives its finding with its fix.

use super::postgres::{
    findings, ColumnFacts, PgFacts, PublicationFacts, ServerSettings, SlotFacts, StateFacts,
    TableFacts, Target,
};
use super::*;
use crate::pg::slot::SourceSpec;
use crate::pg::sql::QualifiedName;
use crate::pg::state::SlotRecord;
use crate::relay::router::config::OutboxConfig;
use crate::relay::router::Router;
use crate::sink::kafka_probe::{ClusterFacts, ProbeError};

fn spec() -> SourceSpec {
    SourceSpec {
        slot: "outbox_relay".into(),
        publication: "outbox_relay".into(),
        table: QualifiedName::parse("public.outbox").unwrap(),
        state_table: QualifiedName::parse("public.outbox_relay_state").unwrap(),
        failover: true,
        outbox: true,
        messages: false,
    }
}

fn router(additional: &[&str]) -> Router {
    Router::try_new(&OutboxConfig {
        additional: additional.iter().map(|s| (*s).to_owned()).collect(),
        ..OutboxConfig::default()
    })
    .unwrap()
}

fn column(name: &str, type_oid: u32, type_name: &str, not_null: bool) -> ColumnFacts {
    ColumnFacts {
        name: name.into(),
        type_oid,
        type_name: type_name.into(),
        not_null,
    }
}

/// sql/outbox.sql, a publication of it alone, a healthy slot, the record table usable.
fn healthy() -> PgFacts {
    PgFacts {
        server: ServerSettings {
            version: "15.8".into(),
            version_num: 150_008,
            in_recovery: false,
            wal_level: "logical".into(),
            max_replication_slots: 10,
            used_replication_slots: 1,
            max_wal_senders: 10,
            active_wal_senders: 0,
            user: "relay".into(),
            database: "app".into(),
            rolreplication: true,
            superuser: false,
            may_create_in_database: true,
            max_slot_wal_keep_size: None,
            synchronized_standby_slots: None,
            reads_all_stats: true,
            signals_backends: true,
        },
        replication_session: Ok(()),
        table: Ok(Some(TableFacts {
            relkind: "r".into(),
            owned: true,
            columns: vec![
                column("id", 2950, "uuid", true),
                column("aggregatetype", 1043, "character varying(255)", true),
                column("aggregateid", 1043, "character varying(255)", true),
                column("type", 1043, "character varying(255)", true),
                column("payload", 3802, "jsonb", false),
                column("created_at", 1184, "timestamp with time zone", true),
                column("shard", 23, "integer", true),
            ],
        })),
        publication: Ok(Some(PublicationFacts {
            inserts: true,
            via_root: false,
            all_tables: false,
            tables: vec![("public".into(), "outbox".into())],
        })),
        slot: Ok(Some(SlotFacts {
            plugin: Some("pgoutput".into()),
            slot_type: "logical".into(),
            database: Some("app".into()),
            wal_status: Some("reserved".into()),
            invalidation_reason: None,
            active_pid: None,
            retained_bytes: Some(1024),
            failover: false,
        })),
        state: Ok(StateFacts::Exists {
            may_select: true,
            may_insert: true,
            may_update: true,
            record: None,
        }),
    }
}

fn check(facts: &PgFacts, additional: &[&str]) -> Vec<Finding> {
    check_with(facts, &spec(), additional)
}

fn check_with(facts: &PgFacts, spec: &SourceSpec, additional: &[&str]) -> Vec<Finding> {
    let router = router(additional);
    findings(
        facts,
        &Target {
            spec,
            columns: router.columns(),
            additional: router.additional(),
            config_hint: "--config relay.toml".into(),
        },
    )
}

fn problems(findings: &[Finding]) -> Vec<&Finding> {
    findings
        .iter()
        .filter(|f| f.status == Status::Problem)
        .collect()
}

/// The one problem of `facts`: its id, message and fix must mention the needles.
#[track_caller]
fn one_problem(facts: &PgFacts, id: &str, needles: &[&str]) {
    let found = check(facts, &[]);
    let problems = problems(&found);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    let problem = problems[0];
    assert_eq!(problem.id, id, "{problem:#?}");
    let text = format!(
        "{} fix: {}",
        problem.message,
        problem.fix.as_deref().unwrap_or("")
    );
    for needle in needles {
        assert!(text.contains(needle), "{needle:?} in {text}");
    }
}

#[test]
fn a_healthy_setup_has_no_problem_and_no_warning() {
    let found = check(&healthy(), &["type:header:eventType", "shard:partition"]);
    let not_ok: Vec<_> = found.iter().filter(|f| f.status != Status::Ok).collect();
    assert!(not_ok.is_empty(), "{not_ok:#?}");
    for id in [
        "postgres.version",
        "postgres.primary",
        "postgres.wal_level",
        "postgres.replication_role",
        "postgres.replication_slots",
        "postgres.wal_senders",
        "outbox.table",
        "outbox.id_column",
        "outbox.payload_column",
        "outbox.additional[1]",
        "postgres.publication",
        "postgres.slot",
        "postgres.takeover",
        "postgres.state_table",
    ] {
        assert!(found.iter().any(|f| f.id == id), "no finding {id}");
    }
}

#[test]
fn server_problems_name_their_fix() {
    let mut facts = healthy();
    facts.server.wal_level = "replica".into();
    one_problem(
        &facts,
        "postgres.wal_level",
        &["replica", "wal_level = logical", "restart"],
    );

    let mut facts = healthy();
    facts.server.version_num = 120_005;
    facts.server.version = "12.5".into();
    one_problem(&facts, "postgres.version", &["12.5", "13 or later"]);

    let mut facts = healthy();
    facts.server.in_recovery = true;
    one_problem(
        &facts,
        "postgres.primary",
        &["standby", "target_session_attrs"],
    );

    let mut facts = healthy();
    facts.server.rolreplication = false;
    facts.replication_session = Err("must be superuser or replication role".into());
    one_problem(
        &facts,
        "postgres.replication_role",
        &["REPLICATION", "ALTER ROLE \"relay\" WITH REPLICATION"],
    );
}

#[test]
fn slots_and_senders_are_counted() {
    let mut facts = healthy();
    facts.slot = Ok(None);
    facts.server.used_replication_slots = 10;
    one_problem(
        &facts,
        "postgres.replication_slots",
        &["max_replication_slots", "pg_drop_replication_slot"],
    );
    // The relay's own slot needs no free one.
    let mut facts = healthy();
    facts.server.used_replication_slots = 10;
    assert!(problems(&check(&facts, &[])).is_empty());

    let mut facts = healthy();
    facts.server.active_wal_senders = 10;
    one_problem(&facts, "postgres.wal_senders", &["max_wal_senders"]);
}

#[test]
fn columns_are_checked_by_setting_and_type() {
    let with = |edit: &dyn Fn(&mut Vec<ColumnFacts>)| {
        let mut facts = healthy();
        if let Ok(Some(table)) = &mut facts.table {
            edit(&mut table.columns);
        }
        facts
    };
    one_problem(
        &with(&|c| c.retain(|c| c.name != "payload")),
        "outbox.payload_column",
        &["no column \"payload\"", "outbox.payload_column"],
    );
    one_problem(
        &with(&|c| c[0].not_null = false),
        "outbox.id_column",
        &["may be NULL", "ALTER COLUMN \"id\" SET NOT NULL"],
    );
    let found = check(
        &with(&|c| c[4] = column("payload", 23, "integer", false)),
        &[],
    );
    assert!(found
        .iter()
        .any(|f| f.id == "outbox.payload_column" && f.status == Status::Warning));
    // A missing type column only weakens logs: a warning.
    let found = check(&with(&|c| c.retain(|c| c.name != "type")), &[]);
    assert!(problems(&found).is_empty(), "{found:#?}");
    // A partition placement on a text column.
    let found = check(&healthy(), &["aggregateid:partition", "nope:header"]);
    let ids: Vec<&str> = problems(&found).iter().map(|f| f.id.as_str()).collect();
    assert_eq!(ids, ["outbox.additional[0]", "outbox.additional[1]"]);

    let mut facts = healthy();
    facts.table = Ok(None);
    let found = check(&facts, &[]);
    let problems = problems(&found);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(problems[0].message.contains("does not exist"));
}

#[test]
fn the_publication_must_publish_inserts_of_the_outbox_alone() {
    let with = |edit: &dyn Fn(&mut PublicationFacts)| {
        let mut facts = healthy();
        if let Ok(Some(publication)) = &mut facts.publication {
            edit(publication);
        }
        facts
    };
    one_problem(
        &with(&|p| p.inserts = false),
        "postgres.publication",
        &["publish = 'insert'"],
    );
    one_problem(
        &with(&|p| p.tables.clear()),
        "postgres.publication",
        &["ADD TABLE \"public\".\"outbox\""],
    );
    one_problem(
        &with(&|p| p.tables.push(("public".into(), "orders".into()))),
        "postgres.publication",
        &["public.orders", "SET TABLE"],
    );
    let mut facts = with(&|p| p.tables = vec![("public".into(), "outbox_2026".into())]);
    if let Ok(Some(table)) = &mut facts.table {
        table.relkind = "p".into();
    }
    one_problem(
        &facts,
        "postgres.publication",
        &["publish_via_partition_root = true"],
    );

    // A missing outbox table: create it first; no ALTER PUBLICATION of a table that
    // does not exist.
    for tables in [vec![], vec![("public".to_owned(), "orders".to_owned())]] {
        let mut facts = with(&|p| p.tables = tables.clone());
        facts.table = Ok(None);
        let found = check(&facts, &[]);
        let publication = found
            .iter()
            .find(|f| f.id == "postgres.publication")
            .expect("a publication finding");
        let fix = publication.fix.as_deref().unwrap_or("");
        assert!(
            fix.contains("outbox-relay init --config relay.toml"),
            "{fix}"
        );
        assert!(
            !fix.contains("ADD TABLE") && !fix.contains("SET TABLE"),
            "{fix}"
        );
        let table = found
            .iter()
            .find(|f| f.id == "outbox.table")
            .expect("outbox.table");
        assert!(
            table
                .fix
                .as_deref()
                .unwrap_or("")
                .contains("outbox-relay init --config relay.toml"),
            "{table:?}"
        );
    }

    // Missing: created by the relay when it may, else the statement to run.
    let mut facts = healthy();
    facts.publication = Ok(None);
    assert!(problems(&check(&facts, &[])).is_empty());
    facts.server.may_create_in_database = false;
    one_problem(
        &facts,
        "postgres.publication",
        &["CREATE PUBLICATION", "as the owner"],
    );
}

#[test]
fn the_slot_record_and_wal_status() {
    let mut facts = healthy();
    facts.slot = Ok(None);
    facts.state = Ok(StateFacts::Exists {
        may_select: true,
        may_insert: true,
        may_update: true,
        record: Some(SlotRecord {
            created_at: Some("2026-11-30 10:00:00+00".into()),
            first_streamed_at: Some("2026-11-30 10:00:01+00".into()),
            acknowledged_lsn: Some(crate::Lsn(0x1A2B3C)),
            acknowledged_at: Some("2026-12-01 09:00:00+00".into()),
            system_identifier: Some("7".into()),
        }),
    });
    one_problem(
        &facts,
        "postgres.slot",
        &[
            "0/1A2B3C",
            "slot create --accept-gap --config relay.toml",
            "backfill --config relay.toml --since '2026-12-01 09:00:00+00'",
        ],
    );

    let with_status = |status: &str| {
        let mut facts = healthy();
        if let Ok(Some(slot)) = &mut facts.slot {
            slot.wal_status = Some(status.into());
        }
        facts
    };
    one_problem(
        &with_status("lost"),
        "postgres.slot",
        &[
            "invalidated",
            "pg_drop_replication_slot('outbox_relay')",
            "--accept-gap",
        ],
    );
    for status in ["extended", "unreserved"] {
        let found = check(&with_status(status), &[]);
        assert!(
            found
                .iter()
                .any(|f| f.id == "postgres.slot" && f.status == Status::Warning),
            "{status}"
        );
    }
    let mut facts = healthy();
    facts.server.max_slot_wal_keep_size = Some(1500);
    let found = check(&facts, &[]);
    assert!(found
        .iter()
        .any(|f| f.id == "postgres.slot" && f.status == Status::Warning));

    let mut facts = healthy();
    if let Ok(Some(slot)) = &mut facts.slot {
        slot.plugin = Some("wal2json".into());
    }
    one_problem(&facts, "postgres.slot", &["not a logical pgoutput slot"]);
}

#[test]
fn the_state_table_must_be_usable_or_creatable() {
    let mut facts = healthy();
    facts.state = Ok(StateFacts::Missing {
        schema_exists: true,
        may_create: false,
    });
    one_problem(
        &facts,
        "postgres.state_table",
        &["CREATE TABLE IF NOT EXISTS", "GRANT SELECT, INSERT, UPDATE"],
    );
    facts.state = Ok(StateFacts::Exists {
        may_select: true,
        may_insert: false,
        may_update: true,
        record: None,
    });
    one_problem(&facts, "postgres.state_table", &["lacks INSERT"]);
}

#[test]
fn kafka_topics_constant_or_by_prefix() {
    let cluster = ClusterFacts {
        brokers: vec!["127.0.0.1:9092".into()],
        topics: [
            ("outbox.event.order".to_owned(), Ok(3)),
            ("dlq".to_owned(), Ok(1)),
        ]
        .into_iter()
        .collect(),
    };
    let target =
        |constant: Option<&str>, create: bool, dead_letter: Option<&'static str>| kafka::Target {
            brokers: "127.0.0.1:9092",
            create_topics: create,
            constant_topic: constant.map(str::to_owned),
            topic_prefix: constant.unwrap_or("outbox.event.").to_owned(),
            dead_letter_topic: dead_letter,
        };
    let status = |found: &[Finding], id: &str| found.iter().find(|f| f.id == id).map(|f| f.status);
    let found = kafka::findings(&Ok(cluster.clone()), &target(None, true, Some("dlq")));
    assert!(found.iter().all(|f| f.status == Status::Ok), "{found:#?}");
    assert!(
        found[1].message.contains("outbox.event.order"),
        "{found:#?}"
    );
    let found = kafka::findings(
        &Ok(cluster.clone()),
        &target(Some("events"), false, Some("dead")),
    );
    assert_eq!(status(&found, "kafka.topics"), Some(Status::Problem));
    assert_eq!(status(&found, "kafka.dead_letter"), Some(Status::Problem));
    let found = kafka::findings(&Ok(cluster.clone()), &target(Some("events"), true, None));
    assert!(found.iter().all(|f| f.status == Status::Ok), "{found:#?}");
    let found = kafka::findings(&Ok(cluster), &target(None, false, None));
    assert_eq!(status(&found, "kafka.topics"), Some(Status::Warning));
    let unreachable = Err(ProbeError::Unreachable {
        brokers: "b:1".into(),
        secs: 10,
        reason: "down".into(),
    });
    let found = kafka::findings(&unreachable, &target(None, true, None));
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].status, Status::Problem);
}

#[test]
fn reports_print_findings_as_built_and_count_problems() {
    // The text is never searched for secrets: a name that happens to equal a password
    // is printed as it is (the findings are built without secrets).
    let report = Report::new(vec![
        Finding::ok("a", "fine"),
        Finding::problem("b", "no publication \"orders_relay\"", "fix"),
    ]);
    assert!(report.has_problems());
    let text = report.text();
    assert!(
        text.contains("\"orders_relay\"") && !text.contains("***"),
        "{text}"
    );
    assert!(text.contains("1 problem(s)"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&report.json()).unwrap();
    assert_eq!(json[1]["status"], "problem");
    assert_eq!(json[1]["message"], "no publication \"orders_relay\"");
    assert_eq!(json[0]["fix"], serde_json::Value::Null);
}

#[test]
fn a_standby_without_pg_read_all_stats_is_warned() {
    let mut facts = healthy();
    facts.server.reads_all_stats = false;
    facts.server.signals_backends = false;
    let found = check(&facts, &[]);
    let takeover = found
        .iter()
        .find(|f| f.id == "postgres.takeover")
        .expect("a takeover finding");
    assert_eq!(takeover.status, Status::Warning);
    assert!(
        takeover.message.contains("wal_sender_timeout"),
        "{takeover:?}"
    );
    assert!(
        takeover
            .fix
            .as_deref()
            .is_some_and(|fix| fix.starts_with("GRANT pg_read_all_stats TO \"relay\"")),
        "{takeover:?}"
    );
    facts.server.reads_all_stats = true;
    let found = check(&facts, &[]);
    let takeover = found.iter().find(|f| f.id == "postgres.takeover").unwrap();
    assert_eq!(takeover.status, Status::Ok);
    assert!(takeover.message.contains("its own role"), "{takeover:?}");
}

fn check_table_less(facts: &PgFacts) -> Vec<Finding> {
    let mut spec = spec();
    spec.outbox = false;
    spec.messages = true;
    check_with(facts, &spec, &[])
}

#[test]
fn a_table_less_relay_needs_a_publication_without_tables_and_postgresql_14() {
    // The healthy facts' publication publishes the outbox: refused for messages only.
    let found = check_table_less(&healthy());
    let refused = problems(&found);
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0].id, "postgres.publication");
    assert!(
        refused[0]
            .fix
            .as_deref()
            .unwrap_or("")
            .contains("WITH (publish = 'insert')"),
        "{refused:#?}"
    );
    let mut facts = healthy();
    facts.table = Ok(None);
    facts.publication = Ok(Some(PublicationFacts {
        inserts: true,
        via_root: false,
        all_tables: false,
        tables: Vec::new(),
    }));
    let found = check_table_less(&facts);
    assert!(problems(&found).is_empty(), "{found:#?}");
    assert!(found
        .iter()
        .any(|f| f.id == "postgres.messages" && f.status == Status::Ok));
    facts.publication = Ok(None);
    assert!(
        problems(&check_table_less(&facts)).is_empty(),
        "the relay creates it"
    );
    facts.server.version_num = 130_010;
    facts.server.version = "13.10".into();
    let found = check_table_less(&facts);
    let old = problems(&found);
    assert!(
        old.iter()
            .any(|p| p.id == "postgres.messages" && p.message.contains("PostgreSQL 14 or later")),
        "{old:#?}"
    );
}

#[test]
fn a_table_without_a_type_column_is_warned_unless_type_column_is_unset() {
    let mut facts = healthy();
    if let Ok(Some(table)) = &mut facts.table {
        table.columns.retain(|c| c.name != "type");
    }
    let warned = |findings: &[Finding]| {
        findings
            .iter()
            .any(|f| f.id == "outbox.type_column" && f.status == Status::Warning)
    };
    assert!(warned(&check(&facts, &[])));
    let router = Router::try_new(&OutboxConfig {
        type_column: String::new(),
        ..OutboxConfig::default()
    })
    .unwrap();
    let found = findings(
        &facts,
        &Target {
            spec: &spec(),
            columns: router.columns(),
            additional: router.additional(),
            config_hint: "--config relay.toml".into(),
        },
    );
    assert!(!warned(&found), "{found:#?}");
    assert!(problems(&found).is_empty(), "{found:#?}");
}
