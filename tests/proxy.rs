//! The TCP fault proxy (`support::proxy::FaultProxy`): first against a local echo
//! server (bytes pass, cut, blackhole, latency, refuse), then in front of the real
//! components it is used with: PostgreSQL (a plain client and the relay's replication
//! connection) and an Apache Kafka broker (which must advertise the proxy's port).

use outbox_relay_harness as support;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use support::kafka::{consume, create_topic, produce, KafkaBroker};
use support::outbox::{cluster_with_outbox, start_streaming, stdout_config, WAIT};
use support::proxy::FaultProxy;
use support::{wait_until, PgCluster, PgOptions};

/// Bounded wait for "this read must not return": long enough that a forwarding proxy
/// would have answered on a loaded machine.
const STALL: Duration = Duration::from_millis(700);
/// Deadline for anything that should happen promptly.
const PROMPT: Duration = Duration::from_secs(10);

/// A local echo server: every connection gets back what it sends, until end-of-file.
fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding the echo server");
    let addr = listener.local_addr().expect("echo server address");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if stream.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = stream.shutdown(Shutdown::Write);
            });
        }
    });
    addr
}

fn connect(proxy: &FaultProxy) -> TcpStream {
    let stream = TcpStream::connect(proxy.addr()).expect("connecting to the proxy");
    stream
        .set_read_timeout(Some(PROMPT))
        .expect("setting a read timeout");
    stream
}

/// Sends `message` and reads the same number of bytes back.
fn round_trip(stream: &mut TcpStream, message: &[u8]) -> Vec<u8> {
    stream
        .write_all(message)
        .expect("writing through the proxy");
    let mut echoed = vec![0u8; message.len()];
    stream
        .read_exact(&mut echoed)
        .expect("reading the echo through the proxy");
    echoed
}

/// Asserts that nothing arrives on `stream` within [`STALL`] (the read times out).
fn assert_stalled(stream: &mut TcpStream, what: &str) {
    stream.set_read_timeout(Some(STALL)).unwrap();
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("{what}: expected the read to stall, got {other:?}"),
    }
    stream.set_read_timeout(Some(PROMPT)).unwrap();
}

/// Asserts that `stream` was closed: a read returns end-of-file or an error (a reset),
/// not a timeout.
fn assert_closed(stream: &mut TcpStream) {
    let started = Instant::now();
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Err(err) if !matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return
            }
            Ok(_) => assert!(
                started.elapsed() < PROMPT,
                "the stream keeps delivering data"
            ),
            Err(err) => panic!("the stream was not closed: {err}"),
        }
    }
}

#[test]
fn bytes_pass_through_in_both_directions() {
    let proxy = FaultProxy::start(echo_server());
    let mut stream = connect(&proxy);
    let message: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    // Writer and reader concurrently: a megabyte does not fit in the socket buffers.
    let mut writer = stream.try_clone().unwrap();
    let sent = message.clone();
    let writing = std::thread::spawn(move || writer.write_all(&sent).unwrap());
    let mut echoed = vec![0u8; message.len()];
    stream.read_exact(&mut echoed).unwrap();
    writing.join().unwrap();
    assert!(echoed == message, "the echo differs from what was sent");
    assert_eq!(proxy.connection_count(), 1);
    assert_eq!(proxy.accepted_count(), 1);

    // A half close travels through: the echo server finishes and closes its side.
    stream.shutdown(Shutdown::Write).unwrap();
    assert_closed(&mut stream);
    wait_until("the proxy forgets the finished connection", PROMPT, || {
        proxy.connection_count() == 0
    });
}

#[test]
fn cut_closes_live_connections_and_new_ones_still_work() {
    let proxy = FaultProxy::start(echo_server());
    let mut first = connect(&proxy);
    let mut second = connect(&proxy);
    assert_eq!(round_trip(&mut first, b"ping"), b"ping");
    assert_eq!(round_trip(&mut second, b"pong"), b"pong");
    assert_eq!(proxy.connection_count(), 2);

    proxy.cut();
    assert_closed(&mut first);
    assert_closed(&mut second);
    wait_until("cut connections are gone", PROMPT, || {
        proxy.connection_count() == 0
    });

    let mut third = connect(&proxy);
    assert_eq!(round_trip(&mut third, b"after the cut"), b"after the cut");
    assert_eq!(proxy.accepted_count(), 3);
}

#[test]
fn blackhole_stalls_traffic_and_new_connections_work_once_lifted() {
    let proxy = FaultProxy::start(echo_server());
    let mut live = connect(&proxy);
    assert_eq!(round_trip(&mut live, b"before"), b"before");
    let mut idle = connect(&proxy);
    assert_eq!(round_trip(&mut idle, b"idle"), b"idle");

    proxy.blackhole(true);
    live.write_all(b"into the void").unwrap();
    assert_stalled(&mut live, "a live connection in a blackhole");
    // Accepted but never connected upstream: the client sees an open socket and silence.
    let mut during = connect(&proxy);
    during.write_all(b"hello?").unwrap();
    assert_stalled(&mut during, "a connection made during the blackhole");
    let mut silent_during = connect(&proxy);
    wait_until("the silent connection is accepted", PROMPT, || {
        proxy.connection_count() == 4
    });

    proxy.blackhole(false);
    let mut after = connect(&proxy);
    assert_eq!(round_trip(&mut after, b"after"), b"after");
    // No bytes lost: these resume (the silent one gets connected upstream now).
    assert_eq!(round_trip(&mut idle, b"still here"), b"still here");
    assert_eq!(round_trip(&mut silent_during, b"late"), b"late");
    // Bytes were discarded: these stay dead rather than deliver a stream with a hole.
    live.write_all(b"more").unwrap();
    assert_stalled(&mut live, "a connection that lost bytes");
    assert_stalled(&mut during, "a held connection that lost bytes");

    // cut() still closes the dead ones.
    proxy.cut();
    assert_closed(&mut live);
    assert_closed(&mut during);
}

