//! `outbox-relay check`: the preflight. It asks the live system everything the relay
//! will need, reports every problem at once, each with its fix, and changes nothing.
//!
//! ```text
//! Settings ──▶ gather (I/O, read-only) ──▶ PgFacts ────────▶ postgres::findings (pure) ─┐
//!          └─▶ sink::kafka_probe (I/O) ──▶ ClusterFacts ──▶ kafka::findings (pure) ────┤
//!                                                                                      ▼
//!                                                     Report: text for people, or JSON
//! ```
//!
//! The I/O parts only collect facts; every judgement is in the pure parts, unit-tested
//! on facts written by hand. A check that cannot connect says so and skips what needs
//! that connection. Secrets never reach a finding: the URL is shown by its non-secret
//! parts ([`crate::pg::url::ConnectParams::redacted`]), configuration errors of secret
//! keys name the key and never the value, and librdkafka's configuration errors of
//! secret properties are rebuilt from the property's name
//! ([`crate::sink::kafka_config::KafkaConfig::client_error`]). Nothing is searched for
//! and replaced in finished text: a password equal to a user, database or table name
//! would be starred out of them.

pub mod facts;
mod gather;
pub mod kafka;
mod messages;
pub mod postgres;
mod slot;

use std::time::Duration;

use serde::Serialize;

use crate::pg::conn::PgError;
use crate::relay::settings::Settings;
use crate::sink::{kafka_probe, SinkSpec};

/// How long the Kafka metadata request may take (as the sink's own admin requests).
pub const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// How a finding stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// The relay would not start, or would stop or lose its way: exit 1.
    Problem,
    /// Worth knowing; the relay runs.
    Warning,
}

/// One finding: what was checked, how it stands, and the fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// A stable name (`postgres.wal_level`, `outbox.id_column`, `kafka.brokers`, ...).
    pub id: String,
    pub status: Status,
    pub message: String,
    /// What to do; `None` for an ok finding.
    pub fix: Option<String>,
}

impl Finding {
    pub fn ok(id: &str, message: impl Into<String>) -> Self {
        Finding {
            id: id.to_owned(),
            status: Status::Ok,
            message: message.into(),
            fix: None,
        }
    }

    pub fn problem(id: &str, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Finding {
            id: id.to_owned(),
            status: Status::Problem,
            message: message.into(),
            fix: Some(fix.into()),
        }
    }

