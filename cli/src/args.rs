//! The command line of `ipq`, as clap parses it.

use std::{ffi::OsString, net::IpAddr, path::PathBuf, time::Duration};

use clap::{Parser, Subcommand, ValueEnum};
use thiserror::Error;

use super::exit::EXIT_CODES_HELP;
use ipq_api::{StateName, DEFAULT_SOCKET as DEFAULT_API_SOCKET};

/// The environment variable naming the agent's socket when `--socket` is not given.
pub const SOCKET_ENV: &str = "IPQ_SOCKET";

#[derive(Debug, Parser)]
#[command(
    name = "ipq",
    version,
    about = "Inspect and steer the ipq agent: addresses, quarantines, conflicts, events",
    after_help = EXIT_CODES_HELP
)]
pub struct Cli {
    /// Output format: tables for people, the API's JSON for scripts.
    #[arg(
        short = 'o',
        long = "output",
        value_enum,
        default_value_t = Output::Table,
        global = true
    )]
    pub output: Output,
    /// The agent's API socket [env: IPQ_SOCKET] [default: /run/ipq/ipq.sock].
    #[arg(long, value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,
    /// How long to wait for the agent to answer (e.g. 500ms, 5s).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_timeout, global = true)]
    pub timeout: Duration,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Is the agent ready; its mode, policy, registry counts and attached interfaces.
    Status,
    /// Every tracked address (free ones are not tracked).
    List {
        /// Only addresses in this state.
        #[arg(long, value_enum)]
        state: Option<StateName>,
    },
    /// Everything the agent knows about one address.
    Get { ip: IpAddr },
    /// Mark an address's holder as terminating: its traffic still flows until it is gone.
    Drain { ip: IpAddr },
    /// Free an address now (a live holder or an unfinished quarantine needs --force).
    Release {
        ip: IpAddr,
        /// End a quarantine early or take the address from a live holder.
        #[arg(long)]
        force: bool,
    },
    /// The most recent conflicts, oldest first.
    Conflicts {
        /// At most this many.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
    },
    /// The recent events, one per line; with --follow, then live events until interrupted.
    Events {
        #[arg(long, short)]
        follow: bool,
    },
}

impl Cli {
    /// The socket to use: `--socket`, else `$IPQ_SOCKET` (given as `env` so tests need not
    /// touch the process environment), else the default.
    pub fn socket_path(&self, env: Option<OsString>) -> PathBuf {
        self.socket
            .clone()
            .or_else(|| env.filter(|v| !v.is_empty()).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_API_SOCKET))
    }
}

/// Why `--timeout` was refused; clap shows it after the value it refused.
#[derive(Debug, Error)]
pub enum TimeoutError {
    #[error(transparent)]
    Unreadable(#[from] humantime::DurationError),
    /// A zero timeout would fail every request before it is sent.
    #[error("must be longer than zero")]
    Zero,
}

fn parse_timeout(value: &str) -> Result<Duration, TimeoutError> {
    let timeout = humantime::parse_duration(value)?;
    if timeout.is_zero() {
        return Err(TimeoutError::Zero);
    }
    Ok(timeout)
}

#[cfg(test)]
mod tests {
    use clap::{error::ErrorKind, CommandFactory as _};

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("ipq").chain(args.iter().copied()))
    }

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_table_output_and_five_seconds() {
        let cli = parse(&["status"]).unwrap();
        assert_eq!(cli.output, Output::Table);
        assert_eq!(cli.timeout, Duration::from_secs(5));
        assert_eq!(cli.command, Command::Status);
        assert_eq!(cli.socket_path(None), PathBuf::from("/run/ipq/ipq.sock"));
    }

    #[test]
    fn the_socket_comes_from_the_flag_then_the_environment() {
        let cli = parse(&["status"]).unwrap();
        assert_eq!(
            cli.socket_path(Some("/tmp/env.sock".into())),
            PathBuf::from("/tmp/env.sock")
        );
        let cli = parse(&["--socket", "/tmp/flag.sock", "status"]).unwrap();
        assert_eq!(
            cli.socket_path(Some("/tmp/env.sock".into())),
            PathBuf::from("/tmp/flag.sock")
        );
    }

    #[test]
    fn global_flags_go_before_or_after_the_command() {
        let cli = parse(&[
            "list",
            "-o",
            "json",
            "--state",
            "draining",
            "--timeout",
            "250ms",
        ])
        .unwrap();
        assert_eq!(cli.output, Output::Json);
        assert_eq!(cli.timeout, Duration::from_millis(250));
        assert_eq!(
            cli.command,
            Command::List {
                state: Some(StateName::Draining)
            }
        );
    }

    #[test]
    fn a_timeout_of_zero_or_of_no_duration_is_refused_with_its_reason() {
        let zero = parse(&["status", "--timeout", "0s"]).unwrap_err();
        assert_eq!(zero.kind(), ErrorKind::ValueValidation);
        assert!(
            zero.to_string().contains("must be longer than zero"),
            "{zero}"
        );
        assert!(matches!(parse_timeout("0s"), Err(TimeoutError::Zero)));
        let unreadable = parse_timeout("soon").unwrap_err();
        assert!(matches!(unreadable, TimeoutError::Unreadable(_)));
        assert_eq!(
            unreadable.to_string(),
            humantime::parse_duration("soon").unwrap_err().to_string()
        );
    }

    #[test]
    fn commands_parse_their_arguments() {
        let ip: IpAddr = "fd77::2".parse().unwrap();
        assert_eq!(
            parse(&["get", "fd77::2"]).unwrap().command,
            Command::Get { ip }
        );
        assert_eq!(
            parse(&["drain", "fd77::2"]).unwrap().command,
            Command::Drain { ip }
        );
        assert_eq!(
            parse(&["release", "fd77::2", "--force"]).unwrap().command,
            Command::Release { ip, force: true }
        );
        assert_eq!(
            parse(&["release", "fd77::2"]).unwrap().command,
            Command::Release { ip, force: false }
        );
        assert_eq!(
            parse(&["conflicts", "--limit", "3"]).unwrap().command,
            Command::Conflicts { limit: Some(3) }
        );
        assert_eq!(
            parse(&["events", "--follow"]).unwrap().command,
            Command::Events { follow: true }
        );
    }

    #[test]
    fn a_bad_ip_is_a_usage_error_naming_it() {
        let err = parse(&["get", "10.0.0.300"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("10.0.0.300"), "{err}");
    }

    #[test]
    fn a_bad_state_is_a_usage_error_naming_it_and_the_choices() {
        let err = parse(&["list", "--state", "free"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidValue);
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        assert!(text.contains("'free'"), "{text}");
        assert!(text.contains("quarantined"), "{text}");
    }

    #[test]
    fn bad_timeouts_and_output_formats_are_usage_errors() {
        for args in [
            &["--timeout", "0s", "status"][..],
            &["--timeout", "soon", "status"],
            &["-o", "yaml", "status"],
            &["conflicts", "--limit", "-1"],
            &["get"],
            &[],
        ] {
            let err = parse(args).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{args:?}: {err}");
        }
    }

    #[test]
    fn the_help_documents_the_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("Exit codes:"), "{help}");
        assert!(help.contains("6  forbidden"), "{help}");
    }
}
