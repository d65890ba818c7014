//! `outbox-relay run --config FILE`: the command line. Here: the arguments of each
//! command (the help text), the logs, and the one path every command runs
//! ([`execute`]: load the configuration, build the runtime, run, say the failure);
//! what each command does with its arguments is in `commands.rs`.

#![forbid(unsafe_code)]

mod commands;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use outbox_relay::config::{Config, ConfigError, Validated};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "outbox-relay",
    version,
    about = "Transactional outbox relay: PostgreSQL logical replication to Kafka (or stdout)"
)]
struct Cli {
    /// Log lines as text for people (default) or as one JSON object per line for log
    /// pipelines (Loki, Elasticsearch, CloudWatch). Logs go to stderr either way.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// `slot status`'s exit code for a lost or invalidated slot (1 is "could not tell": bad
/// configuration, PostgreSQL unreachable).
const SLOT_LOST_EXIT: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs go to stderr: stdout belongs to the stdout sink's events.
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        );
    match cli.log_format {
        // Colours only for a person at a terminal, never in log files or pipes.
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        // One object per line: timestamp, level, target, message and the fields.
        LogFormat::Json => {
            logs.json().flatten_event(true).init();
            JSON_LOGS.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    cli.command.execute()
}

#[derive(Subcommand)]
enum Command {
    /// Run the relay until SIGTERM or SIGINT.
    Run(Run),
    /// Check the configuration, then everything the relay needs on the live system
    /// (PostgreSQL, the outbox table, publication, slot, Kafka), changing nothing.
    /// Lists every problem with its fix; exit 1 if there is any.
    Check(Check),
    /// Print the SQL that sets up a database for the relay (the outbox table, its
    /// state table, the publication, a relay role and an application role that may
    /// only INSERT into the outbox); with --apply, run it.
    Init(Init),
    /// Manage the replication slot.
    Slot {
        #[command(subcommand)]
        command: SlotCommand,
    },
    /// Delete outbox rows older than --older-than that the slot has provably passed, in
    /// short batches (a partitioned outbox: whole old partitions are dropped). Refuses
    /// when the relay lags behind the rows it would delete.
    Cleanup(Cleanup),
    /// Re-send the outbox rows still in the table from a given time on (after a lost
    /// slot or an outbox that left the publication). At-least-once: consumers
    /// deduplicate by event id.
    Backfill(Backfill),
}

#[derive(Subcommand)]
enum SlotCommand {
    /// Create the slot. After a slot the relay streamed from was lost, only with
    /// --accept-gap: the new slot starts at the current position, and events committed
    /// since the old one's last acknowledged position must be re-sent (backfill).
    Create(SlotCreate),
    /// Where the slot stands: position, lag in bytes and time, retained WAL,
    /// wal_status, the walsender streaming from it, the relay's record. Exit 0: the slot
    /// is usable (or not created yet); 2: it was lost or invalidated; 1: cannot tell.
    Status(SlotStatus),
    /// Drop the slot (refused while a relay streams from it). The relay's record of it
    /// stays, so no relay replaces it silently; --forget removes the record too.
    Drop(SlotDrop),
}

impl Command {
    /// Every command, run the one way [`execute`] runs them.
    fn execute(self) -> ExitCode {
        match self {
            Command::Run(run) => execute(run),
            Command::Check(check) => execute(check),
            Command::Init(init) => execute(init),
            Command::Slot { command } => match command {
                SlotCommand::Create(create) => execute(create),
                SlotCommand::Status(status) => execute(status),
                SlotCommand::Drop(drop) => execute(drop),
            },
            Command::Cleanup(cleanup) => execute(cleanup),
            Command::Backfill(backfill) => execute(backfill),
        }
    }
}

/// A command of the command line: its arguments, and what it does once its
/// configuration has loaded. The work is the library's (`outbox_relay::ops`,
/// `outbox_relay::relay::run`); a command says the outcome and picks the exit code.
trait Operation {
    /// The `--config` file it loads.
    fn config(&self) -> &Path;

    /// Whether it connects anywhere: it then runs on a runtime with two worker threads,
    /// otherwise on one without any.
    fn connects(&self) -> bool {
        true
    }

    /// The exit code when the configuration does not load, having said why; `None`:
    /// say it as any other failure.
    fn invalid_config(&self, _error: &ConfigError) -> Option<ExitCode> {
        None
    }

    /// Runs the command: its exit code, or the error that stopped it.
    async fn run(self, settings: Validated) -> Result<ExitCode, Failure>;
}

/// The error a command stopped with, said by [`fail`].
type Failure = Box<dyn std::error::Error>;

/// The one path of every command: load the configuration, build the runtime, run, say
/// the failure.
fn execute(operation: impl Operation) -> ExitCode {
    let settings = match Config::load(operation.config()) {
        Ok(settings) => settings,
        Err(e) => return operation.invalid_config(&e).unwrap_or_else(|| fail(&e)),
    };
    let runtime = if operation.connects() {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread().build()
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(e) => return fail(&e),
    };
    runtime
        .block_on(operation.run(settings))
        .unwrap_or_else(|e| fail(&*e))
}

#[derive(Args)]
struct Run {
    /// Path of the TOML configuration file.
    #[arg(long, short)]
    config: PathBuf,
}

#[derive(Args)]
struct Check {
    /// Path of the TOML configuration file.
    #[arg(long, short)]
    config: PathBuf,
    /// Check the configuration file only, without connecting anywhere.
    #[arg(long)]
    offline: bool,
    /// Print the findings as a JSON array of {id, status, message, fix}.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct Init {
    /// Path of the TOML configuration file.
    #[arg(long, short)]
    config: PathBuf,
    /// Partition the outbox by month of created_at (old months are dropped whole).
    #[arg(long)]
    partitioned: bool,
    /// The relay's role (LOGIN REPLICATION, SELECT on the outbox).
    #[arg(long, default_value = "outbox_relay")]
    relay_role: String,
    /// The application's role (INSERT on the outbox, nothing else).
    #[arg(long, default_value = "app_writer")]
    app_role: String,
    /// Run the SQL (in one transaction) instead of printing it.
    #[arg(long)]
    apply: bool,
    /// Connect as this user to apply (one that may create roles, tables and
    /// publications); default: [postgres] url. The password may come from PGPASSWORD.
    #[arg(long)]
    admin_url: Option<String>,
}

#[derive(Args)]
struct SlotCreate {
    /// Path of the TOML configuration file.
    #[arg(long, short)]
    config: PathBuf,
    /// Start past the gap knowingly.
    #[arg(long)]
    accept_gap: bool,
}

#[derive(Args)]
struct SlotStatus {
    /// Path of the TOML configuration file.
    #[arg(long, short)]
    config: PathBuf,
    /// One JSON object, for scripts.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct SlotDrop {
    /// Path of the TOML configuration file.
    #[arg(long, short)]
    config: PathBuf,
    /// Also remove the relay's record of the slot (decommissioning).
    #[arg(long)]
    forget: bool,
}

#[derive(Args)]
struct Cleanup {
    /// Path of the TOML configuration file.
    #[arg(long, short)]
    config: PathBuf,
    /// A PostgreSQL interval, e.g. 7d, '36 hours'.
    #[arg(long)]
    older_than: String,
    /// The outbox's timestamp column.
    #[arg(long, default_value = "created_at")]
    column: String,
    /// Rows per DELETE transaction.
    #[arg(long, default_value_t = 1000)]
    batch: u32,
    /// How long to wait for the slot to acknowledge everything committed before the
    /// cleanup started.
    #[arg(long, default_value_t = 60)]
    wait_seconds: u64,
    /// Connect as this user (DELETE on the outbox; owner of its partitions to drop
    /// them); default: [postgres] url. The password may come from PGPASSWORD.
    #[arg(long)]
    admin_url: Option<String>,
}

#[derive(Args)]
struct Backfill {
    /// Path of the TOML configuration file.
    #[arg(long, short)]
    config: PathBuf,
    /// Re-send rows whose --column is at or after this time (any timestamp
    /// PostgreSQL reads, e.g. '2026-12-01 09:00:00+00', or -infinity for every row).
    #[arg(long, allow_hyphen_values = true)]
    since: String,
    /// The outbox's timestamp column.
    #[arg(long, default_value = "created_at")]
    column: String,
    /// Only this outbox table (`schema.table`); every outbox table of the
    /// configuration when not given.
    #[arg(long)]
    table: Option<String>,
}

/// Whether logs are JSON lines (`--log-format json`): then the final error is one too.
static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Print the error with its causes (each once) on stderr and fail.
fn fail(error: &dyn std::error::Error) -> ExitCode {
    if JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
        tracing::error!(error = %describe(error).trim_start_matches("error: "), "stopped with an error");
    } else {
        eprintln!("{}", describe(error));
    }
    ExitCode::FAILURE
}

