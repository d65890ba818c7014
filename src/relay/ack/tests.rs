//! The ack tracker's unit tests: the ordering and bounds invariants, and a property
//! test over random delivery orders.

use super::*;

fn t0() -> Instant {
    Instant::now()
}

#[test]
fn nothing_past_the_vouched_position_is_reported() {
    let mut t = AckTracker::new(Lsn(100), 0);
    t.cap_at(Lsn(100));
    t.begin(0).unwrap();
    let ticket = t.event_sent(0, t0(), 1).unwrap();
    t.commit(0, Lsn(200)).unwrap();
    t.delivered(ticket).unwrap();
    t.keepalive(Lsn(300));
    assert!(t.wants_vouching());
    assert_eq!(t.flush_lsn(), Lsn(100), "delivered, but not vouched for");
    t.vouch(Lsn(250));
    assert_eq!(
        t.flush_lsn(),
        Lsn(250),
        "idle position up to the vouched one"
    );
    assert!(t.wants_vouching());
    t.vouch(Lsn(400));
    assert_eq!(t.flush_lsn(), Lsn(300));
    assert!(!t.wants_vouching());
    t.vouch(Lsn(50));
    assert_eq!(t.flush_lsn(), Lsn(300), "a lower vouch changes nothing");
}

#[test]
fn acks_end_lsn_only_after_every_event_is_delivered() {
    let now = t0();
    let mut t = AckTracker::new(Lsn(100), 0);
    t.begin(0).unwrap();
    let a = t.event_sent(0, now, 1).unwrap();
    let b = t.event_sent(0, now, 1).unwrap();
    t.commit(0, Lsn(200)).unwrap();
    assert_eq!(t.flush_lsn(), Lsn(100), "nothing delivered yet");
    t.delivered(a).unwrap();
    assert_eq!(t.flush_lsn(), Lsn(100), "one of two delivered");
    t.delivered(b).unwrap();
    assert_eq!(t.flush_lsn(), Lsn(200), "the commit's end_lsn");
    assert_eq!(t.in_flight(), 0);
}

#[test]
fn a_later_delivered_transaction_waits_for_an_earlier_one() {
    let now = t0();
    let mut t = AckTracker::new(Lsn(0), 5);
    let mut tickets = Vec::new();
    for (seq, end) in [(5, 10), (6, 20)] {
        t.begin(seq).unwrap();
        tickets.push(t.event_sent(seq, now, 1).unwrap());
        t.commit(seq, Lsn(end)).unwrap();
    }
    t.delivered(tickets[1]).unwrap();
    assert_eq!(t.flush_lsn(), Lsn(0));
    t.delivered(tickets[0]).unwrap();
    assert_eq!(t.flush_lsn(), Lsn(20));
}

#[test]
fn an_uncommitted_transaction_is_never_acknowledged() {
    let mut t = AckTracker::new(Lsn(0), 0);
    t.begin(0).unwrap();
    let ticket = t.event_sent(0, t0(), 1).unwrap();
    t.delivered(ticket).unwrap();
    t.keepalive(Lsn(500));
    assert_eq!(
        t.flush_lsn(),
        Lsn(0),
        "open transaction blocks keepalive progress"
    );
    t.commit(0, Lsn(300)).unwrap();
    assert_eq!(t.flush_lsn(), Lsn(500), "then idle: the keepalive position");
}

#[test]
fn idle_reports_keepalive_position_and_empty_transactions_pass() {
    let mut t = AckTracker::new(Lsn(50), 0);
    t.keepalive(Lsn(80));
    assert_eq!(t.flush_lsn(), Lsn(80));
    t.begin(0).unwrap();
    t.commit(0, Lsn(90)).unwrap();
    assert_eq!(
        t.flush_lsn(),
        Lsn(90),
        "an empty transaction (PG <= 14) is acked at once"
    );
    assert_eq!(t.received(), Lsn(90));
}

#[test]
fn flush_lsn_is_monotonic_even_if_a_keepalive_goes_back() {
    let mut t = AckTracker::new(Lsn(0), 0);
    t.keepalive(Lsn(1000));
    assert_eq!(t.flush_lsn(), Lsn(1000));
    t.keepalive(Lsn(10));
    t.begin(0).unwrap();
    t.commit(0, Lsn(500)).unwrap();
    assert_eq!(t.flush_lsn(), Lsn(1000));
}

