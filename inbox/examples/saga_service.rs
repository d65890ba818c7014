//! A saga across two services, each with its own database, outbox and relay (the
//! durable-workflow lesson): an order reserves stock and asks for payment; the payment
//! succeeds or fails; a failed payment is compensated by cancelling the order and
//! releasing its stock. Every step is one PostgreSQL transaction that claims the incoming
//! event in the inbox, changes the service's tables and writes the next event into the
//! service's outbox, so a step redelivered (the relay and Kafka deliver at least once)
//! changes nothing the second time.
//!
//! ```text
//!  orders DB                      Kafka                         payments DB
//!  place_order: stock -= qty,
//!    order PENDING, outbox ──relay──▶ outbox.event.order ──▶ payments step (inbox):
//!                                       OrderPlaced             wallet ≥ amount?
//!                                                               yes: debit, payment row,
//!                                                                    outbox PaymentCompleted
//!                                                               no:  outbox PaymentFailed
//!  orders step (inbox): ◀── outbox.event.payment ◀──relay──────┘
//!    PaymentCompleted: order CONFIRMED
//!    PaymentFailed:    order CANCELLED, stock += qty   (the compensation)
//! ```
//!
//! ```text
//! saga_service --service orders   --init --database-url URL     # tables and seed rows
//! saga_service --service payments --init --database-url URL
//! saga_service --service payments --brokers B --database-url URL    # runs until killed
//! saga_service --service orders   --brokers B --database-url URL
//! ```
//!
//! Placing an order is the orders service's own API; here it is the SQL function
//! `place_order(order_id, customer, sku, qty, amount)` that `--init` creates. Each
//! service prints `applied <event id> <type>` or `duplicate <event id> <type>` per record.

use clap::{Parser, ValueEnum};
use outbox_relay_inbox::{event_id, Applied, Inbox};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use serde_json::{json, Value};
use tokio_postgres::Transaction;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Service {
    Orders,
    Payments,
}

#[derive(Debug, Parser)]
struct Options {
    #[arg(long, value_enum)]
    service: Service,
    /// libpq-style connection string of the service's own database (holding the
    /// relay's outbox table, `sql/outbox.sql`).
    #[arg(long)]
    database_url: String,
    /// Create the service's tables (and seed stock or wallets), then exit.
    #[arg(long)]
    init: bool,
    #[arg(long, default_value = "")]
    brokers: String,
    /// Consumer group [default: the service's name]; the inbox keeps the service's name.
    #[arg(long)]
    group: Option<String>,
}

const ORDERS_SQL: &str = "
CREATE TABLE IF NOT EXISTS stock (sku text PRIMARY KEY, available int NOT NULL CHECK (available >= 0));
CREATE TABLE IF NOT EXISTS orders (
    id text PRIMARY KEY, customer text NOT NULL, sku text NOT NULL, qty int NOT NULL,
    amount bigint NOT NULL, status text NOT NULL);
INSERT INTO stock VALUES ('book', 10), ('lamp', 10) ON CONFLICT DO NOTHING;
CREATE OR REPLACE FUNCTION place_order(order_id text, customer text, sku text, qty int, amount bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE stock SET available = available - qty WHERE stock.sku = place_order.sku;
    INSERT INTO orders VALUES (order_id, customer, sku, qty, amount, 'PENDING');
    INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
    VALUES ('order', order_id, 'OrderPlaced',
            jsonb_build_object('order_id', order_id, 'customer', customer, 'amount', amount));
END $$;
";

const PAYMENTS_SQL: &str = "
CREATE TABLE IF NOT EXISTS wallet (customer text PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE IF NOT EXISTS payment (order_id text PRIMARY KEY, customer text NOT NULL, amount bigint NOT NULL);
INSERT INTO wallet VALUES ('alice', 100), ('bob', 30), ('dave', 10) ON CONFLICT DO NOTHING;
";

/// Why a step could not run (the service stops; the record comes again).
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("bad event: {0}")]
    Event(String),
}

fn field<'a>(event: &'a Value, name: &str) -> Result<&'a Value, Error> {
    event
        .get(name)
        .ok_or_else(|| Error::Event(format!("no {name:?} in {event}")))
}

fn text(event: &Value, name: &str) -> Result<String, Error> {
    field(event, name)?
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| Error::Event(format!("{name:?} is not text")))
}

/// Writes the next event of the saga into this service's outbox, in the step's
/// transaction: it leaves only if the step commits.
async fn emit(
    tx: &Transaction<'_>,
    kind: &str,
    key: &str,
    type_: &str,
    payload: Value,
) -> Result<(), Error> {
    tx.execute(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4::text::jsonb)",
        &[&kind, &key, &type_, &payload.to_string()],
    )
    .await?;
    Ok(())
}

