//! What the `outbox-relay slot` commands say, from what `slot.rs` found: where the
//! slot stands ([`SlotStatus`]), for people or as JSON, and whether it is lost (the
//! exit code of `slot status`); what `slot create` did ([`CreatedSlot`]) and, past a
//! gap, the backfill that closes it. Pure.

use std::path::Path;

use crate::pg::Lsn;

/// What `slot create` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedSlot {
    pub slot: String,
    pub start: Lsn,
    /// The lost slot's last acknowledged position and when, if it had streamed.
    pub gap_from: Option<(Option<Lsn>, Option<String>)>,
    /// The publication was missing and created first.
    pub publication_created: bool,
}

impl CreatedSlot {
    /// What `slot create` tells the operator, a line each: the publication it created
    /// first, then the slot and, past a gap, the `backfill` (of the `--config` file
    /// `config`) that re-sends what the gap skipped.
    pub fn said(&self, publication: &str, config: &Path) -> Vec<String> {
        let mut said = Vec::new();
        if self.publication_created {
            said.push(format!(
                "created publication {publication:?} first: a slot streams only what is published from its start on"
            ));
        }
        said.push(match &self.gap_from {
            Some((lsn, at)) => format!(
                "created replication slot {:?} at {}; events committed after {} (acknowledged at {}) up to {} were not relayed: re-send them with `outbox-relay backfill --config {} --since '{}'`",
                self.slot,
                self.start,
                lsn.map_or_else(|| "the old slot's start".to_owned(), |l| l.to_string()),
                at.as_deref().unwrap_or("an unknown time"),
                self.start,
                config.display(),
                at.as_deref().unwrap_or("<time of the last acknowledged event>"),
            ),
            None => format!("created replication slot {:?} at {}", self.slot, self.start),
        });
        said
    }
}

/// Where the slot stands, as `slot status` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotStatus {
    pub slot: String,
    pub exists: bool,
    pub active: bool,
    pub active_pid: Option<u32>,
    pub confirmed_flush_lsn: Option<String>,
    pub restart_lsn: Option<String>,
    pub current_lsn: Option<String>,
    pub wal_status: Option<String>,
    pub invalidation_reason: Option<String>,
    pub failover: bool,
    /// WAL written since the acknowledged position.
    pub lag_bytes: Option<i64>,
    /// WAL the slot keeps (since `restart_lsn`).
    pub retained_bytes: Option<i64>,
    /// How much more WAL may be written before the slot is invalidated
    /// (`max_slot_wal_keep_size`); `None` when unlimited.
    pub safe_wal_size: Option<i64>,
    pub max_slot_wal_keep_size: Option<String>,
    /// `pg_stat_replication.flush_lag` of the streaming walsender, in seconds.
    pub flush_lag_seconds: Option<f64>,
    /// The relay's record: when it last noted an acknowledged position.
    pub recorded_acknowledged_at: Option<String>,
    pub recorded_acknowledged_lsn: Option<String>,
    pub recorded_streamed: bool,
    /// Each configured outbox table and whether the publication publishes it now
    /// (`None`: it could not be read).
    pub tables: Vec<(String, Option<bool>)>,
}

impl SlotStatus {
    /// The slot cannot stream what the relay still owes: it was lost (dropped after the
    /// relay streamed from it) or PostgreSQL invalidated it (`wal_status = lost`, or an
    /// `invalidation_reason`). `slot status` exits non-zero then, for scripts and probes.
    pub fn is_lost(&self) -> bool {
        if !self.exists {
            return self.recorded_streamed;
        }
        self.wal_status.as_deref() == Some("lost") || self.invalidation_reason.is_some()
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "slot": self.slot,
            "exists": self.exists,
            "active": self.active,
            "active_pid": self.active_pid,
            "confirmed_flush_lsn": self.confirmed_flush_lsn,
            "restart_lsn": self.restart_lsn,
            "current_lsn": self.current_lsn,
            "wal_status": self.wal_status,
            "invalidation_reason": self.invalidation_reason,
            "failover": self.failover,
            "lost": self.is_lost(),
            "lag_bytes": self.lag_bytes,
            "retained_bytes": self.retained_bytes,
            "safe_wal_size": self.safe_wal_size,
            "max_slot_wal_keep_size": self.max_slot_wal_keep_size,
            "flush_lag_seconds": self.flush_lag_seconds,
            "tables": self.tables.iter().map(|(table, published)| serde_json::json!({
                "table": table,
                "published": published,
            })).collect::<Vec<_>>(),
            "record": {
                "streamed": self.recorded_streamed,
                "acknowledged_lsn": self.recorded_acknowledged_lsn,
                "acknowledged_at": self.recorded_acknowledged_at,
            },
        })
    }

    /// For people.
    pub fn describe(&self) -> String {
        let show = |value: &Option<String>| value.clone().unwrap_or_else(|| "-".to_owned());
        let bytes = |value: Option<i64>| value.map_or_else(|| "-".to_owned(), human_bytes);
        if !self.exists {
            let mut text = format!("replication slot {:?} does not exist", self.slot);
            if self.recorded_streamed {
                text.push_str(&format!(
                    "; the relay's record says it streamed from it (last acknowledged {} at {}): the slot was lost, see `outbox-relay slot create --accept-gap` and `backfill`",
                    show(&self.recorded_acknowledged_lsn),
                    show(&self.recorded_acknowledged_at)
                ));
            } else {
                text.push_str("; the relay creates it on its first start");
            }
            return text + "\n";
        }
        let mut lines = vec![
            format!("slot                  {}", self.slot),
            format!(
                "active                {}",
                match (self.active, self.active_pid) {
                    (true, Some(pid)) => format!("yes (walsender pid {pid})"),
                    (true, None) => "yes".to_owned(),
                    (false, _) => "no (no relay streams from it now)".to_owned(),
                }
            ),
            format!("confirmed flush LSN   {}", show(&self.confirmed_flush_lsn)),
            format!("restart LSN           {}", show(&self.restart_lsn)),
            format!("current WAL LSN       {}", show(&self.current_lsn)),
            format!(
                "lag                   {} of WAL not yet acknowledged",
                bytes(self.lag_bytes)
            ),
            format!(
                "lag in time           {}",
                self.flush_lag_seconds.map_or_else(
                    || "- (not streaming, or nothing to catch up)".to_owned(),
                    |s| format!("{s:.3} s (walsender flush_lag)")
                )
            ),
            format!("retained WAL          {}", bytes(self.retained_bytes)),
            format!(
                "wal_status            {}{}",
                show(&self.wal_status),
                self.invalidation_reason
                    .as_ref()
                    .map_or_else(String::new, |r| format!(" (invalidation_reason {r})"))
            ),
            format!(
                "max_slot_wal_keep_size {}{}",
                show(&self.max_slot_wal_keep_size),
                self.safe_wal_size.map_or_else(String::new, |s| format!(
                    " ({} more before invalidation)",
                    human_bytes(s)
                ))
            ),
            format!(
                "failover slot         {}",
                if self.failover { "yes" } else { "no" }
            ),
            format!(
                "last recorded ack     {} at {}",
                show(&self.recorded_acknowledged_lsn),
                show(&self.recorded_acknowledged_at)
            ),
        ];
        for (index, (table, published)) in self.tables.iter().enumerate() {
            let label = if index == 0 { "outbox tables" } else { "" };
            let state = match published {
                Some(true) => "published",
                Some(false) => "NOT published: rows written to it are not streamed (ALTER PUBLICATION ... ADD TABLE, then `backfill --table`)",
                None => "publication not readable",
            };
            lines.push(format!("{label:<21} {table} ({state})"));
        }
        lines.push(String::new());
        lines.join("\n")
    }
}

