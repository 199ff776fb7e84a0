//! CNI errors as the spec prints them: `{"cniVersion","code","msg","details"}` on stdout and a
//! non-zero exit. Codes below 100 are the spec's well-known ones; 100 and up are ipq's own.

use serde::Serialize;

/// The spec's well-known codes ipq-cni uses, and its own (100+).
pub mod code {
    /// The config's `cniVersion` is missing or not one ipq-cni speaks; also GC or STATUS asked
    /// of a config older than 1.1.0 (as the reference `skel` answers).
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// A `CNI_*` variable is missing or malformed.
    pub const INVALID_ENVIRONMENT: u32 = 4;
    /// A spooled DEL could not be written.
    pub const IO_FAILURE: u32 = 5;
    /// stdin is not JSON of the expected shape.
    pub const DECODING_FAILURE: u32 = 6;
    /// A key of the config is unknown or ill-typed, or a required one is missing.
    pub const INVALID_NETWORK_CONFIG: u32 = 7;
    /// The address is not free yet (`refuse-new`), or the agent is unavailable and the config
    /// says `onUnavailable: fail`.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the agent is not ready, so ADDs would fail.
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// CHECK: an address of the attachment is no longer held by it (another holder took it,
    /// it is fenced, drained to quarantine, or the agent does not know it).
    pub const CLAIM_LOST: u32 = 100;
    /// ADD: `prevResult` does not name exactly one host-side interface to hold the addresses.
    pub const NO_HOST_INTERFACE: u32 = 101;
    /// The agent answered with an error other than "try again later" (e.g. the interface does
    /// not match its `interfaces.workload` globs, its registry is full).
    pub const AGENT_REJECTED: u32 = 102;
    /// ipq-ipam: the delegate IPAM plugin could not be run, or failed without a CNI error.
    pub const DELEGATE_FAILED: u32 = 103;
    /// Something failed inside ipq-cni itself (no async runtime, an unwritable stdout).
    pub const INTERNAL: u32 = 999;
}

/// One CNI error, printed as the spec's error object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("CNI error {code}: {msg}{}", details.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: Option<String>,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = Some(details.into());
        self
    }

    /// The JSON object the spec wants on stdout, for config version `cni_version`.
    pub fn to_json(&self, cni_version: &str) -> String {
        #[derive(Serialize)]
        struct Wire<'a> {
            #[serde(rename = "cniVersion")]
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            details: Option<&'a str>,
        }
        let wire = Wire {
            cni_version,
            code: self.code,
            msg: &self.msg,
            details: self.details.as_deref(),
        };
        // Serializing strings and integers cannot fail.
        serde_json::to_string(&wire).unwrap_or_else(|_| {
            format!(
                "{{\"cniVersion\":\"{cni_version}\",\"code\":{}}}",
                self.code
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_the_spec_error_object() {
        let err = CniError::new(code::TRY_AGAIN_LATER, "address 10.0.0.5 is \"busy\"")
            .with_details("until 2026-01-01T00:00:00Z");
        let value: serde_json::Value = serde_json::from_str(&err.to_json("1.0.0")).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "cniVersion": "1.0.0",
                "code": 11,
                "msg": "address 10.0.0.5 is \"busy\"",
                "details": "until 2026-01-01T00:00:00Z",
            })
        );
        let bare: serde_json::Value =
            serde_json::from_str(&CniError::new(4, "CNI_IFNAME is missing").to_json("0.4.0"))
                .unwrap();
        assert!(bare.get("details").is_none(), "{bare}");
    }
}
