//! Talking to the agent's API socket the way its users do: the real `ipq` binary (optionally
//! as another user, through `setpriv`), and raw HTTP/1.1 requests written by hand, so a test
//! can send what no well-behaved client would.

use std::{
    io::{Read as _, Write as _},
    os::unix::{net::UnixStream, process::ExitStatusExt as _},
    path::Path,
    process::{Command, Output},
    time::Duration,
};

use anyhow::{anyhow, bail, Context as _};
use serde_json::Value;

use crate::netns::workspace_binary;

/// How long a raw request may take, end to end.
const RAW_TIMEOUT: Duration = Duration::from_secs(10);

/// What one run of `ipq` did.
#[derive(Clone, Debug)]
pub struct CliRun {
    pub args: Vec<String>,
    /// The exit code; a death by signal is an error before a `CliRun` exists.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl CliRun {
    fn from_output(args: Vec<String>, out: Output) -> anyhow::Result<CliRun> {
        let code = match out.status.code() {
            Some(code) => code,
            None => bail!(
                "ipq {args:?} was killed by signal {:?}; stderr: {}",
                out.status.signal(),
                String::from_utf8_lossy(&out.stderr)
            ),
        };
        Ok(CliRun {
            args,
            code,
            stdout: String::from_utf8(out.stdout).context("ipq's stdout is not UTF-8")?,
            stderr: String::from_utf8(out.stderr).context("ipq's stderr is not UTF-8")?,
        })
    }

    /// Stdout, after checking the run exited 0 with nothing on stderr.
    pub fn ok(&self) -> &str {
        assert_eq!(
            (self.code, self.stderr.as_str()),
            (0, ""),
            "ipq {:?} should succeed silently; stdout:\n{}",
            self.args,
            self.stdout
        );
        &self.stdout
    }

    /// Stdout parsed as one JSON document, after [`ok`](Self::ok).
    pub fn json(&self) -> Value {
        let out = self.ok();
        serde_json::from_str(out)
            .unwrap_or_else(|e| panic!("ipq {:?} printed no JSON ({e}):\n{out}", self.args))
    }

    /// Asserts the exit code and that stderr is one `ipq: ...` line containing every one of
    /// `words`, and nothing is on stdout.
    pub fn assert_fails(&self, code: i32, words: &[&str]) {
        assert_eq!(
            self.code, code,
            "exit code of ipq {:?}; stdout: {}; stderr: {}",
            self.args, self.stdout, self.stderr
        );
        assert_eq!(self.stdout, "", "ipq {:?} printed on failure", self.args);
        let line = self.stderr.trim_end();
        assert!(
            line.starts_with("ipq: ") && !line.contains('\n'),
            "ipq {:?}: stderr is not one `ipq: <message>` line: {:?}",
            self.args,
            self.stderr
        );
        for word in words {
            assert!(
                line.contains(word),
                "ipq {:?}: stderr {line:?} should mention {word:?}",
                self.args
            );
        }
    }
}

/// `ipq --socket <socket> <args>` as root.
pub fn ipq(socket: &Path, args: &[&str]) -> anyhow::Result<CliRun> {
    ipq_as(&[], socket, args)
}

/// `setpriv <setpriv_args> ipq --socket <socket> <args>`; no setpriv when `setpriv_args` is
/// empty. E.g. `["--reuid=65534", "--regid=65534", "--clear-groups"]`.
pub fn ipq_as(setpriv_args: &[&str], socket: &Path, args: &[&str]) -> anyhow::Result<CliRun> {
    let ipq = workspace_binary("ipq");
    let mut cmd = if setpriv_args.is_empty() {
        Command::new(&ipq)
    } else {
        let mut cmd = Command::new("setpriv");
        cmd.args(setpriv_args).arg(&ipq);
        cmd
    };
    cmd.arg("--socket").arg(socket).args(args);
    // The caller's environment must not pick another socket.
    cmd.env_remove("IPQ_SOCKET");
    let out = cmd
        .output()
        .with_context(|| format!("running {cmd:?} (setpriv is in package util-linux)"))?;
    let mut all: Vec<String> = setpriv_args.iter().map(|s| s.to_string()).collect();
    all.extend(args.iter().map(|s| s.to_string()));
    CliRun::from_output(all, out)
}

