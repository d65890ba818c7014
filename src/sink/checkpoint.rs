//! The exactly-once checkpoint: what a committed Kafka transaction says about the
//! PostgreSQL stream, and which replayed transactions it covers. Pure.
//!
//! Every Kafka transaction of the exactly-once sink ends with one checkpoint record,
//! keyed by the slot name, in the compacted offsets topic:
//!
//! ```text
//! Kafka transaction n: [events of PG txns ...] + checkpoint{slot, system_id, end_lsn, partial?}
//!                       └──────── committed (or aborted) together ────────┘
//! ```
//!
//! `end_lsn` is the end of the last PostgreSQL transaction whose events are all
//! committed. A PostgreSQL transaction too large for one Kafka transaction is split;
//! `partial` then names it (by the LSN of its commit record) and says how many of its
//! events are committed. On start the relay reads the last committed checkpoint
//! (read_committed) and, for every transaction replayed from the slot, decides with
//! [`skip_for`]: a transaction whose commit record lies before `end_lsn` is in Kafka
//! already (transactions do not overlap in commit order, so its `end_lsn` is at or
//! below the checkpoint's); the partial one has its first `events` in Kafka.

use serde::{Deserialize, Serialize};

use crate::lsn::Lsn;

/// Version of the record's format, first in every value.
const FORMAT_VERSION: u32 = 1;

/// A PostgreSQL transaction split over Kafka transactions: how far it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partial {
    /// The LSN of its commit record (pgoutput's Begin `final_lsn`).
    #[serde(with = "lsn_text")]
    pub commit_lsn: Lsn,
    /// Its first `events` records (events and dead letters, in stream order) are
    /// committed.
    pub events: u64,
}

/// One checkpoint record's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub version: u32,
    pub slot: String,
    /// PostgreSQL's system identifier: LSNs mean nothing on another cluster.
    pub system_id: String,
    /// Every transaction ending at or below this is committed in Kafka.
    #[serde(with = "lsn_text")]
    pub end_lsn: Lsn,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<Partial>,
}

impl Checkpoint {
    pub fn new(slot: &str, system_id: &str, end_lsn: Lsn, partial: Option<Partial>) -> Self {
        Checkpoint {
            version: FORMAT_VERSION,
            slot: slot.to_owned(),
            system_id: system_id.to_owned(),
            end_lsn,
            partial,
        }
    }

    /// The record's value (JSON, readable with any console consumer).
    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A record's value; an error says what is wrong with it.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let checkpoint: Checkpoint = serde_json::from_slice(bytes)
            .map_err(|e| format!("not an outbox-relay checkpoint: {e}"))?;
        if checkpoint.version != FORMAT_VERSION {
            return Err(format!(
                "checkpoint format version {} is not {FORMAT_VERSION}: written by another version of outbox-relay",
                checkpoint.version
            ));
        }
        Ok(checkpoint)
    }

    /// Whether this checkpoint can be trusted for `system_id`'s stream; otherwise why
    /// not, and what to do.
    pub fn check_system(&self, system_id: &str, offsets_topic: &str) -> Result<(), String> {
        if self.system_id == system_id {
            return Ok(());
        }
        Err(format!(
            "the offsets topic {offsets_topic:?} holds a checkpoint for slot {:?} of PostgreSQL system {}, but this server is system {system_id}: its LSNs mean nothing here, so the relay will not skip by it. If this is a new or restored cluster and Kafka should receive its events, choose a new [kafka] offsets_topic (or delete the checkpoint: produce a tombstone with key {:?}); if the relay is connected to the wrong server, fix [postgres]",
            self.slot, self.system_id, self.slot
        ))
    }
}

/// What to do with a replayed transaction's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Send every event: Kafka has none of them.
    Nothing,
    /// Kafka has all of them.
    All,
    /// Kafka has the first `n`.
    First(u64),
}

