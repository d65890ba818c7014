//! After PostgreSQL forgets part of a slot's progress (it saves `confirmed_flush_lsn` only
//! at checkpoints), the relay resumes from its own record in the state table instead of
//! sending everything since the last checkpoint again (src/relay/record.rs).

use outbox_relay_harness as support;

use support::outbox::{
    cluster_with_outbox, event_ids, insert_events, plain, recorded_lsn, start_streaming,
    stdout_config, SLOT, WAIT,
};
use support::{wait_for, PgCluster, PgOptions, RelayProcess};

#[test]
fn a_crash_restart_of_postgresql_sends_nothing_again_that_the_record_covers() {
    let (pg, relay, record) = crash_after_twenty_recorded_events();

    let sentinel = insert_events(&pg, "sentinel", 1);
    let lines = relay.wait_for_lines(1, WAIT);
    assert_eq!(
        event_ids(&lines),
        sentinel,
        "after the crash only the new event arrives, nothing of the 20 again; relay stderr:\n{}",
        relay.stderr_tail()
    );
    // Logged as the sentinel's transaction is read; stderr is read apart from stdout.
    relay.wait_for_stderr("skipped the transactions between", WAIT);
    let stderr = plain(&relay.stderr());
    let line = stderr
        .lines()
        .find(|l| l.contains("skipped the transactions between"))
        .unwrap_or_else(|| panic!("the skipped range is logged:\n{stderr}"));
    // Transactions: the 20 and, before PostgreSQL 15 (which streams empty ones too), the
    // record's own UPDATEs.
    assert!(
        line.contains(&format!("through={}", support::u64_to_lsn(record)))
            && line.contains("events=20"),
        "the range skipped is exactly the recorded one, with its 20 events: {line}"
    );
}

/// Inserts `n` events of `kind`, one transaction each; their ids, and the WAL position
/// taken just before the last commit. A record covers the last transaction when it is
/// past that position; a position taken after the commit could include WAL others wrote
/// meanwhile (a running-xacts record), which no record of the relay ever reaches.
fn insert_noting_last(pg: &PgCluster, kind: &str, n: usize) -> (Vec<String>, u64) {
    let mut before_last = 0;
    let mut ids = Vec::new();
    for _ in 0..n {
        before_last = pg.current_wal_lsn();
        ids.extend(insert_events(pg, kind, 1));
    }
    (ids, before_last)
}

/// A graceful stop writes the last acknowledged position into the record before it exits
/// (records are otherwise at most one a second, so the last second would be missing).
#[test]
fn a_graceful_stop_records_the_last_acknowledged_position() {
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&stdout_config(&pg));
    let (ids, before_last) = insert_noting_last(&pg, "before", 20);
    assert_eq!(event_ids(&relay.wait_for_lines(20, WAIT)), ids);
    relay.sigterm();
    assert!(relay.wait_exit(WAIT).success());
    let recorded = recorded_lsn(&pg).expect("a record");
    assert!(
        recorded > before_last,
        "the record covers the last transaction (record {recorded:X}, last commit after {before_last:X}); relay stderr:\n{}",
        relay.stderr_tail()
    );
}

/// A session that skips the recorded range and ends before any transaction past it (here:
/// nothing is written after the crash, then the relay is stopped) still logs the range
/// it skipped: the line otherwise comes at the first transaction past the range.
#[test]
fn a_session_ending_inside_the_recorded_range_logs_what_it_skipped() {
    let (pg, relay, record) = crash_after_twenty_recorded_events();
    // The new session skips the 20 and acknowledges past them.
    wait_for("the slot acknowledged past the record", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT)
            .filter(|&lsn| lsn >= record)
    });
    relay.sigterm();
    relay.wait_exit(WAIT);
    let stderr = plain(&relay.stderr());
    let line = stderr
        .lines()
        .find(|l| l.contains("skipped the transactions between"))
        .unwrap_or_else(|| panic!("the skipped range is logged:\n{stderr}"));
    assert!(
        line.contains(&format!("through={}", support::u64_to_lsn(record)))
            && line.contains("events=20"),
        "the range skipped, with its 20 events: {line}"
    );
    // Before PostgreSQL 15 the stream carries empty transactions too, and the record's
    // own UPDATE commits just past the position it records: that session always sees a
    // transaction past the range, and says so.
    let ends_inside = pg.server_version_num() >= 150000;
    assert!(
        line.contains(&format!("ended_inside_the_range={ends_inside}")),
        "the range skipped said to end inside it ({ends_inside} on this server): {line}"
    );
    assert_eq!(relay.lines().len(), 0, "nothing of the 20 again");
}

