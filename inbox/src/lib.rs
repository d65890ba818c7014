//! The consumer side of the outbox: apply each event's effect exactly once.
//!
//! The relay delivers at least once: after a crash, a PostgreSQL restart or a broker
//! outage an event can arrive again, and a consumer that crashed before committing its
//! Kafka offset reads it again too. The inbox makes the *effect* happen once: the
//! consumer records the event id in an inbox table in the same PostgreSQL transaction as
//! its business change, and a second delivery finds the id taken and changes nothing.
//!
//! ```text
//! record (header `id` = event id) ──▶ BEGIN
//!                                      INSERT INTO inbox (consumer, event_id)
//!                                        VALUES ($1, $2) ON CONFLICT DO NOTHING
//!                                      ├─ 1 row: new      ──▶ business change, COMMIT
//!                                      └─ 0 rows: applied ──▶ ROLLBACK (nothing to do)
//!                                    then commit the Kafka offset
//! ```
//!
//! Why it is exactly once: the id and the effect commit together or not at all, so the
//! inbox holds an id exactly when its effect is in the database. A crash before COMMIT
//! leaves neither (the redelivery applies it); a crash after COMMIT but before the
//! offset commit leaves both (the redelivery finds the id). Two consumers handed the same
//! event at once (a rebalance) serialize on the id's primary key: the second INSERT waits
//! for the first transaction and then inserts nothing if it committed.
//!
//! ```no_run
//! # async fn example(client: &mut tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
//! use outbox_relay_inbox::{Applied, Inbox};
//!
//! let inbox = Inbox::new("public.inbox", "billing").expect("a valid table name");
//! client.batch_execute(&inbox.create_table_sql()).await?;
//! let applied = inbox
//!     .apply(client, "2b7e…-event-id", async |tx| {
//!         tx.execute("UPDATE account SET balance = balance + 10 WHERE id = 'a-1'", &[])
//!             .await
//!     })
//!     .await?;
//! if let Applied::Duplicate = applied { /* seen before: nothing changed */ }
//! # Ok(()) }
//! ```
//!
//! The table: `(consumer text, event_id text, applied_at timestamptz)`, primary key
//! `(consumer, event_id)`, so several consumers (services) can share one table and each
//! applies every event once. Old rows can be deleted once redeliveries that old can no
//! longer come (past the topic's retention). The same protocol in plain SQL, for
//! consumers in other languages, is in `docs/inbox.md`.

#![forbid(unsafe_code)]

use tokio_postgres::{Client, Transaction};

/// What [`Inbox::claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The id was not in the inbox; it is now (uncommitted, with the caller's transaction).
    New,
    /// The id was already there: the event was applied before.
    Duplicate,
}

/// What [`Inbox::apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied<T> {
    /// The effect ran and committed with the id; its result.
    New(T),
    /// The event was applied before; the effect did not run.
    Duplicate,
}

/// A table name the inbox cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InboxError {
    #[error("inbox table name {0:?}: give `table` or `schema.table`, each part non-empty")]
    TableName(String),
    #[error("inbox consumer name must not be empty")]
    EmptyConsumer,
}

/// An inbox table and the consumer (service) name its rows are recorded under.
#[derive(Debug, Clone)]
pub struct Inbox {
    /// The table, quoted for SQL.
    table: String,
    consumer: String,
    claim_sql: String,
}

impl Inbox {
    /// `table` is `name` or `schema.name` (taken literally, quoted, not case-folded);
    /// `consumer` names the service applying the events.
    pub fn new(table: &str, consumer: &str) -> Result<Self, InboxError> {
        let parts: Vec<&str> = table.split('.').collect();
        if parts.is_empty() || parts.len() > 2 || parts.iter().any(|part| part.is_empty()) {
            return Err(InboxError::TableName(table.to_owned()));
        }
        if consumer.is_empty() {
            return Err(InboxError::EmptyConsumer);
        }
        let table = parts
            .iter()
            .map(|part| quote_ident(part))
            .collect::<Vec<_>>()
            .join(".");
        Ok(Inbox {
            claim_sql: format!(
                "INSERT INTO {table} (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
            ),
            table,
            consumer: consumer.to_owned(),
        })
    }

