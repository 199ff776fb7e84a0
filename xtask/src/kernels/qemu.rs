//! Boots one kernel with its initramfs under QEMU (TCG: KVM does not work on the build
//! machines) and reads the outcome from the serial console: `/init`'s markers, libtest's
//! lines, and how long each test executable took. The whole console is also kept in
//! `target/kernels/<name>/console.log`.

use std::fs::File;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::fetch::Tree;
use super::initramfs::MARKER;
use super::{cache_dir, Config, Kernel, TestSet};
use crate::cross::Arch;
use crate::test::{add_result_line, Totals};

/// What a boot produced.
pub struct Report {
    pub totals: Totals,
    /// Why the kernel failed, if it did.
    pub failure: Option<String>,
}

/// What the console said, as it is read.
#[derive(Default)]
struct Console {
    booted: Option<String>,
    done: bool,
    totals: Totals,
    /// The test executable running now, and since when.
    running: Option<(String, Instant)>,
    /// (target, exit status, how long it took), in order.
    exits: Vec<(String, i32, Duration)>,
    insmod_failed: Vec<String>,
    /// `test <name> ... FAILED` lines.
    failed_tests: Vec<String>,
    /// How many tests each target ran (`test <name> ... ok|FAILED` lines while it ran): a
    /// name in `kernels.toml` that matches no test runs nothing, and must not pass unseen.
    ran: std::collections::HashMap<String, usize>,
    /// What the failures said, deduplicated: each failed test's first message line, the
    /// agent's ERROR lines and the verifier's verdicts.
    errors: Vec<String>,
    /// A failed test whose message comes next (after `---- <name> stdout ----`).
    awaiting_message: Option<String>,
    /// The last lines, for a kernel that dies without saying why.
    tail: Vec<String>,
}

/// How many distinct error lines a kernel's failure quotes.
const MAX_ERRORS: usize = 12;

impl Console {
    fn read(&mut self, line: &str) {
        self.note_error(line);
        self.tail.push(line.to_owned());
        if self.tail.len() > 30 {
            self.tail.remove(0);
        }
        add_result_line(&mut self.totals, line);
        if line.starts_with("test ") && (line.ends_with(" ... ok") || line.ends_with(" ... FAILED"))
        {
            if let Some((target, _)) = &self.running {
                *self.ran.entry(target.clone()).or_default() += 1;
            }
        }
        if let Some(name) = line
            .strip_prefix("test ")
            .and_then(|rest| rest.strip_suffix(" ... FAILED"))
        {
            self.failed_tests.push(name.to_owned());
        }
        let Some((_, marker)) = line.split_once(MARKER) else {
            return;
        };
        let words: Vec<&str> = marker.split_whitespace().collect();
        match words.as_slice() {
            ["booted", release] => self.booted = Some((*release).to_owned()),
            ["insmod-failed", module] => self.insmod_failed.push((*module).to_owned()),
            ["run", target] => self.running = Some(((*target).to_owned(), Instant::now())),
            ["exit", target, status] => {
                let took = self
                    .running
                    .take()
                    .map_or(Duration::ZERO, |(_, since)| since.elapsed());
                let status = status.parse().unwrap_or(-1);
                println!("==> {target}: exit {status} after {took:.1?}");
                self.exits.push(((*target).to_owned(), status, took));
            }
            ["done"] => self.done = true,
            _ => {}
        }
    }

