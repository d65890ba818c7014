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
        #[arg(long, short)]
        config: PathBuf,
        /// Check the configuration file only, without connecting anywhere.
        #[arg(long)]
        offline: bool,
        /// Print the findings as a JSON array of {id, status, message, fix}.
        #[arg(long)]
        json: bool,
    },
    /// Manage the replication slot.
    Slot {
        #[command(subcommand)]
        command: SlotCommand,
    },
    /// Re-send the outbox rows still in the table from a given time on (after a lost
    /// slot or an outbox that left the publication). At-least-once: consumers
    /// deduplicate by event id.
    Backfill {
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
        #[arg(long, short)]
        config: PathBuf,
        /// Start past the gap knowingly.
        #[arg(long)]
        accept_gap: bool,
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
            use outbox_relay::relay::check::{self, Report};
            let shown = config.display().to_string();
            let settings = match Config::load(&config) {
                Ok(settings) => settings,
                Err(ConfigError::Invalid { problems, .. }) if json => {
                    println!(
                        "{}",
                        Report::new(check::config_problems(&problems), None).json()
                    );
                    return ExitCode::FAILURE;
                }
                Err(e) if json => {
                    println!(
                        "{}",
                        Report::new(check::config_problems(&[e.to_string()]), None).json()
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
            let report = Report::new(findings, Some(&settings));
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
            match runtime.block_on(outbox_relay::relay::run(settings, shutdown_signal())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            }
        }
        Command::Slot {
            command: SlotCommand::Create { config, accept_gap },
        } => {
            let (settings, runtime) = match load_with_runtime(&config) {
                Ok(loaded) => loaded,
                Err(code) => return code,
            };
            match runtime.block_on(outbox_relay::relay::repair::create_slot(
                &settings, accept_gap,
            )) {
                Ok(created) => {
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
        Command::Backfill {
            config,
            since,
            column,
        } => {
            let (settings, runtime) = match load_with_runtime(&config) {
                Ok(loaded) => loaded,
                Err(code) => return code,
            };
            match runtime.block_on(outbox_relay::relay::repair::backfill(
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