#[test]
fn protocol_misuse_is_an_error() {
    let now = t0();
    let mut t = AckTracker::new(Lsn(0), 0);
    assert_eq!(
        t.begin(1),
        Err(AckError::OutOfOrderBegin {
            seq: 1,
            expected: 0
        })
    );
    assert_eq!(
        t.event_sent(0, now, 1),
        Err(AckError::UnknownTxn { seq: 0 })
    );
    t.begin(0).unwrap();
    let ticket = t.event_sent(0, now, 1).unwrap();
    t.delivered(ticket).unwrap();
    assert_eq!(
        t.delivered(ticket),
        Err(AckError::TooManyReports { seq: 0 }),
        "a ticket settles once"
    );
    t.commit(0, Lsn(1)).unwrap();
    t.flush_lsn();
    assert_eq!(t.delivered(ticket), Err(AckError::UnknownTxn { seq: 0 }));
}

#[test]
fn the_oldest_undelivered_event_ages_while_others_deliver() {
    let start = t0();
    let at = |ms: u64| start + Duration::from_millis(ms);
    let mut t = AckTracker::new(Lsn(0), 0);
    assert_eq!(t.oldest_undelivered_age(at(0)), None, "nothing in flight");
    t.begin(0).unwrap();
    // One event on a stuck partition, sent at 0 ms.
    let stuck = t.event_sent(0, at(0), 1).unwrap();
    t.commit(0, Lsn(10)).unwrap();
    // Later transactions keep being sent and delivered (other partitions).
    for seq in 1..=50u64 {
        t.begin(seq).unwrap();
        let ticket = t.event_sent(seq, at(seq * 100), 1).unwrap();
        t.commit(seq, Lsn(10 + seq * 10)).unwrap();
        t.delivered(ticket).unwrap();
    }
    assert_eq!(
        t.oldest_undelivered_age(at(5_000)),
        Some(Duration::from_secs(5)),
        "deliveries elsewhere do not hide the stuck event"
    );
    assert_eq!(t.flush_lsn(), Lsn(0), "and nothing past it is acknowledged");
    t.delivered(stuck).unwrap();
    assert_eq!(t.oldest_undelivered_age(at(5_000)), None);
    assert_eq!(t.flush_lsn(), Lsn(510));
}

#[test]
fn the_age_follows_the_oldest_of_several_undelivered_events() {
    let start = t0();
    let at = |ms: u64| start + Duration::from_millis(ms);
    let mut t = AckTracker::new(Lsn(0), 0);
    t.begin(0).unwrap();
    let first = t.event_sent(0, at(0), 1).unwrap();
    let second = t.event_sent(0, at(1_000), 1).unwrap();
    let third = t.event_sent(0, at(2_000), 1).unwrap();
    assert_eq!(
        t.oldest_undelivered_age(at(3_000)),
        Some(Duration::from_secs(3))
    );
    t.delivered(first).unwrap();
    assert_eq!(
        t.oldest_undelivered_age(at(3_000)),
        Some(Duration::from_secs(2))
    );
    t.delivered(third).unwrap();
    assert_eq!(
        t.oldest_undelivered_age(at(3_000)),
        Some(Duration::from_secs(2)),
        "a younger delivery does not reset the older one"
    );
    t.delivered(second).unwrap();
    assert_eq!(t.oldest_undelivered_age(at(3_000)), None);
    assert_eq!(
        t.oldest_undelivered_age(at(0)),
        None,
        "and a clock before a send time is no panic"
    );
}

const LIMITS: InFlightLimits = InFlightLimits {
    events: 100,
    bytes: 1_000,
};

#[test]
fn reading_pauses_at_the_byte_bound_and_resumes_on_delivery() {
    let now = t0();
    let mut t = AckTracker::new(Lsn(0), 0);
    t.begin(0).unwrap();
    assert!(t.has_room(LIMITS), "nothing in flight");
    let a = t.event_sent(0, now, 600).unwrap();
    assert!(t.has_room(LIMITS), "600 of 1000 bytes");
    let b = t.event_sent(0, now, 300).unwrap();
    assert!(t.has_room(LIMITS), "900 of 1000 bytes");
    let c = t.event_sent(0, now, 100).unwrap();
    assert_eq!(t.in_flight_bytes(), 1_000);
    assert!(!t.has_room(LIMITS), "at the bound: reading pauses");
    assert_eq!(t.in_flight(), 3, "far below the event bound");
    t.delivered(b).unwrap();
    assert_eq!(t.in_flight_bytes(), 700);
    assert!(t.has_room(LIMITS), "a delivery frees room");
    t.delivered(a).unwrap();
    t.delivered(c).unwrap();
    assert_eq!(t.in_flight_bytes(), 0);
}

