//! The inbox against real components: the relay delivers outbox events from PostgreSQL
//! to Apache Kafka; a consumer applies them through `Inbox` into its own tables, then
//! again (a consumer that crashed before committing its offsets reads everything
//! again), again in reverse order, and twice at once from two sessions (a rebalance
//! hands a partition to a second consumer while the first still works on it). Every
//! event's effect must be in the ledger exactly once, by event id.

use std::collections::{BTreeMap, BTreeSet};

mod common;

use outbox_relay_harness as support;
use outbox_relay_inbox::{event_id, Applied, Inbox};
use support::kafka::{consume, create_topic, KafkaBroker, Record};
use support::outbox::{cluster_with_outbox, kafka_config, start_streaming, WAIT};
use support::PgOptions;

const TOPIC: &str = "outbox.event.account";
const EVENTS: usize = 120;

const BUSINESS_SQL: &str = "
CREATE TABLE account (id text PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE ledger (event_id text NOT NULL, account text NOT NULL, amount bigint NOT NULL);
";

/// Applies one record through the inbox: a ledger row and the account's credit.
async fn apply(inbox: &Inbox, client: &mut tokio_postgres::Client, record: &Record) -> Applied<()> {
    let id = event_id(
        record
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_deref())),
    )
    .unwrap_or_else(|| panic!("record without an id header: {record:?}"))
    .to_owned();
    let event: serde_json::Value =
        serde_json::from_slice(record.value.as_deref().expect("a value")).expect("JSON");
    let account = event["account"].as_str().expect("account").to_owned();
    let amount = event["amount"].as_i64().expect("amount");
    inbox
        .apply(client, &id, async |tx| {
            tx.execute(
                "INSERT INTO ledger (event_id, account, amount) VALUES ($1, $2, $3)",
                &[&id, &account, &amount],
            )
            .await?;
            tx.execute(
                "INSERT INTO account (id, balance) VALUES ($1, $2)
                 ON CONFLICT (id) DO UPDATE SET balance = account.balance + EXCLUDED.balance",
                &[&account, &amount],
            )
            .await?;
            Ok::<(), tokio_postgres::Error>(())
        })
        .await
        .unwrap_or_else(|err| panic!("applying {id}: {err}"))
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connecting the consumer");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A broker with the topic, a cluster with the outbox (database `app`) and the
/// consumer's database `billing`, and the relay streaming from one to the other.
fn relay_to_kafka() -> (KafkaBroker, support::PgCluster, support::RelayProcess) {
    let broker = KafkaBroker::start();
    create_topic(&broker.bootstrap(), TOPIC, 3);
    let pg = cluster_with_outbox(PgOptions::default());
    pg.batch_execute("CREATE DATABASE billing");
    let relay = start_streaming(&kafka_config(&pg, &broker.bootstrap(), "", None, &[]));
    (broker, pg, relay)
}