/// One HTTP answer as read off the socket.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: String,
}

impl HttpResponse {
    pub fn json(&self) -> anyhow::Result<Value> {
        serde_json::from_str(&self.body)
            .with_context(|| format!("answer body is not JSON: {:?}", self.body))
    }

    /// Asserts an error answer: `status`, a JSON content type, and a body
    /// `{"error":{"code":code,"message":...}}` whose message contains every one of `words`.
    /// Returns the error object.
    pub fn assert_error(&self, what: &str, status: u16, code: &str, words: &[&str]) -> Value {
        assert_eq!(self.status, status, "{what}: status; body {}", self.body);
        assert!(
            self.content_type
                .as_deref()
                .is_some_and(|t| t.starts_with("application/json")),
            "{what}: content type {:?}",
            self.content_type
        );
        let body = self.json().unwrap_or_else(|e| panic!("{what}: {e:#}"));
        let error = body
            .get("error")
            .unwrap_or_else(|| panic!("{what}: no `error` in {body}"));
        assert_eq!(error["code"], code, "{what}: code in {body}");
        let message = error["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no message string in {body}"));
        for word in words {
            assert!(
                message.contains(word),
                "{what}: message {message:?} should mention {word:?}"
            );
        }
        error.clone()
    }
}

/// The events the agent still has (`GET /v1/events`, not followed), each line read as the
/// API's typed event: a line that is not one fails, naming it.
pub fn events(socket: &Path) -> anyhow::Result<Vec<ipq_api::model::Event>> {
    let answer = request(socket, "GET", "/v1/events", None)?;
    if answer.status != 200 {
        bail!("GET /v1/events: {} {}", answer.status, answer.body);
    }
    answer
        .body
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .with_context(|| format!("an event line of /v1/events: {line}"))
        })
        .collect()
}

/// `method path` with an optional JSON body, over a fresh connection.
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> anyhow::Result<HttpResponse> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: ipq\r\nConnection: close\r\n");
    if let Some(body) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    } else if method == "POST" {
        head.push_str("Content-Length: 0\r\n");
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.unwrap_or("").as_bytes());
    raw(socket, &bytes)
}

/// Writes `bytes` as they are, then reads the answer until the agent closes the connection
/// (the request should say `Connection: close`).
pub fn raw(socket: &Path, bytes: &[u8]) -> anyhow::Result<HttpResponse> {
    let mut stream = UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    stream.set_read_timeout(Some(RAW_TIMEOUT))?;
    stream.set_write_timeout(Some(RAW_TIMEOUT))?;
    stream.write_all(bytes)?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .context("reading the answer")?;
    parse_response(&answer)
}

fn parse_response(answer: &[u8]) -> anyhow::Result<HttpResponse> {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("no end of headers in {text:?}"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let header = |name: &str| {
        head.split("\r\n").skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    };
    let chunked = header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Ok(HttpResponse {
        status,
        content_type: header("content-type"),
        body,
    })
}

/// The payload of a `Transfer-Encoding: chunked` body.
fn dechunk(mut rest: &str) -> anyhow::Result<String> {
    let mut body = String::new();
    loop {
        let (size, after) = rest
            .split_once("\r\n")
            .ok_or_else(|| anyhow!("chunk without a size line: {rest:?}"))?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("chunk size {size:?}"))?;
        if size == 0 {
            return Ok(body);
        }
        let chunk = after
            .get(..size)
            .ok_or_else(|| anyhow!("chunk of {size} bytes cut short: {after:?}"))?;
        body.push_str(chunk);
        rest = after[size..]
            .strip_prefix("\r\n")
            .ok_or_else(|| anyhow!("chunk not followed by CRLF"))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_and_plain_answers_parse() {
        let plain = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        let r = parse_response(plain).unwrap();
        assert_eq!(
            (r.status, r.content_type.as_deref(), r.body.as_str()),
            (404, Some("application/json"), "{}")
        );
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap().body, "{\"a\":1}");
    }
}
