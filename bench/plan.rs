//! A run's plan: the command line resolved (the full run's and the smoke's defaults) and
//! checked before anything starts, so a wrong option fails in a second, not after
//! PostgreSQL and Kafka were started and the WAL loaded.

use std::path::PathBuf;
use std::time::Duration;

use crate::latency_runs::LATENCY_CONTENDERS;
use crate::output::out_dir;
use crate::{many, outage, relay_bin, standby, Options, CONTENDERS};

/// Most tables (j) may have: a relay and a WAL sender each, on a 2-core machine.
const MAX_MANY_TABLES: u32 = 200;

/// What a run does, with every default applied.
pub struct Plan {
    pub smoke: bool,
    /// Events of the preloaded WAL.
    pub events: u64,
    pub txn_sizes: Vec<u32>,
    /// Rows of the one large transaction of (g); 0 skips it.
    pub large_txn: u64,
    pub outage: outage::OutagePlan,
    pub many: many::ManyPlan,
    pub standby: standby::StandbyPlan,
    /// How long each contender may wait for a quiet machine.
    pub idle_wait: Duration,
    pub latency_rates: Vec<u32>,
    pub latency_single_rates: Vec<u32>,
    pub latency_seconds: u64,
    pub latency_contenders: Vec<String>,
    pub relay_bin: PathBuf,
    pub out_dir: PathBuf,
    only: Option<Vec<String>>,
}

impl Plan {
    pub fn new(options: &Options) -> Result<Plan, String> {
        let smoke = options.smoke;
        let events = options
            .events
            .unwrap_or(if smoke { 2_000 } else { 500_000 });
        let txn_sizes = options.txn_sizes.clone().unwrap_or_else(|| {
            if smoke {
                vec![1, 10, 100]
            } else {
                vec![1, 10, 100, 1000]
            }
        });
        if events == 0 || txn_sizes.is_empty() || txn_sizes.contains(&0) {
            return Err("--events and every --txn-sizes must be positive".into());
        }
        let large_txn = options
            .large_txn
            .unwrap_or(if smoke { 2_000 } else { 1_000_000 });
        let outage = outage::OutagePlan {
            events: options
                .outage_events
                .unwrap_or(if smoke { 500 } else { 100_000 }),
            large_events: options
                .outage_large_events
                .unwrap_or(if smoke { 20 } else { 2_000 }),
            length: Duration::from_secs(options.outage_s.unwrap_or(if smoke { 1 } else { 20 })),
            baseline: options.baseline_bin.clone(),
        };
        let idle_wait =
            Duration::from_secs(options.idle_wait_s.unwrap_or(if smoke { 0 } else { 1800 }));
        // (j) spreads the standard load over its tables.
        if !(1..=MAX_MANY_TABLES).contains(&options.many_tables) {
            return Err(format!("--many-tables must be 1 to {MAX_MANY_TABLES}"));
        }
        let many = many::ManyPlan {
            tables: options.many_tables,
            events,
            txn_sizes: txn_sizes.clone(),
            pad: options.payload_pad,
            idle_max_busy: options.idle_max_busy,
            idle_wait,
        };
        let standby = standby::StandbyPlan {
            events,
            txn_sizes: txn_sizes.clone(),
            pad: options.payload_pad,
            idle_max_busy: options.idle_max_busy,
            idle_wait,
        };
        if let Some(only) = &options.only {
            if let Some(unknown) = only.iter().find(|o| !CONTENDERS.contains(&o.as_str())) {
                return Err(format!("--only {unknown}: choose from {CONTENDERS:?}"));
            }
        }
        let relay_bin = relay_bin();
        if !relay_bin.is_file() {
            return Err(format!(
                "no relay binary at {} (cargo builds it for `cargo bench --bench side_by_side`; or set OUTBOX_RELAY_BIN)",
                relay_bin.display()
            ));
        }
        if let Some(baseline) = &options.baseline_bin {
            if !baseline.is_file() {
                return Err(format!(
                    "--baseline-bin {}: no such file",
                    baseline.display()
                ));
            }
        }
        let latency_rates = options.latency_rates.clone().unwrap_or_else(|| {
            if smoke {
                vec![200]
            } else {
                vec![1_000, 5_000, 20_000]
            }
        });
        let latency_single_rates: Vec<u32> = options
            .latency_single_rates
            .clone()
            .unwrap_or_else(|| if smoke { vec![200] } else { vec![5_000] })
            .into_iter()
            .filter(|&rate| rate > 0)
            .collect();
        let latency_seconds = options
            .latency_seconds
            .unwrap_or(if smoke { 2 } else { 30 });
        let latency_contenders: Vec<String> = options
            .latency_contenders
            .clone()
            .unwrap_or_else(|| LATENCY_CONTENDERS.iter().map(|&c| c.to_owned()).collect());
        if let Some(unknown) = latency_contenders
            .iter()
            .find(|c| !LATENCY_CONTENDERS.contains(&c.as_str()))
        {
            return Err(format!(
                "--latency-contenders {unknown}: choose from {LATENCY_CONTENDERS:?}"
            ));
        }
        if latency_rates.is_empty() || latency_rates.contains(&0) || latency_seconds == 0 {
            return Err("--latency-rates and --latency-seconds must be positive".into());
        }
        let plan = Plan {
            smoke,
            events,
            txn_sizes,
            large_txn,
            outage,
            many,
            standby,
            idle_wait,
            latency_rates,
            latency_single_rates,
            latency_seconds,
            latency_contenders,
            relay_bin,
            out_dir: out_dir(options)?,
            only: options.only.clone(),
        };
        let uses_debezium = plan.selected("debezium")
            || (plan.selected("latency")
                && plan.latency_contenders.iter().any(|c| c == "debezium"));
        if uses_debezium {
            // Fails early, naming ./deploy/dev-deps.sh, when the jars are missing.
            outbox_relay_harness::debezium::find_debezium_libs().ok_or(
                "Kafka Connect's and Debezium's jars are not installed: run ./deploy/dev-deps.sh \
                 (or leave Debezium out: --only without debezium, --latency-contenders without it)",
            )?;
        }
        Ok(plan)
    }

    /// Whether `--only` (or its absence) selects the contender `name`.
    pub fn selected(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .map_or(true, |only| only.iter().any(|o| o == name))
    }

    /// Slots (and WAL senders) beyond the harness's 10 that must exist at once: (j)'s,
    /// one per table and the one of all.
    pub fn extra_slots(&self) -> u32 {
        if self.selected("many") {
            self.many.tables + 1
        } else {
            0
        }
    }

    /// Whether any selected contender needs the broker.
    pub fn needs_kafka(&self) -> bool {
        [
            "kafka", "eos", "debezium", "polling", "latency", "messages", "outage", "many",
            "standby",
        ]
        .into_iter()
        .any(|name| self.selected(name))
            || (self.selected("large") && self.large_txn > 0)
    }
}
