//! Commit times of the transactions not yet acknowledged: pure. They give the
//! replication lag in seconds (the age, by its commit time on PostgreSQL, of the oldest
//! transaction not acknowledged) and each event's commit-to-delivery latency.
//!
//! Bounded like the ack tracker: one entry per transaction between its Begin and the
//! status update that acknowledges it.

use std::collections::VecDeque;

use crate::event::TxnSeq;
use crate::Lsn;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    seq: TxnSeq,
    commit_ts_ms: i64,
    /// Set at Commit.
    end_lsn: Option<Lsn>,
}

/// Transactions in sequence order, oldest first.
#[derive(Debug, Default)]
pub struct CommitTimes {
    open: VecDeque<Entry>,
}

impl CommitTimes {
    pub fn begin(&mut self, seq: TxnSeq, commit_ts_ms: i64) {
        self.open.push_back(Entry {
            seq,
            commit_ts_ms,
            end_lsn: None,
        });
    }

    pub fn commit(&mut self, seq: TxnSeq, end_lsn: Lsn) {
        if let Some(entry) = self.open.iter_mut().rev().find(|e| e.seq == seq) {
            entry.end_lsn = Some(end_lsn);
        }
    }

    /// The commit time of transaction `seq`, while it is not acknowledged.
    /// Transactions begin in sequence, one after the other, so the entry of `seq` is at
    /// its distance from the front (asked once per delivered event).
    pub fn commit_ts_ms(&self, seq: TxnSeq) -> Option<i64> {
        let first = self.open.front()?.seq;
        let at = usize::try_from(seq.checked_sub(first)?).ok()?;
        self.open
            .get(at)
            .filter(|e| e.seq == seq)
            .map(|e| e.commit_ts_ms)
    }

    /// PostgreSQL was told everything up to `flush` is done: forget those transactions.
    pub fn acknowledged(&mut self, flush: Lsn) {
        while self
            .open
            .front()
            .is_some_and(|e| e.end_lsn.is_some_and(|end| end <= flush))
        {
            self.open.pop_front();
        }
    }

    /// How long ago (ms) the oldest transaction not acknowledged committed; 0 when all
    /// are (or the clocks disagree).
    pub fn lag_ms(&self, now_unix_ms: i64) -> u64 {
        self.open.front().map_or(0, |e| {
            u64::try_from(now_unix_ms.saturating_sub(e.commit_ts_ms)).unwrap_or(0)
        })
    }

    /// The commit time (unix ms) of the oldest transaction not acknowledged.
    pub fn oldest_commit_ms(&self) -> Option<i64> {
        self.open.front().map(|e| e.commit_ts_ms)
    }

    /// A new attempt starts over from the slot's position.
    pub fn clear(&mut self) {
        self.open.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lag_is_the_age_of_the_oldest_unacknowledged_commit() {
        let mut times = CommitTimes::default();
        assert_eq!(times.lag_ms(10_000), 0, "nothing open");
        times.begin(0, 1_000);
        times.commit(0, Lsn(100));
        times.begin(1, 4_000);
        times.commit(1, Lsn(200));
        times.begin(2, 6_000);
        assert_eq!(times.lag_ms(10_000), 9_000);
        assert_eq!(times.commit_ts_ms(1), Some(4_000));
        assert_eq!(times.commit_ts_ms(2), Some(6_000));
        assert_eq!(times.commit_ts_ms(3), None, "not begun");
        times.acknowledged(Lsn(150));
        assert_eq!(times.lag_ms(10_000), 6_000);
        assert_eq!(times.commit_ts_ms(0), None);
        times.acknowledged(Lsn(1_000));
        assert_eq!(
            times.lag_ms(10_000),
            4_000,
            "an uncommitted transaction is never acknowledged"
        );
        times.commit(2, Lsn(300));
        times.acknowledged(Lsn(300));
        assert_eq!(times.lag_ms(10_000), 0);
        times.begin(3, 20_000);
        assert_eq!(times.lag_ms(10_000), 0, "a server clock ahead counts as 0");
    }
}
