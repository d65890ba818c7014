//! The pipeline's steps for logical decoding messages (the table-less outbox,
//! [`crate::relay::messages`]): a relayed message becomes a record of its transaction
//! or a dead letter; a non-transactional one delivered on its own is a transaction of
//! its own; a refused one is logged and counted; an ignored one only counted.

use crate::metrics::Metrics;
use crate::pg::Lsn;
use crate::relay::deadletter::DeadLetter;
use crate::relay::messages::MessageError;
use crate::relay::router::OutboxEvent;
use crate::relay::source::ReplicationStream;
use crate::relay::txn::Step;
use crate::relay::{Definite, RelayError};
use crate::sink::TxnSeq;

use super::{Pipeline, Place};

impl<S: ReplicationStream> Pipeline<S> {
    /// One of the message steps of [`Step`] (others are not passed here).
    pub(super) fn on_message_step(&mut self, step: Step) -> Result<(), RelayError> {
        match step {
            Step::Message { seq, event } => self.on_message(seq, event)?,
            Step::Standalone {
                seq,
                event,
                end_lsn,
                timestamp_ms,
            } => {
                self.on_step(Step::Begin {
                    seq,
                    commit_ts_ms: timestamp_ms,
                    // Its own transaction ends at the message's LSN + 1: the message's
                    // LSN stands for the commit record (the exactly-once skip).
                    final_lsn: Lsn(end_lsn.0.saturating_sub(1)),
                })?;
                self.on_message(seq, event)?;
                self.on_step(Step::Commit { seq, end_lsn })?;
            }
            Step::Refused { prefix, lsn } => {
                Metrics::add(&self.metrics.messages_refused, 1);
                tracing::error!(
                    prefix = %prefix,
                    lsn = %lsn,
                    "non-transactional message refused: written with pg_logical_emit_message(false, ...), it is not atomic with the writer's transaction; write it with transactional = true, or set [messages] non_transactional = \"deliver\" to relay such messages (docs/messages.md)"
                );
            }
            Step::Ignored => Metrics::add(&self.metrics.messages_ignored, 1),
            other => self.on_step(other)?,
        }
        Ok(())
    }

    /// A relayed message of transaction `seq`: a record, or a dead letter.
    fn on_message(
        &mut self,
        seq: TxnSeq,
        event: Result<OutboxEvent, MessageError>,
    ) -> Result<(), RelayError> {
        Metrics::add(&self.metrics.messages, 1);
        match event {
            Ok(event) => self.on_step(Step::Event {
                seq,
                event: Ok(event),
            }),
            // A dead letter Kafka committed before this session (exactly-once).
            Err(_) if self.skip_committed() => Ok(()),
            Err(error) => {
                self.txn_had_events = true;
                let letter = DeadLetter {
                    reason: error.reason.clone(),
                    source_table: format!("message:{}", error.prefix),
                    source_lsn: error.lsn,
                    original_topic: Some(error.topic.clone()),
                    key: None,
                    headers: Vec::new(),
                    value: error.content.clone(),
                    timestamp_ms: 0,
                };
                self.dead_letter_or(seq, letter, Place::Back, || Definite::Message(error).into())?;
                self.pump()
            }
        }
    }
}
