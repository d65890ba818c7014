//! `outbox-relay backfill`: the way out after events could not be streamed (a lost
//! slot, an outbox that left the publication, a table added to the publication with
//! rows already in it) is to re-send the outbox rows still in the table since a given
//! time: of every outbox table, or of the one `--table` names.
//!
//! A backfill is at-least-once like everything else: rows the consumers already have
//! come again with the same event id, and consumers deduplicate by it. It reads each
//! table through a cursor (bounded memory), in one read-only transaction (one snapshot
//! for every table), routes each row exactly as the stream would (the table's own
//! router, the same column mapping by name) and waits for every delivery report.

use std::collections::HashSet;

use tokio::sync::mpsc;

use crate::pg::conn::{PgConnection, SessionKind};
use crate::pg::pgoutput::{ColumnValue, RelationBody, RelationColumn, TupleData};
use crate::pg::sql::{quote_ident, quote_literal, QualifiedName};
use crate::pg::Lsn;
use crate::relay::ack::AckTracker;
use crate::relay::router::config::OutboxSettings;
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
    /// The tables read, in order.
    pub tables: Vec<String>,
    pub rows: u64,
    pub delivered: u64,
    /// Rows that could not be routed (each logged with its reason).
    pub unroutable: u64,
}

impl BackfillReport {
    /// What `backfill --since SINCE` tells the operator.
    pub fn said(&self, since: &str) -> String {
        format!(
            "backfill: {} rows since {since:?} read from {}, {} delivered, {} could not be routed",
            self.rows,
            self.tables.join(", "),
            self.delivered,
            self.unroutable
        )
    }
}

/// Which outbox tables `--table` asks for: every one (`tables`: the configuration's,
/// and those its patterns match now), or the named one (which must be one of the
/// relay's: listed, or matched by a pattern); each with its entry's settings.
pub fn chosen<'a>(
    settings: &'a Settings,
    tables: Vec<QualifiedName>,
    table: Option<&str>,
) -> Result<Vec<(QualifiedName, &'a OutboxSettings)>, RelayError> {
    if settings.outboxes.is_empty() {
        return Err(definite(
            "this relay has no outbox table ([outbox] enabled = false): there is nothing to backfill",
        ));
    }
    let Some(name) = table else {
        return Ok(tables
            .into_iter()
            .filter_map(|table| {
                let outbox = settings.outbox(&table)?;
                Some((table, outbox))
            })
            .collect());
    };
    let wanted =
        QualifiedName::parse(name).map_err(|e| definite(format!("--table {name:?}: {e}")))?;
    match settings.outbox(&wanted) {
        Some(outbox) => Ok(vec![(wanted, outbox)]),
        None => Err(definite(format!(
            "--table {wanted} is not an outbox table of this configuration; its tables are {}",
            settings.source().tables_shown()
        ))),
    }
}

/// Re-sends every row of the chosen outbox tables ([`chosen`]) whose `column` is at or
/// after `since` (a timestamp PostgreSQL understands), table by table, oldest first
/// within each, through the configured sink, and waits until each is delivered.
pub async fn backfill(
    settings: &Settings,
    since: &str,
    column: &str,
    table: Option<&str>,
) -> Result<BackfillReport, RelayError> {
    let mut conn = PgConnection::connect(&settings.connect, SessionKind::Sql).await?;
    let tables = crate::pg::slot::resolve_tables(&mut conn, &settings.source())
        .await?
        .tables;
    let outboxes = chosen(settings, tables, table)?;
    let (notice_tx, notices) = mpsc::unbounded_channel();
    let sink = settings.sink.build(
        notice_tx,
        SinkOptions {
            max_in_flight: settings.relay.max_in_flight,
            max_in_flight_bytes: settings.relay.max_in_flight_bytes,
            keep_events: false,
            metrics: crate::metrics::Metrics::new(),
            // Not transactional even with exactly_once: a backfill sends copies on
            // purpose and must not fence the running relay's producer.
            slot: None,
            partition_column: settings.partition_column(),
        },
    )?;
    // One open "transaction" holding every backfilled record: the tracker hands out the
    // tickets that deliveries settle, and counts what is in flight.
    let mut tracker = AckTracker::new(Lsn::ZERO, 0);
    tracker.begin(0)?;
    let mut run = Run {
        sink,
        notices,
        tracker,
        report: BackfillReport::default(),
        ready_topics: HashSet::new(),
        commit_ts_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
    };
    conn.simple_query("BEGIN READ ONLY").await?;
    for (table, outbox) in outboxes {
        run.report.tables.push(table.to_string());
        run.table(&mut conn, (&table, outbox), (since, column), settings)
            .await?;
    }
    conn.simple_query("COMMIT").await?;
    run.sink.flush()?;
    let all = run.tracker.in_flight();
    settle(&mut run, all).await?;
    Ok(run.report)
}