#[test]
fn each_event_applies_once_however_often_it_is_delivered() {
    let (broker, pg, _relay) = relay_to_kafka();
    let bootstrap = broker.bootstrap();

    // The producing service: events crediting five accounts.
    let mut expected_ids = BTreeSet::new();
    let mut expected_balance: BTreeMap<String, i64> = BTreeMap::new();
    let mut app = pg.client_db("app");
    for i in 0..EVENTS {
        let account = format!("a-{}", i % 5);
        let amount = i as i64 + 1;
        let payload = serde_json::json!({ "account": account, "amount": amount });
        let id: String = app
            .query_one(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
                 VALUES ('account', $1, 'Credited', $2::text::jsonb) RETURNING id::text",
                &[&account, &payload.to_string()],
            )
            .expect("insert")
            .get(0);
        expected_ids.insert(id);
        *expected_balance.entry(account).or_default() += amount;
    }
    let records = consume(&bootstrap, &[TOPIC], EVENTS, WAIT);
    assert_eq!(records.len(), EVENTS, "the relay delivered every event");

    let url = pg.url("postgres", None, "billing");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (first, replays) = runtime.block_on(async {
        let inbox = Inbox::new("public.inbox", "billing").expect("inbox");
        let mut client = connect(&url).await;
        client
            .batch_execute(&inbox.create_table_sql())
            .await
            .expect("inbox table");
        client
            .batch_execute(BUSINESS_SQL)
            .await
            .expect("business tables");

        let mut first = Vec::new();
        for record in &records {
            first.push(apply(&inbox, &mut client, record).await);
        }
        // Redelivered: all again, then all again in reverse, then by two sessions at
        // once, each of them everything.
        let mut replays = Vec::new();
        for record in records.iter().chain(records.iter().rev()) {
            replays.push(apply(&inbox, &mut client, record).await);
        }
        let twice = |records: Vec<Record>| {
            let (url, inbox) = (url.clone(), inbox.clone());
            tokio::spawn(async move {
                let mut client = connect(&url).await;
                let mut outcomes = Vec::new();
                for record in &records {
                    outcomes.push(apply(&inbox, &mut client, record).await);
                }
                outcomes
            })
        };
        let (a, b) = (twice(records.clone()), twice(records.clone()));
        replays.extend(a.await.expect("first session"));
        replays.extend(b.await.expect("second session"));
        (first, replays)
    });

    assert!(
        first.iter().all(|outcome| *outcome == Applied::New(())),
        "a first delivery was taken for a duplicate: {first:?}"
    );
    let applied_again = replays
        .iter()
        .filter(|outcome| **outcome != Applied::Duplicate)
        .count();
    assert_eq!(applied_again, 0, "redeliveries applied again");

    let mut billing = pg.client_db("billing");
    let mut ledger: BTreeMap<String, i64> = BTreeMap::new();
    for row in billing
        .query("SELECT event_id FROM ledger", &[])
        .expect("ledger")
    {
        *ledger.entry(row.get(0)).or_default() += 1;
    }
    let twice: Vec<_> = ledger.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "events applied more than once: {twice:?}");
    let ids: BTreeSet<String> = ledger.into_keys().collect();
    assert_eq!(
        ids, expected_ids,
        "the ledger holds exactly the events written"
    );
    let balances: BTreeMap<String, i64> = billing
        .query("SELECT id, balance FROM account", &[])
        .expect("accounts")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(balances, expected_balance, "each credit counted once");
}

fn run_example(bootstrap: &str, pg: &support::PgCluster, group: &str) -> support::ChildProcess {
    let mut command = std::process::Command::new(common::example("inbox_consumer"));
    command
        .args(["--brokers", bootstrap, "--topic", TOPIC, "--group", group])
        .args(["--inbox-consumer", "billing", "--database-url"])
        .arg(format!(
            "host=127.0.0.1 port={} user=postgres dbname=billing",
            pg.port()
        ));
    support::ChildProcess::spawn("inbox_consumer", command)
}

fn ledger_ids(pg: &support::PgCluster) -> Vec<String> {
    pg.client_db("billing")
        .query("SELECT event_id FROM ledger ORDER BY event_id", &[])
        .map(|rows| rows.iter().map(|row| row.get(0)).collect())
        .unwrap_or_default()
}

fn credit(pg: &support::PgCluster, n: usize) -> BTreeSet<String> {
    let mut app = pg.client_db("app");
    (0..n)
        .map(|i| {
            let payload = serde_json::json!({ "account": format!("a-{}", i % 3), "amount": 1 });
            app.query_one(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
                 VALUES ('account', 'a', 'Credited', $1::text::jsonb) RETURNING id::text",
                &[&payload.to_string()],
            )
            .expect("insert")
            .get(0)
        })
        .collect()
}

#[test]
fn the_example_consumer_killed_and_replaying_applies_each_event_once() {
    let (broker, pg, _relay) = relay_to_kafka();
    let bootstrap = broker.bootstrap();

    // First run: applies the first batch, then is killed without warning.
    let first_batch = credit(&pg, 40);
    let consumer = run_example(&bootstrap, &pg, "billing");
    support::wait_until("the first batch applied", WAIT, || {
        ledger_ids(&pg).len() >= first_batch.len()
    });
    consumer.kill9();

    // Second run, a new group: Kafka hands it every record from the start, the first
    // batch again included; the inbox must turn those into duplicates.
    let second_batch = credit(&pg, 40);
    let replay = run_example(&bootstrap, &pg, "billing-replay");
    let lines = replay.wait_for_lines(first_batch.len() + second_batch.len(), WAIT);
    replay.kill9();

    let ids = ledger_ids(&pg);
    let unique: BTreeSet<String> = ids.iter().cloned().collect();
    assert_eq!(ids.len(), unique.len(), "an event applied twice: {ids:?}");
    let all: BTreeSet<String> = first_batch.union(&second_batch).cloned().collect();
    assert_eq!(unique, all, "the ledger holds exactly the events written");
    let duplicates: BTreeSet<String> = lines
        .iter()
        .filter_map(|line| line.strip_prefix("duplicate "))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        duplicates, first_batch,
        "the replay reported the first batch as duplicates; its output: {lines:?}"
    );
}
