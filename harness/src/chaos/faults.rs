//! The fault plan (seeded times and kinds) and the rig it is injected into: PostgreSQL,
//! the broker, the proxies in front of both, and the supervised relay.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use super::super::kafka::KafkaBroker;
use super::super::proxy::FaultProxy;
use super::super::PgCluster;
use super::rng::Rng;
use super::supervisor::Supervisor;

/// How long a link cut waits for the relay to have a connection to cut.
const LINK_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    RelayKill9,
    PgRestartFast,
    PgRestartImmediate,
    BrokerPause,
    BrokerKill9,
    PgLinkCut,
    BrokerLinkCut,
}

const ALL_FAULTS: [Fault; 7] = [
    Fault::RelayKill9,
    Fault::PgRestartFast,
    Fault::PgRestartImmediate,
    Fault::BrokerPause,
    Fault::BrokerKill9,
    Fault::PgLinkCut,
    Fault::BrokerLinkCut,
];

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::RelayKill9 => "relay kill -9",
            Fault::PgRestartFast => "postgres restart (fast)",
            Fault::PgRestartImmediate => "postgres restart (immediate)",
            Fault::BrokerPause => "broker paused",
            Fault::BrokerKill9 => "broker kill -9",
            Fault::PgLinkCut => "postgres link cut",
            Fault::BrokerLinkCut => "broker link cut",
        }
    }
}

/// `count` faults at sorted random offsets within the window; kinds come in shuffled
/// rounds of all seven, so every kind occurs once `count >= 7`.
pub fn schedule(rng: &mut Rng, count: usize, window: Duration) -> Vec<(Duration, Fault)> {
    let window_ms = u64::try_from(window.as_millis()).expect("window fits in u64 ms");
    let mut times: Vec<Duration> = (0..count)
        .map(|_| Duration::from_millis(rng.between(window_ms * 3 / 100, window_ms * 97 / 100)))
        .collect();
    times.sort();
    let mut kinds = Vec::with_capacity(count);
    while kinds.len() < count {
        let mut round = ALL_FAULTS;
        for i in (1..round.len()).rev() {
            let j = usize::try_from(rng.below(i as u64 + 1)).expect("small index");
            round.swap(i, j);
        }
        kinds.extend(round);
    }
    times.into_iter().zip(kinds).collect()
}

/// The components under fault.
pub struct Rig {
    pub pg: PgCluster,
    pub pg_proxy: FaultProxy,
    pub broker: KafkaBroker,
    pub broker_proxy: FaultProxy,
    pub relay: Supervisor,
    /// Harness-side trouble worth reporting (e.g. a fast shutdown that hung).
    pub incidents: Vec<String>,
    /// For each immediate (crash) restart: the slot's position after it (rewound to the
    /// last checkpoint) and the WAL position before it. Events committed in between may
    /// come again: counted apart from the relay's own duplicates.
    pub crash_windows: Vec<(u64, u64)>,
}

impl Rig {
    /// Injects `fault`; returns a short description of what was done.
    pub fn inject(&mut self, fault: Fault, rng: &mut Rng) -> String {
        match fault {
            Fault::RelayKill9 => {
                let down = rng.millis(0, 1_000);
                self.relay.kill9_and_restart(down);
                format!("down {down:?}")
            }
            Fault::PgRestartFast => {
                let down = rng.millis(200, 3_000);
                let stopping = Instant::now();
                let pg = &mut self.pg;
                let stopped = catch_unwind(AssertUnwindSafe(|| pg.stop_fast()));
                let stop_took = stopping.elapsed();
                let mut note = String::new();
                if stopped.is_err() {
                    let incident = format!(
                        "postgres fast shutdown (SIGINT) did not finish in {stop_took:?} \
                         (walsender waiting for the relay to confirm?); stopped it \
                         immediately instead"
                    );
                    eprintln!("chaos: {incident}");
                    self.incidents.push(incident);
                    self.pg.stop_immediate();
                    note = " (fast stop hung: immediate)".to_owned();
                }
                self.relay.watch_for(down);
                self.pg.start_again();
                format!("stop took {stop_took:.1?}{note}, down {down:?}")
            }
            Fault::PgRestartImmediate => {
                let down = rng.millis(200, 3_000);
                let wal_before = self.pg.current_wal_lsn();
                self.pg.stop_immediate();
                self.relay.watch_for(down);
                self.pg.start_again();
                let slot_after = self
                    .pg
                    .slot_confirmed_flush_lsn(super::super::outbox::SLOT)
                    .unwrap_or(0);
                self.crash_windows.push((slot_after, wal_before));
                format!(
                    "down {down:?}, slot rewound to {}",
                    super::super::pg::u64_to_lsn(slot_after)
                )
            }
            Fault::BrokerPause => {
                let paused = rng.millis(1_000, 6_000);
                self.broker.pause();
                self.relay.watch_for(paused);
                self.broker.resume();
                format!("for {paused:?}")
            }
            Fault::BrokerKill9 => {
                // The broker restarts on its log directory: what it acknowledged stays.
                let down = rng.millis(500, 5_000);
                self.broker.kill9();
                self.relay.watch_for(down);
                self.broker.restart();
                format!("down {down:?}")
            }
            Fault::PgLinkCut => cut_when_connected(&mut self.relay, &self.pg_proxy),
            Fault::BrokerLinkCut => cut_when_connected(&mut self.relay, &self.broker_proxy),
        }
    }
}

/// Cuts `proxy`'s connections once the relay has at least one (it may be between
/// attempts after an earlier fault), waiting at most [`LINK_WAIT`].
fn cut_when_connected(relay: &mut Supervisor, proxy: &FaultProxy) -> String {
    let waiting = Instant::now();
    while proxy.connection_count() == 0 && waiting.elapsed() < LINK_WAIT {
        relay.watch_for(Duration::from_millis(100));
    }
    let open = proxy.connection_count();
    proxy.cut();
    format!(
        "{open} connection(s), after waiting {:.1?}",
        waiting.elapsed()
    )
}
