//! The pure parts of the preflight on facts written by hand: a healthy set-up gives no
//! problem, and each fault gives its finding with its fix. The facts and helpers are
//! here; the faults are grouped as the findings are ([`postgres`], [`messages`],
//! [`slot`], [`kafka`]).

mod kafka;
mod messages;
mod postgres;
mod slot;

use crate::ops::check::facts::{
    ColumnFacts, OutboxTarget, PgFacts, PublicationFacts, ServerSettings, SlotFacts, StateFacts,
    TableFacts, Target,
};
use crate::ops::check::postgres::findings;
use crate::ops::check::{Finding, Report, Status};
use crate::pg::slot::SourceSpec;
use crate::pg::sql::QualifiedName;
use crate::relay::router::config::OutboxConfig;
use crate::relay::router::Router;

fn spec() -> SourceSpec {
    SourceSpec {
        slot: "outbox_relay".into(),
        publication: "outbox_relay".into(),
        tables: vec![QualifiedName::parse("public.outbox").unwrap()],
        patterns: Vec::new(),
        state_table: QualifiedName::parse("public.outbox_relay_state").unwrap(),
        failover: true,
        messages: false,
        decode_on_standby: false,
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
            hot_standby_feedback: false,
            primary_slot_name: String::new(),
        },
        replication_session: Ok(()),
        tables: vec![Ok(Some(TableFacts {
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
        }))],
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
            outboxes: vec![OutboxTarget::of(&router)],
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
