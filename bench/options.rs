//! The command line of the side-by-side benchmark; `plan.rs` resolves its defaults.

use std::path::PathBuf;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "outbox-relay side by side: the ceiling, the relay, Debezium, the polling relay")]
pub struct Options {
    /// Every contender on a few thousand events, no idle wait: proves the benchmark
    /// works in well under a minute; its figures mean nothing.
    #[arg(long)]
    pub smoke: bool,
    /// Events of the preloaded WAL [default: 500000; smoke 2000].
    #[arg(long)]
    pub events: Option<u64>,
    /// Transaction sizes of the load, each carrying an equal share of the events
    /// [default: 1,10,100,1000; smoke 1,10,100].
    #[arg(long, value_delimiter = ',')]
    pub txn_sizes: Option<Vec<u32>>,
    /// Rows of the one transaction of (g) [default: 1000000; smoke 2000]; 0 skips it.
    #[arg(long)]
    pub large_txn: Option<u64>,
    /// Characters of filler in each payload (164 bytes of JSON in all at 100).
    #[arg(long, default_value_t = 100)]
    pub payload_pad: u32,
    /// Rows of ~4 KB JSON in the backlog of (i), the broker outage [default: 100000;
    /// smoke 500]; 0 skips that run.
    #[arg(long)]
    pub outage_events: Option<u64>,
    /// Rows of ~256 KB JSON in the second backlog of (i) [default: 2000; smoke 20]; 0
    /// skips that run.
    #[arg(long)]
    pub outage_large_events: Option<u64>,
    /// Seconds the broker is frozen (SIGSTOP) in (i) [default: 20; smoke 1].
    #[arg(long)]
    pub outage_s: Option<u64>,
    /// Another relay binary (the code before a change, built elsewhere) to run on (b)
    /// and (i) too, each on slots of its own: before/after in one run.
    #[arg(long)]
    pub baseline_bin: Option<PathBuf>,
    /// Worker counts of the polling relay, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub polling_workers: Vec<usize>,
    /// Writer rates of the latency runs, events/s [default: 1000,5000,20000; smoke 200].
    #[arg(long, value_delimiter = ',')]
    pub latency_rates: Option<Vec<u32>>,
    /// Rates of the latency runs whose writer commits one event per transaction,
    /// transactions/s [default: 5000; smoke 200; 0 = none].
    #[arg(long, value_delimiter = ',')]
    pub latency_single_rates: Option<Vec<u32>>,
    /// Seconds each latency run writes [default: 30; smoke 2].
    #[arg(long)]
    pub latency_seconds: Option<u64>,
    /// The latency contenders (producer, relay, debezium, polling-100ms, polling-1s)
    /// [default: all].
    #[arg(long, value_delimiter = ',')]
    pub latency_contenders: Option<Vec<String>>,
    /// Outbox tables of (j), read by one relay of them all, then by a relay each.
    #[arg(long, default_value_t = 20)]
    pub many_tables: u32,
    /// Run only these contenders (ceiling, kafka, eos, stdout, debezium, polling, large,
    /// messages, outage, many, standby, latency).
    #[arg(long, value_delimiter = ',')]
    pub only: Option<Vec<String>>,
    /// Where results.json and chart.png go [default: target/side-by-side].
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// Write the results as JSON to this file too.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Only draw chart.png (into --out-dir) from a results.json of an earlier run.
    #[arg(long)]
    pub redraw: Option<PathBuf>,
    /// Before each contender, wait until the machine's CPUs are at most this % busy ...
    #[arg(long, default_value_t = 20.0)]
    pub idle_max_busy: f64,
    /// ... for at most this long [default: 1800; smoke 0 = do not wait].
    #[arg(long)]
    pub idle_wait_s: Option<u64>,
    /// Give up on a contender after this long.
    #[arg(long, default_value_t = 900)]
    pub timeout_s: u64,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    pub bench: bool,
}
