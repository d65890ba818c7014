//! The commit-to-delivery latency histogram: Prometheus' fixed buckets, counted with
//! relaxed atomics on the hot path and summed into cumulative buckets when rendered.
//! Apart from the metrics registry because it is a data structure of its own, with
//! its own arithmetic (clamping, bucketing, a sum in whole microseconds) and test; it
//! names nothing else of the crate.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds (seconds) of the commit-to-delivery histogram's buckets: from a few
/// milliseconds (a relay keeping up) to minutes (a broker outage).
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// A Prometheus histogram with fixed buckets ([`LATENCY_BUCKETS`]).
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations at or below each bound (not cumulative; summed when rendered).
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    /// Sum of observations, in microseconds.
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, seconds: f64) {
        let seconds = if seconds.is_finite() {
            seconds.max(0.0)
        } else {
            0.0
        };
        if let Some(i) = LATENCY_BUCKETS.iter().position(|bound| seconds <= *bound) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        // Whole microseconds: precise enough for a sum of latencies.
        let micros = (seconds * 1e6).min(u64::MAX as f64) as u64;
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    pub(super) fn render(&self, name: &str, help: &str, out: &mut String) {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
        let mut cumulative = 0;
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            out.push_str(&format!("{name}_bucket{{le=\"{bound}\"}} {cumulative}\n"));
        }
        let count = self.count.load(Ordering::Relaxed);
        out.push_str(&format!("{name}_bucket{{le=\"+Inf\"}} {count}\n"));
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        out.push_str(&format!("{name}_sum {sum}\n{name}_count {count}\n"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latency_histogram_is_cumulative() {
        let histogram = Histogram::default();
        for seconds in [0.001, 0.02, 0.02, 7.0, 1e9, -1.0, f64::NAN] {
            histogram.observe(seconds);
        }
        let mut text = String::new();
        histogram.render("h", "help", &mut text);
        for line in [
            "h_bucket{le=\"0.005\"} 3\n",
            "h_bucket{le=\"0.025\"} 5\n",
            "h_bucket{le=\"5\"} 5\n",
            "h_bucket{le=\"10\"} 6\n",
            "h_bucket{le=\"300\"} 6\n",
            "h_bucket{le=\"+Inf\"} 7\n",
            "h_count 7\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
