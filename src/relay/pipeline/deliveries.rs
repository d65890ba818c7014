//! The pipeline's side of the sink boundary: routed events counted in the ack tracker
//! and queued in order, handed to the sink while their topics are ready and it has
//! room ([`Pipeline::pump`]), and the sink's notices taken in ([`Pipeline::on_notice`]):
//! a delivery moves the tracker, a refused record becomes a dead letter (or the relay
//! stops without acknowledging it), a retry or a stop ends the attempt, a wake lets the
//! sink do its own bookkeeping. What a sink's failures mean is the sink's to say
//! ([`crate::sink`]); nothing here knows which sink it is.

use crate::metrics::{unix_ms_now, Metrics};
use crate::relay::deadletter::{self, DeadLetter, Refusal};
use crate::relay::router::OutboxEvent;
use crate::relay::source::ReplicationStream;
use crate::relay::txn::RoutedRowError;
use crate::relay::{Definite, RelayError};
use crate::sink::{RecordTag, SendError, SinkError, SinkNotice, TopicStatus, TxnSeq};

use super::{now, Pipeline, Place, Waiting};

impl<S: ReplicationStream> Pipeline<S> {
    /// Count one routed event and queue it for its topic. An event routed to the
    /// dead-letter topic's own name is refused here: sent there as it is, it would be
    /// taken for a dead letter (and a dead letter's failures are handled differently).
    pub(super) fn dispatch(&mut self, event: OutboxEvent, seq: TxnSeq) -> Result<(), RelayError> {
        let ticket = self.tracker.event_sent(seq, now(), event.record_bytes())?;
        let tag = RecordTag {
            ticket,
            dead_letter: false,
        };
        self.progress.events += 1;
        Metrics::add(&self.metrics.events, 1);
        if let Some(entry) = self.assembler.entry_of(event.outbox) {
            self.metrics.add_outbox_event(entry);
        }
        if self.metrics.oldest_undelivered.since_ms().is_none() {
            // The first event waiting: its age counts from now, not from the next tick.
            self.update_ages();
        }
        if self.dead_letter_topic.as_deref() == Some(event.topic.as_str()) {
            let reason = format!(
                "routed to the dead-letter topic's own name {:?}; change the route-by value or [outbox] topic, or choose another [dead_letter] topic",
                event.topic
            );
            self.dead_letter_event(tag, &event, reason, Place::Back)?;
        } else {
            self.waiting.push_back(Waiting { event, tag });
        }
        self.pump()
    }

    /// Hand waiting records to the sink, in order, while their topics are ready and the
    /// producer has room. A record whose topic is still being prepared holds back every
    /// record after it: order is kept, and reading stays paused until it moves.
    pub(super) fn pump(&mut self) -> Result<(), RelayError> {
        while let Some(front) = self.waiting.front() {
            let status = self.sink.topic_status(&front.event.topic);
            if status == TopicStatus::Waiting {
                break;
            }
            let Some(Waiting { event, tag }) = self.waiting.pop_front() else {
                break;
            };
            if let TopicStatus::Refused(reason) = status {
                let reason = format!("topic {:?}: {reason}", event.topic);
                self.refused(tag, Some(event), reason, false, Place::Front)?;
                continue;
            }
            match self.sink.send(event, tag) {
                Ok(()) => {}
                Err(SendError::QueueFull(event)) => {
                    self.waiting.push_front(Waiting { event: *event, tag });
                    break;
                }
                Err(SendError::Refused {
                    reason,
                    too_large,
                    event,
                }) => self.refused(tag, Some(*event), reason, too_large, Place::Front)?,
                Err(SendError::Sink(error)) => return Err(error.into()),
            }
        }
        Ok(())
    }

    pub(super) fn push(&mut self, waiting: Waiting, place: Place) {
        match place {
            Place::Front => self.waiting.push_front(waiting),
            Place::Back => self.waiting.push_back(waiting),
        }
    }

    /// A record was refused for a reason of its own (too large, malformed, a topic
    /// Kafka refuses). An event is settled through the dead-letter topic, or the relay
    /// stops without acknowledging it. A dead-letter record refused for its size goes
    /// again without its value, saying so in a header; refused otherwise, the relay
    /// stops.
    pub(super) fn refused(
        &mut self,
        tag: RecordTag,
        event: Option<OutboxEvent>,
        reason: String,
        too_large: bool,
        place: Place,
    ) -> Result<(), RelayError> {
        let policy = deadletter::on_refusal(
            tag.dead_letter,
            event,
            &reason,
            too_large,
            self.dead_letter_topic.is_some(),
        );
        match policy {
            Refusal::DeadLetter(event) => self.dead_letter_event(tag, &event, reason, place),
            Refusal::ResendWithoutValue(bare) => {
                tracing::warn!(reason = %reason, "dead-letter record too large; sending it without its value (header value.dropped says why)");
                self.push(Waiting { event: bare, tag }, place);
                Ok(())
            }
            Refusal::StopDeadLetterRefused => Err(Definite::DeadLetterRefused(reason).into()),
            Refusal::StopNoDeadLetterTopic(Some(event)) => Err(Definite::Undeliverable {
                topic: event.topic,
                lsn: event.lsn,
                reason,
            }
            .into()),
            Refusal::StopNoDeadLetterTopic(None) => {
                Err(Definite::RefusedWithoutDeadLetter { reason }.into())
            }
        }
    }

