//! Unit tests of the pipeline loop's decisions, on a scripted stream, sink and watch
//! (`tests/script.rs`), in milliseconds and without servers: commit order and the ack
//! invariant under delivery reports in any order, backpressure at the event and byte
//! bounds, prompt status updates, the watch's vouched bound, idle progress, dead letters,
//! retries and stops from the sink, the stall release, shutdown with its final status
//! update and record, and the exactly-once skip. The real connection and sinks are the
//! integration suite's (`tests/`).
//!
//! The clock is tokio's, paused: it moves only when every task waits, straight to the
//! next timer, so "before the next heartbeat" is exact and a minute's stall limit takes
//! no time. The loop reads every duration from that clock ([`super::now`]).

mod script;
mod wire;

use std::time::Duration;

use script::{Options, Relay, Row, SLOT_LSN};

use crate::pg::conn::{DbError, PgError};
use crate::pg::publication::PublicationChange;
use crate::pg::Lsn;
use crate::relay::ack::InFlightLimits;
use crate::relay::{Definite, RelayError, Transient};
use crate::sink::{DeliveryFailure, RecordTag, SinkNotice};

/// The event id (the default Kafka key) of a record.
fn id(record: &(crate::relay::router::OutboxEvent, RecordTag)) -> String {
    record.0.key.clone().unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn events_go_out_in_commit_order_and_the_ack_waits_for_every_earlier_delivery() {
    let mut relay = Relay::start(Options::default());
    let first = relay.commit(&[Row::event("a1"), Row::event("a2")]);
    let second = relay.commit(&[Row::event("b1")]);
    let third = relay.commit(&[Row::event("c1"), Row::event("c2")]);
    let mut sent = Vec::new();
    for _ in 0..5 {
        sent.push(relay.next_sent().await);
    }
    let ids: Vec<String> = sent.iter().map(id).collect();
    assert_eq!(ids, ["a1", "a2", "b1", "c1", "c2"]);
    assert!(sent.iter().all(|(_, tag)| !tag.dead_letter));

    // Everything but the first event is confirmed, newest first: nothing may be
    // acknowledged, however long the relay waits.
    for (_, tag) in sent[1..].iter().rev() {
        relay.deliver(*tag);
    }
    let update = relay.ask_status().await;
    assert_eq!(
        update.flush, SLOT_LSN,
        "acknowledged past the undelivered a1"
    );

    // The second transaction's event alone would not do either: a2 of the first is
    // delivered, a1 not. Once a1 is, all three transactions are acknowledged at once,
    // at the last one's end (never at a commit LSN).
    relay.deliver(sent[0].1);
    relay.acknowledged(third).await;
    assert!(first < second && second < third);
}

#[tokio::test(start_paused = true)]
async fn each_transaction_is_acknowledged_as_soon_as_its_prefix_is_delivered() {
    let mut relay = Relay::start(Options::default());
    let first = relay.commit(&[Row::event("a1")]);
    let second = relay.commit(&[Row::event("b1")]);
    let a1 = relay.next_sent().await;
    let b1 = relay.next_sent().await;
    relay.deliver(b1.1);
    assert_eq!(relay.ask_status().await.flush, SLOT_LSN);
    relay.deliver(a1.1);
    relay.acknowledged(second).await;
    assert!(first < second);
}

#[tokio::test(start_paused = true)]
async fn reading_pauses_at_the_event_bound_and_resumes_on_a_delivery() {
    let mut relay = Relay::start(Options {
        limits: InFlightLimits {
            events: 2,
            bytes: 1 << 20,
        },
        status_interval: Duration::from_millis(100),
        ..Options::default()
    });
    for n in 1..=4 {
        relay.commit(&[Row::event(&format!("e{n}"))]);
    }
    let e1 = relay.next_sent().await;
    let e2 = relay.next_sent().await;
    assert_eq!((id(&e1), id(&e2)), ("e1".into(), "e2".into()));
    // Several turns of the loop (status ticks) later, nothing more was read.
    for _ in 0..3 {
        relay.next_status().await;
    }
    assert!(
        relay.sent_now().is_none(),
        "a third event in flight past the bound of 2"
    );
    assert!(
        !relay.read_everything(),
        "the stream was read past the bound"
    );

    relay.deliver(e1.1);
    assert_eq!(id(&relay.next_sent().await), "e3");
    for _ in 0..3 {
        relay.next_status().await;
    }
    assert!(
        relay.sent_now().is_none(),
        "e4 went with e2 and e3 in flight"
    );
    relay.deliver(e2.1);
    assert_eq!(id(&relay.next_sent().await), "e4");
}

#[tokio::test(start_paused = true)]
async fn reading_pauses_at_the_byte_bound_and_a_larger_event_goes_alone() {
    let mut relay = Relay::start(Options {
        limits: InFlightLimits {
            events: 1_000,
            bytes: 1_000,
        },
        status_interval: Duration::from_millis(100),
        ..Options::default()
    });
    relay.commit(&[Row::sized("big", 5_000)]);
    relay.commit(&[Row::sized("s1", 400)]);
    relay.commit(&[Row::sized("s2", 400)]);
    relay.commit(&[Row::sized("s3", 400)]);
    relay.commit(&[Row::sized("s4", 400)]);
    let big = relay.next_sent().await;
    assert_eq!(id(&big), "big");
    for _ in 0..3 {
        relay.next_status().await;
    }
    assert!(
        relay.sent_now().is_none(),
        "an event went with 5 kB in flight over a 1 kB bound"
    );

    relay.deliver(big.1);
    // Small events of about 410 bytes: the third one takes the bytes in flight past
    // the bound of 1,000, and the fourth waits.
    let ids = [
        id(&relay.next_sent().await),
        id(&relay.next_sent().await),
        id(&relay.next_sent().await),
    ];
    assert_eq!(ids, ["s1", "s2", "s3"]);
    for _ in 0..3 {
        relay.next_status().await;
    }
    assert!(relay.sent_now().is_none(), "s4 went past the byte bound");
}

#[tokio::test(start_paused = true)]
async fn a_delivery_is_acknowledged_promptly_not_at_the_next_heartbeat() {
    // A ten-second status interval: the heartbeat is one second, so an update within
    // it comes from the delivery.
    let mut relay = Relay::start(Options::default());
    relay.next_status().await; // the heartbeat's first tick, at start
    let end = relay.commit(&[Row::event("a1")]);
    let a1 = relay.next_sent().await;
    let delivered_at = tokio::time::Instant::now();
    relay.deliver(a1.1);
    relay.acknowledged(end).await;
    let after = delivered_at.elapsed();
    assert!(
        after < Duration::from_millis(500),
        "acknowledged {after:?} after the delivery: at a heartbeat, not promptly"
    );
}

#[tokio::test(start_paused = true)]
async fn nothing_is_acknowledged_past_what_the_watch_vouched_for() {
    let mut relay = Relay::start(Options::default());
    relay.next_status().await;
    relay.hold_vouching(true);
    let end = relay.commit(&[Row::event("a1")]);
    let a1 = relay.next_sent().await;
    relay.deliver(a1.1);
    // Delivered, and the watch's check is under way: the update stays where the watch
    // last vouched (the start), however often it goes out.
    for _ in 0..3 {
        let update = relay.ask_status().await;
        assert_eq!(
            update.flush, SLOT_LSN,
            "acknowledged what the watch has not vouched for"
        );
    }
    relay.hold_vouching(false);
    relay.acknowledged(end).await;
}

#[tokio::test(start_paused = true)]
async fn an_idle_relay_follows_the_servers_wal_and_answers_a_reply_request_at_once() {
    let mut relay = Relay::start(Options::default());
    relay.next_status().await;
    let end = relay.commit(&[Row::event("a1")]);
    let a1 = relay.next_sent().await;
    relay.deliver(a1.1);
    relay.acknowledged(end).await;
    // Writes to other tables move the server's WAL: only keepalives say so. With
    // nothing in flight the slot follows them, at the next update.
    relay.commit(&[]);
    let update = relay.ask_status().await;
    assert_eq!(update.write, relay.wal());
    relay.acknowledged(relay.wal()).await;
}

/// A session that resumes past its record, from what the process delivered before
/// PostgreSQL went away, records that position at once, before it streams anything: a
/// process killed meanwhile would otherwise have only the older record.
#[tokio::test(start_paused = true)]
async fn a_resume_from_memory_past_the_record_is_recorded_before_streaming() {
    let through = Lsn(SLOT_LSN.0 + 0x5000);
    let relay = Relay::start(Options {
        resumed_through: Some(through),
        ..Options::default()
    });
    relay.recorded_through(through).await;
    assert_eq!(relay.recorded(), [through], "one write, of that position");
}

/// A server's error, as an ErrorResponse carries it.
fn server_error(code: &str, message: &str) -> PgError {
    PgError::Db(DbError {
        severity: "ERROR".into(),
        code: code.into(),
        message: message.into(),
        detail: None,
        hint: None,
    })
}

/// The error a read of a dropped table gets.
fn relation_gone() -> PgError {
    server_error("XX000", "could not open relation with OID 16385")
}

/// How a streaming session ends when PostgreSQL fails the stream with `error`, the
/// outbox unchanged; `watch_answers: false` holds the watch's answers back past the wait.
async fn ended_by_server_error(error: PgError, watch_answers: bool) -> RelayError {
    let mut relay = Relay::start(Options::default());
    relay.next_status().await;
    relay.hold_vouching(!watch_answers);
    relay.fail(error);
    relay
        .ended()
        .await
        .1
        .expect_err("a failed stream ends the session with an error")
}

/// Waits (on the paused clock) until the pipeline took everything written.
async fn taken_everything(relay: &Relay) {
    let taken = async {
        while !relay.read_everything() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), taken)
        .await
        .expect("the pipeline takes what was written");
}