impl Skip {
    /// How many of the transaction's events to drop, counting from its first.
    pub fn events(self) -> u64 {
        match self {
            Skip::Nothing => 0,
            Skip::All => u64::MAX,
            Skip::First(n) => n,
        }
    }
}

/// The decision for the transaction whose commit record is at `final_lsn`.
pub fn skip_for(checkpoint: Option<&Checkpoint>, final_lsn: Lsn) -> Skip {
    let Some(checkpoint) = checkpoint else {
        return Skip::Nothing;
    };
    if final_lsn < checkpoint.end_lsn {
        return Skip::All;
    }
    match checkpoint.partial {
        Some(partial) if partial.commit_lsn == final_lsn => Skip::First(partial.events),
        _ => Skip::Nothing,
    }
}

/// LSNs as PostgreSQL writes them (`16/B374D848`) in the record.
mod lsn_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::lsn::Lsn;

    pub fn serialize<S: Serializer>(lsn: &Lsn, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(lsn)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Lsn, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(end: u64, partial: Option<(u64, u64)>) -> Checkpoint {
        Checkpoint::new(
            "outbox_slot",
            "7301",
            Lsn(end),
            partial.map(|(commit_lsn, events)| Partial {
                commit_lsn: Lsn(commit_lsn),
                events,
            }),
        )
    }

    #[test]
    fn encodes_and_decodes() {
        for value in [
            checkpoint(0x16_B374_D848, None),
            checkpoint(100, Some((120, 7))),
        ] {
            let bytes = value.encode();
            assert_eq!(Checkpoint::decode(&bytes), Ok(value));
        }
        let text = String::from_utf8(checkpoint(0x16_B374_D848, None).encode()).unwrap();
        assert!(text.contains("\"16/B374D848\""), "{text}");
        assert!(!text.contains("partial"), "{text}");
    }

    #[test]
    fn refuses_what_is_not_a_checkpoint() {
        for bytes in [
            &b""[..],
            b"{}",
            b"\xff\x00",
            br#"{"version":1,"slot":"s","system_id":"1","end_lsn":"nope"}"#,
            br#"{"version":2,"slot":"s","system_id":"1","end_lsn":"0/1"}"#,
            br#"{"version":1,"slot":"s","system_id":"1","end_lsn":"0/1","partial":{"commit_lsn":"0/1","events":-1}}"#,
        ] {
            assert!(Checkpoint::decode(bytes).is_err(), "{bytes:?}");
        }
    }

    #[test]
    fn skips_what_the_checkpoint_covers() {
        // No checkpoint: everything goes.
        assert_eq!(skip_for(None, Lsn(5)), Skip::Nothing);
        let done = checkpoint(200, None);
        // Committed before the checkpoint's end: all in Kafka.
        assert_eq!(skip_for(Some(&done), Lsn(150)), Skip::All);
        assert_eq!(skip_for(Some(&done), Lsn(199)), Skip::All);
        // At or after it: a later transaction.
        assert_eq!(skip_for(Some(&done), Lsn(200)), Skip::Nothing);
        assert_eq!(skip_for(Some(&done), Lsn(300)), Skip::Nothing);
        let split = checkpoint(200, Some((260, 40)));
        assert_eq!(skip_for(Some(&split), Lsn(150)), Skip::All);
        assert_eq!(skip_for(Some(&split), Lsn(260)), Skip::First(40));
        assert_eq!(skip_for(Some(&split), Lsn(300)), Skip::Nothing);
        assert_eq!(Skip::First(40).events(), 40);
        assert_eq!(Skip::All.events(), u64::MAX);
        assert_eq!(Skip::Nothing.events(), 0);
    }

    #[test]
    fn another_system_is_not_trusted() {
        let value = checkpoint(200, None);
        assert!(value.check_system("7301", "t").is_ok());
        let error = value
            .check_system("9999", "outbox-relay-offsets")
            .unwrap_err();
        assert!(error.contains("7301") && error.contains("9999"), "{error}");
        assert!(error.contains("offsets_topic"), "{error}");
    }
}