/// The record cannot follow the last of what a session delivered when PostgreSQL goes
/// away first (its UPDATE is refused from the moment a shutdown begins, while the
/// walsender still sends the rest of the WAL). Here the record's row is held locked, so
/// nothing of the 20 is recorded; PostgreSQL then crashes and the slot rewinds. The
/// relay process, which delivered them, skips them in its next session.
#[test]
fn a_session_after_a_crash_skips_what_this_process_delivered_but_could_not_record() {
    let mut pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&stdout_config(&pg));
    let recorded_before = recorded_lsn(&pg);
    let mut holder = pg.client_db("app");
    holder
        .batch_execute("BEGIN; SELECT 1 FROM outbox_relay_state FOR UPDATE")
        .expect("locking the record's row");
    let created_at = pg.slot_confirmed_flush_lsn(SLOT).expect("the slot");
    let (before, before_last) = insert_noting_last(&pg, "before", 20);
    assert_eq!(event_ids(&relay.wait_for_lines(20, WAIT)), before);
    assert_eq!(
        recorded_lsn(&pg),
        recorded_before,
        "nothing of the 20 recorded"
    );
    drop(holder);
    pg.stop_immediate();
    pg.start_again();
    let rewound = pg.slot_confirmed_flush_lsn(SLOT).expect("the slot");
    assert!(
        rewound <= created_at,
        "the slot rewound to its creation (at {rewound:X}, created at {created_at:X})"
    );
    // The skipped range is recorded once acknowledged, with no new event to carry it:
    // a process started after a later fault knows it too.
    wait_for("the record covers the skipped 20", WAIT, || {
        recorded_lsn(&pg).filter(|&lsn| lsn > before_last)
    });
    let (sentinel, before_sentinel) = insert_noting_last(&pg, "sentinel", 1);
    let lines = relay.wait_for_lines(21, WAIT);
    assert_eq!(
        event_ids(&lines)[20..],
        sentinel[..],
        "after the crash only the new event arrives, nothing of the 20 again; relay stderr:\n{}",
        relay.stderr_tail()
    );
    relay.wait_for_stderr("skipped the transactions between", WAIT);
    let stderr = plain(&relay.stderr());
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("skipped the transactions between") && l.contains("events=20")),
        "the skip of the 20 is logged:\n{stderr}"
    );
    // A new process after another crash: the record alone covers the 20 (and the
    // sentinel, once recorded: at most one record a second).
    wait_for("the record covers the sentinel", WAIT, || {
        recorded_lsn(&pg).filter(|&lsn| lsn > before_sentinel)
    });
    relay.kill9();
    relay.wait_exit(WAIT);
    pg.stop_immediate();
    pg.start_again();
    let relay = start_streaming(&stdout_config(&pg));
    let last = insert_events(&pg, "last", 1);
    assert_eq!(
        event_ids(&relay.wait_for_lines(1, WAIT)),
        last,
        "a new process sends nothing of the 20 again; relay stderr:\n{}",
        relay.stderr_tail()
    );
}

/// A relay streams 20 events and records them, and is killed (-9); then PostgreSQL
/// crashes (immediate stop) and starts again. The slot's position on disk is the one of
/// its creation (no checkpoint since), so it rewinds behind the record, which is in the
/// WAL and survives. A new relay process (which knows only the record) streams.
/// Returns the cluster, the new relay and the recorded position.
fn crash_after_twenty_recorded_events() -> (PgCluster, RelayProcess, u64) {
    let mut pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&stdout_config(&pg));
    let created_at = pg.slot_confirmed_flush_lsn(SLOT).expect("the slot");
    let (before, before_last) = insert_noting_last(&pg, "before", 20);
    assert_eq!(event_ids(&relay.wait_for_lines(20, WAIT)), before);
    let record = wait_for("the record covers the 20 events", WAIT, || {
        recorded_lsn(&pg).filter(|&lsn| lsn > before_last)
    });
    relay.kill9();
    relay.wait_exit(WAIT);
    pg.stop_immediate();
    pg.start_again();
    let rewound = pg.slot_confirmed_flush_lsn(SLOT).expect("the slot");
    assert!(
        rewound < record,
        "the slot rewound behind the record (at {rewound:X}, record {record:X}, created at {created_at:X})"
    );
    let relay = start_streaming(&stdout_config(&pg));
    (pg, relay, record)
}
