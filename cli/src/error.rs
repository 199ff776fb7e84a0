//! What can make an `ipq` command fail, and the exit code each failure means.

use std::io;

use thiserror::Error;

use super::exit::Exit;
use ipq_api::client::ClientError;

#[derive(Debug, Error)]
pub enum CliError {
    /// The agent could not be reached or answered with an error (a refusal says which role
    /// the request needed).
    #[error("{}", client_message(.0))]
    Client(#[from] ClientError),
    /// The async runtime the client runs on could not be built.
    #[error("starting the I/O runtime: {0}")]
    Runtime(#[source] io::Error),
    /// Writing the answer to stdout failed (other than the reader going away).
    #[error("writing to stdout: {0}")]
    Output(#[source] io::Error),
    /// The answer could not be written as JSON.
    #[error("encoding the answer as JSON: {0}")]
    Encode(#[from] serde_json::Error),
}

fn client_message(error: &ClientError) -> String {
    match error {
        ClientError::Api { error: body, .. } => match body.needs {
            Some(role) => format!(
                "{} (this needs the {role} role: {})",
                body.message,
                role.holders()
            ),
            None => body.message.clone(),
        },
        other => other.to_string(),
    }
}

impl CliError {
    pub fn exit(&self) -> Exit {
        match self {
            Self::Client(e) => match e {
                ClientError::Unavailable { .. } => Exit::Unavailable,
                ClientError::Api { error, .. } => Exit::of_api(error.code),
                ClientError::Protocol { .. } => Exit::Failure,
            },
            Self::Runtime(_) | Self::Output(_) | Self::Encode(_) => Exit::Failure,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use ipq_api::model::{ApiErrorBody, ErrorCode, Role};

    fn api(code: ErrorCode) -> CliError {
        CliError::from(ClientError::Api {
            status: code.http_status(),
            error: Box::new(ApiErrorBody {
                code,
                message: format!("{} happened", code),
                address: None,
                holder: None,
                until: None,
                needs: None,
            }),
        })
    }

    #[test]
    fn client_error_kinds_map_to_their_exit_codes() {
        let unavailable = CliError::from(ClientError::Unavailable {
            socket: PathBuf::from("/run/ipq/ipq.sock"),
            reason: "Permission denied (os error 13)".into(),
        });
        assert_eq!(unavailable.exit(), Exit::Unavailable);
        let protocol = CliError::from(ClientError::Protocol {
            what: "/v1/status".into(),
            reason: "expected value at line 1 column 1".into(),
        });
        assert_eq!(protocol.exit(), Exit::Failure);
        assert_eq!(api(ErrorCode::NotFound).exit(), Exit::NotFound);
        assert_eq!(api(ErrorCode::NotReleasable).exit(), Exit::Refused);
        assert_eq!(api(ErrorCode::NotReady).exit(), Exit::Unavailable);
        assert_eq!(api(ErrorCode::Forbidden).exit(), Exit::Forbidden);
        assert_eq!(api(ErrorCode::Internal).exit(), Exit::Failure);
        let broken = CliError::Output(io::Error::other("disk full"));
        assert_eq!(broken.exit(), Exit::Failure);
    }

    #[test]
    fn an_api_error_prints_the_agents_message() {
        assert_eq!(api(ErrorCode::NotFound).to_string(), "not_found happened");
    }

    #[test]
    fn a_refusal_says_which_role_it_needed() {
        let refused = CliError::from(ClientError::Api {
            status: 403,
            error: Box::new(ApiErrorBody {
                needs: Some(Role::Admin),
                ..*api_body(ErrorCode::Forbidden)
            }),
        });
        assert_eq!(refused.exit(), Exit::Forbidden);
        assert_eq!(
            refused.to_string(),
            "forbidden happened (this needs the admin role: root with CAP_NET_ADMIN in the \
             initial user namespace, or members of api_admin_group)"
        );
    }

    fn api_body(code: ErrorCode) -> Box<ApiErrorBody> {
        match api(code) {
            CliError::Client(ClientError::Api { error, .. }) => error,
            other => panic!("{other:?}"),
        }
    }
}