/// `error: <message>: <cause>: ...`, leaving out causes the message already contains.
fn describe(error: &dyn std::error::Error) -> String {
    let mut message = format!("error: {error}");
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// Resolves at the first SIGTERM or SIGINT. A second signal exits at once: nothing
/// undelivered has been acknowledged, so stopping hard loses nothing.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop the relay with SIGKILL");
        return std::future::pending().await;
    };
    // SIGHUP would end the process silently (its default action). The relay does not
    // reload its configuration: say so and go on.
    match signal(SignalKind::hangup()) {
        Ok(mut hangup) => {
            tokio::spawn(async move {
                while hangup.recv().await.is_some() {
                    tracing::warn!("SIGHUP received and ignored: the relay does not reload its configuration; restart it to apply changes");
                }
            });
        }
        Err(error) => {
            tracing::warn!(error = %error, "cannot handle SIGHUP; it will stop the relay")
        }
    }
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        eprintln!("second signal: exiting at once without acknowledging anything undelivered");
        std::process::exit(130);
    });
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every argument of every subcommand, nested ones included, says what it is in
    /// `--help`: `--config` once had help text on `run` only.
    #[test]
    fn every_argument_of_every_subcommand_has_help_text() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id != "help" && id != "version" && arg.get_help().is_none() {
                    missing.push(format!("{path} --{id}"));
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "outbox-relay", &mut missing);
        assert!(
            missing.is_empty(),
            "arguments without help text: {missing:?}"
        );
    }
}
