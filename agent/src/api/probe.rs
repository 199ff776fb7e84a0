//! `ipq-agent probe healthz|readyz`: the kubelet's exec probe. It asks the agent over the API
//! socket, where root's connections have slots no other user can take
//! ([`crate::listen::API_ROOT_RESERVE`]), rather than on the metrics port, which any local user
//! (8 connections) or the node's network can fill.

use std::{
    io::{self, Read as _, Write as _},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

use thiserror::Error;

/// What a probe asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum Probe {
    /// The agent answers (liveness).
    Healthz,
    /// The datapath is loaded and attached and changes can be saved (readiness).
    Readyz,
}

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("{}: {source}", socket.display())]
    Io {
        socket: std::path::PathBuf,
        source: io::Error,
    },
    #[error("/{probe}: answered {status}: {body}")]
    Failed {
        probe: &'static str,
        status: u16,
        body: String,
    },
    #[error("/{probe}: not an HTTP answer: {answer:?}")]
    Garbled { probe: &'static str, answer: String },
}

/// Asks `probe` of the agent on `socket`, within `timeout` for each read and write; the
/// answer's body when it is 200.
pub fn ask(socket: &Path, probe: Probe, timeout: Duration) -> Result<String, ProbeError> {
    let name: &'static str = probe.into();
    let io_err = |source| ProbeError::Io {
        socket: socket.to_owned(),
        source,
    };
    let mut stream = UnixStream::connect(socket).map_err(io_err)?;
    stream.set_read_timeout(Some(timeout)).map_err(io_err)?;
    stream.set_write_timeout(Some(timeout)).map_err(io_err)?;
    // HTTP/1.0: the agent closes the connection after its answer, which ends the read.
    write!(stream, "GET /{name} HTTP/1.0\r\nHost: ipq\r\n\r\n").map_err(io_err)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(io_err)?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| ProbeError::Garbled {
            probe: name,
            answer: answer.chars().take(200).collect(),
        })?;
    if status == 200 {
        Ok(body.to_owned())
    } else {
        Err(ProbeError::Failed {
            probe: name,
            status,
            body: body.trim().to_owned(),
        })
    }
}
