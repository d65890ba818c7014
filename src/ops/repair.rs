//! The ways out after events could not be streamed: a new slot that knowingly starts past
//! a gap (`outbox-relay slot create --accept-gap`), and a backfill that re-sends the
//! outbox rows still in the table since a given time (`outbox-relay backfill`).
//!
//! A backfill is at-least-once like everything else: rows the consumers already have
//! come again with the same event id, and consumers deduplicate by it. It reads the
//! table through a cursor (bounded memory), routes each row exactly as the stream would
//! (same router, same column mapping by name) and waits for every delivery report.

use std::collections::HashSet;

use tokio::sync::mpsc;

use crate::pg::conn::{PgConnection, SessionKind};
use crate::pg::diagnose::SetupError;
use crate::pg::pgoutput::{ColumnValue, RelationBody, RelationColumn, TupleData};
use crate::pg::slot;
use crate::pg::sql::{quote_ident, quote_literal};
use crate::pg::{state, Lsn};
use crate::relay::ack::AckTracker;
use crate::relay::router::EventContext;
use crate::relay::settings::Settings;
use crate::relay::RelayError;
use crate::sink::{RecordTag, SendError, SinkError, SinkNotice, SinkOptions};

/// Rows fetched per cursor round trip.
const BACKFILL_BATCH: usize = 1_000;

fn definite(message: impl Into<String>) -> RelayError {
    RelayError::Setup(Box::new(SetupError::Definite(message.into())))
}

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

/// Creates the slot. When the record says an earlier slot of that name was streamed
/// from (so events between its last acknowledged position and now were never relayed),
/// only with `accept_gap`; the gap is written to the record.
pub async fn create_slot(settings: &Settings, accept_gap: bool) -> Result<CreatedSlot, RelayError> {
    let spec = settings.source();
    let mut conn =
        PgConnection::connect(&settings.connect, SessionKind::LogicalReplication).await?;
    let exists = conn
        .simple_query(&format!(
            "SELECT confirmed_flush_lsn::text AS lsn FROM pg_catalog.pg_replication_slots WHERE slot_name = {}",
            quote_literal(&spec.slot)
        ))
        .await?;
    if !exists.rows.is_empty() {
        return Err(definite(format!(
            "replication slot {:?} already exists (acknowledged up to {}): there is nothing to create; `outbox-relay run` streams from it",
            spec.slot,
            exists.get(0, "lsn").unwrap_or("an unknown position")
        )));
    }
    state::ensure_table(&mut conn, &spec.state_table)
        .await
        .map_err(definite)?;
    let record = state::read(&mut conn, &spec.state_table, &spec.slot).await?;
    let lost = record.filter(state::SlotRecord::streamed);
    if let Some(record) = &lost {
        if !accept_gap {
            return Err(definite(state::lost_slot_message(
                &spec.slot,
                &spec.state_table,
                record,
                "--config FILE",
            )));
        }
    }
    // The publication first: the slot streams what is published from its start on.
    let publication_created = slot::ensure_publication_for_slot(&mut conn, &spec).await?;
    let identify = conn.simple_query("IDENTIFY_SYSTEM").await?;
    let system_id = identify.get(0, "systemid").unwrap_or_default().to_owned();
    let version_num = slot::server_version_num(&mut conn).await?;
    let failover = spec.failover && version_num >= slot::FAILOVER_SLOTS_SINCE;
    let start = slot::create_slot(&mut conn, &spec, &system_id, failover).await?;
    let gap_from = match lost {
        Some(record) => {
            conn.simple_query(&state::gap_sql(
                &spec.state_table,
                &spec.slot,
                record.acknowledged_lsn,
                start,
            ))
            .await?;
            tracing::warn!(
                slot = %spec.slot,
                gap_from = %record.acknowledged_lsn.map_or_else(|| "unknown".to_owned(), |l| l.to_string()),
                gap_to = %start,
                "created the slot past a gap, as asked: events committed in the gap were not relayed"
            );
            Some((record.acknowledged_lsn, record.acknowledged_at))
        }
        None => None,
    };
    Ok(CreatedSlot {
        slot: spec.slot,
        start,
        gap_from,
        publication_created,
    })
}

/// What a backfill did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackfillReport {
    pub rows: u64,
    pub delivered: u64,
    /// Rows that could not be routed (each logged with its reason).
    pub unroutable: u64,
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
                        settle(&mut notices, &mut tracker, &mut report, 1).await?;
                    }
                    Err(SendError::Refused { reason, event, .. }) => {
                        return Err(RelayError::Undeliverable {
                            topic: event.topic,
                            lsn: Lsn::ZERO,
                            reason,
                        })
                    }
                    Err(SendError::Sink(error)) => return Err(error.into()),
                }
            }
            if !tracker.has_room(limits) {
                sink.flush()?;
                settle(&mut notices, &mut tracker, &mut report, 1).await?;
            }
        }
    }
    conn.simple_query("COMMIT").await?;
    sink.flush()?;
    let all = tracker.in_flight();
    settle(&mut notices, &mut tracker, &mut report, all).await?;
    Ok(report)
}

/// Waits for `at_least` delivery notices (and takes any others already there). A
/// backfill is one pass: any failure stops it with its reason (run it again; what was
/// delivered comes again, which consumers deduplicate).
async fn settle(
    notices: &mut mpsc::UnboundedReceiver<SinkNotice>,
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
            SinkNotice::Failed { failure, .. } => {
                return Err(RelayError::Undeliverable {
                    topic: String::new(),
                    lsn: Lsn::ZERO,
                    reason: failure.reason,
                })
            }
            SinkNotice::Retry { reason } => {
                return Err(RelayError::Sink(SinkError::KafkaRetry(reason)))
            }
            SinkNotice::Stop { reason } => {
                return Err(RelayError::Sink(SinkError::KafkaStop(reason)))
            }
            SinkNotice::ClientError | SinkNotice::Topic { .. } | SinkNotice::Due => {}
        }
    }
    Ok(())
}
