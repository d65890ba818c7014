//! What each command of the command line does with its arguments, once its
//! configuration has loaded: an [`Operation`] per command, run by `execute` in
//! `main.rs`, which declares them. The work is the library's (`outbox_relay::ops`, and
//! `outbox_relay::relay::run` for `run`); each says the outcome and picks the exit code.
//! Part of the binary, not of the library.

use std::path::Path;
use std::process::ExitCode;

use outbox_relay::config::{ConfigError, Validated};
use outbox_relay::ops::check::{self, Report};
use outbox_relay::ops::{backfill, cleanup, init, slot};
use outbox_relay::pg::url::{ConnectParams, Secret, UrlOrigin};

use super::{
    shutdown_signal, Backfill, Check, Cleanup, Failure, Init, Operation, Run, SlotCreate, SlotDrop,
    SlotStatus, SLOT_LOST_EXIT,
};

impl Operation for Run {
    fn config(&self) -> &Path {
        &self.config
    }

    async fn run(self, settings: Validated) -> Result<ExitCode, Failure> {
        // The relay runs on a worker, not on this thread: the worker that waits for the
        // replication socket then runs the loop itself, with no hand-over to another
        // thread per message (on `block_on` here it was one per message). A
        // current-thread runtime cut that further but cost 13–21 % of the bulk
        // throughput: docs/benchmarks.md, "Latency, one event per transaction".
        match tokio::spawn(outbox_relay::relay::run(settings, shutdown_signal())).await {
            Ok(Ok(())) => Ok(ExitCode::SUCCESS),
            Ok(Err(e)) => Err(e.into()),
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(join) => Err(join.into()),
        }
    }
}

impl Operation for Check {
    fn config(&self) -> &Path {
        &self.config
    }

    fn connects(&self) -> bool {
        !self.offline
    }

    /// With --json, the configuration's problems are findings too.
    fn invalid_config(&self, error: &ConfigError) -> Option<ExitCode> {
        if !self.json {
            return None;
        }
        let findings = match error {
            ConfigError::Invalid { problems, .. } => check::config_problems(problems),
            other => check::config_problems(&[other.to_string()]),
        };
        println!("{}", Report::new(findings).json());
        Some(ExitCode::FAILURE)
    }

    async fn run(self, settings: Validated) -> Result<ExitCode, Failure> {
        let shown = self.config.display().to_string();
        if self.offline && !self.json {
            eprintln!("{shown}: ok");
            return Ok(ExitCode::SUCCESS);
        }
        let mut findings = vec![check::config_ok(&shown)];
        if !self.offline {
            findings.extend(check::live(&settings, &format!("--config {shown}")).await);
        }
        let report = Report::new(findings);
        if self.json {
            println!("{}", report.json());
        } else {
            print!("{}", report.text());
        }
        Ok(if report.has_problems() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    }
}

impl Operation for Init {
    fn config(&self) -> &Path {
        &self.config
    }

    async fn run(self, settings: Validated) -> Result<ExitCode, Failure> {
        let (relay_role, app_role) = (&self.relay_role, &self.app_role);
        let script = init::init_script(&settings, self.partitioned, relay_role, app_role);
        if !self.apply {
            print!("{script}");
            return Ok(ExitCode::SUCCESS);
        }
        let admin = match admin_params(self.admin_url.as_deref()) {
            Ok(admin) => admin.unwrap_or_else(|| settings.connect.clone()),
            Err(said) => return Ok(said),
        };
        init::apply_script(&admin, &script).await?;
        eprintln!(
            "applied the set-up SQL as {:?}; set the passwords of roles {relay_role:?} and {app_role:?} (ALTER ROLE ... PASSWORD)",
            admin.user
        );
        Ok(ExitCode::SUCCESS)
    }
}

impl Operation for SlotCreate {
    fn config(&self) -> &Path {
        &self.config
    }

    async fn run(self, settings: Validated) -> Result<ExitCode, Failure> {
        let created = slot::create_slot(&settings, self.accept_gap).await?;
        for line in created.said(&settings.source().publication, &self.config) {
            eprintln!("{line}");
        }
        Ok(ExitCode::SUCCESS)
    }
}

impl Operation for SlotStatus {
    fn config(&self) -> &Path {
        &self.config
    }

    async fn run(self, settings: Validated) -> Result<ExitCode, Failure> {
        let status = slot::slot_status(&settings).await?;
        if self.json {
            println!("{}", status.to_json());
        } else {
            print!("{}", status.describe());
        }
        Ok(if status.is_lost() {
            ExitCode::from(SLOT_LOST_EXIT)
        } else {
            ExitCode::SUCCESS
        })
    }
}

impl Operation for SlotDrop {
    fn config(&self) -> &Path {
        &self.config
    }

    async fn run(self, settings: Validated) -> Result<ExitCode, Failure> {
        eprintln!("{}", slot::slot_drop(&settings, self.forget).await?);
        Ok(ExitCode::SUCCESS)
    }
}

impl Operation for Cleanup {
    fn config(&self) -> &Path {
        &self.config
    }

    async fn run(self, settings: Validated) -> Result<ExitCode, Failure> {
        let admin = match admin_params(self.admin_url.as_deref()) {
            Ok(admin) => admin,
            Err(said) => return Ok(said),
        };
        let options = cleanup::CleanupOptions {
            older_than: self.older_than,
            column: self.column,
            batch: self.batch.max(1),
            wait: std::time::Duration::from_secs(self.wait_seconds),
            admin,
        };
        eprintln!("{}", cleanup::cleanup(&settings, &options).await?.said());
        Ok(ExitCode::SUCCESS)
    }
}

impl Operation for Backfill {
    fn config(&self) -> &Path {
        &self.config
    }

    async fn run(self, settings: Validated) -> Result<ExitCode, Failure> {
        let report =
            backfill::backfill(&settings, &self.since, &self.column, self.table.as_deref()).await?;
        eprintln!("{}", report.said(&self.since));
        Ok(if report.unroutable > 0 {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    }
}

/// `--admin-url`, the password from PGPASSWORD when the URL has none; `Err`: the exit
/// code, the problem said.
fn admin_params(url: Option<&str>) -> Result<Option<ConnectParams>, ExitCode> {
    let Some(url) = url else {
        return Ok(None);
    };
    match ConnectParams::from_url(url) {
        Ok(mut params) => {
            params.origin = UrlOrigin::AdminUrl;
            if params.password.is_none() {
                params.password = std::env::var("PGPASSWORD").ok().map(Secret::new);
            }
            Ok(Some(params))
        }
        Err(e) => {
            eprintln!("error: --admin-url: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}
