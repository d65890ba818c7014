//! The stream's steps: a replication frame decoded and assembled into transactions
//! ([`crate::relay::txn`]), each step applied (a transaction's begin and commit counted
//! in the ack tracker and the commit times, an event dispatched or dead-lettered, a
//! keepalive's position taken), and the skip of what a checkpoint (exactly-once) or the
//! state table's record covers, with the range it skipped logged once.

use crate::metrics::Metrics;
use crate::pg::conn::{CopyEvent, DbError, PgError};
use crate::pg::diagnose;
use crate::pg::pgoutput::{self, StreamState};
use crate::pg::replication::ReplicationFrame;
use crate::relay::record::Resume;
use crate::relay::source::ReplicationStream;
use crate::relay::txn::Step;
use crate::relay::{RelayError, Transient};
use crate::sink::checkpoint::{skip_for, Skip};

use super::Pipeline;

impl<S: ReplicationStream> Pipeline<S> {
    pub(super) async fn on_copy_event(&mut self, event: CopyEvent) -> Result<(), RelayError> {
        match event {
            CopyEvent::Frame(ReplicationFrame::XLogData(xlog)) => {
                let message = pgoutput::decode(&xlog.data, StreamState::Outside)?;
                let step = self.assembler.apply(message, xlog.wal_start)?;
                self.on_step(step)?;
            }
            CopyEvent::Frame(ReplicationFrame::Keepalive(keepalive)) => {
                self.tracker.keepalive(keepalive.wal_end);
                if keepalive.reply_requested {
                    self.send_status(false).await?;
                }
            }
            CopyEvent::Notice(notice) => self.on_server_notice(notice)?,
            CopyEvent::Done => return Err(Transient::StreamEnded.into()),
        }
        Ok(())
    }

    /// A notice in the middle of the stream is logged; one saying that PostgreSQL skips
    /// changes because the publication is missing (PostgreSQL 18) stops the relay
    /// before anything after it is acknowledged, as the ERROR of earlier versions does.
    fn on_server_notice(&mut self, notice: DbError) -> Result<(), RelayError> {
        if diagnose::skips_publication(&notice, &self.publication) {
            return Err(RelayError::Pg(PgError::Db(notice)));
        }
        tracing::warn!(notice = %notice, "PostgreSQL sent a notice on the replication stream");
        Ok(())
    }

    pub(super) fn on_step(&mut self, step: Step) -> Result<(), RelayError> {
        match step {
            Step::Begin {
                seq,
                commit_ts_ms,
                final_lsn,
            } => {
                self.tracker.begin(seq)?;
                self.commit_times.begin(seq, commit_ts_ms);
                let skip = skip_for(self.committed.as_ref(), final_lsn);
                self.count_resume(&skip);
                self.skip_left = skip.events();
                let skipped = match skip {
                    Skip::First(n) => {
                        tracing::info!(
                            commit_lsn = %final_lsn,
                            committed_events = n,
                            "{}",
                            crate::relay::log::RESUMING_SPLIT
                        );
                        n
                    }
                    Skip::All | Skip::Nothing => 0,
                };
                self.sink.transaction_begin(final_lsn, skipped);
            }
            Step::Event { .. } if self.skip_committed() => {
                // Skipped on the strength of the record or of this process's memory
                // (crate::relay::record): once acknowledged, its position is recorded
                // like any delivered transaction's, so that a process started after a
                // later fault does not send it again. (What the record itself covers
                // is not written twice: the recorder starts from it.)
                if self.resume.is_some() {
                    self.txn_had_events = true;
                }
            }
            Step::Event { seq, event } => {
                self.txn_had_events = true;
                match event {
                    Ok(event) => self.dispatch(event, seq)?,
                    Err(row_error) => self.dead_letter_row(row_error, seq)?,
                }
                if !self.tracker.has_room(self.limits) || !self.waiting.is_empty() {
                    // About to stop reading: make sure what is buffered can be delivered.
                    self.sink.flush()?;
                }
            }
            Step::Commit { seq, end_lsn } => {
                self.tracker.commit(seq, end_lsn)?;
                self.commit_times.commit(seq, end_lsn);
                if self.txn_had_events {
                    self.recorder.event_commit(end_lsn);
                    self.txn_had_events = false;
                }
                self.progress.transactions += 1;
                Metrics::add(&self.metrics.transactions, 1);
                self.skip_left = 0;
                self.sink.transaction_end(end_lsn)?;
            }
            Step::Message { .. }
            | Step::Standalone { .. }
            | Step::Refused { .. }
            | Step::Ignored => self.on_message_step(step)?,
            Step::Nothing => {}
        }
        Ok(())
    }

    /// Whether the next event of the open transaction is one Kafka committed before
    /// this session (exactly-once checkpoint): then it is dropped here, and counted.
    pub(super) fn skip_committed(&mut self) -> bool {
        if self.skip_left == 0 {
            return false;
        }
        if self.skip_left != u64::MAX {
            self.skip_left -= 1;
        }
        match &mut self.resume {
            Some(resume) => {
                resume.events += 1;
                Metrics::add(&self.metrics.skipped_recorded, 1);
            }
            None => Metrics::add(&self.metrics.skipped_committed, 1),
        }
        true
    }

    /// While resuming from the state table's record: count a skipped transaction, or
    /// log the range skipped at the first transaction past it.
    fn count_resume(&mut self, skip: &Skip) {
        let Some(resume) = &mut self.resume else {
            return;
        };
        if matches!(skip, Skip::All) {
            resume.transactions += 1;
            return;
        }
        log_resume(resume, false);
        self.resume = None;
    }

    /// The session ends (cut, stopped) before any transaction past the recorded range:
    /// log what it skipped so far, which the first transaction past it would have.
    pub(in crate::relay) fn log_unfinished_resume(&mut self) {
        if let Some(resume) = self.resume.take() {
            if resume.transactions > 0 || resume.events > 0 {
                log_resume(&resume, true);
            }
        }
    }
}

/// The range a session skipped because the state table's record showed it delivered;
/// `ended_inside`: the session ended before passing the recorded position.
fn log_resume(resume: &Resume, ended_inside: bool) {
    tracing::info!(
        from = %resume.from,
        through = %resume.through,
        transactions = resume.transactions,
        events = resume.events,
        ended_inside_the_range = ended_inside,
        "skipped the transactions between the slot's position and what the relay had delivered (its record, or what this process remembers): delivered before the slot rewound"
    );
}