    fn note_error(&mut self, line: &str) {
        let text = line.trim();
        let error = if let Some(name) = text
            .strip_prefix("---- ")
            .and_then(|rest| rest.strip_suffix(" stdout ----"))
        {
            self.awaiting_message = Some(name.to_owned());
            None
        } else if text.contains("verification time") {
            // The verifier's verdict is the line before its statistics.
            self.tail
                .last()
                .map(|prev| format!("verifier: {}", prev.trim()))
        } else if let Some((_, after)) = text.split_once(" ERROR ") {
            Some(format!("agent: {after}"))
        } else if text.is_empty() || text.starts_with("thread '") {
            None
        } else {
            self.awaiting_message
                .take()
                .map(|name| format!("{name}: {text}"))
        };
        if let Some(mut error) = error {
            if error.len() > 300 {
                let mut end = 300;
                while !error.is_char_boundary(end) {
                    end -= 1;
                }
                error.truncate(end);
                error.push_str(" ...");
            }
            if self.errors.len() < MAX_ERRORS && !self.errors.contains(&error) {
                self.errors.push(error);
            }
        }
    }

    /// Why this boot failed, or None.
    fn failure(&self, expected: &[TestSet], timed_out: Option<Duration>) -> Option<String> {
        let mut why = Vec::new();
        if let Some(limit) = timed_out {
            why.push(format!("did not power off within {limit:?}"));
        }
        if self.booted.is_none() {
            why.push("never reached /init".to_owned());
        }
        if !self.insmod_failed.is_empty() {
            why.push(format!("insmod failed: {}", self.insmod_failed.join(" ")));
        }
        for set in expected {
            let target = &set.target;
            let ran = self.ran.get(target).copied().unwrap_or(0);
            if !set.names.is_empty() && ran < set.names.len() {
                why.push(format!(
                    "{target} ran {ran} of its {} named tests: a name in xtask/kernels.toml \
                     matches no test (renamed?)",
                    set.names.len()
                ));
            }
            match self.exits.iter().find(|(t, _, _)| t == target) {
                Some((_, 0, _)) => {}
                Some((_, status, _)) => why.push(format!("{target} exited {status}")),
                None => match &self.running {
                    Some((t, _)) if t == target => why.push(format!("{target} did not finish")),
                    _ => why.push(format!("{target} did not run")),
                },
            }
        }
        if !self.failed_tests.is_empty() {
            why.push(format!("failed tests: {}", self.failed_tests.join(", ")));
        }
        if self.totals.ignored > 0 {
            why.push(format!("{} tests ignored", self.totals.ignored));
        }
        if !self.done && why.is_empty() {
            why.push("/init did not finish".to_owned());
        }
        if why.is_empty() {
            return None;
        }
        if !self.errors.is_empty() {
            why.push(format!(
                "errors seen:\n      {}",
                self.errors.join("\n      ")
            ));
        }
        if self.booted.is_none() || !self.done {
            why.push(format!(
                "last console lines:\n      {}",
                self.tail.join("\n      ")
            ));
        }
        // One reason per line, indented under the kernel's name.
        Some(format!("\n    {}", why.join("\n    ")))
    }
}

pub fn boot(config: &Config, kernel: &Kernel, tree: &Tree, initrd: &Path) -> Result<Report> {
    let log_path = cache_dir().join(&kernel.name).join("console.log");
    let mut log =
        File::create(&log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
    let mut qemu = command(config, kernel, tree, initrd);
    let line = crate::util::command_line(&qemu);
    eprintln!("+ {line}");
    let mut child = qemu
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| {
            format!(
                "cannot start `{line}` (qemu-system-x86 and qemu-system-arm are in setup's \
                     package list)"
            )
        })?;
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().context("qemu stdout")?;
    let stderr = child.stderr.take().context("qemu stderr")?;
    for stream in [
        Box::new(stdout) as Box<dyn std::io::Read + Send>,
        Box::new(stderr),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for text in BufReader::new(stream).lines() {
                let Ok(text) = text else { break };
                if tx.send(text).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);

    let limit = Duration::from_secs(kernel.timeout_secs.unwrap_or(config.qemu.timeout_secs));
    let deadline = Instant::now() + limit;
    let mut console = Console::default();
    let mut timed_out = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(text) => {
                let text = printable(&text);
                println!("[{}] {text}", kernel.name);
                writeln!(log, "{text}").ok();
                console.read(&text);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = Some(limit);
                // Ours to stop: the child we started.
                let _ = child.kill();
                break;
            }
        }
    }
    let status = child.wait().context("waiting for qemu")?;
    let expected = TestSet::for_kernel(&config.tests, &kernel.name);
    let mut failure = console.failure(&expected, timed_out);
    if !status.success() && timed_out.is_none() {
        let why = format!("qemu exited with {status}");
        failure = Some(failure.map_or(why.clone(), |f| format!("{why}; {f}")));
    }
    if let Some(release) = &console.booted {
        println!("==> kernel {}: booted {release}", kernel.name);
    }
    Ok(Report {
        totals: console.totals,
        failure,
    })
}