#[test]
fn latency_delays_each_direction() {
    let proxy = FaultProxy::start(echo_server());
    let mut stream = connect(&proxy);
    assert_eq!(round_trip(&mut stream, b"warm"), b"warm");
    let latency = Duration::from_millis(150);
    proxy.set_latency(latency);
    let started = Instant::now();
    assert_eq!(round_trip(&mut stream, b"slow"), b"slow");
    let elapsed = started.elapsed();
    // Once on the way up, once on the way back. Lower bound only: a loaded machine may
    // add any amount.
    assert!(
        elapsed >= latency * 2,
        "round trip took {elapsed:?}, expected at least {:?}",
        latency * 2
    );
    proxy.set_latency(Duration::ZERO);
    assert_eq!(round_trip(&mut stream, b"fast"), b"fast");
}

#[test]
fn refuse_closes_new_connections_only() {
    let proxy = FaultProxy::start(echo_server());
    let mut existing = connect(&proxy);
    assert_eq!(round_trip(&mut existing, b"one"), b"one");
    proxy.refuse(true);
    let mut refused = connect(&proxy);
    assert_closed(&mut refused);
    assert_eq!(round_trip(&mut existing, b"two"), b"two");
    proxy.refuse(false);
    let mut accepted = connect(&proxy);
    assert_eq!(round_trip(&mut accepted, b"three"), b"three");
    assert_eq!(
        proxy.accepted_count(),
        2,
        "refused connections are not counted"
    );
}

#[test]
fn drop_closes_connections_and_the_listener() {
    let proxy = FaultProxy::start(echo_server());
    let addr = proxy.addr();
    let mut stream = connect(&proxy);
    assert_eq!(round_trip(&mut stream, b"x"), b"x");
    drop(proxy);
    assert_closed(&mut stream);
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(),
        "nothing listens on the dropped proxy's port"
    );
}

fn pg_client_through(proxy: &FaultProxy) -> postgres::Client {
    let mut config = postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(proxy.port())
        .user("postgres")
        .dbname("postgres")
        .connect_timeout(Duration::from_secs(5));
    config
        .connect(postgres::NoTls)
        .expect("connecting to PostgreSQL through the proxy")
}

#[test]
fn postgres_through_the_proxy_cut_and_reconnect() {
    let pg = PgCluster::start();
    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], pg.port())));
    let mut client = pg_client_through(&proxy);
    let one: i32 = client.query_one("SELECT 1", &[]).unwrap().get(0);
    assert_eq!(one, 1);
    proxy.cut();
    assert!(
        client.query_one("SELECT 1", &[]).is_err(),
        "a cut connection cannot answer"
    );
    let mut client = pg_client_through(&proxy);
    let two: i32 = client.query_one("SELECT 2", &[]).unwrap().get(0);
    assert_eq!(two, 2);
}

/// The relay's config with its `[postgres] url` pointing at `proxy` instead of `pg`.
fn via_proxy(config: &str, pg: &PgCluster, proxy: &FaultProxy) -> String {
    let direct = pg.url("postgres", None, "app");
    let proxied = direct.replace(
        &format!("127.0.0.1:{}", pg.port()),
        &format!("127.0.0.1:{}", proxy.port()),
    );
    assert!(config.contains(&direct));
    config.replace(&direct, &proxied)
}

fn insert_event(pg: &PgCluster, id: u32) {
    pg.client_db("app")
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
             VALUES (('00000000-0000-0000-0000-' || lpad($1::text, 12, '0'))::uuid,
                     'proxy', 'a', 'T', '{}')",
            &[&id.to_string()],
        )
        .unwrap();
}

#[test]
fn relay_reconnects_after_its_postgres_link_is_cut() {
    let pg = cluster_with_outbox(PgOptions::default());
    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], pg.port())));
    let relay = start_streaming(&via_proxy(&stdout_config(&pg), &pg, &proxy));
    insert_event(&pg, 1);
    relay.wait_for_lines(1, WAIT);
    let before = proxy.accepted_count();
    proxy.cut();
    insert_event(&pg, 2);
    let lines = relay.wait_for_lines(2, WAIT);
    assert!(lines.iter().any(|l| l.contains("000000000002")));
    assert!(
        proxy.accepted_count() > before,
        "the relay came back through the proxy"
    );
}

#[test]
fn kafka_through_the_proxy_survives_a_cut() {
    let (broker, proxy) = KafkaBroker::start_behind_proxy();
    let bootstrap = proxy.addr().to_string();
    create_topic(&bootstrap, "proxied", 1);
    produce(&bootstrap, "proxied", "k", "one");
    assert!(
        proxy.accepted_count() > 0,
        "clients reach the broker through the proxy"
    );
    proxy.cut();
    produce(&bootstrap, "proxied", "k", "two");
    // Even when bootstrapped on the broker's own port, clients are sent to the proxy.
    let before = proxy.accepted_count();
    let records = consume(&broker.bootstrap(), &["proxied"], 2, WAIT);
    let values: Vec<String> = records.iter().filter_map(|r| r.value_str()).collect();
    assert_eq!(values, ["one", "two"]);
    assert!(
        proxy.accepted_count() > before,
        "the consumer fetched through the proxy"
    );
}