/// One backfill's sink, tracker and tally.
struct Run {
    sink: Box<dyn Sink>,
    notices: mpsc::UnboundedReceiver<SinkNotice>,
    tracker: AckTracker,
    report: BackfillReport,
    ready_topics: HashSet<String>,
    /// The records' timestamp when the row gives none: the backfill's start.
    commit_ts_ms: i64,
}

impl Run {
    /// Sends the rows of one outbox table.
    async fn table(
        &mut self,
        conn: &mut PgConnection,
        (table, outbox): (&QualifiedName, &OutboxSettings),
        (since, column): (&str, &str),
        settings: &Settings,
    ) -> Result<(), RelayError> {
        let router = &outbox.router;
        let declare = format!(
            "DECLARE outbox_backfill NO SCROLL CURSOR FOR SELECT * FROM {} WHERE {} >= {}::timestamptz ORDER BY {}",
            table.quoted(),
            quote_ident(column),
            quote_literal(since),
            quote_ident(column)
        );
        conn.simple_query(&declare).await.map_err(|e| {
            definite(format!(
                "cannot read the outbox rows since {since:?} by column {column:?}: {e} (give --column a timestamp column of {table})"
            ))
        })?;
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
                namespace: table.schema.clone(),
                name: table.name.clone(),
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
                self.report.rows += 1;
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
                    commit_ts_ms: self.commit_ts_ms,
                };
                let event = match router.route(&resolved, &tuple, context) {
                    Ok(event) => event,
                    Err(error) => {
                        self.report.unroutable += 1;
                        tracing::error!(error = %error, %table, row = self.report.rows, "backfill: row cannot be routed; skipped");
                        continue;
                    }
                };
                self.send(event).await?;
                if !self.tracker.has_room(limits) {
                    self.sink.flush()?;
                    settle(self, 1).await?;
                }
            }
        }
        conn.simple_query("CLOSE outbox_backfill").await?;
        Ok(())
    }

    async fn send(&mut self, event: crate::event::OutboxEvent) -> Result<(), RelayError> {
        if self.ready_topics.insert(event.topic.clone()) {
            self.sink.ensure_topic(&event.topic).await?;
        }
        let ticket = self
            .tracker
            .event_sent(0, std::time::Instant::now(), event.record_bytes())?;
        let tag = RecordTag {
            ticket,
            dead_letter: false,
        };
        let mut pending = Some(event);
        while let Some(event) = pending.take() {
            match self.sink.send(event, tag) {
                Ok(()) => {}
                Err(SendError::QueueFull(event)) => {
                    pending = Some(*event);
                    settle(self, 1).await?;
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
        Ok(())
    }
}

/// Waits for `at_least` delivery notices (and takes any others already there). A
/// backfill is one pass: any failure stops it with its reason (run it again; what was
/// delivered comes again, which consumers deduplicate).
async fn settle(run: &mut Run, at_least: u64) -> Result<(), RelayError> {
    let mut settled = 0;
    while settled < at_least || !run.notices.is_empty() {
        let Some(notice) = run.notices.recv().await else {
            break;
        };
        match notice {
            SinkNotice::Delivered { tag } => {
                settled += 1;
                run.tracker.delivered(tag.ticket)?;
                run.report.delivered += 1;
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
            SinkNotice::Wake => run.sink.poll()?,
        }
    }
    Ok(())
}
