//! The API's wire types: what `/v1` accepts and returns. The agent, the `ipq` CLI and `ipq-cni`
//! share them, so a field cannot mean one thing on one side and another on the other.
//!
//! Times are RFC 3339 UTC strings (`"2026-11-22T10:00:00.123Z"`), converted from the
//! registry's monotonic clock when a response is built. Addresses are IP strings; holders are
//! [`Holder`](crate::Holder)s as the registry keeps them.

mod allocation;
pub mod cni_names;
mod error;
mod events;
mod ipam;
mod requests;
mod status;
mod views;

pub use allocation::*;
pub use error::*;
pub use events::*;
pub use ipam::*;
pub use requests::*;
pub use status::*;
pub use views::*;

/// The API version prefix of every path.
pub const API_PREFIX: &str = "/v1";