/// A console line without its CR (the serial console ends lines with CR LF) and without the
/// terminal escapes the firmware sends (`ESC c`, `ESC [ ... letter`), which would clear the
/// terminal or the CI log they are echoed to.
fn printable(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.trim_end_matches('\r').chars();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        // `ESC [ ... letter`; anything else is a two-character escape such as `ESC c`.
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        }
    }
    out
}

/// The guests' niceness: a cluster process that wakes preempts a guest at once, and against a
/// busy cluster tier a guest still gets about a quarter of a core (weight 335 against 1024).
/// At 10 (a tenth), with a second three-node cluster test run by hand beside the tier, the
/// arm64 guest missed a scaled deadline (a repair in 1.18 s of its 1 s).
const GUEST_NICENESS: libc::c_int = 5;

/// QEMU for the kernel's architecture with the kernel, the initramfs and a serial console on
/// stdout: `qemu-system-x86_64`, or `qemu-system-aarch64 -M virt` (its PL011 UART is
/// `ttyAMA0`).
fn command(config: &Config, kernel: &Kernel, tree: &Tree, initrd: &Path) -> Command {
    let (program, append) = match kernel.arch {
        // noapic: TCG guests sometimes panic with "IO-APIC + timer doesn't work" (aya saw it
        // too). random.trust_cpu: TCG's `max` CPU has RDRAND; the agent's getrandom must not
        // block.
        Arch::Amd64 => (
            "qemu-system-x86_64",
            "console=ttyS0 quiet noapic panic=-1 random.trust_cpu=on",
        ),
        // `-cpu max` has RNDR (ARMv8.5), which random.trust_cpu trusts as RDRAND on x86.
        Arch::Arm64 => (
            "qemu-system-aarch64",
            "console=ttyAMA0 quiet panic=-1 random.trust_cpu=on",
        ),
    };
    let mut qemu = Command::new(program);
    // A guest is batch work: it yields the CPU to the cluster tier beside it (`xtask test`)
    // and to whatever else the machine runs. Its tests' timeouts are scaled for a busy host
    // (`qemu.time_scale`); the cluster tier's latencies are not.
    // SAFETY: setpriority is async-signal-safe and touches only the child about to exec.
    unsafe {
        qemu.pre_exec(|| {
            if libc::setpriority(libc::PRIO_PROCESS, 0, GUEST_NICENESS) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    if kernel.arch == Arch::Arm64 {
        qemu.args(["-M", "virt"]);
    }
    // panic=-1 with -no-reboot: a kernel panic ends QEMU at once instead of hanging.
    qemu.args(["-accel", "tcg,thread=single", "-cpu", "max"])
        .args(["-m", &config.qemu.memory_mib.to_string()])
        .args(["-smp", &config.qemu.cpus.to_string()])
        .args([
            "-nographic",
            "-no-reboot",
            "-nodefaults",
            "-serial",
            "stdio",
        ])
        .arg("-kernel")
        .arg(&tree.vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", append]);
    qemu
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_read_after_terminal_escapes() {
        let line = printable("\x1bc\x1b[?7l\x1b[2JIPQ-TIER: booted 6.12.100\r");
        assert_eq!(line, "IPQ-TIER: booted 6.12.100");
        let mut console = Console::default();
        for text in [
            line.as_str(),
            "IPQ-TIER: run verdicts",
            "test verdict_table ... FAILED",
            "---- verdict_table stdout ----",
            "thread 'verdict_table' (1) panicked at tests/tests/verdicts.rs:1:1:",
            "Error: loading the datapath",
            "       667: (85) call unknown#160",
            "       invalid func unknown#160",
            "       verification time 67400 usec",
            "[2026-11-23T04:17:11.157Z ERROR ipq::tracker] vethpa: `bpf_mprog_attach` failed",
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
            "IPQ-TIER: exit verdicts 101",
            "IPQ-TIER: done",
        ] {
            console.read(text);
        }
        assert_eq!(console.booted.as_deref(), Some("6.12.100"));
        assert_eq!((console.totals.passed, console.totals.failed), (2, 1));
        let set = |target: &str| TestSet {
            target: target.into(),
            names: Vec::new(),
            kernels: Vec::new(),
        };
        let why = console
            .failure(&[set("verdicts"), set("traffic")], None)
            .expect("a failure");
        assert!(why.contains("verdicts exited 101"), "{why}");
        assert!(why.contains("traffic did not run"), "{why}");
        assert!(why.contains("failed tests: verdict_table"), "{why}");
        assert!(why.contains("errors seen:"), "{why}");
        assert_eq!(
            console.errors,
            [
                "verdict_table: Error: loading the datapath",
                "verifier: invalid func unknown#160",
                "agent: ipq::tracker] vethpa: `bpf_mprog_attach` failed",
            ]
        );
    }

    /// A named test that no longer exists (renamed in its file, not in kernels.toml) runs
    /// nothing under `--exact`: the boot fails, naming the target, instead of passing short.
    #[test]
    fn a_named_test_that_ran_nothing_fails_the_kernel() {
        let mut console = Console::default();
        for text in [
            "IPQ-TIER: booted 6.1.0",
            "IPQ-TIER: run slots",
            "test every_address_of_a_full_registry_is_judged_from_the_copy ... ok",
            "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 3 filtered out",
            "IPQ-TIER: exit slots 0",
            "IPQ-TIER: done",
        ] {
            console.read(text);
        }
        let slots = TestSet {
            target: "slots".into(),
            names: vec![
                "every_address_of_a_full_registry_is_judged_from_the_copy".into(),
                "a_test_since_renamed".into(),
            ],
            kernels: Vec::new(),
        };
        let why = console.failure(&[slots], None).expect("a failure");
        assert!(why.contains("slots ran 1 of its 2 named tests"), "{why}");
    }

    /// Two sets of one target on one kernel are one run with both sets' names (the console
    /// reads one exit per run); a set that names nothing runs all of the target.
    #[test]
    fn sets_of_one_target_on_one_kernel_are_one_run() {
        let set = |names: &[&str], kernels: &[&str]| TestSet {
            target: "slots".into(),
            names: names.iter().map(|n| n.to_string()).collect(),
            kernels: kernels.iter().map(|k| k.to_string()).collect(),
        };
        let sets = [set(&["a", "b"], &[]), set(&["c", "a"], &["5.10"])];
        let on_510 = TestSet::for_kernel(&sets, "5.10");
        assert_eq!(on_510.len(), 1);
        assert_eq!(on_510[0].names, ["a", "b", "c"]);
        let on_61 = TestSet::for_kernel(&sets, "6.1");
        assert_eq!(on_61.len(), 1);
        assert_eq!(on_61[0].names, ["a", "b"]);
        let whole = [set(&["a"], &[]), set(&[], &["5.10"])];
        assert!(TestSet::for_kernel(&whole, "5.10")[0].names.is_empty());
        assert_eq!(TestSet::for_kernel(&whole, "6.1")[0].names, ["a"]);
    }
}