#[tokio::test(start_paused = true)]
async fn a_server_error_after_the_outbox_changed_stops_the_relay_with_the_change() {
    let mut relay = Relay::start(Options::default());
    let end = relay.commit(&[Row::event("a1")]);
    let a1 = relay.next_sent().await;
    relay.deliver(a1.1);
    relay.acknowledged(end).await;
    // The outbox is dropped; the WAL sender fails on it before the watch's check has
    // reported (held here until the error was read).
    relay.hold_vouching(true);
    relay.change_publication(PublicationChange::TableDropped);
    relay.fail(relation_gone());
    taken_everything(&relay).await;
    relay.hold_vouching(false);
    match relay.ended().await.1 {
        Err(RelayError::Definite(Definite::OutboxUnpublished { change, since, .. })) => {
            assert_eq!(change, PublicationChange::TableDropped.to_string());
            assert_eq!(
                since, end,
                "rows may be missing from the last vouched position"
            );
        }
        other => panic!("the server's error instead of the change that explains it: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_server_error_the_watch_cannot_explain_stays_the_servers_error() {
    // The watch does not answer within the wait: nothing vouches for the outbox.
    match ended_by_server_error(relation_gone(), false).await {
        error @ RelayError::Pg(PgError::Db(_)) => {
            assert!(!error.is_retryable(), "{error:?}");
            assert!(
                error.to_string().contains("could not open relation"),
                "{error}"
            );
        }
        other => panic!("not the server's error: {other:?}"),
    }
}

/// With the outbox vouched for after it, a server error stays what it was: the relay
/// stops on it.
#[tokio::test(start_paused = true)]
async fn a_server_error_with_the_outbox_unchanged_stays_the_servers_error() {
    match ended_by_server_error(relation_gone(), true).await {
        error @ RelayError::Pg(PgError::Db(_)) => {
            assert!(!error.is_retryable(), "{error:?}");
            assert!(
                error.to_string().contains("could not open relation"),
                "{error}"
            );
        }
        other => panic!("not the server's error: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_refused_row_becomes_a_dead_letter_in_its_place_and_is_acknowledged_with_it() {
    let mut relay = Relay::start(Options {
        dead_letter_topic: Some("outbox.dead".into()),
        ..Options::default()
    });
    let end = relay.commit(&[Row::event("a1"), Row::without_id(), Row::event("a3")]);
    let sent = [
        relay.next_sent().await,
        relay.next_sent().await,
        relay.next_sent().await,
    ];
    assert_eq!(id(&sent[0]), "a1");
    assert_eq!(sent[1].0.topic, "outbox.dead");
    assert!(sent[1].1.dead_letter);
    assert_eq!(id(&sent[2]), "a3");
    for (_, tag) in &sent[..2] {
        relay.deliver(*tag);
    }
    assert_eq!(relay.ask_status().await.flush, SLOT_LSN);
    relay.deliver(sent[2].1);
    relay.acknowledged(end).await;
}

#[tokio::test(start_paused = true)]
async fn a_refused_row_without_a_dead_letter_topic_stops_the_relay_unacknowledged() {
    let mut relay = Relay::start(Options::default());
    relay.commit(&[Row::event("a1"), Row::without_id()]);
    let a1 = relay.next_sent().await;
    relay.deliver(a1.1);
    let (_, ended) = relay.ended().await;
    let error = ended.expect_err("a row without its event id stops the relay");
    assert!(
        matches!(error, RelayError::Definite(Definite::Route(_))),
        "{error:?}"
    );
    assert!(!error.is_retryable());
    assert_eq!(relay.flushed, SLOT_LSN);
}

#[tokio::test(start_paused = true)]
async fn a_record_the_sink_refuses_goes_to_the_dead_letter_topic() {
    let mut relay = Relay::start(Options {
        dead_letter_topic: Some("outbox.dead".into()),
        ..Options::default()
    });
    let end = relay.commit(&[Row::event("a1")]);
    let (event, tag) = relay.next_sent().await;
    relay.notice(SinkNotice::Refused {
        tag,
        failure: DeliveryFailure {
            reason: "the broker refused the record: too large".into(),
            too_large: false,
            event: Some(Box::new(event)),
        },
    });
    let (letter, letter_tag) = relay.next_sent().await;
    assert_eq!(letter.topic, "outbox.dead");
    assert!(letter_tag.dead_letter);
    assert_eq!(relay.ask_status().await.flush, SLOT_LSN);
    relay.deliver(letter_tag);
    relay.acknowledged(end).await;
}

#[tokio::test(start_paused = true)]
async fn a_retry_from_the_sink_ends_the_attempt_without_acknowledging_the_undelivered() {
    let mut relay = Relay::start(Options::default());
    let first = relay.commit(&[Row::event("a1")]);
    relay.commit(&[Row::event("b1")]);
    let a1 = relay.next_sent().await;
    let _b1 = relay.next_sent().await;
    relay.deliver(a1.1);
    relay.acknowledged(first).await;
    relay.notice(SinkNotice::Retry {
        reason: "the broker went away".into(),
    });
    let (mut pipeline, ended) = relay.ended().await;
    let error = ended.expect_err("a retry ends the attempt");
    assert!(error.is_retryable(), "{error:?}");
    assert_eq!(relay.flushed, first);
    // What the next session may skip: the first transaction, not the second.
    assert_eq!(pipeline.delivered_through(), first);
}

#[tokio::test(start_paused = true)]
async fn a_stop_from_the_sink_is_definite() {
    let mut relay = Relay::start(Options::default());
    relay.notice(SinkNotice::Stop {
        reason: "not authorized to write to the topic: grant WRITE".into(),
    });
    let (_, ended) = relay.ended().await;
    let error = ended.expect_err("a stop ends the relay");
    assert!(!error.is_retryable(), "{error:?}");
    assert!(error.to_string().contains("grant WRITE"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn a_sink_without_confirmations_releases_the_connection_after_the_stall_limit() {
    let mut relay = Relay::start(Options {
        status_interval: Duration::from_secs(1),
        stall_release: Duration::from_secs(5),
        ..Options::default()
    });
    let started = tokio::time::Instant::now();
    relay.commit(&[Row::event("a1")]);
    let _a1 = relay.next_sent().await;
    let (_, ended) = relay.ended().await;
    match ended {
        Err(error @ RelayError::Transient(Transient::SinkStalled { in_flight: 1, .. })) => {
            assert!(error.is_retryable());
            assert!(
                started.elapsed() >= Duration::from_secs(5),
                "released early"
            );
        }
        other => panic!("expected the stall release, got {other:?}"),
    }
    assert_eq!(relay.flushed, SLOT_LSN);
}

#[tokio::test(start_paused = true)]
async fn shutdown_drains_deliveries_then_sends_the_final_update_and_record() {
    let mut relay = Relay::start(Options::default());
    let end = relay.commit(&[Row::event("a1"), Row::event("a2")]);
    let a1 = relay.next_sent().await;
    let a2 = relay.next_sent().await;
    relay.stop();
    // The relay waits for what is in flight: no more reading, heartbeats go on.
    relay.next_status().await;
    relay.deliver(a1.1);
    relay.deliver(a2.1);
    let (pipeline, ended) = relay.ended().await;
    ended.expect("a clean shutdown");
    // The last update acknowledged everything delivered, and the state table got its
    // position before the end (a rewind after this stop sends nothing again).
    while relay.flushed < end {
        relay.next_status().await;
    }
    assert_eq!(relay.flushed, end);
    assert_eq!(relay.recorded().last(), Some(&end));
    assert_eq!(pipeline.progress().events, 2);
}

#[tokio::test(start_paused = true)]
async fn a_stop_records_the_last_acknowledged_position_before_it_ends() {
    let mut relay = Relay::start(Options::default());
    let first = relay.commit(&[Row::event("a1")]);
    let a1 = relay.next_sent().await;
    relay.deliver(a1.1);
    relay.acknowledged(first).await;
    relay.recorded_through(first).await;
    // The next record would be owed a second after the first one: the stop comes
    // before that, and must write it anyway (and wait for the write).
    let second = relay.commit(&[Row::event("b1")]);
    let b1 = relay.next_sent().await;
    relay.stop();
    relay.deliver(b1.1);
    let (_, ended) = relay.ended().await;
    ended.expect("a clean shutdown");
    assert_eq!(relay.recorded(), [first, second]);
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_comes_before_new_input() {
    // The request and a transaction are both waiting when the loop first turns: the
    // shutdown is taken first, and nothing more is read.
    let mut relay = Relay::start(Options::default());
    relay.stop();
    relay.commit(&[Row::event("late")]);
    let (pipeline, ended) = relay.ended().await;
    ended.expect("a clean shutdown");
    assert!(
        relay.sent_now().is_none(),
        "an event was read after the shutdown"
    );
    assert_eq!(pipeline.progress().events, 0);
    assert_eq!(relay.flushed, SLOT_LSN);
}

#[tokio::test(start_paused = true)]
async fn what_a_checkpoint_covers_is_skipped_and_acknowledged() {
    // Exactly-once (or the state table's record): Kafka holds the first transaction.
    let covered_end = Lsn(SLOT_LSN.0 + 0x1000);
    let mut relay = Relay::start(Options {
        committed: Some(covered_end),
        ..Options::default()
    });
    let first = relay.commit(&[Row::event("a1"), Row::event("a2")]);
    assert_eq!(first, covered_end);
    let second = relay.commit(&[Row::event("b1")]);
    let b1 = relay.next_sent().await;
    assert_eq!(
        id(&b1),
        "b1",
        "a transaction the checkpoint covers was sent again"
    );
    relay.deliver(b1.1);
    relay.acknowledged(second).await;
}
