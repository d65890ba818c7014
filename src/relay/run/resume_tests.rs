//! Unit tests of where a session starts skipping: the record counts only on its own
//! cluster and only past the slot; this process's memory only on the same cluster and
//! timeline, up to the server's WAL end; the later of the two wins.

use super::*;
use crate::pg::state::SlotRecord;

const SYSTEM: &str = "7300000000000000001";

fn prepared(slot_lsn: u64, record: Option<(u64, &str)>) -> PreparedSource {
    PreparedSource {
        system_id: SYSTEM.into(),
        timeline: 1,
        wal_end: Lsn(0x9000),
        slot_lsn: Lsn(slot_lsn),
        slot_created: false,
        publication_created: false,
        wal_sender_timeout: None,
        server_version: "15".into(),
        outboxes: Vec::new(),
        failover_slot: false,
        on_standby: false,
        record: record.map(|(lsn, system)| SlotRecord {
            created_at: None,
            first_streamed_at: Some("2026-12-07 00:00:00+00".into()),
            acknowledged_lsn: Some(Lsn(lsn)),
            acknowledged_at: None,
            system_identifier: Some(system.into()),
        }),
    }
}

fn delivered(through: u64, timeline: u32) -> Delivered {
    Delivered {
        system_id: SYSTEM.into(),
        timeline,
        through: Lsn(through),
    }
}

/// The position skipped through, checking the checkpoint and the resume agree.
fn skip_through(prepared: &PreparedSource, delivered: Option<&Delivered>) -> Option<Lsn> {
    match resume_from_record(prepared, "outbox_relay", delivered) {
        (Some(checkpoint), Some(resume)) => {
            assert_eq!(checkpoint.end_lsn, resume.through);
            assert_eq!(checkpoint.system_id, prepared.system_id);
            assert_eq!(checkpoint.partial, None);
            assert_eq!(resume.from, prepared.slot_lsn);
            assert_eq!((resume.transactions, resume.events), (0, 0));
            Some(resume.through)
        }
        (None, None) => None,
        other => panic!("checkpoint and resume disagree: {other:?}"),
    }
}

#[test]
fn a_record_past_the_slot_on_this_cluster_is_skipped_through() {
    let prepared = prepared(0x1000, Some((0x2000, SYSTEM)));
    assert_eq!(skip_through(&prepared, None), Some(Lsn(0x2000)));
    assert_eq!(already_recorded(&prepared), Lsn(0x2000));
}

#[test]
fn a_record_of_another_cluster_skips_nothing() {
    let prepared = prepared(0x1000, Some((0x2000, "7300000000000000999")));
    assert_eq!(skip_through(&prepared, None), None);
    // The recorder starts from the slot: the foreign record is overwritten.
    assert_eq!(already_recorded(&prepared), Lsn(0x1000));
}

#[test]
fn a_record_at_or_behind_the_slot_skips_nothing() {
    for record in [0x1000, 0x0800] {
        let prepared = prepared(0x1000, Some((record, SYSTEM)));
        assert_eq!(skip_through(&prepared, None), None, "record {record:#x}");
        assert_eq!(already_recorded(&prepared), Lsn(0x1000));
    }
    assert_eq!(skip_through(&prepared(0x1000, None), None), None);
}

#[test]
fn what_the_last_session_delivered_counts_on_the_same_timeline_only() {
    let prepared = prepared(0x1000, Some((0x2000, SYSTEM)));
    // Past the record: the memory wins.
    assert_eq!(
        skip_through(&prepared, Some(&delivered(0x3000, 1))),
        Some(Lsn(0x3000))
    );
    // Behind the record: the record wins.
    assert_eq!(
        skip_through(&prepared, Some(&delivered(0x1800, 1))),
        Some(Lsn(0x2000))
    );
    // Another timeline (a promotion, a restore): only the record counts.
    assert_eq!(
        skip_through(&prepared, Some(&delivered(0x3000, 2))),
        Some(Lsn(0x2000))
    );
    // Past the end of the server's WAL: not these transactions.
    assert_eq!(
        skip_through(&prepared, Some(&delivered(0x9001, 1))),
        Some(Lsn(0x2000))
    );
    // Without a record, the memory alone; behind the slot, nothing.
    let bare = self::prepared(0x1000, None);
    assert_eq!(
        skip_through(&bare, Some(&delivered(0x3000, 1))),
        Some(Lsn(0x3000))
    );
    assert_eq!(skip_through(&bare, Some(&delivered(0x1000, 1))), None);
}
