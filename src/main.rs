//! `outbox-relay run --config FILE`: the command line.

#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use outbox_relay::config::Config;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "outbox-relay",
    version,
    about = "Transactional outbox relay: PostgreSQL logical replication to Kafka (or stdout)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the relay until SIGTERM or SIGINT.
    Run {
        /// Path of the TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Check the configuration file and exit.
    Check {
        #[arg(long, short)]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    // Logs go to stderr: stdout belongs to the stdout sink's events.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, never in log files or pipes.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => match Config::load(&config) {
            Ok(_) => {
                eprintln!("{}: ok", config.display());
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        Command::Run { config } => {
            let settings = match Config::load(&config) {
                Ok(settings) => settings,
                Err(e) => return fail(&e),
            };
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => return fail(&e),
            };
            match runtime.block_on(outbox_relay::relay::run(settings, shutdown_signal())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            }
        }
    }
}

/// Print the error with its causes (each once) on stderr and fail.
fn fail(error: &dyn std::error::Error) -> ExitCode {
    eprintln!("{}", describe(error));
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
