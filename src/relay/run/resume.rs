//! Where a new session starts skipping: what the state table's record (or this
//! process's memory of its last session) shows delivered past the slot's position, after
//! the slot rewound (a PostgreSQL restart or crash, a failover). Pure: values of the
//! prepared source in, a checkpoint out; see [`crate::relay::record`] for why skipping
//! is safe.

use crate::pg::slot::PreparedSource;
use crate::pg::Lsn;
use crate::relay::record::{Delivered, Resume};
use crate::sink::checkpoint::Checkpoint;

/// The skip of what the state table's record shows delivered past the slot's position
/// (the slot rewound: a PostgreSQL restart or crash, a failover), as a checkpoint of the
/// same shape as exactly-once's; see [`crate::relay::record`] for why it is safe.
/// `delivered`: what this process's previous session had delivered when it ended, used
/// where the record could not follow (see [`Delivered`]).
pub(super) fn resume_from_record(
    prepared: &PreparedSource,
    slot: &str,
    delivered: Option<&Delivered>,
) -> (Option<Checkpoint>, Option<Resume>) {
    let recorded = recorded_position(prepared, slot);
    let remembered = delivered
        .and_then(|d| d.usable(&prepared.system_id, prepared.timeline, prepared.wal_end))
        .filter(|&lsn| lsn > prepared.slot_lsn);
    let Some(through) = recorded.into_iter().chain(remembered).max() else {
        return (None, None);
    };
    let recorded_at = prepared
        .record
        .as_ref()
        .and_then(|record| record.acknowledged_at.as_deref())
        .unwrap_or("unknown");
    if recorded == Some(through) {
        tracing::info!(
            slot,
            slot_lsn = %prepared.slot_lsn,
            recorded = %through,
            recorded_at,
            "the slot is behind the relay's record (PostgreSQL saves a slot's position only at checkpoints): transactions committed before the recorded position were delivered and are skipped"
        );
    } else {
        tracing::info!(
            slot,
            slot_lsn = %prepared.slot_lsn,
            recorded = %recorded.map_or_else(|| "none".to_owned(), |lsn| lsn.to_string()),
            delivered = %through,
            "the slot is behind what this relay delivered before its last session ended (PostgreSQL saves a slot's position only at checkpoints, and the relay's record was not written for the last of it): transactions committed before that position are skipped"
        );
    }
    (
        Some(Checkpoint::new(slot, &prepared.system_id, through, None)),
        Some(Resume {
            from: prepared.slot_lsn,
            through,
            transactions: 0,
            events: 0,
        }),
    )
}

/// What the state table holds already, for the recorder's start: the record's position
/// when it comes from this cluster and is past the slot's, else the slot's.
pub(super) fn already_recorded(prepared: &PreparedSource) -> Lsn {
    prepared
        .record
        .as_ref()
        .filter(|record| record.system_identifier.as_deref() == Some(prepared.system_id.as_str()))
        .and_then(|record| record.acknowledged_lsn)
        .map_or(prepared.slot_lsn, |recorded| {
            recorded.max(prepared.slot_lsn)
        })
}

/// The record's position when it is past the slot's and comes from this cluster.
fn recorded_position(prepared: &PreparedSource, slot: &str) -> Option<Lsn> {
    let record = prepared.record.as_ref()?;
    let recorded = record.acknowledged_lsn?;
    if recorded <= prepared.slot_lsn {
        return None;
    }
    if record.system_identifier.as_deref() != Some(prepared.system_id.as_str()) {
        tracing::warn!(
            slot,
            recorded = %recorded,
            record_system_id = record.system_identifier.as_deref().unwrap_or("none"),
            system_id = %prepared.system_id,
            "the state table's record of the slot comes from another PostgreSQL cluster (a copied database?): its position is not used, transactions after the slot's position are sent again"
        );
        return None;
    }
    Some(recorded)
}

#[cfg(test)]
#[path = "resume_tests.rs"]
mod tests;
