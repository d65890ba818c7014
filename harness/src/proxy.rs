//! A small TCP fault proxy for tests: sits between a client and a real server
//! (PostgreSQL, a Kafka broker) on 127.0.0.1 and breaks the link on command. Plain std
//! threads, no async runtime.
//!
//! ```text
//! client ──▶ FaultProxy (127.0.0.1:free port) ──▶ upstream
//!            one acceptor thread; per connection one thread per direction
//!
//! cut()              close every current connection at once (FIN both ways);
//!                    new connections are accepted as usual
//! blackhole(true)    forward nothing, keep sockets open: bytes read are discarded,
//!                    new connections are accepted but not connected upstream
//! blackhole(false)   forwarding resumes for connections that lost no bytes; the others
//!                    stay silent until cut() or their peer closes (see below)
//! set_latency(d)     each forwarded chunk waits d before it is written
//! refuse(true)       new connections are closed right after accept
//! ```
//!
//! A black-holed connection that lost bytes is dead for good: TCP never delivers a
//! stream with a hole in it, so resuming it would hand the peer a desynchronised
//! protocol stream, which no real network does. It keeps discarding (like a route that
//! never came back) and the endpoints must notice by their own timeouts, or a later
//! `cut()` closes it. A connection accepted during the blackhole that sent nothing yet
//! is connected upstream when the blackhole ends (like a SYN retry that succeeds).
//!
//! `KafkaBroker::start_behind_proxy()` puts a proxy in front of a broker: Kafka clients
//! connect to the broker's *advertised* address, so the broker advertises the proxy's
//! port while it listens on its own.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::kafka::KafkaBroker;

/// Deadline for connecting to the upstream server.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a connection held during a blackhole re-checks the switch.
const HOLD_POLL: Duration = Duration::from_millis(20);
/// Bytes read per chunk.
const CHUNK: usize = 64 * 1024;

pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    /// `None` until known: connections are then closed at once.
    upstream: Mutex<Option<SocketAddr>>,
    stopping: AtomicBool,
    blackhole: AtomicBool,
    refuse: AtomicBool,
    latency_nanos: AtomicU64,
    accepted: AtomicUsize,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// One proxied connection.
struct Conn {
    client: TcpStream,
    /// Set once connected upstream (under the lock, checked against `closed`).
    upstream: Mutex<Option<TcpStream>>,
    /// Closed by `cut()` or by the proxy shutting down.
    closed: AtomicBool,
    /// Bytes were discarded: this connection never forwards again.
    lost_bytes: AtomicBool,
}

