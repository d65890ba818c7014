//! Free slots and WAL senders, the slot and its record, the record table, takeover.

use super::*;
use crate::pg::state::SlotRecord;

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
