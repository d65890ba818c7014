//! A consumer that applies outbox events exactly once through the inbox: it credits
//! accounts from events `{"account": "...", "amount": N}` read from a Kafka topic the
//! relay writes, recording each event in a ledger, and commits its Kafka offset only
//! after the PostgreSQL transaction (inbox row + ledger + balance) committed.
//!
//! ```text
//! cargo run -p outbox-relay-inbox --example inbox_consumer -- \
//!     --brokers 127.0.0.1:9092 --topic outbox.event.account --group billing \
//!     --database-url 'host=127.0.0.1 port=5432 user=postgres dbname=app'
//! ```
//!
//! Kill it at any moment and start it again: events after the last committed offset
//! come again, and the inbox turns each repeat into "duplicate" instead of a second
//! credit. It prints one line per record: `applied <id>` or `duplicate <id>`.

use clap::Parser;
use outbox_relay_inbox::{event_id, Applied, Inbox};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};

#[derive(Debug, Parser)]
struct Options {
    #[arg(long)]
    brokers: String,
    #[arg(long)]
    topic: String,
    /// Consumer group.
    #[arg(long, default_value = "billing")]
    group: String,
    /// The name the inbox records events under [default: the group]. Keep it when the
    /// group changes: a new group reads the topic from the start, and the inbox still
    /// knows what this service applied.
    #[arg(long)]
    inbox_consumer: Option<String>,
    /// libpq-style connection string of the consumer's own database.
    #[arg(long)]
    database_url: String,
}

/// The consumer's business tables, next to its inbox.
const BUSINESS_SQL: &str = "
CREATE TABLE IF NOT EXISTS account (id text PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (event_id text NOT NULL, account text NOT NULL, amount bigint NOT NULL);
";

/// Why one record could not be applied (the consumer stops; the record comes again).
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("bad payload: {0}")]
    Payload(String),
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = Options::parse();
    let (mut client, connection) =
        tokio_postgres::connect(&options.database_url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            eprintln!("inbox_consumer: postgres connection: {err}");
        }
    });
    let inbox = Inbox::new(
        "public.inbox",
        options.inbox_consumer.as_deref().unwrap_or(&options.group),
    )?;
    client.batch_execute(&inbox.create_table_sql()).await?;
    client.batch_execute(BUSINESS_SQL).await?;

    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &options.brokers)
        .set("group.id", &options.group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[&options.topic])?;
    loop {
        let message = consumer.recv().await?;
        let headers = message.headers();
        let pairs = headers
            .iter()
            .flat_map(|headers| headers.iter().map(|h| (h.key, h.value)));
        let Some(id) = event_id(pairs).map(str::to_owned) else {
            eprintln!(
                "inbox_consumer: record at {}/{}@{} has no id header; skipped",
                message.topic(),
                message.partition(),
                message.offset()
            );
            consumer.commit_message(&message, CommitMode::Sync)?;
            continue;
        };
        let payload = message.payload().unwrap_or_default();
        let applied = inbox
            .apply(&mut client, &id, async |tx| {
                let event: serde_json::Value = serde_json::from_slice(payload)
                    .map_err(|err| Error::Payload(err.to_string()))?;
                let account = event["account"]
                    .as_str()
                    .ok_or_else(|| Error::Payload("no \"account\"".into()))?;
                let amount = event["amount"]
                    .as_i64()
                    .ok_or_else(|| Error::Payload("no integer \"amount\"".into()))?;
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
                Ok::<(), Error>(())
            })
            .await?;
        match applied {
            Applied::New(()) => println!("applied {id}"),
            Applied::Duplicate => println!("duplicate {id}"),
        }
        // Only now: a crash before this line makes Kafka deliver the record again,
        // which the inbox then reports as a duplicate.
        consumer.commit_message(&message, CommitMode::Sync)?;
    }
}
