//! The verifier: what the broker holds, checked against what the writers committed.
//! Every committed id present, no rolled-back id present, first occurrences in commit
//! order within each partition; duplicates counted, not failed.

use super::super::kafka::Record;
use super::writers::WriterLog;
use super::{event_id, parse_event_id, topic_of};

/// What the verifier found in Kafka.
#[derive(Debug, Default)]
pub struct Verdict {
    pub records: usize,
    pub duplicates: usize,
    /// The record timestamp of every second (or later) copy, in the order read: the
    /// broker's append time where the topic stamps it (a broker behind a fault proxy).
    pub duplicate_times_ms: Vec<i64>,
    pub lost: usize,
    pub lost_examples: Vec<String>,
    pub not_committed_seen: usize,
    pub not_committed_examples: Vec<String>,
    pub unknown_ids: usize,
    pub unknown_examples: Vec<String>,
    pub misrouted: usize,
    pub order_violations: usize,
    pub order_examples: Vec<String>,
}

impl Verdict {
    /// One line per kind of violation found, in a fixed order; empty when the run held
    /// its promise (duplicates are allowed: delivery is at least once).
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.lost > 0 {
            failures.push(format!(
                "{} committed events lost, e.g. {:?}",
                self.lost, self.lost_examples
            ));
        }
        if self.not_committed_seen > 0 {
            failures.push(format!(
                "{} records of rolled-back or uncommitted events, e.g. {:?}",
                self.not_committed_seen, self.not_committed_examples
            ));
        }
        if self.unknown_ids > 0 {
            failures.push(format!(
                "{} records with ids never written, e.g. {:?}",
                self.unknown_ids, self.unknown_examples
            ));
        }
        if self.misrouted > 0 {
            failures.push(format!(
                "{} records in another writer's topic",
                self.misrouted
            ));
        }
        if self.order_violations > 0 {
            failures.push(format!(
                "{} first occurrences out of commit order, e.g. {:?}",
                self.order_violations, self.order_examples
            ));
        }
        failures
    }
}

const COMMITTED: u8 = 1;
const NOT_COMMITTED: u8 = 2;
const EXAMPLES: usize = 5;

fn note(examples: &mut Vec<String>, example: impl FnOnce() -> String) {
    if examples.len() < EXAMPLES {
        examples.push(example());
    }
}

pub fn verify(records: &[Record], logs: &[WriterLog]) -> Verdict {
    // Per writer and seq: 0 = never written, COMMITTED or NOT_COMMITTED.
    let mut states: Vec<Vec<u8>> = logs
        .iter()
        .map(|log| vec![0u8; usize::try_from(log.next_seq).expect("fits")])
        .collect();
    for (log, states) in logs.iter().zip(&mut states) {
        for &(first, last) in &log.committed {
            states[first as usize..=last as usize].fill(COMMITTED);
        }
        for &(first, last) in &log.not_committed {
            states[first as usize..=last as usize].fill(NOT_COMMITTED);
        }
    }
    let mut seen: Vec<Vec<bool>> = states.iter().map(|s| vec![false; s.len()]).collect();
    let mut last_in_partition: std::collections::HashMap<(&str, i32), u64> =
        std::collections::HashMap::new();
    let mut verdict = Verdict {
        records: records.len(),
        ..Verdict::default()
    };
    for record in records {
        let id = record.header("id").unwrap_or_default();
        let parsed = parse_event_id(&id).filter(|&(writer, seq)| {
            states
                .get(writer as usize)
                .is_some_and(|s| (seq as usize) < s.len())
        });
        let Some((writer, seq)) = parsed else {
            verdict.unknown_ids += 1;
            note(&mut verdict.unknown_examples, || {
                format!(
                    "{id:?} in {}/{}@{}",
                    record.topic, record.partition, record.offset
                )
            });
            continue;
        };
        let (w, s) = (writer as usize, seq as usize);
        if record.topic != topic_of(writer) {
            verdict.misrouted += 1;
        }
        match states[w][s] {
            COMMITTED => {}
            NOT_COMMITTED => {
                verdict.not_committed_seen += 1;
                note(&mut verdict.not_committed_examples, || {
                    format!(
                        "{id} in {}/{}@{}",
                        record.topic, record.partition, record.offset
                    )
                });
                continue;
            }
            _ => {
                verdict.unknown_ids += 1;
                note(&mut verdict.unknown_examples, || {
                    format!("{id} (seq never written)")
                });
                continue;
            }
        }
        if seen[w][s] {
            verdict.duplicates += 1;
            verdict
                .duplicate_times_ms
                .push(record.timestamp_ms.unwrap_or(0));
            continue;
        }
        seen[w][s] = true;
        let last = last_in_partition
            .entry((record.topic.as_str(), record.partition))
            .or_insert(0);
        if seq < *last {
            verdict.order_violations += 1;
            note(&mut verdict.order_examples, || {
                format!(
                    "{}/{}@{}: first occurrence of seq {seq} after seq {}",
                    record.topic, record.partition, record.offset, *last
                )
            });
        }
        *last = (*last).max(seq);
    }
    for (w, states) in states.iter().enumerate() {
        for (s, state) in states.iter().enumerate() {
            if *state == COMMITTED && !seen[w][s] {
                verdict.lost += 1;
                note(&mut verdict.lost_examples, || {
                    event_id(u32::try_from(w).expect("fits"), s as u64)
                });
            }
        }
    }
    verdict
}

/// Which fault each second copy followed: `faults_at_ms` are the instants the faults
/// began (ascending, the same clock as `copies_at_ms`). Returns the copies that came
/// before the first fault, and per fault the copies between it and the next one.
pub fn attribute_copies(copies_at_ms: &[i64], faults_at_ms: &[i64]) -> (usize, Vec<usize>) {
    let mut per_fault = vec![0; faults_at_ms.len()];
    let mut before_any = 0;
    for &at in copies_at_ms {
        // The number of faults begun at or before `at`.
        match faults_at_ms.partition_point(|&fault| fault <= at) {
            0 => before_any += 1,
            begun => per_fault[begun - 1] += 1,
        }
    }
    (before_any, per_fault)
}

#[cfg(test)]
mod tests {
    use super::attribute_copies;

    #[test]
    fn each_copy_goes_to_the_last_fault_begun_before_it() {
        let (before, per_fault) = attribute_copies(&[5, 10, 11, 29, 30, 31, 99], &[10, 30]);
        assert_eq!(before, 1);
        assert_eq!(per_fault, vec![3, 3]);
        assert_eq!(attribute_copies(&[], &[1]), (0, vec![0]));
    }
}
