//! An in-memory sink for in-process tests of `relay::run`: it implements the crate's
//! `Sink` trait as a producer would (records accepted into a bounded queue, reported
//! later from a task, in order), and a [`MemorySinkControl`] lets the test script it
//! and see what became durable.
//!
//! ```text
//! pipeline ──send──▶ queue (capacity; QueueFull beyond) ──delivery task──▶ notices
//!                    └─ refuse(rule): send() refuses at once       └─ fail(rule): Refused
//!                                                  paused: nothing is reported
//! ```

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use outbox_relay::event::OutboxEvent;
use outbox_relay::sink::{
    DeliveryFailure, NoticeSender, RecordTag, SendError, Sink, SinkError, SinkNotice, SinkOptions,
    SinkSpec,
};
use tokio::sync::Notify;

/// Decides whether a record is refused: `Some((reason, too_large))`.
pub type Rule = Arc<dyn Fn(&OutboxEvent) -> Option<(String, bool)> + Send + Sync>;

/// A record the sink has reported durable.
#[derive(Debug, Clone)]
pub struct DurableRecord {
    pub event: OutboxEvent,
    pub dead_letter: bool,
}

impl DurableRecord {
    pub fn id(&self) -> Option<&str> {
        self.header("id")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.event
            .headers
            .iter()
            .find(|h| h.name == name)
            .and_then(|h| h.value.as_deref())
    }
}

struct State {
    queue: VecDeque<(OutboxEvent, RecordTag)>,
    capacity: usize,
    paused: bool,
    /// Report at most this many more records (None: no limit); the rest wait.
    release_budget: Option<usize>,
    refuse: Option<Rule>,
    fail: Option<Rule>,
    durable: Vec<DurableRecord>,
    queue_full: u64,
    builds: u64,
}

struct Shared {
    state: Mutex<State>,
    wake: Notify,
}

/// The test's handle on the sinks built for a run.
#[derive(Clone)]
pub struct MemorySinkControl(Arc<Shared>);

impl MemorySinkControl {
    /// A sink accepting up to `capacity` records before `QueueFull`.
    pub fn new(capacity: usize) -> Self {
        MemorySinkControl(Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                capacity,
                paused: false,
                release_budget: None,
                refuse: None,
                fail: None,
                durable: Vec::new(),
                queue_full: 0,
                builds: 0,
            }),
            wake: Notify::new(),
        }))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The spec to put in `Settings::sink`.
    pub fn spec(&self) -> SinkSpec {
        let control = self.clone();
        SinkSpec::Custom(Arc::new(move |notices, options: SinkOptions| {
            let _ = options;
            let mut state = control.state();
            state.builds += 1;
            // A new attempt: what the previous sink held is gone with it (the pipeline
            // resends from the slot's position).
            state.queue.clear();
            drop(state);
            let shared = Arc::clone(&control.0);
            let task = tokio::spawn(deliver(Arc::clone(&shared), notices));
            Ok(Box::new(MemorySink { shared, task }) as Box<dyn Sink>)
        }))
    }

    /// `send` refuses records matching `rule`, at once (as librdkafka refuses an
    /// oversize record).
    pub fn refuse(
        &self,
        rule: impl Fn(&OutboxEvent) -> Option<(String, bool)> + Send + Sync + 'static,
    ) {
        self.state().refuse = Some(Arc::new(rule));
    }

    /// Records matching `rule` are accepted, then reported failed (as a broker refusing
    /// a record).
    pub fn fail(
        &self,
        rule: impl Fn(&OutboxEvent) -> Option<(String, bool)> + Send + Sync + 'static,
    ) {
        self.state().fail = Some(Arc::new(rule));
    }

    /// Stop or resume reporting (records stay queued meanwhile).
    pub fn set_paused(&self, paused: bool) {
        self.state().paused = paused;
        self.0.wake.notify_one();
    }

    /// While paused, report the next `n` queued records.
    pub fn release(&self, n: usize) {
        let mut state = self.state();
        state.release_budget = Some(state.release_budget.unwrap_or(0) + n);
        drop(state);
        self.0.wake.notify_one();
    }

    /// Records accepted and not yet reported.
    pub fn queued(&self) -> usize {
        self.state().queue.len()
    }

    /// Everything reported durable, in report order.
    pub fn durable(&self) -> Vec<DurableRecord> {
        self.state().durable.clone()
    }

    /// Ids of the events (not dead letters) reported durable, in order.
    pub fn event_ids(&self) -> Vec<String> {
        self.durable()
            .iter()
            .filter(|r| !r.dead_letter)
            .filter_map(|r| r.id().map(str::to_owned))
            .collect()
    }

    /// How often `send` answered that the queue is full.
    pub fn queue_full_count(&self) -> u64 {
        self.state().queue_full
    }

    /// How many sinks the relay built (one per pipeline attempt).
    pub fn builds(&self) -> u64 {
        self.state().builds
    }
}

struct MemorySink {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MemorySink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sink for MemorySink {
    fn send(&mut self, event: OutboxEvent, tag: RecordTag) -> Result<(), SendError> {
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((reason, too_large)) = state.refuse.as_ref().and_then(|rule| rule(&event)) {
            return Err(SendError::Refused {
                reason,
                too_large,
                event: Box::new(event),
            });
        }
        if state.queue.len() >= state.capacity {
            state.queue_full += 1;
            return Err(SendError::QueueFull(Box::new(event)));
        }
        state.queue.push_back((event, tag));
        drop(state);
        self.shared.wake.notify_one();
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        self.shared.wake.notify_one();
        Ok(())
    }
}

/// Reports queued records in order, a few at a time (as a producer's batches), unless
/// paused.
async fn deliver(shared: Arc<Shared>, notices: NoticeSender) {
    const BATCH: usize = 16;
    loop {
        let reports: Vec<SinkNotice> = {
            let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            let mut allowed = if state.paused {
                state.release_budget.unwrap_or(0)
            } else {
                usize::MAX
            };
            allowed = allowed.min(BATCH);
            let mut reports = Vec::new();
            while allowed > 0 {
                let Some((event, tag)) = state.queue.pop_front() else {
                    break;
                };
                allowed -= 1;
                if state.paused {
                    if let Some(budget) = state.release_budget.as_mut() {
                        *budget -= 1;
                    }
                }
                match state.fail.as_ref().and_then(|rule| rule(&event)) {
                    Some((reason, too_large)) => reports.push(SinkNotice::Refused {
                        tag,
                        failure: DeliveryFailure {
                            reason,
                            too_large,
                            event: Some(Box::new(event)),
                        },
                    }),
                    None => {
                        state.durable.push(DurableRecord {
                            event,
                            dead_letter: tag.dead_letter,
                        });
                        reports.push(SinkNotice::Delivered { tag });
                    }
                }
            }
            reports
        };
        if reports.is_empty() {
            shared.wake.notified().await;
            continue;
        }
        for report in reports {
            let _ = notices.send(report);
        }
        tokio::task::yield_now().await;
    }
}
