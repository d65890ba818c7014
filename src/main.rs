//! `outbox-relay run --config FILE`: the command line.

#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
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

#[derive(Subcommand)]
enum Command {
    /// Run the relay until SIGTERM or SIGINT.
    Run {
        /// Path of the TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Check the configuration, then everything the relay needs on the live system
    /// (PostgreSQL, the outbox table, publication, slot, Kafka), changing nothing.
    /// Lists every problem with its fix; exit 1 if there is any.
    Check {
        /// Path of the TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Check the configuration file only, without connecting anywhere.
        #[arg(long)]
        offline: bool,
        /// Print the findings as a JSON array of {id, status, message, fix}.
        #[arg(long)]
        json: bool,
    },
    /// Print the SQL that sets up a database for the relay (the outbox table, its
    /// state table, the publication, a relay role and an application role that may
    /// only INSERT into the outbox); with --apply, run it.
    Init {
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
    },
    /// Manage the replication slot.
    Slot {
        #[command(subcommand)]
        command: SlotCommand,
    },
    /// Delete outbox rows older than --older-than that the slot has provably passed, in
    /// short batches (a partitioned outbox: whole old partitions are dropped). Refuses
    /// when the relay lags behind the rows it would delete.
    Cleanup {
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
    },
    /// Re-send the outbox rows still in the table from a given time on (after a lost
    /// slot or an outbox that left the publication). At-least-once: consumers
    /// deduplicate by event id.
    Backfill {
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
    },
}

#[derive(Subcommand)]
enum SlotCommand {
    /// Create the slot. After a slot the relay streamed from was lost, only with
    /// --accept-gap: the new slot starts at the current position, and events committed
    /// since the old one's last acknowledged position must be re-sent (backfill).
    Create {
        /// Path of the TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Start past the gap knowingly.
        #[arg(long)]
        accept_gap: bool,
    },
    /// Where the slot stands: position, lag in bytes and time, retained WAL,
    /// wal_status, the walsender streaming from it, the relay's record. Exit 0: the slot
    /// is usable (or not created yet); 2: it was lost or invalidated; 1: cannot tell.
    Status {
        /// Path of the TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// One JSON object, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Drop the slot (refused while a relay streams from it). The relay's record of it
    /// stays, so no relay replaces it silently; --forget removes the record too.
    Drop {
        /// Path of the TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Also remove the relay's record of the slot (decommissioning).
        #[arg(long)]
        forget: bool,
    },
}

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
    match cli.command {
        Command::Check {
            config,
            offline,
            json,
        } => {
            use outbox_relay::ops::check::{self, Report};
            let shown = config.display().to_string();
            let settings = match Config::load(&config) {
                Ok(settings) => settings,
                Err(ConfigError::Invalid { problems, .. }) if json => {
                    println!("{}", Report::new(check::config_problems(&problems)).json());
                    return ExitCode::FAILURE;
                }
                Err(e) if json => {
                    println!(
                        "{}",
                        Report::new(check::config_problems(&[e.to_string()])).json()
                    );
                    return ExitCode::FAILURE;
                }
                Err(e) => return fail(&e),
            };
            if offline && !json {
                eprintln!("{shown}: ok");
                return ExitCode::SUCCESS;
            }
            let mut findings = vec![check::config_ok(&shown)];
            if !offline {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => return fail(&e),
                };
                findings
                    .extend(runtime.block_on(check::live(&settings, &format!("--config {shown}"))));
            }
            let report = Report::new(findings);
            if json {
                println!("{}", report.json());
            } else {
                print!("{}", report.text());
            }
            if report.has_problems() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Run { config } => {
            let (settings, runtime) = match load_with_runtime(&config) {
                Ok(loaded) => loaded,
                Err(code) => return code,
            };
            // The relay runs on a worker, not on this thread: the worker that waits for
            // the replication socket then runs the loop itself, with no hand-over to
            // another thread per message (on `block_on` here it was one per message).
            // A current-thread runtime cut that further but cost 13–21 % of the bulk
            // throughput: docs/benchmarks.md, "Latency, one event per transaction".
            let relay = runtime.spawn(outbox_relay::relay::run(settings, shutdown_signal()));
            match runtime.block_on(relay) {
                Ok(Ok(())) => ExitCode::SUCCESS,
                Ok(Err(e)) => fail(&e),
                Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
                Err(join) => fail(&join),
            }
        }
        Command::Slot {
            command: SlotCommand::Create { config, accept_gap },
        } => {
            let (settings, runtime) = match load_with_runtime(&config) {
                Ok(loaded) => loaded,
                Err(code) => return code,
            };
            match runtime.block_on(outbox_relay::ops::slot::create_slot(&settings, accept_gap)) {
                Ok(created) => {
                    if created.publication_created {
                        eprintln!(
                            "created publication {:?} first: a slot streams only what is published from its start on",
                            settings.source().publication
                        );
                    }
                    match created.gap_from {
                        Some((lsn, at)) => eprintln!(
                            "created replication slot {:?} at {}; events committed after {} (acknowledged at {}) up to {} were not relayed: re-send them with `outbox-relay backfill --config {} --since '{}'`",
                            created.slot,
                            created.start,
                            lsn.map_or_else(|| "the old slot's start".to_owned(), |l| l.to_string()),
                            at.as_deref().unwrap_or("an unknown time"),
                            created.start,
                            config.display(),
                            at.as_deref().unwrap_or("<time of the last acknowledged event>"),
                        ),
                        None => eprintln!("created replication slot {:?} at {}", created.slot, created.start),
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        Command::Init {
            config,
            partitioned,
            relay_role,
            app_role,
            apply,
            admin_url,
        } => {
            let (settings, runtime) = match load_with_runtime(&config) {
                Ok(loaded) => loaded,
                Err(code) => return code,
            };
            let script = outbox_relay::ops::init::init_script(
                &settings,
                partitioned,
                &relay_role,
                &app_role,
            );
            if !apply {
                print!("{script}");
                return ExitCode::SUCCESS;
            }
            let admin = match admin_params(admin_url.as_deref()) {
                Ok(admin) => admin.unwrap_or_else(|| settings.connect.clone()),
                Err(code) => return code,
            };
            match runtime.block_on(outbox_relay::ops::init::apply_script(&admin, &script)) {
                Ok(()) => {
                    eprintln!(
                        "applied the set-up SQL as {:?}; set the passwords of roles {relay_role:?} and {app_role:?} (ALTER ROLE ... PASSWORD)",
                        admin.user
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        Command::Slot {
            command: SlotCommand::Status { config, json },
        } => {
            let (settings, runtime) = match load_with_runtime(&config) {
                Ok(loaded) => loaded,
                Err(code) => return code,
            };
            match runtime.block_on(outbox_relay::ops::slot::slot_status(&settings)) {
                Ok(status) => {
                    if json {
                        println!("{}", status.to_json());
                    } else {
                        print!("{}", status.describe());
                    }
                    if status.is_lost() {
                        ExitCode::from(SLOT_LOST_EXIT)
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                Err(e) => fail(&e),
            }
        }
        Command::Slot {
            command: SlotCommand::Drop { config, forget },
        } => {
            let (settings, runtime) = match load_with_runtime(&config) {
                Ok(loaded) => loaded,
                Err(code) => return code,
            };
            match runtime.block_on(outbox_relay::ops::slot::slot_drop(&settings, forget)) {
                Ok(said) => {
                    eprintln!("{said}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        Command::Cleanup {
            config,
            older_than,
            column,
            batch,
            wait_seconds,
            admin_url,
        } => {
            let (settings, runtime) = match load_with_runtime(&config) {
                Ok(loaded) => loaded,
                Err(code) => return code,
            };
            let admin = match admin_params(admin_url.as_deref()) {
                Ok(admin) => admin,
                Err(code) => return code,
            };
            let options = outbox_relay::ops::cleanup::CleanupOptions {
                older_than,
                column,
                batch: batch.max(1),
                wait: std::time::Duration::from_secs(wait_seconds),
                admin,
            };
            match runtime.block_on(outbox_relay::ops::cleanup::cleanup(&settings, &options)) {
                Ok(report) => {
                    eprintln!(
                        "cleanup: deleted {} rows older than {} that the slot has passed{}",
                        report.deleted_rows,
                        report.cutoff,
                        if report.dropped_partitions.is_empty() {
                            String::new()
                        } else {
                            format!(
                                "; dropped partitions {}",
                                report.dropped_partitions.join(", ")
                            )
                        }
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        Command::Backfill {
            config,
            since,
            column,
        } => {
            let (settings, runtime) = match load_with_runtime(&config) {
                Ok(loaded) => loaded,
                Err(code) => return code,
            };
            match runtime.block_on(outbox_relay::ops::backfill::backfill(
                &settings, &since, &column,
            )) {
                Ok(report) => {
                    eprintln!(
                        "backfill: {} rows since {since:?} read, {} delivered, {} could not be routed",
                        report.rows, report.delivered, report.unroutable
                    );
                    if report.unroutable > 0 {
                        ExitCode::FAILURE
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                Err(e) => fail(&e),
            }
        }
    }
}

/// `--admin-url`, the password from PGPASSWORD when the URL has none.
fn admin_params(
    url: Option<&str>,
) -> Result<Option<outbox_relay::pg::url::ConnectParams>, ExitCode> {
    let Some(url) = url else {
        return Ok(None);
    };
    match outbox_relay::pg::url::ConnectParams::from_url(url) {
        Ok(mut params) => {
            params.origin = outbox_relay::pg::url::UrlOrigin::AdminUrl;
            if params.password.is_none() {
                params.password = std::env::var("PGPASSWORD")
                    .ok()
                    .map(outbox_relay::pg::url::Secret::new);
            }
            Ok(Some(params))
        }
        Err(e) => {
            eprintln!("error: --admin-url: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

/// The validated config and a runtime to run a command on.
fn load_with_runtime(
    config: &std::path::Path,
) -> Result<(Validated, tokio::runtime::Runtime), ExitCode> {
    let settings = Config::load(config).map_err(|e| fail(&e))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| fail(&e))?;
    Ok((settings, runtime))
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
