//! A watchdog over `cargo test`'s output: a test binary that says nothing for [`STALL`] is
//! hung, and killed, so its target fails (cargo goes on with the next, `--no-fail-fast`)
//! instead of the whole run waiting for CI's limit with nothing to show for it.
//!
//! Why: a test that panicked inside `thread::scope` while a thread it spawned never stopped
//! once hung a full run for 38 minutes (`tcx_displaced`, fixed since). libtest has no timeout
//! of its own on stable; it only says once that a test "has been running for over 60 seconds".
//! The longest quiet stretch of a healthy run is a test binary of ~90 s, and of a build, a
//! crate's compile of a minute or two, so ten minutes of silence is a hang, never a slow test.

use std::{
    io::{BufRead as _, BufReader, Read},
    sync::mpsc,
    time::Duration,
};

use anyhow::{Context as _, Result};

/// How long `cargo test` may print nothing before the binary it runs is taken for hung.
pub const STALL: Duration = Duration::from_secs(10 * 60);

/// Hands each line of `output` to `each` as it comes. Whenever none comes for `stall`, the
/// processes `parent` (cargo) runs are killed: the test binary, whose agents and helpers die
/// with it (the tests set their parent-death signal), and each kill is said on stderr and in
/// the returned list. Returns when `output` ends.
pub fn read_lines(
    output: impl Read + Send + 'static,
    parent: u32,
    stall: Duration,
    mut each: impl FnMut(&str),
) -> Result<Vec<String>> {
    let (lines, received) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(output).lines() {
            let end = line.is_err();
            if lines.send(line).is_err() || end {
                return;
            }
        }
    });
    let mut kills = Vec::new();
    let mut last_slow = None;
    loop {
        match received.recv_timeout(stall) {
            Ok(line) => {
                let line = line.context("reading cargo test's output")?;
                if line.contains("has been running for over") {
                    last_slow = Some(line.trim().to_owned());
                }
                each(&line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                for (pid, name) in children(parent) {
                    // SAFETY: a signal to a process; at worst it is gone already.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    let said = format!(
                        "xtask: nothing printed for {} s; killed {name} (pid {pid}) as hung{}",
                        stall.as_secs(),
                        last_slow
                            .as_deref()
                            .map(|line| format!(" (its last word: \"{line}\")"))
                            .unwrap_or_default()
                    );
                    eprintln!("{said}");
                    kills.push(said);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = reader.join();
    Ok(kills)
}

/// The processes whose parent is `parent`: their pids and names (`/proc/<pid>/stat`).
fn children(parent: u32) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // "pid (name) state ppid ...": the name may hold spaces and parentheses.
            let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
            let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent).then(|| (pid, name.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// `script` run by a shell standing for cargo, its output read with `stall`: the lines,
    /// the kills, and whether the shell exited 0.
    fn watched(script: &str, stall: Duration) -> (Vec<String>, Vec<String>, bool) {
        let mut shell = Command::new("sh")
            .args(["-c", script])
            .stderr(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh");
        let output = shell.stdout.take().expect("its stdout");
        let mut lines = Vec::new();
        let kills = read_lines(output, shell.id(), stall, |line| {
            lines.push(line.to_owned())
        })
        .expect("reading");
        let ok = shell.wait().expect("sh ends").success();
        (lines, kills, ok)
    }

    #[test]
    fn a_silent_child_is_killed_and_the_output_read_to_its_end() {
        // Its `sleep` stands for a hung test binary.
        let (lines, kills, _) = watched(
            "echo before; sleep 600; echo after",
            Duration::from_millis(500),
        );
        assert_eq!(lines, ["before", "after"]);
        assert_eq!(kills.len(), 1, "{kills:?}");
        assert!(kills[0].contains("killed sleep"), "{kills:?}");
    }

    #[test]
    fn output_that_keeps_coming_is_left_alone() {
        let (lines, kills, ok) = watched(
            "for i in 1 2 3 4 5; do echo $i; sleep 0.1; done",
            Duration::from_secs(2),
        );
        assert!(ok);
        assert_eq!(lines, ["1", "2", "3", "4", "5"]);
        assert!(kills.is_empty(), "{kills:?}");
    }
}
