//! One run of the plugin: environment and stdin in, what to print and the exit status out.
//! The binary is a thin shell over [`run`], so every path is testable without a process.

use std::{
    ffi::OsString,
    io::{Read as _, Write as _},
    process::ExitCode,
};

use serde_json::{json, Value};

use super::{
    commands::Invocation,
    config::{self, NetConf, LATEST_VERSION, SUPPORTED_VERSIONS},
    env::{Command, Env},
    error::{code, CniError},
};

/// What the process prints on stdout, and whether it exits 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: String,
    pub success: bool,
}

impl Outcome {
    pub(crate) fn ok(stdout: String) -> Self {
        Self {
            stdout,
            success: true,
        }
    }

    pub(crate) fn error(err: &CniError, cni_version: &str) -> Self {
        Self {
            stdout: err.to_json(cni_version),
            success: false,
        }
    }
}

/// The process shell of `ipq-cni` and `ipq-ipam`: logs on stderr (which runtimes keep apart
/// from the result), stdin read whole and handed to `run`, its outcome printed on stdout.
pub fn serve(run: impl FnOnce(&[u8]) -> Outcome) -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("IPQ_CNI_LOG", "warn"))
        .format_timestamp(None)
        .format_target(false)
        .init();
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        log::warn!("reading stdin: {e}");
    }
    let outcome = run(&stdin);
    let mut stdout = std::io::stdout().lock();
    if !outcome.stdout.is_empty() {
        let written = stdout
            .write_all(outcome.stdout.as_bytes())
            .and_then(|()| stdout.write_all(b"\n"))
            .and_then(|()| stdout.flush());
        if let Err(e) = written {
            log::error!("writing the result to stdout: {e}");
            return ExitCode::FAILURE;
        }
    }
    if outcome.success {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs the command `var` names with config `stdin`.
pub fn run(var: impl Fn(&str) -> Option<OsString>, stdin: &[u8]) -> Outcome {
    let hint = config::version_hint(stdin);
    let error_version = hint.as_deref().unwrap_or(LATEST_VERSION);
    match dispatch(var, stdin) {
        Ok(stdout) => Outcome::ok(stdout),
        Err(err) => {
            log::debug!("{err}");
            Outcome::error(&err, error_version)
        }
    }
}

fn dispatch(var: impl Fn(&str) -> Option<OsString>, stdin: &[u8]) -> Result<String, CniError> {
    let env = Env::from_lookup(var)?;
    if env.command == Command::Version {
        return version(stdin);
    }
    let conf = NetConf::parse(stdin, env.command)?;
    let invocation = Invocation { env, conf };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CniError::new(code::INTERNAL, format!("starting the async runtime: {e}")))?;
    runtime.block_on(async {
        match invocation.env.command {
            Command::Add => {
                let result = invocation.add().await?;
                Ok(result.to_string())
            }
            Command::Del => invocation.del().await.map(|()| String::new()),
            Command::Check => invocation.check().await.map(|()| String::new()),
            Command::Gc => invocation.gc().await.map(|()| String::new()),
            Command::Status => invocation.status().await.map(|()| String::new()),
            // Answered above, before any config is parsed.
            Command::Version => version(stdin),
        }
    })
}

/// VERSION: the versions ipq-cni speaks, under the `cniVersion` the runtime asked with (or the
/// newest when it sent none).
pub(crate) fn version(stdin: &[u8]) -> Result<String, CniError> {
    let asked = if stdin.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(
                code::DECODING_FAILURE,
                format!("VERSION: stdin is not JSON: {e}"),
            )
        })?;
        match value.get("cniVersion") {
            None => None,
            Some(Value::String(v)) => Some(v.clone()),
            Some(other) => {
                return Err(CniError::new(
                    code::DECODING_FAILURE,
                    format!("VERSION: cniVersion must be a string, not {other}"),
                ))
            }
        }
    };
    Ok(json!({
        "cniVersion": asked.as_deref().unwrap_or(LATEST_VERSION),
        "supportedVersions": SUPPORTED_VERSIONS,
    })
    .to_string())
}

#[cfg(test)]
mod tests;
