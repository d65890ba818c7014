//! CPU time and memory of processes, read from Linux's `/proc`: what the benchmark
//! reports per contender (`bench/`), and what any runner of another relay (the
//! Debezium runner) needs to report the same figures for its JVM.
//!
//! ```text
//! process_cpu(pid)          utime + stime of one process, all its threads
//! process_cpu_with_reaped   ... plus cutime + cstime: the children it has waited for
//! postgres_cpu(postmaster)  every process of one PostgreSQL cluster: the postmaster with
//!                           its reaped backends, plus its live children
//! machine_busy()            busy time of the whole machine (/proc/stat)
//! busy_percent(over)        share of all CPUs busy over a sample
//! peak_rss_kib(pid)         VmHWM of a live process
//! ```
//!
//! Times are [`CpuTime`] values in clock ticks of `USER_HZ`, which is 100 on every Linux
//! (the `/proc` ABI fixes it, whatever the kernel's `CONFIG_HZ`). A process that has
//! exited reads as zero: sample before stopping it, or count it through its parent.

use std::time::Duration;

/// `USER_HZ`: the unit of the CPU times in `/proc/<pid>/stat` and `/proc/stat`.
pub const TICKS_PER_SECOND: u64 = 100;

/// CPU time in clock ticks ([`TICKS_PER_SECOND`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct CpuTime(pub u64);

impl CpuTime {
    pub fn seconds(self) -> f64 {
        self.0 as f64 / TICKS_PER_SECOND as f64
    }

    /// `self - earlier`, never negative.
    pub fn since(self, earlier: CpuTime) -> CpuTime {
        CpuTime(self.0.saturating_sub(earlier.0))
    }
}

/// The fields of `/proc/<pid>/stat` after the command name, which may itself hold spaces
/// and parentheses: everything after the last `)`.
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: state (not a number, kept as 0), ppid, ... utime is field 14 of
    // the whole line, the 12th after the name.
    Some(
        rest.split_whitespace()
            .map(|field| field.parse().unwrap_or(0))
            .collect(),
    )
}

/// utime + stime of `pid` (every thread); zero when it is gone.
pub fn process_cpu(pid: u32) -> CpuTime {
    stat_fields(pid)
        .and_then(|f| Some(CpuTime(f.get(11)? + f.get(12)?)))
        .unwrap_or_default()
}

/// utime + stime + cutime + cstime of `pid`: its own CPU and that of the children it has
/// reaped; zero when it is gone.
pub fn process_cpu_with_reaped(pid: u32) -> CpuTime {
    stat_fields(pid)
        .and_then(|f| Some(CpuTime(f.get(11)? + f.get(12)? + f.get(13)? + f.get(14)?)))
        .unwrap_or_default()
}

/// The parent pid of `pid`.
fn parent_of(pid: u32) -> Option<u32> {
    stat_fields(pid)
        .and_then(|f| f.get(1).copied())
        .and_then(|ppid| u32::try_from(ppid).ok())
}

/// The live children of `pid` (a scan of `/proc`).
pub fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| parent_of(child) == Some(pid))
        .collect()
}

/// Every process of a PostgreSQL cluster: the postmaster with the backends it has
/// reaped, plus its live children (walsenders, backends, checkpointer, ...). A backend
/// that has exited but is not reaped yet counts for nothing: give the postmaster a
/// moment after connections close.
pub fn postgres_cpu(postmaster: u32) -> CpuTime {
    let live: u64 = children_of(postmaster)
        .into_iter()
        .map(|child| process_cpu(child).0)
        .sum();
    CpuTime(process_cpu_with_reaped(postmaster).0 + live)
}

/// Busy time of the whole machine, all CPUs (`/proc/stat`: user, nice, system, irq,
/// softirq, steal), and the total (busy + idle + iowait).
pub fn machine_busy() -> (CpuTime, CpuTime) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|line| line.starts_with("cpu ")) else {
        return (CpuTime(0), CpuTime(0));
    };
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|field| field.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| fields.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal (guest time is inside user)
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    let total = busy + at(3) + at(4);
    (CpuTime(busy), CpuTime(total))
}

/// Percent of all CPUs busy over `over` (sleeps that long).
pub fn busy_percent(over: Duration) -> f64 {
    let (busy0, total0) = machine_busy();
    std::thread::sleep(over);
    let (busy1, total1) = machine_busy();
    let total = total1.since(total0).0;
    if total == 0 {
        return 0.0;
    }
    100.0 * busy1.since(busy0).0 as f64 / total as f64
}

/// Peak resident set size (`VmHWM`) of a live process, in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    crate::outbox::peak_rss_kib(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let me = std::process::id();
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {}
        assert!(process_cpu(me).0 > 0);
        assert!(process_cpu_with_reaped(me) >= process_cpu(me));
        assert!(peak_rss_kib(me).unwrap_or(0) > 0);
        let (busy, total) = machine_busy();
        assert!(total >= busy && busy.0 > 0);
    }

    #[test]
    fn a_gone_process_reads_as_zero() {
        assert_eq!(process_cpu(u32::MAX), CpuTime(0));
        assert!(children_of(u32::MAX).is_empty());
    }
}
