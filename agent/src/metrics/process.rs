//! The standard `process_*` metrics of the agent itself, read from `/proc/self` at scrape time,
//! under the names every Prometheus client library uses (so stock dashboards and alerts on
//! memory, file descriptors, restarts via `process_start_time_seconds` work unchanged).

use std::{fs, io, path::PathBuf};

use log::warn;
use prometheus::{
    core::{Collector, Desc},
    proto::MetricFamily,
    Counter, Gauge, Opts,
};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ProcessError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("getrlimit(RLIMIT_NOFILE): {0}")]
    Rlimit(io::Error),
    #[error("{path}: no {field} field in {text:?}")]
    Field {
        path: &'static str,
        field: &'static str,
        text: String,
    },
}

/// What `/proc/self/stat` says about the process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Stat {
    /// User plus system CPU time, in clock ticks.
    pub cpu_ticks: u64,
    pub threads: u64,
    /// Since boot, in clock ticks.
    pub start_ticks: u64,
    pub virtual_bytes: u64,
    pub resident_pages: u64,
}

const STAT: &str = "/proc/self/stat";

fn read(path: &str) -> Result<String, ProcessError> {
    fs::read_to_string(path).map_err(|source| ProcessError::Read {
        path: path.into(),
        source,
    })
}

/// Parses `/proc/<pid>/stat` (proc(5)). The command name, in parentheses, may itself hold
/// spaces and parentheses: the fields are what follows the last `)`.
pub(super) fn parse_stat(text: &str) -> Result<Stat, ProcessError> {
    let missing = |field| ProcessError::Field {
        path: STAT,
        field,
        text: text.to_owned(),
    };
    let (_, rest) = text.rsplit_once(')').ok_or_else(|| missing("comm"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // proc(5) numbers fields from 1 with `pid` and `comm` first: field n is fields[n - 3].
    let field = |n: usize, name| -> Result<u64, ProcessError> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| missing(name))
    };
    Ok(Stat {
        cpu_ticks: field(14, "utime")? + field(15, "stime")?,
        threads: field(20, "num_threads")?,
        start_ticks: field(22, "starttime")?,
        virtual_bytes: field(23, "vsize")?,
        resident_pages: field(24, "rss")?,
    })
}

/// The boot time (Unix seconds) from `/proc/stat`'s `btime` line.
pub(super) fn parse_boot_time(text: &str) -> Result<u64, ProcessError> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| ProcessError::Field {
            path: "/proc/stat",
            field: "btime",
            text: text.chars().take(200).collect(),
        })
}

fn open_fds() -> Result<u64, ProcessError> {
    let path = "/proc/self/fd";
    let entries = fs::read_dir(path).map_err(|source| ProcessError::Read {
        path: path.into(),
        source,
    })?;
    // The directory handle read_dir holds is one of the entries; it is not the agent's.
    Ok((entries.count() as u64).saturating_sub(1))
}

fn max_fds() -> Result<u64, ProcessError> {
    // SAFETY: rlimit is plain old data, filled in by the call.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-parameter.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(ProcessError::Rlimit(io::Error::last_os_error()));
    }
    Ok(limit.rlim_cur)
}

/// The families, fresh on every scrape: nothing is carried between scrapes, so concurrent
/// scrapes cannot race on a counter.
struct Families {
    cpu: Counter,
    open_fds: Gauge,
    max_fds: Gauge,
    virtual_bytes: Gauge,
    resident_bytes: Gauge,
    start_time: Gauge,
    threads: Gauge,
}

impl Families {
    fn new() -> Result<Self, prometheus::Error> {
        let gauge = |name: &str, help: &str| Gauge::with_opts(Opts::new(name, help));
        Ok(Self {
            cpu: Counter::with_opts(Opts::new(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent by the agent, in seconds.",
            ))?,
            open_fds: gauge("process_open_fds", "Open file descriptors of the agent.")?,
            max_fds: gauge(
                "process_max_fds",
                "The agent's limit on open file descriptors (RLIMIT_NOFILE, soft).",
            )?,
            virtual_bytes: gauge(
                "process_virtual_memory_bytes",
                "Virtual memory size of the agent, in bytes.",
            )?,
            resident_bytes: gauge(
                "process_resident_memory_bytes",
                "Resident memory size of the agent, in bytes.",
            )?,
            start_time: gauge(
                "process_start_time_seconds",
                "When the agent process started, in seconds since the Unix epoch: a change \
                 means a restart.",
            )?,
            threads: gauge("process_threads", "Threads of the agent process.")?,
        })
    }

    fn all(&self) -> [&dyn Collector; 7] {
        [
            &self.cpu,
            &self.open_fds,
            &self.max_fds,
            &self.virtual_bytes,
            &self.resident_bytes,
            &self.start_time,
            &self.threads,
        ]
    }
}

pub(super) struct ProcessCollector {
    descs: Vec<Desc>,
    ticks_per_second: f64,
    page_size: f64,
}

impl ProcessCollector {
    pub(super) fn new() -> Result<Self, prometheus::Error> {
        let descs = Families::new()?
            .all()
            .iter()
            .flat_map(|c| c.desc().into_iter().cloned().collect::<Vec<_>>())
            .collect();
        // SAFETY: sysconf has no preconditions.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        Ok(Self {
            descs,
            ticks_per_second: if ticks > 0 { ticks as f64 } else { 100.0 },
            page_size: if page > 0 { page as f64 } else { 4096.0 },
        })
    }

    fn families(&self) -> Result<Vec<MetricFamily>, Box<dyn std::error::Error>> {
        let stat = parse_stat(&read(STAT)?)?;
        let boot = parse_boot_time(&read("/proc/stat")?)?;
        let f = Families::new()?;
        f.cpu.inc_by(stat.cpu_ticks as f64 / self.ticks_per_second);
        f.threads.set(stat.threads as f64);
        f.virtual_bytes.set(stat.virtual_bytes as f64);
        f.resident_bytes
            .set(stat.resident_pages as f64 * self.page_size);
        f.start_time
            .set(boot as f64 + stat.start_ticks as f64 / self.ticks_per_second);
        f.open_fds.set(open_fds()? as f64);
        f.max_fds.set(max_fds()? as f64);
        Ok(f.all().iter().flat_map(|c| c.collect()).collect())
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.families().unwrap_or_else(|e| {
            warn!("process metrics left out of this scrape: {e}");
            Vec::new()
        })
    }
}
