//! A child process whose output is captured by background threads: stdout line by
//! line (the relay prints one JSON event per line), stderr as text, echoed to the
//! test's stderr with a `[label] ` prefix so `--nocapture` shows what the child said.
//! Killed with SIGKILL and reaped on drop.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::wait::{poll_until, tail_lines, wait_child};

/// How many stderr lines a panic message quotes.
const STDERR_TAIL_LINES: usize = 40;
/// How long to wait for the reader threads to see end-of-file after the child exited
/// (a grandchild holding the pipes open must not hang the test).
const READER_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

pub struct ChildProcess {
    label: String,
    child: Mutex<Child>,
    stdout_lines: Arc<Mutex<Vec<String>>>,
    stderr_text: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

impl ChildProcess {
    /// Spawns `command` with stdin closed and stdout/stderr piped into the capture
    /// buffers. `label` names the process in echoed lines and panic messages.
    pub fn spawn(label: &str, mut command: Command) -> Self {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|err| panic!("spawning {label} ({command:?}): {err}"));
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");

        let stdout_lines = Arc::new(Mutex::new(Vec::new()));
        let stderr_text = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            spawn_reader(label, "stdout", stdout, {
                let lines = Arc::clone(&stdout_lines);
                move |line| lock(&lines).push(line)
            }),
            spawn_reader(label, "stderr", stderr, {
                let text = Arc::clone(&stderr_text);
                let prefix = format!("[{label}] ");
                move |line| {
                    eprintln!("{prefix}{line}");
                    let mut text = lock(&text);
                    text.push_str(&line);
                    text.push('\n');
                }
            }),
        ];
        ChildProcess {
            label: label.to_owned(),
            child: Mutex::new(child),
            stdout_lines,
            stderr_text,
            readers,
        }
    }

    pub fn pid(&self) -> u32 {
        lock(&self.child).id()
    }

    /// Every stdout line received so far, without line terminators.
    pub fn lines(&self) -> Vec<String> {
        lock(&self.stdout_lines).clone()
    }

    pub fn line_count(&self) -> usize {
        lock(&self.stdout_lines).len()
    }

    /// Stdout received so far, lines joined with `\n`.
    pub fn stdout(&self) -> String {
        lock(&self.stdout_lines).join("\n")
    }

    pub fn stderr(&self) -> String {
        lock(&self.stderr_text).clone()
    }

    /// The last lines of stderr, for panic messages.
    pub fn stderr_tail(&self) -> String {
        tail_lines(&self.stderr(), STDERR_TAIL_LINES)
    }

    /// Waits until at least `n` stdout lines have arrived and returns all lines so far.
    /// Panics on timeout, or as soon as the process has exited with fewer lines.
    pub fn wait_for_lines(&self, n: usize, timeout: Duration) -> Vec<String> {
        let done = poll_until(timeout, || {
            let lines = self.lines();
            if lines.len() >= n {
                return Some(Ok(lines));
            }
            // Exited and fully drained: no more lines can come.
            let status = self.exit_status()?;
            self.readers_done().then_some(Err(status))
        });
        match done {
            Some(Ok(lines)) => lines,
            Some(Err(status)) => panic!(
                "{} exited ({status}) after {} of {n} expected stdout lines; stderr tail:\n{}",
                self.label,
                self.line_count(),
                self.stderr_tail()
            ),
            None => panic!(
                "timed out after {timeout:?} waiting for {n} stdout lines from {}: {} arrived; \
                 stderr tail:\n{}",
                self.label,
                self.line_count(),
                self.stderr_tail()
            ),
        }
    }

    /// Waits until stderr contains `needle`. Panics on timeout, or as soon as the process
    /// has exited without printing it.
    pub fn wait_for_stderr(&self, needle: &str, timeout: Duration) {
        let found = poll_until(timeout, || {
            if self.stderr().contains(needle) {
                return Some(true);
            }
            self.exit_status()?;
            (self.readers_done() && !self.stderr().contains(needle)).then_some(false)
        });
        match found {
            Some(true) => {}
            Some(false) => panic!(
                "{} exited without printing {needle:?} to stderr; stderr tail:\n{}",
                self.label,
                self.stderr_tail()
            ),
            None => panic!(
                "timed out after {timeout:?} waiting for {needle:?} on {} stderr; tail:\n{}",
                self.label,
                self.stderr_tail()
            ),
        }
    }

    /// Sends `signal` unless the process has already exited (and been reaped, so its pid
    /// may belong to someone else). Returns whether the signal was sent.
    pub fn signal(&self, signal: Signal) -> bool {
        let mut child = lock(&self.child);
        if child.try_wait().ok().flatten().is_some() {
            return false;
        }
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits in i32"));
        kill(pid, signal).is_ok()
    }

    pub fn sigterm(&self) {
        self.signal(Signal::SIGTERM);
    }

    pub fn sigint(&self) {
        self.signal(Signal::SIGINT);
    }

    pub fn kill9(&self) {
        self.signal(Signal::SIGKILL);
    }

    /// SIGSTOP: freeze the process (it keeps its sockets open but stops answering).
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// SIGCONT after [`ChildProcess::pause`].
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// The exit status if the process has exited, without blocking.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        let mut child = lock(&self.child);
        child
            .try_wait()
            .unwrap_or_else(|err| panic!("waiting for {}: {err}", self.label))
    }

    /// Waits for the process to exit and for its output to be fully read, so that
    /// `lines()` and `stderr()` are complete afterwards. Panics on timeout.
    pub fn wait_exit(&self, timeout: Duration) -> ExitStatus {
        let status = poll_until(timeout, || self.exit_status()).unwrap_or_else(|| {
            panic!(
                "timed out after {timeout:?} waiting for {} (pid {}) to exit; stderr tail:\n{}",
                self.label,
                self.pid(),
                self.stderr_tail()
            )
        });
        // Best effort: a grandchild could keep the pipes open.
        poll_until(READER_DRAIN_TIMEOUT, || self.readers_done().then_some(()));
        status
    }

    fn readers_done(&self) -> bool {
        self.readers.iter().all(JoinHandle::is_finished)
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = wait_child(child, Duration::from_secs(10));
    }
}

/// Reads `source` line by line (lossy UTF-8, terminators stripped) into `sink` until
/// end-of-file or a read error.
fn spawn_reader(
    label: &str,
    stream: &str,
    source: impl Read + Send + 'static,
    mut sink: impl FnMut(String) + Send + 'static,
) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name(format!("{label}-{stream}"))
        .spawn(move || {
            let mut reader = BufReader::new(source);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&buf);
                        sink(line.trim_end_matches(['\n', '\r']).to_owned());
                    }
                }
            }
        })
        .expect("spawning output reader thread")
}

/// Locks a mutex, ignoring poisoning (a panicking test must still be able to clean up).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// `sh -c 'read _; kill -9 PID'` with its stdin a pipe from the test process: when the
/// test process exits (normally, by panic, or killed), the pipe closes and the process
/// `PID` (a JVM: the Kafka broker, Kafka Connect) dies with it. Dropping the watchdog
/// (the process was retired the ordinary way) kills the shell.
pub struct Watchdog(Child);

impl Watchdog {
    pub fn start(pid: u32) -> Self {
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("read _ignored; kill -9 {pid} 2>/dev/null"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning a watchdog shell");
        Watchdog(child)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = wait_child(&mut self.0, Duration::from_secs(5));
    }
}
