//! Waiting for what proves a thing, never for time: the one bounded poll every helper and test
//! waits with, a child's exit within a bound, and the spawn that dies with the test.

use std::{
    os::unix::process::CommandExt as _,
    process::{Child, Command, ExitStatus},
    time::{Duration, Instant},
};

use anyhow::bail;

use crate::time::scaled;

/// How often a probe is asked again.
const INTERVAL: Duration = Duration::from_millis(20);

/// Calls `probe` every 20 ms until it returns `Some`, for at most `timeout` (times the time
/// scale); the error names `what` and the last thing the probe said.
pub fn poll<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let timeout = scaled(timeout);
    let deadline = Instant::now() + timeout;
    loop {
        let last = match probe() {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => "not yet".to_owned(),
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what} (last: {last})");
        }
        std::thread::sleep(INTERVAL);
    }
}

/// Whether something accepts connections on the unix socket at `path`. The file appears at
/// `bind()`, before `listen()`: a connect in between is refused (ECONNREFUSED), so a socket's
/// existence does not prove its server is up; an accepted connection does.
pub fn unix_socket_accepts(path: &std::path::Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

/// `child`'s exit status once it exits within `timeout` (as given: callers scale it where the
/// time scale applies); `None` when it did not, after it was killed and reaped.
pub fn exit_within(child: &mut Child, timeout: Duration) -> anyhow::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(INTERVAL);
    }
}

/// Makes `cmd` die with the test process, even one that dies without unwinding (SIGKILL, a
/// harness timeout): an agent, a Prometheus or a runtime must not live on holding pins,
/// ports and mounts. The signal comes when the spawning thread exits, which is the test's own
/// thread: the guard that owns the child never outlives it.
pub fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
