//! The release ipq-ipam hands to the agent: the API's wire type (`ipq-api`), kept at this
//! path for the IPAM code that builds and runs it.

pub use ipq_api::model::{now_unix_ms, HeldRelease, InvalidRelease};