/// The payments step for an `OrderPlaced` event.
async fn payments_step(tx: &Transaction<'_>, event: &Value) -> Result<(), Error> {
    let order_id = text(event, "order_id")?;
    let customer = text(event, "customer")?;
    let amount = field(event, "amount")?
        .as_i64()
        .ok_or_else(|| Error::Event("\"amount\" is not an integer".into()))?;
    let balance: Option<i64> = tx
        .query_opt(
            "SELECT balance FROM wallet WHERE customer = $1 FOR UPDATE",
            &[&customer],
        )
        .await?
        .map(|row| row.get(0));
    match balance {
        Some(balance) if balance >= amount => {
            tx.execute(
                "UPDATE wallet SET balance = balance - $2 WHERE customer = $1",
                &[&customer, &amount],
            )
            .await?;
            tx.execute(
                "INSERT INTO payment VALUES ($1, $2, $3)",
                &[&order_id, &customer, &amount],
            )
            .await?;
            emit(
                tx,
                "payment",
                &order_id,
                "PaymentCompleted",
                json!({ "order_id": order_id }),
            )
            .await
        }
        _ => {
            let reason = if balance.is_some() {
                "insufficient funds"
            } else {
                "no wallet"
            };
            emit(
                tx,
                "payment",
                &order_id,
                "PaymentFailed",
                json!({ "order_id": order_id, "reason": reason }),
            )
            .await
        }
    }
}

/// The orders step for a payment outcome: confirm, or compensate.
async fn orders_step(tx: &Transaction<'_>, type_: &str, event: &Value) -> Result<(), Error> {
    let order_id = text(event, "order_id")?;
    match type_ {
        "PaymentCompleted" => {
            tx.execute(
                "UPDATE orders SET status = 'CONFIRMED' WHERE id = $1 AND status = 'PENDING'",
                &[&order_id],
            )
            .await?;
        }
        "PaymentFailed" => {
            // The compensation of place_order: the order is cancelled, its stock released.
            let cancelled = tx
                .query_opt(
                    "UPDATE orders SET status = 'CANCELLED' WHERE id = $1 AND status = 'PENDING'
                     RETURNING sku, qty",
                    &[&order_id],
                )
                .await?;
            if let Some(row) = cancelled {
                let (sku, qty): (String, i32) = (row.get(0), row.get(1));
                tx.execute(
                    "UPDATE stock SET available = available + $2 WHERE sku = $1",
                    &[&sku, &qty],
                )
                .await?;
            }
        }
        other => return Err(Error::Event(format!("unexpected event type {other:?}"))),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = Options::parse();
    let (mut client, connection) =
        tokio_postgres::connect(&options.database_url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            eprintln!("saga_service: postgres connection: {err}");
        }
    });
    let (name, topic) = match options.service {
        Service::Orders => ("orders", "outbox.event.payment"),
        Service::Payments => ("payments", "outbox.event.order"),
    };
    let inbox = Inbox::new("public.inbox", name)?;
    if options.init {
        client.batch_execute(&inbox.create_table_sql()).await?;
        client
            .batch_execute(match options.service {
                Service::Orders => ORDERS_SQL,
                Service::Payments => PAYMENTS_SQL,
            })
            .await?;
        return Ok(());
    }
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &options.brokers)
        .set("group.id", options.group.as_deref().unwrap_or(name))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[topic])?;
    loop {
        let message = consumer.recv().await?;
        let headers = message.headers();
        let pairs = headers
            .iter()
            .flat_map(|headers| headers.iter().map(|h| (h.key, h.value)));
        let id = event_id(pairs)
            .map(str::to_owned)
            .ok_or("a record without an id header")?;
        let type_ = headers
            .iter()
            .flat_map(|headers| headers.iter())
            .find(|header| header.key == "type")
            .and_then(|header| header.value)
            .map(|value| String::from_utf8_lossy(value).into_owned())
            .unwrap_or_default();
        let event: Value = serde_json::from_slice(message.payload().unwrap_or_default())?;
        let service = options.service;
        let applied = inbox
            .apply(&mut client, &id, async |tx| match service {
                Service::Payments => payments_step(tx, &event).await,
                Service::Orders => orders_step(tx, &type_, &event).await,
            })
            .await?;
        match applied {
            Applied::New(()) => println!("applied {id} {type_}"),
            Applied::Duplicate => println!("duplicate {id} {type_}"),
        }
        consumer.commit_message(&message, CommitMode::Sync)?;
    }
}
