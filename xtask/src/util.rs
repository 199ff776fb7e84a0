//! Running external commands, with errors that name the command that failed.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};

use anyhow::{bail, Context, Result};

/// A command for `program` with `args`.
pub fn cmd<I, S>(program: impl AsRef<OsStr>, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut command = Command::new(program);
    command.args(args);
    command
}

/// `cargo build --release` of the binaries ipq's image ships (ipq-agent, ipq, ipq-cni,
/// ipq-ipam: the packages `ipq`, `ipq-cni`, `ipq-cli`); a caller adds its own flags.
pub fn release_build_of_shipped_binaries() -> Command {
    cargo([
        "build",
        "--release",
        "-p",
        "ipq",
        "-p",
        "ipq-cni",
        "-p",
        "ipq-cli",
        "--bins",
    ])
}

/// A command running the cargo that runs xtask (the `CARGO` cargo sets), so that nested builds
/// use the same toolchain.
pub fn cargo<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    cmd(program, args)
}

/// A command run under the pinned nightly toolchain (`ebpf/rust-toolchain.toml`):
/// `rustup run nightly-YYYY-MM-DD <program> <args>`. Besides PATH, rustup puts the toolchain's
/// `lib` on LD_LIBRARY_PATH, which is where a bpf-linker built against nightly's LLVM finds
/// `libLLVM.so.*`.
pub fn nightly<I, S>(program: impl AsRef<OsStr>, args: I) -> Result<Command>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut command = cmd("rustup", ["run", crate::toolchain::pinned_nightly()?]);
    command.arg(program).args(args);
    Ok(command)
}

/// Runs `command` with inherited stdio, printing it first (to stderr); fails unless it exits 0.
pub fn run(command: &mut Command) -> Result<()> {
    let line = command_line(command);
    eprintln!("+ {line}");
    let status = command
        .status()
        .with_context(|| spawn_failure(command, &line))?;
    check(&line, status, None)
}

/// Runs `command` quietly and returns its stdout; fails unless it exits 0, quoting its stderr.
pub fn output(command: &mut Command) -> Result<String> {
    let line = command_line(command);
    let out = probe(command)?;
    check(&line, out.status, Some(&out.stderr))?;
    String::from_utf8(out.stdout).with_context(|| format!("`{line}` printed non-UTF-8 output"))
}

/// Runs `command` quietly and returns whatever it produced, whatever its exit status; fails only
/// when it cannot be started at all.
pub fn probe(command: &mut Command) -> Result<Output> {
    let line = command_line(command);
    command
        .stdin(Stdio::null())
        .output()
        .with_context(|| spawn_failure(command, &line))
}

fn check(line: &str, status: ExitStatus, stderr: Option<&[u8]>) -> Result<()> {
    if status.success() {
        return Ok(());
    }
    match stderr.map(String::from_utf8_lossy) {
        Some(err) if !err.trim().is_empty() => {
            bail!("`{line}` failed with {status}:\n{}", err.trim_end())
        }
        _ => bail!("`{line}` failed with {status}"),
    }
}

fn spawn_failure(command: &Command, line: &str) -> String {
    let program = command.get_program().to_string_lossy();
    format!("could not start `{line}`: is `{program}` installed and on PATH?")
}

/// The command as a shell would show it, environment overrides first.
pub fn command_line(command: &Command) -> String {
    let env = command.get_envs().filter_map(|(key, value)| {
        value.map(|v| format!("{}={}", key.to_string_lossy(), quote(v)))
    });
    let words = std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(quote);
    env.chain(words).collect::<Vec<_>>().join(" ")
}

fn quote(word: &OsStr) -> String {
    let word = word.to_string_lossy();
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=+:,@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.into_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The workspace root: the directory above this crate's manifest.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .expect("xtask lives in a directory of the workspace")
        .to_path_buf()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Fails with `<what> needs root: <why>` unless running as root.
pub fn require_root(what: &str, why: &str) -> Result<()> {
    if !is_root() {
        bail!("{what} needs root: {why}");
    }
    Ok(())
}

/// "N MiB free on <path>", or why that is unknown: a build that fails for want of disk says so.
pub fn free_space_of(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return format!("free space of {} unknown", path.display());
    };
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: c_path is NUL-terminated and stat is a valid out-pointer for one statvfs.
    if unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return format!(
            "free space of {} unknown: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: statvfs returned 0, so it filled stat.
    let stat = unsafe { stat.assume_init() };
    let free = stat.f_bavail.saturating_mul(stat.f_frsize);
    format!("{} MiB free on {}", free >> 20, path.display())
}

/// Opens (creating) the lock file `path` and waits until this process holds it exclusively
/// (flock); held until the returned file is dropped. When another holds it, prints
/// `<waiting>` with the path first, so a second xtask says why it sits still.
pub fn exclusive_lock(path: &Path, waiting: &str) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        // Root opens it: never through a link someone put in its place.
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let lock = |how| {
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), how) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    if let Err(e) = lock(libc::LOCK_EX | libc::LOCK_NB) {
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            bail!("cannot lock {}: {e}", path.display());
        }
        println!("{waiting} ({} is locked): waiting for it", path.display());
        lock(libc::LOCK_EX).with_context(|| format!("cannot lock {}", path.display()))?;
    }
    Ok(file)
}
