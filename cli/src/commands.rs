//! Runs one parsed command against the agent and writes the answer: a table, or the API's JSON.

use std::{
    io::{self, Write},
    time::SystemTime,
};

use serde::Serialize;

use super::{
    args::{Cli, Command, Output},
    error::CliError,
    render,
};
use ipq_api::client::Client;

/// Runs `cli`'s command with `client`, writing to `out`.
pub async fn run(cli: &Cli, client: &Client, out: &mut impl Write) -> Result<(), CliError> {
    let json = cli.output == Output::Json;
    let now = SystemTime::now();
    let text = match &cli.command {
        Command::Status => {
            let status = client.status().await?;
            answer(json, &status, || render::status(&status, now))?
        }
        Command::List { state } => {
            let list = client.list(*state).await?;
            answer(json, &list, || render::addresses(&list.addresses, now))?
        }
        Command::Get { ip } => {
            let view = client.get(*ip).await?;
            answer(json, &view, || render::address_detail(&view, now))?
        }
        Command::Drain { ip } => {
            let changed = client.drain(*ip).await?;
            answer(json, &changed, || {
                render::addresses(&changed.addresses, now)
            })?
        }
        Command::Release { ip, force } => {
            let changed = client.release(*ip, *force).await?;
            answer(json, &changed, || {
                render::addresses(&changed.addresses, now)
            })?
        }
        Command::Conflicts { limit } => {
            let list = client.conflicts(*limit).await?;
            answer(json, &list, || render::conflicts(&list.conflicts, now))?
        }
        Command::Events { follow } => return events(client, *follow, json, out).await,
    };
    write_all(out, text.as_bytes()).map(|_| ())
}

/// The JSON document (pretty, newline-ended) or the table.
fn answer<T: Serialize>(
    json: bool,
    value: &T,
    table: impl FnOnce() -> String,
) -> Result<String, CliError> {
    if json {
        let mut text = serde_json::to_string_pretty(value)?;
        text.push('\n');
        Ok(text)
    } else {
        Ok(table())
    }
}

/// One line per event as it arrives (NDJSON with `-o json`), flushed at once so a pipe sees
/// each event live.
async fn events(
    client: &Client,
    follow: bool,
    json: bool,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let mut failed = None;
    client
        .events(follow, |event| {
            let line = if json {
                serde_json::to_string(&event).map_err(CliError::from)
            } else {
                Ok(render::event_line(&event))
            };
            let written = line.and_then(|mut line| {
                line.push('\n');
                write_all(out, line.as_bytes())
            });
            match written {
                Ok(Reader::Present) => true,
                // `ipq events --follow | head -3`: stop following, successfully.
                Ok(Reader::Gone) => false,
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        })
        .await?;
    failed.map_or(Ok(()), Err)
}

/// Whether anyone still reads what `ipq` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reader {
    Present,
    /// The pipe's reader exited (`ipq events | head`): not an error, it has what it wanted.
    Gone,
}

/// Writes and flushes.
fn write_all(out: &mut impl Write, bytes: &[u8]) -> Result<Reader, CliError> {
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(Reader::Present),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(Reader::Gone),
        Err(e) => Err(CliError::Output(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stdout whose every write fails with `kind`.
    struct Failing(io::ErrorKind);

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(self.0.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_pipe_ends_output_quietly_and_other_write_errors_fail() {
        let mut out = Vec::new();
        assert_eq!(write_all(&mut out, b"x\n").unwrap(), Reader::Present);
        assert_eq!(out, b"x\n");
        let gone = write_all(&mut Failing(io::ErrorKind::BrokenPipe), b"x\n");
        assert_eq!(gone.unwrap(), Reader::Gone);
        let full = write_all(&mut Failing(io::ErrorKind::StorageFull), b"x\n");
        assert!(matches!(full, Err(CliError::Output(_))), "{full:?}");
    }
}
