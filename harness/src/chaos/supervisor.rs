//! The relay under fault as a supervised child process: restarted after `kill -9`, and
//! after an exit of its own, which is kept as evidence of a failure.

use std::time::{Duration, Instant};

use super::super::outbox::WAIT;
use super::super::wait::tail_lines;
use super::super::RelayProcess;

/// The relay as a supervised child: restarted after `kill -9`, and after an exit of
/// its own, which is recorded as a failure with its stderr.
pub struct Supervisor {
    config: String,
    log_filter: String,
    process: Option<RelayProcess>,
    pub starts: usize,
    /// Exits the harness did not cause: what the relay said before.
    pub unexpected_exits: Vec<String>,
    /// Stderr of earlier incarnations.
    earlier_stderr: String,
    started: Instant,
}

impl Supervisor {
    pub fn start(config: String, started: Instant) -> Self {
        // Warnings, and the few lines that say what each session skipped and whether
        // it waited for what it had in flight: what a duplicate count needs explaining.
        let log_filter = std::env::var("RELAY_TEST_LOG").unwrap_or_else(|_| {
            "warn,outbox_relay::relay::pipeline::steps=info,outbox_relay::relay::run::resume=info"
                .to_owned()
        });
        let mut supervisor = Supervisor {
            config,
            log_filter,
            process: None,
            starts: 0,
            unexpected_exits: Vec::new(),
            earlier_stderr: String::new(),
            started,
        };
        supervisor.spawn();
        supervisor
    }

    fn spawn(&mut self) {
        let env = [("RUST_LOG", self.log_filter.as_str())];
        self.process = Some(RelayProcess::start_with_env(&self.config, &env));
        self.starts += 1;
    }

    fn retire(&mut self) {
        if let Some(process) = self.process.take() {
            process.kill9();
            let status = process.wait_exit(WAIT);
            self.earlier_stderr.push_str(&process.stderr());
            self.earlier_stderr.push_str(&format!(
                "--- relay #{} ended ({status}) at {:.1}s ---\n",
                self.starts,
                self.started.elapsed().as_secs_f64()
            ));
        }
    }

    pub fn kill9_and_restart(&mut self, down: Duration) {
        self.retire();
        std::thread::sleep(down);
        self.spawn();
    }

    /// Restarts the relay if it exited by itself, recording the evidence.
    pub fn check(&mut self) {
        let Some(process) = &self.process else { return };
        let Some(status) = process.exit_status() else {
            return;
        };
        let evidence = format!(
            "relay #{} exited by itself ({status}) at {:.1}s; stderr tail:\n{}",
            self.starts,
            self.started.elapsed().as_secs_f64(),
            process.stderr_tail()
        );
        eprintln!("chaos: {evidence}");
        self.unexpected_exits.push(evidence);
        self.retire();
        self.spawn();
    }

    /// Sleeps `duration` while watching the relay.
    pub fn watch_for(&mut self, duration: Duration) {
        let end = Instant::now() + duration;
        loop {
            self.check();
            let now = Instant::now();
            if now >= end {
                return;
            }
            std::thread::sleep((end - now).min(Duration::from_millis(100)));
        }
    }

    pub fn stderr_tail(&self, lines: usize) -> String {
        let mut text = self.earlier_stderr.clone();
        if let Some(process) = &self.process {
            text.push_str(&process.stderr());
        }
        tail_lines(&text, lines)
    }
}
