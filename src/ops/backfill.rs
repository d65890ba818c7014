//! `outbox-relay backfill`: the way out after events could not be streamed (a lost
//! slot, an outbox that left the publication) is to re-send the outbox rows still in
//! the table since a given time.
//!
//! A backfill is at-least-once like everything else: rows the consumers already have
//! come again with the same event id, and consumers deduplicate by it. It reads the
//! table through a cursor (bounded memory), routes each row exactly as the stream would
//! (same router, same column mapping by name) and waits for every delivery report.

use std::collections::HashSet;

use tokio::sync::mpsc;

use crate::pg::conn::{PgConnection, SessionKind};
use crate::pg::pgoutput::{ColumnValue, RelationBody, RelationColumn, TupleData};
use crate::pg::sql::{quote_ident, quote_literal};
use crate::pg::Lsn;
use crate::relay::ack::AckTracker;
use crate::relay::router::EventContext;
use crate::relay::settings::Settings;
use crate::relay::{Definite, RelayError};
use crate::sink::{RecordTag, SendError, Sink, SinkError, SinkNotice, SinkOptions};

use super::definite;

/// Rows fetched per cursor round trip.
const BACKFILL_BATCH: usize = 1_000;

/// What a backfill did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackfillReport {
    pub rows: u64,
    pub delivered: u64,
    /// Rows that could not be routed (each logged with its reason).
    pub unroutable: u64,
}

impl BackfillReport {
    /// What `backfill --since SINCE` tells the operator.
    pub fn said(&self, since: &str) -> String {
        format!(
            "backfill: {} rows since {since:?} read, {} delivered, {} could not be routed",
            self.rows, self.delivered, self.unroutable
        )
    }
}

