//! The `ipq` command line: talks to the agent's API through `ipq-api`, and links nothing of
//! the agent itself (no aya, no registry).
//!
//! [`args`] is what clap parses, [`commands`] calls the agent and picks the output, [`render`]
//! draws the tables (over [`table`] and [`reltime`]), [`exit`] and [`error`] say what the
//! process exits with. `src/bin/ipq.rs` only calls [`main`].

pub mod args;
pub mod commands;
pub mod error;
pub mod exit;
pub mod reltime;
pub mod render;
pub mod table;

#[cfg(test)]
mod render_tests;

use std::io::Write as _;

use clap::Parser as _;

pub use self::{args::Cli, error::CliError, exit::Exit};
use ipq_api::client::Client;

/// Parses the command line, runs the command, prints errors as `ipq: <message>` on stderr.
pub fn main() -> Exit {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version come through here too, on stdout and with 0.
            let _ = e.print();
            return if e.use_stderr() {
                Exit::Usage
            } else {
                Exit::Success
            };
        }
    };
    match run(&cli) {
        Ok(()) => Exit::Success,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "ipq: {e}");
            e.exit()
        }
    }
}

/// Runs `cli`'s command against the agent, answering on stdout.
pub fn run(cli: &Cli) -> Result<(), CliError> {
    let socket = cli.socket_path(std::env::var_os(args::SOCKET_ENV));
    let client = Client::new(socket, cli.timeout);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    let mut stdout = std::io::stdout().lock();
    runtime.block_on(commands::run(cli, &client, &mut stdout))
}
