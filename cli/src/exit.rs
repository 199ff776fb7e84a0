//! The exit codes of `ipq`, which scripts branch on: one enum with explicit values, the mapping
//! from every API error code onto them, and the text `ipq --help` shows.

use ipq_api::model::ErrorCode;

/// What `ipq` exits with. The values are a stable interface: never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[derive(strum::VariantArray)]
pub enum Exit {
    /// The command did what it was asked.
    Success = 0,
    /// Anything not covered below: an internal agent error, an answer the CLI does not
    /// understand, stdout unwritable.
    Failure = 1,
    /// The command line is wrong (clap's own code).
    Usage = 2,
    /// The address is free or the interface does not exist (`not_found`, `unknown_interface`).
    NotFound = 3,
    /// The agent refused the change (`refused`, `not_holder`, `not_releasable`,
    /// `registry_full`).
    Refused = 4,
    /// No agent answered: cannot connect, timed out, or not ready.
    Unavailable = 5,
    /// The agent does not allow this user on its socket.
    Forbidden = 6,
}

/// Shown after `ipq --help`; a test checks it lists every [`Exit`] value.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  other error (agent internal error, unexpected answer, output failure)
  2  usage error (bad arguments)
  3  not found (address free, unknown interface)
  4  refused (refused, not_holder, not_releasable, registry_full)
  5  agent unavailable (cannot connect, timeout, not ready)
  6  forbidden (this user is not allowed on the agent's socket)";

impl Exit {
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The exit code of an error the agent answered with.
    pub const fn of_api(code: ErrorCode) -> Exit {
        match code {
            ErrorCode::NotFound | ErrorCode::UnknownInterface => Self::NotFound,
            ErrorCode::Refused
            | ErrorCode::NotHolder
            | ErrorCode::NotReleasable
            | ErrorCode::RegistryFull => Self::Refused,
            ErrorCode::NotReady | ErrorCode::Unavailable => Self::Unavailable,
            ErrorCode::Forbidden => Self::Forbidden,
            // The CLI validates what it sends: the agent rejecting it is a mismatch between
            // the two, not something the user typed.
            ErrorCode::BadRequest
            | ErrorCode::InvalidArgument
            | ErrorCode::MethodNotAllowed
            | ErrorCode::Internal
            // A newer agent's code: not something this CLI can say more about.
            | ErrorCode::Unknown => Self::Failure,
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        std::process::ExitCode::from(exit.code())
    }
}

#[cfg(test)]
mod tests {
    use strum::VariantArray as _;

    use super::*;

    #[test]
    fn every_api_error_code_maps_to_the_documented_exit_code() {
        use ErrorCode::*;
        let expected = [
            (BadRequest, 1),
            (InvalidArgument, 1),
            (NotFound, 3),
            (UnknownInterface, 3),
            (Refused, 4),
            (NotHolder, 4),
            (NotReleasable, 4),
            (RegistryFull, 4),
            (Forbidden, 6),
            (MethodNotAllowed, 1),
            (NotReady, 5),
            (Internal, 1),
        ];
        for (code, exit) in expected {
            assert_eq!(Exit::of_api(code).code(), exit, "{}", code);
        }
    }

    #[test]
    fn values_are_stable_and_the_help_lists_each_once() {
        let values: Vec<u8> = Exit::VARIANTS.iter().map(|e| e.code()).collect();
        assert_eq!(values, [0, 1, 2, 3, 4, 5, 6]);
        for &exit in Exit::VARIANTS {
            let line = format!("\n  {}  ", exit.code());
            assert_eq!(
                EXIT_CODES_HELP.matches(&line).count(),
                1,
                "exit code {exit:?} in the help text:\n{EXIT_CODES_HELP}"
            );
        }
    }
}
