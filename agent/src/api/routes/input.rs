//! What a request brings, checked before anything reaches the registry: its path's address,
//! its query, its body within its size and time limits, decoded naming the field at fault.

use std::net::IpAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::{body::Incoming, Request};
use ipq_api::echo::{echo, Echo};
use serde::de::DeserializeOwned;

use super::{BODY_TIMEOUT, MAX_BODY};
use crate::{
    addr_class,
    api::{model::ErrorCode, views::ApiError},
    registry::StateName,
};

pub(super) fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidArgument, message)
}

pub(super) fn parse_ip(raw: &str) -> Result<IpAddr, ApiError> {
    raw.parse::<IpAddr>()
        .map(|a| a.to_canonical())
        .map_err(|_| {
            invalid(format!(
                "address `{}`: not an IPv4 or IPv6 address",
                Echo(raw)
            ))
        })
}

/// Refuses addresses no workload can hold, as netlink events of them are ignored.
pub(super) fn claimable(addresses: &[IpAddr]) -> Result<(), ApiError> {
    for (i, addr) in addresses.iter().enumerate() {
        if let Err(class) = addr_class::workload_address(*addr) {
            return Err(invalid(format!(
                "addresses[{i}] `{addr}`: a {} address, which no workload holds; claim unicast \
                 addresses only",
                class.as_ref()
            )));
        }
    }
    Ok(())
}

pub(super) fn parse_state(raw: &str) -> Result<StateName, ApiError> {
    StateName::parse_held(raw).ok_or_else(|| {
        invalid(format!(
            "state `{}`: must be active, draining or quarantined",
            Echo(raw)
        ))
    })
}

pub(super) async fn read_body(request: Request<Incoming>, what: &str) -> Result<Bytes, ApiError> {
    read_body_up_to(request, what, MAX_BODY).await
}

pub(super) async fn read_body_up_to(
    request: Request<Incoming>,
    what: &str,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let body = Limited::new(request.into_body(), limit).collect();
    tokio::time::timeout(BODY_TIMEOUT, body)
        .await
        .map_err(|_| {
            ApiError::new(
                ErrorCode::BadRequest,
                format!("body of {what}: not received within {BODY_TIMEOUT:?}"),
            )
        })?
        .map(|b| b.to_bytes())
        .map_err(|e| {
            ApiError::new(
                ErrorCode::BadRequest,
                format!("body of {what}: {e} (at most {limit} bytes)"),
            )
        })
}

/// Decodes a JSON body; the error names the field (`addresses[1]: invalid IP address syntax`).
pub(super) fn decode<T: DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        let at = if field == "." {
            String::new()
        } else {
            format!(" at `{field}`")
        };
        ApiError::new(
            ErrorCode::BadRequest,
            format!("body of {what}{at}: {}", echo(&e.into_inner().to_string())),
        )
    })?;
    de.end()
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("body of {what}: {e}")))?;
    Ok(value)
}

/// A query string's parameters.
pub(super) struct Query(Vec<(String, String)>);

impl Query {
    pub(super) fn parse(raw: &str) -> Result<Self, ApiError> {
        let mut pairs = Vec::new();
        for pair in raw.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if pairs.iter().any(|(k, _)| k == key) {
                return Err(invalid(format!(
                    "query parameter `{}` given twice",
                    Echo(key)
                )));
            }
            pairs.push((key.to_owned(), value.to_owned()));
        }
        Ok(Self(pairs))
    }

    pub(super) fn allow(&self, known: &[&str]) -> Result<(), ApiError> {
        match self.0.iter().find(|(k, _)| !known.contains(&k.as_str())) {
            None => Ok(()),
            Some((key, _)) if known.is_empty() => Err(invalid(format!(
                "query parameter `{}`: this path takes none",
                Echo(key)
            ))),
            Some((key, _)) => Err(invalid(format!(
                "query parameter `{}`: unknown (known: {})",
                Echo(key),
                known.join(", ")
            ))),
        }
    }

    pub(super) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}