impl Conn {
    /// Shuts both sockets down (FIN both ways; blocked reads and writes return).
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = self.client.shutdown(Shutdown::Both);
        if let Some(upstream) = lock(&self.upstream).as_ref() {
            let _ = upstream.shutdown(Shutdown::Both);
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

impl FaultProxy {
    /// A proxy on 127.0.0.1 (free port) forwarding to `upstream`.
    pub fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the proxy on 127.0.0.1:0");
        Self::start_on(listener, upstream)
    }

    /// A proxy accepting on an already bound `listener` (so its port can be handed out
    /// before the upstream exists, e.g. as a broker's advertised port).
    pub fn start_on(listener: TcpListener, upstream: SocketAddr) -> Self {
        Self::start_routed(listener, Some(upstream))
    }

    fn start_routed(listener: TcpListener, upstream: Option<SocketAddr>) -> Self {
        let addr = listener.local_addr().expect("proxy listener address");
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            stopping: AtomicBool::new(false),
            blackhole: AtomicBool::new(false),
            refuse: AtomicBool::new(false),
            latency_nanos: AtomicU64::new(0),
            accepted: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
        });
        let acceptor = std::thread::Builder::new()
            .name(format!("proxy-{}-accept", addr.port()))
            .spawn({
                let shared = Arc::clone(&shared);
                move || accept_loop(&listener, &shared)
            })
            .expect("spawning the proxy acceptor");
        FaultProxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// Where clients connect: `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn upstream(&self) -> Option<SocketAddr> {
        *lock(&self.shared.upstream)
    }

    /// Where connections made from now on are forwarded.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *lock(&self.shared.upstream) = Some(upstream);
    }

    /// Connections open right now (accepted and not yet closed on both sides).
    pub fn connection_count(&self) -> usize {
        lock(&self.shared.conns).len()
    }

    /// Connections accepted since start (refused ones not counted).
    pub fn accepted_count(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Closes every current connection at once (both sides see end-of-file, then resets
    /// on further writes). Connections made afterwards are proxied as usual.
    pub fn cut(&self) {
        let conns: Vec<Arc<Conn>> = lock(&self.shared.conns).values().cloned().collect();
        for conn in conns {
            conn.close();
        }
    }

    /// `true`: forward nothing in either direction (bytes are read and discarded, so
    /// their connections are dead for good), keep sockets open, and accept new
    /// connections without connecting them upstream. `false`: forwarding resumes for
    /// connections that lost no bytes and for new ones.
    pub fn blackhole(&self, on: bool) {
        self.shared.blackhole.store(on, Ordering::SeqCst);
    }

    /// Delay added before each forwarded chunk is written (both directions).
    pub fn set_latency(&self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.shared.latency_nanos.store(nanos, Ordering::SeqCst);
    }

    /// `true`: new connections are closed right after accept (like a port that
    /// answers and hangs up). Current connections are not touched.
    pub fn refuse(&self, on: bool) {
        self.shared.refuse.store(on, Ordering::SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.cut();
        // Wake the acceptor from its blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl KafkaBroker {
    /// A fresh broker with a [`FaultProxy`] in front of it: the broker listens
    /// on its own port and advertises the proxy's, so every client connection after
    /// bootstrap goes through the proxy. Bootstrap clients on `proxy.addr()` to route
    /// the bootstrap connection through it too.
    pub fn start_behind_proxy() -> (KafkaBroker, FaultProxy) {
        let listener =
            TcpListener::bind("127.0.0.1:0").expect("binding the broker proxy on 127.0.0.1:0");
        // The proxy runs before the broker does: the broker's readiness check may
        // already be sent to the advertised port.
        let proxy = FaultProxy::start_routed(listener, None);
        let broker = KafkaBroker::start_advertising(proxy.port(), |port| {
            proxy.set_upstream(SocketAddr::from(([127, 0, 0, 1], port)));
        });
        (broker, proxy)
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let Ok(client) = stream else {
            continue;
        };
        if shared.refuse.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let _ = client.set_nodelay(true);
        let conn = Arc::new(Conn {
            client,
            upstream: Mutex::new(None),
            closed: AtomicBool::new(false),
            lost_bytes: AtomicBool::new(false),
        });
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        {
            // Registered under the lock and only while not stopping, so `Drop`'s cut
            // (which sets `stopping` first, then takes the lock) sees every connection.
            let mut conns = lock(&shared.conns);
            if shared.stopping.load(Ordering::SeqCst) {
                conn.close();
                break;
            }
            conns.insert(id, Arc::clone(&conn));
        }
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let thread = std::thread::Builder::new()
            .name(format!("proxy-conn-{id}"))
            .spawn({
                let shared = Arc::clone(shared);
                move || {
                    serve(&shared, &conn);
                    conn.close();
                    lock(&shared.conns).remove(&id);
                }
            })
            .expect("spawning a proxy connection thread");
        let mut threads = lock(&shared.threads);
        threads.retain(|t| !t.is_finished());
        threads.push(thread);
    }
}

/// Runs one connection until both directions are done or it is closed.
fn serve(shared: &Arc<Shared>, conn: &Arc<Conn>) {
    if shared.blackhole.load(Ordering::SeqCst) && !hold_while_blackholed(shared, conn) {
        return;
    }
    let Some(upstream_addr) = *lock(&shared.upstream) else {
        return;
    };
    let Ok(upstream) = TcpStream::connect_timeout(&upstream_addr, UPSTREAM_CONNECT_TIMEOUT) else {
        return;
    };
    let _ = upstream.set_nodelay(true);
    let (Ok(upstream_reader), Ok(client_writer)) = (upstream.try_clone(), conn.client.try_clone())
    else {
        return;
    };
    let Ok(upstream_writer) = upstream.try_clone() else {
        return;
    };
    {
        let mut slot = lock(&conn.upstream);
        *slot = Some(upstream);
        if conn.is_closed() {
            // cut() ran between connect and here.
            if let Some(upstream) = slot.as_ref() {
                let _ = upstream.shutdown(Shutdown::Both);
            }
            return;
        }
    }
    let downstream = std::thread::Builder::new()
        .name("proxy-downstream".to_owned())
        .spawn({
            let shared = Arc::clone(shared);
            let conn = Arc::clone(conn);
            move || pump(&shared, &conn, upstream_reader, client_writer)
        });
    let Ok(client_reader) = conn.client.try_clone() else {
        return;
    };
    pump(shared, conn, client_reader, upstream_writer);
    if let Ok(downstream) = downstream {
        let _ = downstream.join();
    }
}

/// A connection accepted during a blackhole: not connected upstream, anything the
/// client sends is discarded. Returns `true` when it should now be connected (the
/// blackhole ended and nothing was lost), `false` when it is finished.
fn hold_while_blackholed(shared: &Shared, conn: &Conn) -> bool {
    let Ok(mut client) = conn.client.try_clone() else {
        return false;
    };
    if client.set_read_timeout(Some(HOLD_POLL)).is_err() {
        return false;
    }
    let mut buf = vec![0u8; CHUNK];
    loop {
        if conn.is_closed() || shared.stopping.load(Ordering::SeqCst) {
            return false;
        }
        let lost = conn.lost_bytes.load(Ordering::SeqCst);
        if !lost && !shared.blackhole.load(Ordering::SeqCst) {
            return client.set_read_timeout(None).is_ok();
        }
        // Peek first: bytes that arrive just after the blackhole ended are not lost,
        // they are forwarded once connected.
        match client.peek(&mut buf) {
            Ok(0) => return false,
            Ok(_) => {
                if lost || shared.blackhole.load(Ordering::SeqCst) {
                    let _ = client.read(&mut buf);
                    conn.lost_bytes.store(true, Ordering::SeqCst);
                }
            }
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// Copies `from` → `to` chunk by chunk, applying the blackhole and latency switches.
/// End-of-file is passed on as a half close; an error closes the whole connection.
fn pump(shared: &Shared, conn: &Conn, mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let read = from.read(&mut buf);
        if let Err(err) = &read {
            if err.kind() == ErrorKind::Interrupted {
                continue;
            }
        }
        if matches!(read, Ok(0) | Err(_)) && !conn.is_closed() && is_blackholed(shared, conn) {
            // The end of the stream is lost in the blackhole like any byte: the other
            // side never learns, the connection stays open and silent.
            conn.lost_bytes.store(true, Ordering::SeqCst);
            return;
        }
        let n = match read {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => n,
            Err(_) => {
                conn.close();
                return;
            }
        };
        if conn.is_closed() {
            return;
        }
        let latency = Duration::from_nanos(shared.latency_nanos.load(Ordering::SeqCst));
        if !latency.is_zero() {
            sleep_unless_closed(conn, latency);
        }
        if is_blackholed(shared, conn) {
            conn.lost_bytes.store(true, Ordering::SeqCst);
            continue;
        }
        if to.write_all(&buf[..n]).is_err() {
            conn.close();
            return;
        }
    }
}

/// Bytes of `conn` are discarded now: the blackhole is on, or the connection already
/// lost bytes.
fn is_blackholed(shared: &Shared, conn: &Conn) -> bool {
    shared.blackhole.load(Ordering::SeqCst) || conn.lost_bytes.load(Ordering::SeqCst)
}

fn sleep_unless_closed(conn: &Conn, duration: Duration) {
    let end = Instant::now() + duration;
    loop {
        let now = Instant::now();
        if now >= end || conn.is_closed() {
            return;
        }
        std::thread::sleep((end - now).min(HOLD_POLL));
    }
}

/// Locks a mutex, ignoring poisoning (a panicking test must still be able to clean up).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