    pub fn warning(id: &str, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Finding {
            id: id.to_owned(),
            status: Status::Warning,
            message: message.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Every finding of one run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn new(findings: Vec<Finding>) -> Self {
        Report { findings }
    }

    /// Whether any finding is a problem (exit 1).
    pub fn has_problems(&self) -> bool {
        self.findings.iter().any(|f| f.status == Status::Problem)
    }

    /// One line per finding, its fix indented under it, and a summary.
    pub fn text(&self) -> String {
        let width = self.findings.iter().map(|f| f.id.len()).max().unwrap_or(0);
        let mut text = String::new();
        for finding in &self.findings {
            let status = match finding.status {
                Status::Ok => "ok",
                Status::Problem => "PROBLEM",
                Status::Warning => "warning",
            };
            text.push_str(&format!(
                "{status:<8} {:<width$}  {}\n",
                finding.id, finding.message
            ));
            if let Some(fix) = &finding.fix {
                text.push_str(&format!("{:<8} {:<width$}  fix: {fix}\n", "", ""));
            }
        }
        let count = |status| self.findings.iter().filter(|f| f.status == status).count();
        let (problems, warnings) = (count(Status::Problem), count(Status::Warning));
        text.push_str(&if problems > 0 {
            format!("{problems} problem(s), {warnings} warning(s): fix the problems before `outbox-relay run`\n")
        } else {
            format!("no problems, {warnings} warning(s): the relay can run\n")
        });
        text
    }

    /// The findings as a JSON array of `{id, status, message, fix}`.
    pub fn json(&self) -> String {
        let text = serde_json::to_string_pretty(&self.findings).unwrap_or_else(|e| {
            format!(
                "[{{\"id\":\"check\",\"status\":\"problem\",\"message\":{:?},\"fix\":null}}]",
                e.to_string()
            )
        });
        text
    }
}

/// The finding of a configuration that loaded.
pub fn config_ok(path: &str) -> Finding {
    Finding::ok("config", format!("{path} is a valid configuration"))
}

/// Findings for a configuration that did not load: one per problem.
pub fn config_problems(problems: &[String]) -> Vec<Finding> {
    problems
        .iter()
        .map(|problem| {
            Finding::problem(
                "config",
                problem.clone(),
                "fix the key the message names (docs/configuration.md)",
            )
        })
        .collect()
}

/// The live checks, after the configuration loaded. `config_hint` is the
/// `--config FILE` the fixes name.
pub async fn live(settings: &Settings, config_hint: &str) -> Vec<Finding> {
    let spec = settings.source();
    let pg = async {
        match gather::pg_facts(&settings.connect, &spec).await {
            Ok((facts, spec)) => {
                // The tables the patterns matched follow the listed ones, each checked
                // against its entry's router.
                let target = facts::Target {
                    spec: &spec,
                    outboxes: spec
                        .tables
                        .iter()
                        .filter_map(|table| {
                            let entry = settings.entry_of(table)?;
                            let outbox = &settings.outboxes[entry];
                            let key = if settings.outboxes.len() > 1 {
                                format!("outbox[{entry}]")
                            } else {
                                "outbox".to_owned()
                            };
                            Some(facts::OutboxTarget::entry(
                                &outbox.router,
                                key,
                                outbox.pattern.is_some(),
                            ))
                        })
                        .collect(),
                    config_hint: config_hint.to_owned(),
                };
                let mut findings = vec![Finding::ok(
                    "postgres.connection",
                    format!(
                        "connected to {} as {:?}",
                        settings.connect.redacted(),
                        facts.server.user
                    ),
                )];
                findings.extend(postgres::findings(&facts, &target));
                findings
            }
            Err(error) => vec![connection_problem(settings, &error)],
        }
    };
    let kafka = async {
        let SinkSpec::Kafka(config) = &settings.sink else {
            return Vec::new();
        };
        let cluster = kafka_probe::cluster_facts(config, KAFKA_TIMEOUT).await;
        kafka::findings(
            &cluster,
            &kafka::Target {
                brokers: &config.brokers,
                create_topics: config.create_topics,
                routes: settings
                    .outboxes
                    .iter()
                    .map(|outbox| kafka::Route {
                        table: (settings.outboxes.len() > 1).then(|| outbox.table.to_string()),
                        constant_topic: outbox.router.constant_topic(),
                        topic_prefix: outbox.router.topic_prefix(),
                    })
                    .collect(),
                dead_letter_topic: settings.dead_letter_topic.as_deref(),
            },
        )
    };
    let (mut findings, kafka) = tokio::join!(pg, kafka);
    findings.extend(kafka);
    findings
}

fn connection_problem(settings: &Settings, error: &PgError) -> Finding {
    let fix = match error {
        PgError::Authentication { .. } => "check the user and password in [postgres] url (or PGPASSWORD) and the server's pg_hba.conf",
        PgError::Db(db) if db.code == "3D000" => "check the database name in [postgres] url (the outbox table's database)",
        PgError::Db(db) if db.code == "28000" => "add a pg_hba.conf line allowing this user, database and address (for the relay, also its replication connections), then reload PostgreSQL",
        PgError::Db(_) => "the server's message says what it refused",
        _ => "check host and port in [postgres] url, that PostgreSQL runs and listens there (listen_addresses), and that no firewall is in the way",
    };
    Finding::problem(
        "postgres.connection",
        format!(
            "cannot connect to {}: {error}; the other PostgreSQL checks need this connection",
            settings.connect.redacted()
        ),
        fix,
    )
}

#[cfg(test)]
mod tests;
