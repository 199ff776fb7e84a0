//! Runs a delegate CNI plugin as a runtime would: its binary found on `CNI_PATH` (the first
//! directory that has a file of that name, as libcni's `FindInPath`), the caller's environment
//! with `CNI_*` set, its config on stdin, its result or CNI error on stdout.
//!
//! Both sides of ipq-ipam run a delegate: the plugin its ADD, CHECK, GC and STATUS, the agent
//! the DEL it defers until a quarantine ends. This crate is what they share, with the CNI error
//! object a delegate answers in ([`error::CniError`]), so the agent does not link the plugins'
//! crate and the plugins link nothing of the agent's.

pub mod error;

use std::{
    io::Write as _,
    os::fd::{AsRawFd as _, BorrowedFd},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use error::{code, CniError};

/// The first `CNI_PATH` directory holding an executable named `kind`.
pub fn find(cni_path: &str, kind: &str) -> Result<PathBuf, CniError> {
    std::env::split_paths(cni_path)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(kind))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| {
            // Worded as ipq-cni words every config error, naming the key.
            CniError::new(
                code::INVALID_NETWORK_CONFIG,
                format!(
                    "network config key \"ipam.delegate.type\": plugin {kind:?} is not on \
                     CNI_PATH {cni_path:?}"
                ),
            )
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs `binary` (the delegate `kind`) with `env` set over the inherited environment and
/// `stdin`; its stdout on success. A failure is the delegate's own CNI error (code, msg and
/// details kept, msg prefixed with the delegate's name), or ipq-ipam's when the delegate
/// printed none.
pub fn exec(
    kind: &str,
    binary: &Path,
    env: &[(&str, &str)],
    stdin: &[u8],
) -> Result<String, CniError> {
    run(
        kind,
        &binary.display().to_string(),
        Command::new(binary),
        env,
        stdin,
    )
}

/// [`exec`] of the file open as `fd` (an `O_PATH` descriptor the caller checked), never of a
/// path looked up again: `/proc/self/fd/N` is the descriptor's own file. The descriptor stays
/// open across the exec (its close-on-exec flag cleared in the child only), as a `#!` script's
/// interpreter opens that same `/proc/self/fd/N`. `shown` names the file in messages.
pub fn exec_fd(
    kind: &str,
    fd: BorrowedFd<'_>,
    shown: &Path,
    env: &[(&str, &str)],
    stdin: &[u8],
) -> Result<String, CniError> {
    use std::os::unix::process::CommandExt as _;
    let raw = fd.as_raw_fd();
    let mut command = Command::new(format!("/proc/self/fd/{raw}"));
    // SAFETY: fcntl is async-signal-safe, and `raw` is open in the child (inherited at fork,
    // held by the caller until spawn returns).
    unsafe {
        command.pre_exec(move || {
            if libc::fcntl(raw, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    run(kind, &shown.display().to_string(), command, env, stdin)
}

fn run(
    kind: &str,
    shown: &str,
    mut command: Command,
    env: &[(&str, &str)],
    stdin: &[u8],
) -> Result<String, CniError> {
    let mut child = command
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            CniError::new(
                code::DELEGATE_FAILED,
                format!("starting the delegate {kind} ({shown}): {e}"),
            )
        })?;
    if let Some(mut pipe) = child.stdin.take() {
        // A delegate may exit without reading its config; its answer is what counts.
        let _ = pipe.write_all(stdin);
    }
    let out = child.wait_with_output().map_err(|e| {
        CniError::new(
            code::DELEGATE_FAILED,
            format!("waiting for the delegate {kind}: {e}"),
        )
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        return Ok(stdout);
    }
    Err(delegate_error(
        kind,
        &stdout,
        &String::from_utf8_lossy(&out.stderr),
        out.status,
    ))
}

/// Whether the delegate speaks spec `version` (its VERSION answer lists it). GC and STATUS
/// exist from 1.1.0 on: a delegate that does not list it has neither, and is not sent them
/// (libcni does the same for a plugin whose config version is older).
pub fn supports(
    kind: &str,
    binary: &Path,
    cni_version: &str,
    version: &str,
) -> Result<bool, CniError> {
    #[derive(serde::Deserialize)]
    struct Versions {
        #[serde(rename = "supportedVersions", default)]
        supported: Vec<String>,
    }
    let stdin = serde_json::json!({ "cniVersion": cni_version }).to_string();
    let stdout = exec(
        kind,
        binary,
        &[("CNI_COMMAND", "VERSION")],
        stdin.as_bytes(),
    )?;
    let versions: Versions = serde_json::from_str(&stdout).map_err(|e| {
        CniError::new(
            code::DELEGATE_FAILED,
            format!(
                "delegate {kind}: its VERSION answer is not a version list ({e}): {:?}",
                stdout.trim()
            ),
        )
    })?;
    Ok(versions.supported.iter().any(|v| v == version))
}

/// The delegate's error object, passed on under its name; else one of ipq-ipam's.
fn delegate_error(
    kind: &str,
    stdout: &str,
    stderr: &str,
    status: std::process::ExitStatus,
) -> CniError {
    #[derive(serde::Deserialize)]
    struct Wire {
        code: u32,
        #[serde(default)]
        msg: String,
        details: Option<String>,
    }
    match serde_json::from_str::<Wire>(stdout) {
        Ok(wire) => {
            let err = CniError::new(wire.code, format!("delegate {kind}: {}", wire.msg));
            match wire.details {
                Some(details) => err.with_details(details),
                None => err,
            }
        }
        Err(_) => CniError::new(
            code::DELEGATE_FAILED,
            format!(
                "delegate {kind} {status} without a CNI error; stdout {:?}, stderr {:?}",
                stdout.trim(),
                stderr.trim()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn finds_the_first_executable_on_the_path() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::write(a.path().join("host-local"), "not executable").unwrap();
        let wanted = script(b.path(), "host-local", "exit 0");
        let path = format!("{}:{}", a.path().display(), b.path().display());
        assert_eq!(find(&path, "host-local").unwrap(), wanted);
        let err = find(&path, "static").expect_err("absent");
        assert_eq!(err.code, code::INVALID_NETWORK_CONFIG);
        assert!(err.msg.contains("\"static\""), "{err}");
    }

    #[test]
    fn passes_env_stdin_and_errors_through() {
        let dir = tempfile::tempdir().unwrap();
        let echo = script(dir.path(), "echo", "printf '%s ' \"$CNI_COMMAND\"; cat");
        let out = exec("echo", &echo, &[("CNI_COMMAND", "ADD")], b"{\"a\":1}").unwrap();
        assert_eq!(out, "ADD {\"a\":1}");
        let failing = script(
            dir.path(),
            "failing",
            "echo '{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"busy\",\"details\":\"d\"}'; exit 1",
        );
        let err = exec("failing", &failing, &[], b"{}").expect_err("fails");
        assert_eq!(
            (err.code, err.msg.as_str(), err.details.as_deref()),
            (11, "delegate failing: busy", Some("d"))
        );
        let versions = script(
            dir.path(),
            "versions",
            "echo '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.4.0\",\"1.0.0\"]}'",
        );
        assert!(supports("versions", &versions, "1.0.0", "1.0.0").unwrap());
        assert!(!supports("versions", &versions, "1.0.0", "1.1.0").unwrap());
        let silent = script(dir.path(), "silent", "echo oops >&2; exit 3");
        let err = exec("silent", &silent, &[], b"{}").expect_err("fails");
        assert_eq!(err.code, code::DELEGATE_FAILED);
        assert!(err.msg.contains("oops"), "{err}");
    }
}