    /// `CREATE TABLE IF NOT EXISTS` for the inbox.
    pub fn create_table_sql(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n    \
                 consumer   text        NOT NULL,\n    \
                 event_id   text        NOT NULL,\n    \
                 applied_at timestamptz NOT NULL DEFAULT now(),\n    \
                 PRIMARY KEY (consumer, event_id)\n\
             )",
            self.table
        )
    }

    /// Records `event_id` in the inbox inside `tx`: [`Claim::New`] when it was not there
    /// (apply the effect in the same `tx`, then commit), [`Claim::Duplicate`] when it was
    /// (roll back or commit: nothing was written). Waits while another transaction
    /// holds the same id uncommitted.
    pub async fn claim(
        &self,
        tx: &Transaction<'_>,
        event_id: &str,
    ) -> Result<Claim, tokio_postgres::Error> {
        let inserted = tx
            .execute(&self.claim_sql, &[&self.consumer, &event_id])
            .await?;
        Ok(if inserted == 1 {
            Claim::New
        } else {
            Claim::Duplicate
        })
    }

    /// One transaction: [`Inbox::claim`], then `effect` when the event is new, then
    /// COMMIT. An error from `effect` rolls everything back (the id too: a redelivery
    /// tries again).
    pub async fn apply<T, E, F>(
        &self,
        client: &mut Client,
        event_id: &str,
        effect: F,
    ) -> Result<Applied<T>, E>
    where
        F: AsyncFnOnce(&Transaction<'_>) -> Result<T, E>,
        E: From<tokio_postgres::Error>,
    {
        let tx = client.transaction().await?;
        match self.claim(&tx, event_id).await? {
            Claim::Duplicate => {
                tx.rollback().await?;
                Ok(Applied::Duplicate)
            }
            Claim::New => {
                let out = effect(&tx).await?;
                tx.commit().await?;
                Ok(Applied::New(out))
            }
        }
    }
}

/// The event id of a record the relay produced: its `id` header (the relay, like
/// Debezium's outbox router, puts the event id there whatever the key is), as UTF-8.
pub fn event_id<'a>(
    headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
) -> Option<&'a str> {
    headers
        .into_iter()
        .find(|(name, _)| *name == "id")
        .and_then(|(_, value)| value)
        .and_then(|value| std::str::from_utf8(value).ok())
}

/// `"name"` with embedded quotes doubled.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_quoted_and_checked() {
        let inbox = Inbox::new("billing.inbox", "svc").expect("valid");
        assert!(inbox.create_table_sql().contains("\"billing\".\"inbox\""));
        assert!(inbox
            .claim_sql
            .starts_with("INSERT INTO \"billing\".\"inbox\" "));
        let odd = Inbox::new("In\"box", "svc").expect("valid");
        assert!(odd.create_table_sql().contains("\"In\"\"box\""));
        for bad in ["", ".", "a.", ".b", "a.b.c"] {
            assert_eq!(
                Inbox::new(bad, "svc").unwrap_err(),
                InboxError::TableName(bad.to_owned())
            );
        }
        assert_eq!(
            Inbox::new("inbox", "").unwrap_err(),
            InboxError::EmptyConsumer
        );
    }

    #[test]
    fn the_event_id_is_the_id_header() {
        let headers = [("type", Some(&b"Created"[..])), ("id", Some(&b"e-1"[..]))];
        assert_eq!(event_id(headers), Some("e-1"));
        assert_eq!(event_id([("id", None)]), None);
        assert_eq!(event_id([("id", Some(&[0xff][..]))]), None);
        assert_eq!(event_id([("type", Some(&b"x"[..]))]), None);
    }
}
