//! The saga example (`examples/saga_service.rs`) end to end: two services, each with its
//! own database, outbox and relay, talking through Apache Kafka. Orders that can be paid
//! are confirmed; orders that cannot are cancelled and their stock released (the
//! compensation). Then both services run again under new consumer groups, so every
//! event of the saga is delivered to them a second time: each step must turn out a
//! duplicate, and no balance, stock level or order status may change.

use std::collections::BTreeMap;
use std::process::Command;

mod common;

use outbox_relay_harness as support;
use support::kafka::{create_topic, KafkaBroker};
use support::outbox::{start_streaming, OUTBOX_SQL, WAIT};
use support::{ChildProcess, PgCluster, RelayProcess};

fn database_url(pg: &PgCluster, db: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user=postgres dbname={db}",
        pg.port()
    )
}

fn service(pg: &PgCluster, name: &str, args: &[&str]) -> Command {
    let mut command = Command::new(common::example("saga_service"));
    command
        .args(["--service", name, "--database-url"])
        .arg(database_url(pg, name))
        .args(args);
    command
}

/// The relay of one service's database: its own slot, the `type` column as a header.
fn relay(pg: &PgCluster, db: &str, bootstrap: &str) -> RelayProcess {
    start_streaming(&format!(
        "[postgres]\nurl = \"{}\"\nslot = \"relay_{db}\"\npublication = \"relay_{db}\"\n\
         status_interval_ms = 200\n\
         [outbox]\ntable = \"public.outbox\"\nadditional = [\"type:header:type\"]\n\
         [sink]\ntype = \"kafka\"\n[kafka]\nbrokers = \"{bootstrap}\"\n",
        pg.url("postgres", None, db)
    ))
}

/// Everything the saga changes, to compare before and after the redelivery.
#[derive(Debug, Clone, PartialEq, Eq)]
struct State {
    orders: BTreeMap<String, String>,
    stock: BTreeMap<String, i32>,
    wallets: BTreeMap<String, i64>,
    payments: BTreeMap<String, i64>,
}

fn state(pg: &PgCluster) -> State {
    let mut orders_db = pg.client_db("orders");
    let mut payments_db = pg.client_db("payments");
    let pairs = |client: &mut postgres::Client, sql: &str| -> Vec<postgres::Row> {
        client
            .query(sql, &[])
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    };
    State {
        orders: pairs(&mut orders_db, "SELECT id, status FROM orders")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect(),
        stock: pairs(&mut orders_db, "SELECT sku, available FROM stock")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect(),
        wallets: pairs(&mut payments_db, "SELECT customer, balance FROM wallet")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect(),
        payments: pairs(&mut payments_db, "SELECT order_id, amount FROM payment")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect(),
    }
}

fn settled(pg: &PgCluster) -> bool {
    let mut orders_db = pg.client_db("orders");
    orders_db
        .query_one("SELECT count(*) FROM orders WHERE status = 'PENDING'", &[])
        .map(|row| row.get::<_, i64>(0) == 0)
        .unwrap_or(false)
}

#[test]
fn the_saga_confirms_or_compensates_each_order_once() {
    let broker = KafkaBroker::start();
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "outbox.event.order", 3);
    create_topic(&bootstrap, "outbox.event.payment", 3);
    let pg = PgCluster::start();
    for db in ["orders", "payments"] {
        pg.batch_execute(&format!("CREATE DATABASE {db}"));
        pg.client_db(db)
            .batch_execute(OUTBOX_SQL)
            .unwrap_or_else(|e| panic!("outbox in {db}: {e}"));
        let status = service(&pg, db, &["--init"])
            .status()
            .expect("saga_service --init");
        assert!(
            status.success(),
            "saga_service --service {db} --init: {status}"
        );
    }
    let _orders_relay = relay(&pg, "orders", &bootstrap);
    let _payments_relay = relay(&pg, "payments", &bootstrap);
    let orders = ChildProcess::spawn("orders", service(&pg, "orders", &["--brokers", &bootstrap]));
    let payments = ChildProcess::spawn(
        "payments",
        service(&pg, "payments", &["--brokers", &bootstrap]),
    );

    // alice (100) pays for o-1 (40) and o-2 (50), bob (30) for o-4 (30); dave (10)
    // cannot pay o-3 (20); carol has no wallet (o-5). No outcome depends on the order in
    // which one customer's payments are taken (events are keyed by event id, so they
    // spread over partitions). Stock: book 10, lamp 10.
    let placed = [
        ("o-1", "alice", "book", 2i32, 40i64),
        ("o-2", "alice", "lamp", 1, 50),
        ("o-3", "dave", "book", 3, 20),
        ("o-4", "bob", "lamp", 4, 30),
        ("o-5", "carol", "book", 1, 5),
    ];
    let mut orders_db = pg.client_db("orders");
    for (id, customer, sku, qty, amount) in placed {
        orders_db
            .execute(
                "SELECT place_order($1, $2, $3, $4, $5)",
                &[&id, &customer, &sku, &qty, &amount],
            )
            .unwrap_or_else(|e| panic!("placing {id}: {e}"));
    }
    support::wait_until("every order confirmed or cancelled", WAIT, || settled(&pg));
    // 5 OrderPlaced through payments, 5 outcomes through orders.
    payments.wait_for_lines(5, WAIT);
    orders.wait_for_lines(5, WAIT);
    let after = state(&pg);
    let expected = State {
        orders: [
            ("o-1", "CONFIRMED"),
            ("o-2", "CONFIRMED"),
            ("o-3", "CANCELLED"),
            ("o-4", "CONFIRMED"),
            ("o-5", "CANCELLED"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
        // book: 10 - 2 (o-1); o-3's 3 and o-5's 1 released. lamp: 10 - 1 - 4.
        stock: [("book", 8), ("lamp", 5)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        wallets: [("alice", 10), ("bob", 0), ("dave", 10)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        payments: [("o-1", 40), ("o-2", 50), ("o-4", 30)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    };
    assert_eq!(after, expected, "the saga's outcome");
    orders.kill9();
    payments.kill9();

    // Every event of the saga again: new groups read both topics from the start.
    let orders = ChildProcess::spawn(
        "orders-replay",
        service(
            &pg,
            "orders",
            &["--brokers", &bootstrap, "--group", "orders-replay"],
        ),
    );
    let payments = ChildProcess::spawn(
        "payments-replay",
        service(
            &pg,
            "payments",
            &["--brokers", &bootstrap, "--group", "payments-replay"],
        ),
    );
    let replayed: Vec<String> = payments
        .wait_for_lines(5, WAIT)
        .into_iter()
        .chain(orders.wait_for_lines(5, WAIT))
        .collect();
    let applied: Vec<&String> = replayed
        .iter()
        .filter(|line| !line.starts_with("duplicate "))
        .collect();
    assert!(
        applied.is_empty(),
        "redelivered steps ran again: {applied:?}"
    );
    assert_eq!(state(&pg), expected, "the redelivery changed nothing");
}