fn human_bytes(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {} ({bytes} bytes)", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{CreatedSlot, SlotStatus};
    use crate::pg::Lsn;

    fn status(
        exists: bool,
        wal_status: Option<&str>,
        reason: Option<&str>,
        streamed: bool,
    ) -> SlotStatus {
        SlotStatus {
            slot: "outbox_relay".into(),
            exists,
            active: false,
            active_pid: None,
            confirmed_flush_lsn: None,
            restart_lsn: None,
            current_lsn: None,
            wal_status: wal_status.map(str::to_owned),
            invalidation_reason: reason.map(str::to_owned),
            failover: false,
            lag_bytes: None,
            retained_bytes: None,
            safe_wal_size: None,
            max_slot_wal_keep_size: None,
            flush_lag_seconds: None,
            recorded_acknowledged_at: None,
            recorded_acknowledged_lsn: None,
            recorded_streamed: streamed,
            tables: vec![
                ("public.outbox".into(), Some(true)),
                ("t2.outbox".into(), Some(false)),
            ],
        }
    }

    #[test]
    fn the_status_says_which_outbox_tables_are_published() {
        let status = status(true, Some("reserved"), None, true);
        let text = status.describe();
        assert!(
            text.contains("outbox tables         public.outbox (published)"),
            "{text}"
        );
        assert!(text.contains("t2.outbox (NOT published"), "{text}");
        let json = status.to_json();
        assert_eq!(json["tables"][1]["table"], "t2.outbox");
        assert_eq!(json["tables"][1]["published"], false);
    }

    #[test]
    fn a_slot_is_lost_when_dropped_after_streaming_or_invalidated() {
        // Not created yet: the relay creates it; nothing is owed.
        assert!(!status(false, None, None, false).is_lost());
        // Gone after the relay streamed from it.
        assert!(status(false, None, None, true).is_lost());
        for usable in ["reserved", "extended", "unreserved"] {
            assert!(
                !status(true, Some(usable), None, true).is_lost(),
                "{usable}"
            );
        }
        assert!(status(true, Some("lost"), None, true).is_lost());
        // PostgreSQL 16+ names why (rows_removed, wal_level_insufficient, ...).
        assert!(status(true, Some("reserved"), Some("rows_removed"), true).is_lost());
        assert_eq!(
            status(true, Some("lost"), None, true).to_json()["lost"],
            true
        );
    }

    #[test]
    fn slot_create_names_the_gap_and_the_backfill_that_closes_it() {
        let mut created = CreatedSlot {
            slot: "outbox_relay".into(),
            start: Lsn(0x1_0000_0060),
            gap_from: None,
            publication_created: false,
        };
        let config = Path::new("relay.toml");
        assert_eq!(
            created.said("outbox_pub", config),
            ["created replication slot \"outbox_relay\" at 1/60"]
        );
        created.publication_created = true;
        created.gap_from = Some((Some(Lsn(0x50)), Some("2026-12-01 09:00:00+00".into())));
        let said = created.said("outbox_pub", config);
        assert_eq!(said.len(), 2);
        assert!(said[0].starts_with("created publication \"outbox_pub\" first"));
        assert!(
            said[1].contains("events committed after 0/50 (acknowledged at 2026-12-01 09:00:00+00) up to 1/60 were not relayed: re-send them with `outbox-relay backfill --config relay.toml --since '2026-12-01 09:00:00+00'`"),
            "{}",
            said[1]
        );
        created.gap_from = Some((None, None));
        assert!(created.said("outbox_pub", config)[1].contains(
            "after the old slot's start (acknowledged at an unknown time) up to 1/60 were not relayed: re-send them with `outbox-relay backfill --config relay.toml --since '<time of the last acknowledged event>'`"
        ));
    }
}