    /// Settle the counted event of `tag` through a dead-letter record carrying
    /// `reason`, or stop when no dead-letter topic is configured.
    pub(super) fn dead_letter_event(
        &mut self,
        tag: RecordTag,
        event: &OutboxEvent,
        reason: String,
        place: Place,
    ) -> Result<(), RelayError> {
        // A logical decoding message's record has no table.
        let source_table = self
            .assembler
            .table_of(event.outbox)
            .map_or_else(|| "message".to_owned(), ToString::to_string);
        let letter = DeadLetter::from_event(event, reason.clone(), &source_table);
        self.dead_letter_or(tag.ticket.seq(), letter, place, || {
            Definite::Undeliverable {
                topic: event.topic.clone(),
                lsn: event.lsn,
                reason,
            }
            .into()
        })?;
        // The original event is settled by its dead-letter record.
        self.tracker.delivered(tag.ticket)?;
        Ok(())
    }

    pub(super) fn dead_letter_row(
        &mut self,
        row_error: RoutedRowError,
        seq: TxnSeq,
    ) -> Result<(), RelayError> {
        let letter = DeadLetter {
            reason: row_error.error.to_string(),
            source_table: row_error.table.clone(),
            source_lsn: row_error.lsn,
            original_topic: None,
            key: None,
            headers: Vec::new(),
            value: Some(row_error.row_json.clone()),
            timestamp_ms: 0,
        };
        self.dead_letter_or(seq, letter, Place::Back, || {
            Definite::Route(row_error).into()
        })?;
        self.pump()
    }

    /// Queue `letter` for the dead-letter topic as an event of `seq`, or fail with
    /// `otherwise()` when none is configured.
    pub(super) fn dead_letter_or(
        &mut self,
        seq: TxnSeq,
        letter: DeadLetter,
        place: Place,
        otherwise: impl FnOnce() -> RelayError,
    ) -> Result<(), RelayError> {
        let Some(topic) = self.dead_letter_topic.clone() else {
            return Err(otherwise());
        };
        tracing::warn!(
            reason = %letter.reason,
            source_lsn = %letter.source_lsn,
            dead_letter_topic = %topic,
            "event sent to the dead-letter topic"
        );
        self.progress.dead_lettered += 1;
        Metrics::add(&self.metrics.dead_lettered, 1);
        self.metrics
            .dead_lettered_by_topic
            .add(letter.original_topic.as_deref().unwrap_or(""), 1);
        let event = letter.into_event(&topic);
        let ticket = self.tracker.event_sent(seq, now(), event.record_bytes())?;
        let tag = RecordTag {
            ticket,
            dead_letter: true,
        };
        self.push(Waiting { event, tag }, place);
        Ok(())
    }

    pub(super) fn on_notice(&mut self, notice: SinkNotice) -> Result<(), RelayError> {
        match notice {
            SinkNotice::Delivered { tag } => {
                if let Some(commit_ms) = self.commit_times.commit_ts_ms(tag.ticket.seq()) {
                    let waited_ms =
                        unix_ms_now().saturating_sub(u64::try_from(commit_ms).unwrap_or(0));
                    self.metrics
                        .delivery_latency
                        .observe(waited_ms as f64 / 1000.0);
                }
                // The ages follow in the status update this delivery brings (within
                // PROMPT_ACK_GAP), not per delivery report.
                self.tracker.delivered(tag.ticket)?;
            }
            SinkNotice::Refused { tag, failure } => self.refused(
                tag,
                failure.event.map(|event| *event),
                failure.reason,
                failure.too_large,
                Place::Back,
            )?,
            SinkNotice::Retry { reason } => return Err(SinkError::Retry(reason).into()),
            SinkNotice::Stop { reason } => return Err(SinkError::Stop(reason).into()),
            // The sink's own bookkeeping (a timer, a client error, a prepared topic).
            SinkNotice::Wake => self.sink.poll()?,
        }
        Ok(())
    }

    /// Take every notice already waiting.
    pub(super) fn take_ready_notices(&mut self) -> Result<(), RelayError> {
        while let Ok(notice) = self.notices.try_recv() {
            self.on_notice(notice)?;
        }
        Ok(())
    }
}
