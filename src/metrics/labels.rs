//! Per-topic counters with a bounded number of labels.
//!
//! Topics come from row values (the route-by column), so every bad or unexpected value
//! would otherwise become a label, and a Prometheus series, for ever. The first
//! [`MAX_TOPIC_LABELS`] distinct topics counted get their own `topic` label; every
//! topic after them is counted under [`OTHER_TOPICS`]. A topic that has its label keeps
//! it. The relay's own topics (the dead-letter topic, the usual routes) are among the
//! first seen in practice.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Distinct topics that get a label of their own, per counter.
pub const MAX_TOPIC_LABELS: usize = 100;
/// The label under which the topics past [`MAX_TOPIC_LABELS`] are counted.
pub const OTHER_TOPICS: &str = "_other";

/// Counters by topic name, at most `limit` names plus [`OTHER_TOPICS`].
#[derive(Debug)]
pub struct TopicCounts {
    counts: Mutex<BTreeMap<String, u64>>,
    limit: usize,
}

impl Default for TopicCounts {
    fn default() -> Self {
        TopicCounts::with_limit(MAX_TOPIC_LABELS)
    }
}

impl TopicCounts {
    /// Counters giving at most `limit` topics a label of their own.
    pub fn with_limit(limit: usize) -> Self {
        TopicCounts {
            counts: Mutex::new(BTreeMap::new()),
            limit,
        }
    }

    pub fn add(&self, topic: &str, n: u64) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(topic) {
            *count = count.saturating_add(n);
            return;
        }
        let labelled = counts.len() - usize::from(counts.contains_key(OTHER_TOPICS));
        let label = if labelled < self.limit {
            topic
        } else {
            OTHER_TOPICS
        };
        let count = counts.entry(label.to_owned()).or_insert(0);
        *count = count.saturating_add(n);
    }

    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_past_the_limit_are_counted_under_other() {
        let counts = TopicCounts::with_limit(2);
        counts.add("orders", 1);
        counts.add("users", 2);
        for bad in ["typo-1", "typo-2", "typo-3"] {
            counts.add(bad, 1);
        }
        counts.add("orders", 4);
        let snapshot = counts.snapshot();
        assert_eq!(
            snapshot,
            BTreeMap::from([
                ("orders".to_owned(), 5),
                ("users".to_owned(), 2),
                (OTHER_TOPICS.to_owned(), 3),
            ])
        );
        // However many values arrive, the labels stay bounded.
        for i in 0..1_000 {
            counts.add(&format!("bad-{i}"), 1);
        }
        assert_eq!(counts.snapshot().len(), 3);
        assert_eq!(counts.snapshot()[OTHER_TOPICS], 1_003);
    }

    #[test]
    fn the_default_limit_is_the_documented_one() {
        let counts = TopicCounts::default();
        for i in 0..MAX_TOPIC_LABELS + 10 {
            counts.add(&format!("t{i}"), 1);
        }
        let snapshot = counts.snapshot();
        assert_eq!(snapshot.len(), MAX_TOPIC_LABELS + 1);
        assert_eq!(snapshot[OTHER_TOPICS], 10);
    }
}