/// Re-sends every row of the outbox whose `column` is at or after `since` (a timestamp
/// PostgreSQL understands), oldest first, through the configured sink, and waits until
/// each is delivered.
pub async fn backfill(
    settings: &Settings,
    since: &str,
    column: &str,
) -> Result<BackfillReport, RelayError> {
    let router = &settings.router;
    let (notice_tx, mut notices) = mpsc::unbounded_channel();
    let mut sink = settings.sink.build(
        notice_tx,
        SinkOptions {
            max_in_flight: settings.relay.max_in_flight,
            max_in_flight_bytes: settings.relay.max_in_flight_bytes,
            keep_events: false,
            metrics: crate::metrics::Metrics::new(),
            // Not transactional even with exactly_once: a backfill sends copies on
            // purpose and must not fence the running relay's producer.
            slot: None,
            partition_column: router.partition_column().map(str::to_owned),
        },
    )?;

    let mut conn = PgConnection::connect(&settings.connect, SessionKind::Sql).await?;
    conn.simple_query("BEGIN READ ONLY").await?;
    let declare = format!(
        "DECLARE outbox_backfill NO SCROLL CURSOR FOR SELECT * FROM {} WHERE {} >= {}::timestamptz ORDER BY {}",
        settings.table.quoted(),
        quote_ident(column),
        quote_literal(since),
        quote_ident(column)
    );
    conn.simple_query(&declare).await.map_err(|e| {
        definite(format!(
            "cannot read the outbox rows since {since:?} by column {column:?}: {e} (give --column a timestamp column of {})",
            settings.table
        ))
    })?;
    let commit_ts_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let mut report = BackfillReport::default();
    // One open "transaction" holding every backfilled record: the tracker hands out the
    // tickets that deliveries settle, and counts what is in flight.
    let mut tracker = AckTracker::new(Lsn::ZERO, 0);
    tracker.begin(0)?;
    let mut ready_topics: HashSet<String> = HashSet::new();
    let limits = settings.relay.limits();
    loop {
        let batch = conn
            .simple_query(&format!("FETCH {BACKFILL_BATCH} FROM outbox_backfill"))
            .await?;
        if batch.rows.is_empty() {
            break;
        }
        let relation = RelationBody {
            xid: None,
            relation_id: 0,
            namespace: settings.table.schema.clone(),
            name: settings.table.name.clone(),
            replica_identity: b'd',
            columns: batch
                .columns
                .iter()
                .zip(&batch.column_types)
                .map(|(name, type_oid)| RelationColumn {
                    is_key: false,
                    name: name.clone(),
                    type_oid: *type_oid,
                    type_modifier: -1,
                })
                .collect(),
        };
        let resolved = router.resolve(&relation);
        for row in &batch.rows {
            report.rows += 1;
            let tuple = TupleData {
                columns: row
                    .iter()
                    .map(|value| match value {
                        Some(text) => {
                            ColumnValue::Text(bytes::Bytes::copy_from_slice(text.as_bytes()))
                        }
                        None => ColumnValue::Null,
                    })
                    .collect(),
            };
            let context = EventContext {
                lsn: Lsn::ZERO,
                commit_ts_ms,
            };
            let event = match router.route(&resolved, &tuple, context) {
                Ok(event) => event,
                Err(error) => {
                    report.unroutable += 1;
                    tracing::error!(error = %error, row = report.rows, "backfill: row cannot be routed; skipped");
                    continue;
                }
            };
            if ready_topics.insert(event.topic.clone()) {
                sink.ensure_topic(&event.topic).await?;
            }
            let ticket = tracker.event_sent(0, std::time::Instant::now(), event.record_bytes())?;
            let tag = RecordTag {
                ticket,
                dead_letter: false,
            };
            let mut pending = Some(event);
            while let Some(event) = pending.take() {
                match sink.send(event, tag) {
                    Ok(()) => {}
                    Err(SendError::QueueFull(event)) => {
                        pending = Some(*event);
                        settle(&mut notices, sink.as_mut(), &mut tracker, &mut report, 1).await?;
                    }
                    Err(SendError::Refused { reason, event, .. }) => {
                        return Err(Definite::Undeliverable {
                            topic: event.topic,
                            lsn: Lsn::ZERO,
                            reason,
                        }
                        .into())
                    }
                    Err(SendError::Sink(error)) => return Err(error.into()),
                }
            }
            if !tracker.has_room(limits) {
                sink.flush()?;
                settle(&mut notices, sink.as_mut(), &mut tracker, &mut report, 1).await?;
            }
        }
    }
    conn.simple_query("COMMIT").await?;
    sink.flush()?;
    let all = tracker.in_flight();
    settle(&mut notices, sink.as_mut(), &mut tracker, &mut report, all).await?;
    Ok(report)
}

/// Waits for `at_least` delivery notices (and takes any others already there). A
/// backfill is one pass: any failure stops it with its reason (run it again; what was
/// delivered comes again, which consumers deduplicate).
async fn settle(
    notices: &mut mpsc::UnboundedReceiver<SinkNotice>,
    sink: &mut dyn Sink,
    tracker: &mut AckTracker,
    report: &mut BackfillReport,
    at_least: u64,
) -> Result<(), RelayError> {
    let mut settled = 0;
    while settled < at_least || !notices.is_empty() {
        let Some(notice) = notices.recv().await else {
            break;
        };
        match notice {
            SinkNotice::Delivered { tag } => {
                settled += 1;
                tracker.delivered(tag.ticket)?;
                report.delivered += 1;
            }
            SinkNotice::Refused { failure, .. } => {
                return Err(Definite::Undeliverable {
                    topic: String::new(),
                    lsn: Lsn::ZERO,
                    reason: failure.reason,
                }
                .into())
            }
            SinkNotice::Retry { reason } => return Err(SinkError::Retry(reason).into()),
            SinkNotice::Stop { reason } => return Err(SinkError::Stop(reason).into()),
            SinkNotice::Wake => sink.poll()?,
        }
    }
    Ok(())
}