#[test]
fn an_event_larger_than_the_byte_bound_goes_alone() {
    let now = t0();
    let mut t = AckTracker::new(Lsn(0), 0);
    t.begin(0).unwrap();
    assert!(t.has_room(LIMITS), "nothing in flight: admitted");
    let big = t.event_sent(0, now, 5_000).unwrap();
    assert!(
        !t.has_room(LIMITS),
        "nothing else is read while the oversize event is in flight"
    );
    t.delivered(big).unwrap();
    assert!(t.has_room(LIMITS), "delivered: reading goes on");
    let small = t.event_sent(0, now, 10).unwrap();
    assert!(t.has_room(LIMITS));
    t.delivered(small).unwrap();
    t.commit(0, Lsn(10)).unwrap();
    assert_eq!(t.flush_lsn(), Lsn(10));
}

#[test]
fn the_event_bound_still_pauses_small_events() {
    let now = t0();
    let limits = InFlightLimits {
        events: 2,
        bytes: 1_000,
    };
    let mut t = AckTracker::new(Lsn(0), 0);
    t.begin(0).unwrap();
    let a = t.event_sent(0, now, 1).unwrap();
    assert!(t.has_room(limits));
    t.event_sent(0, now, 1).unwrap();
    assert!(!t.has_room(limits), "two events: the event bound");
    t.delivered(a).unwrap();
    assert!(t.has_room(limits));
}

#[test]
fn one_waiting_event_bounds_the_span_behind_it() {
    let now = t0();
    let limits = InFlightLimits {
        events: 3,
        bytes: 1_000,
    };
    let mut t = AckTracker::new(Lsn(0), 0);
    t.begin(0).unwrap();
    let waiting = t.event_sent(0, now, 1).unwrap();
    // Later events are delivered while the first one waits: the in-flight count
    // stays low, the span behind the waiting event grows up to twice the bound.
    for _ in 0..5 {
        assert!(t.has_room(limits));
        let later = t.event_sent(0, now, 1).unwrap();
        t.delivered(later).unwrap();
    }
    assert_eq!(t.in_flight(), 1);
    assert!(
        !t.has_room(limits),
        "six events since the waiting one: the span bound (2 x 3)"
    );
    t.delivered(waiting).unwrap();
    assert!(t.has_room(limits), "delivered: the span is empty again");
    assert_eq!(t.oldest_undelivered_age(now), None);
    assert_eq!(
        t.delivered(waiting),
        Err(AckError::TooManyReports { seq: 0 })
    );
}

proptest::proptest! {
    /// Random interleavings of deliveries: the flush LSN never passes a transaction
    /// with an undelivered event, never goes back, and ends at the last end_lsn.
    #[test]
    fn never_acks_past_undelivered(
        sizes in proptest::collection::vec(0u64..4, 1..20),
        order in proptest::collection::vec(proptest::num::usize::ANY, 0..200),
    ) {
        let now = Instant::now();
        let mut t = AckTracker::new(Lsn(0), 0);
        let mut pending: Vec<Ticket> = Vec::new();
        for (seq, size) in sizes.iter().enumerate() {
            let seq = seq as u64;
            t.begin(seq).unwrap();
            for _ in 0..*size {
                pending.push(t.event_sent(seq, now, 1).unwrap());
            }
            t.commit(seq, Lsn((seq + 1) * 100)).unwrap();
        }
        let mut last = Lsn(0);
        let mut remaining: Vec<u64> = sizes.clone();
        let mut picks = order.into_iter();
        while !pending.is_empty() {
            let i = picks.next().unwrap_or(0) % pending.len();
            let ticket = pending.swap_remove(i);
            t.delivered(ticket).unwrap();
            remaining[ticket.seq() as usize] -= 1;
            let flush = t.flush_lsn();
            proptest::prop_assert!(flush >= last);
            last = flush;
            if let Some(first_open) = remaining.iter().position(|r| *r > 0) {
                proptest::prop_assert!(flush.0 <= first_open as u64 * 100);
            }
        }
        proptest::prop_assert_eq!(t.flush_lsn(), Lsn(sizes.len() as u64 * 100));
        proptest::prop_assert_eq!(t.oldest_undelivered_age(now), None);
    }
}
