//! Two-phase commit (protocol version 3), from the captured `v3_two_phase.hex`
//! fixture: Begin Prepare, Prepare, Commit Prepared and Rollback Prepared, also for a
//! transaction that was streamed before it was prepared.

use super::*;

#[test]
fn v3_two_phase_transactions() {
    let decoded = decode_fixture(V3_TWO_PHASE);
    let messages: Vec<&PgOutputMessage> = decoded.iter().map(|(_, _, m)| m).collect();
    let lsn_of = |tag: u8, nth: usize| {
        decoded
            .iter()
            .filter(|(c, _, _)| c.tag == tag)
            .nth(nth)
            .map(|(c, _, _)| c.lsn)
            .expect("message present")
    };

    let PgOutputMessage::BeginPrepare {
        prepare_lsn,
        end_lsn,
        prepare_ts,
        xid,
        gid,
    } = messages[0].clone()
    else {
        panic!("starts with Begin Prepare: {:?}", messages[0])
    };
    assert_eq!(gid, "gid-commit ✓");
    assert!(end_lsn > prepare_lsn);
    assert_eq!(
        *messages[4],
        PgOutputMessage::Prepare {
            flags: 0,
            prepare_lsn,
            end_lsn,
            prepare_ts,
            xid,
            gid: gid.clone(),
        },
        "Prepare repeats what Begin Prepare announced"
    );
    let PgOutputMessage::CommitPrepared {
        flags: 0,
        commit_lsn,
        end_lsn: commit_end_lsn,
        commit_ts,
        xid: commit_xid,
        gid: commit_gid,
    } = messages[5]
    else {
        panic!("then Commit Prepared: {:?}", messages[5])
    };
    assert_eq!((*commit_xid, commit_gid), (xid, &gid));
    assert!(*commit_lsn >= end_lsn && commit_end_lsn > commit_lsn);
    assert_eq!(*commit_end_lsn, lsn_of(b'K', 0));
    assert!(*commit_ts >= prepare_ts);

    let PgOutputMessage::Prepare {
        end_lsn: rollback_prepare_end,
        prepare_ts: rollback_prepare_ts,
        xid: rollback_xid,
        ..
    } = messages[7].clone()
    else {
        panic!("second Prepare: {:?}", messages[7])
    };
    let PgOutputMessage::RollbackPrepared {
        flags,
        prepare_end_lsn,
        rollback_end_lsn,
        prepare_ts,
        rollback_ts,
        xid,
        gid,
    } = messages[8]
    else {
        panic!("then Rollback Prepared: {:?}", messages[8])
    };
    assert_eq!(
        (*flags, *prepare_end_lsn, *prepare_ts, *xid, gid.as_str()),
        (
            0,
            rollback_prepare_end,
            rollback_prepare_ts,
            rollback_xid,
            "gid-rollback"
        )
    );
    assert!(rollback_end_lsn > prepare_end_lsn);
    assert_eq!(*rollback_end_lsn, lsn_of(b'r', 0));
    assert!(rollback_ts >= prepare_ts);

    let PgOutputMessage::StreamStart {
        xid: streamed_xid,
        first_segment: true,
    } = *messages[9]
    else {
        panic!("then a streamed transaction: {:?}", messages[9])
    };
    let (stream_prepare, commit) = (&messages[messages.len() - 2], &messages[messages.len() - 1]);
    let PgOutputMessage::StreamPrepare {
        flags: 0,
        prepare_lsn,
        end_lsn,
        xid,
        gid,
        ..
    } = stream_prepare
    else {
        panic!("Stream Prepare: {stream_prepare:?}")
    };
    assert_eq!((*xid, gid.as_str()), (streamed_xid, "gid-stream"));
    assert!(end_lsn > prepare_lsn);
    assert_eq!(*end_lsn, lsn_of(b'p', 0));
    assert!(matches!(
        commit,
        PgOutputMessage::CommitPrepared { xid, gid, .. } if *xid == streamed_xid && gid == "gid-stream"
    ));
}
