//! The demo (`./deploy/demo.sh`): a throwaway PostgreSQL with `wal_level=logical`, the
//! relay on its stdout sink (no Kafka needed), and sample outbox events inserted every
//! second, so the events can be watched arriving as JSON lines on stdout. Logs go to
//! stderr. PostgreSQL is started by the same harness the tests use.
//!
//! `DEMO_SECONDS` (default 20) seconds of events, then a graceful stop; `0` keeps
//! inserting until Ctrl-C.

use std::process::{Child, Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_relay_harness::outbox::OUTBOX_SQL;
use outbox_relay_harness::{relay_bin, PgCluster};

const SLOT: &str = "outbox_relay";
/// How long the relay may take to start streaming.
const START_WAIT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let seconds: u64 = std::env::var("DEMO_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let interrupted = Arc::new(AtomicBool::new(false));
    watch_for_ctrl_c(Arc::clone(&interrupted));

    eprintln!("demo: starting PostgreSQL (wal_level=logical) in a temp dir");
    let pg = PgCluster::start();
    pg.batch_execute("CREATE DATABASE app");
    let mut app = pg.client_db("app");
    // The relay's role: REPLICATION to stream the WAL; owning the table and CREATE on
    // the database let it create its publication itself, CREATE on the schema its state
    // table (its record of the slot) (see sql/roles.sql).
    app.batch_execute(OUTBOX_SQL)
        .and_then(|()| {
            app.batch_execute(
                "CREATE ROLE relay LOGIN REPLICATION PASSWORD 'relay';
                 ALTER TABLE public.outbox OWNER TO relay;
                 GRANT CREATE ON DATABASE app TO relay;
                 GRANT CREATE ON SCHEMA public TO relay;",
            )
        })
        .unwrap_or_else(|e| panic!("setting up database app: {e}"));

    let dir = tempfile::tempdir().expect("temp dir");
    let config_path = dir.path().join("relay.toml");
    let config = format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{SLOT}\"\npublication = \"outbox_relay\"\n\
         [outbox]\ntable = \"public.outbox\"\n[sink]\ntype = \"stdout\"\n",
        pg.url("relay", Some("relay"), "app")
    );
    std::fs::write(&config_path, &config).expect("writing the relay config");
    eprintln!("demo: relay config:");
    for line in config.lines() {
        eprintln!("    {line}");
    }

    let mut relay = match Command::new(relay_bin())
        .arg("run")
        .arg("--config")
        .arg(&config_path)
        .spawn()
    {
        Ok(relay) => relay,
        Err(e) => {
            eprintln!(
                "demo: cannot start {}: {e} (build it first: cargo build --release)",
                relay_bin().display()
            );
            return ExitCode::FAILURE;
        }
    };
    if !wait_streaming(&pg, &mut relay, &interrupted) {
        stop(&mut relay);
        return ExitCode::FAILURE;
    }

    eprintln!("demo: inserting sample events every second (Ctrl-C to stop)");
    let mut i: u64 = 0;
    while (seconds == 0 || i < seconds) && !interrupted.load(Ordering::SeqCst) {
        i += 1;
        let n = i64::try_from(i).unwrap_or(i64::MAX);
        let inserted = app.transaction().and_then(|mut txn| {
            txn.execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
                 SELECT 'order', 'order-' || n, 'OrderCreated',
                        jsonb_build_object('order', n, 'total', n * 9.5)
                   FROM (SELECT $1::bigint AS n) AS i
                 UNION ALL
                 SELECT 'customer', 'customer-' || (n % 3), 'CustomerSeen',
                        jsonb_build_object('visits', n)
                   FROM (SELECT $1::bigint AS n) AS i",
                &[&n],
            )?;
            txn.commit()
        });
        if let Err(e) = inserted {
            eprintln!("demo: inserting sample events failed: {e:?}");
            break;
        }
        if let Ok(Some(status)) = relay.try_wait() {
            eprintln!("demo: the relay exited ({status}); see its error above");
            return ExitCode::FAILURE;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    eprintln!("demo: stopping the relay gracefully");
    if stop(&mut relay) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Waits until the relay streams from its slot, so the first sample events are part of
/// its stream; false when it exited or Ctrl-C came first.
fn wait_streaming(pg: &PgCluster, relay: &mut Child, interrupted: &AtomicBool) -> bool {
    let mut client = pg.client();
    let deadline = Instant::now() + START_WAIT;
    while Instant::now() < deadline && !interrupted.load(Ordering::SeqCst) {
        if let Ok(Some(status)) = relay.try_wait() {
            eprintln!("demo: the relay exited ({status}); see its error above");
            return false;
        }
        let streaming = client
            .query_one(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND active",
                &[&SLOT],
            )
            .map(|row| row.get::<_, i64>(0) == 1)
            .unwrap_or(false);
        if streaming {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !interrupted.load(Ordering::SeqCst) {
        eprintln!("demo: the relay did not start streaming within {START_WAIT:?}");
    }
    false
}

/// SIGTERM, then wait: the relay drains and acknowledges what it delivered.
fn stop(relay: &mut Child) -> bool {
    if let Ok(pid) = i32::try_from(relay.id()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    relay.wait().is_ok_and(|status| status.success())
}

/// Ctrl-C (SIGINT, which the relay receives too and drains on) ends the loop instead
/// of killing the demo, so PostgreSQL is stopped and its temp dir removed on the way out.
fn watch_for_ctrl_c(interrupted: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async {
            if tokio::signal::ctrl_c().await.is_ok() {
                interrupted.store(true, Ordering::SeqCst);
            }
        });
    });
}
