//! The local API (DESIGN §4): HTTP/JSON over the unix socket `api_socket`, versioned under
//! `/v1`, used by the `ipq` CLI, `ipq-cni` and IPAMs.
//!
//! | method | path | body | answer |
//! |---|---|---|---|
//! | GET | `/v1/status` | | [`Status`](model::Status) |
//! | GET | `/v1/addresses[?state=S]` | | [`AddressList`](model::AddressList) |
//! | GET | `/v1/addresses/{ip}` | | [`AddressView`](model::AddressView) |
//! | POST | `/v1/claims` | [`ClaimRequest`](model::ClaimRequest) | [`ClaimResponse`](model::ClaimResponse) |
//! | POST | `/v1/addresses/{ip}/drain` | | [`ChangedResponse`](model::ChangedResponse) |
//! | POST | `/v1/addresses/{ip}/release` | [`ReleaseRequest`](model::ReleaseRequest) | [`ChangedResponse`](model::ChangedResponse) |
//! | POST | `/v1/drains` | [`DrainAttachmentRequest`](model::DrainAttachmentRequest) | [`ChangedResponse`](model::ChangedResponse) |
//! | POST | `/v1/gc` | [`GcRequest`](model::GcRequest) | [`ChangedResponse`](model::ChangedResponse) |
//! | GET | `/v1/conflicts[?limit=N]` | | [`ConflictList`](model::ConflictList) |
//! | GET | `/v1/events[?follow=true]` | | newline-delimited [`Event`](model::Event)s |
//! | POST | `/v1/ipam/allocations` (root only) | [`AllocationRecord`](model::AllocationRecord) | the record as kept |
//! | POST | `/v1/ipam/releases` (root only) | [`HeldRelease`](model::HeldRelease) | the release as held (its record's) |
//! | POST | `/v1/ipam/exhausted` (root only) | [`ExhaustedRequest`](model::ExhaustedRequest) | [`ExhaustedAnswer`](model::ExhaustedAnswer) |
//! | PUT, DELETE | `/v1/datapath/{ip}` (break-glass) | [`DatapathEntryRequest`](model::DatapathEntryRequest) (PUT) | [`DatapathEntryView`](model::DatapathEntryView) |
//!
//! Errors are [`ErrorResponse`](model::ErrorResponse)s with a stable
//! [`ErrorCode`](model::ErrorCode); a request that fails changes nothing.

pub mod command;
mod peer;
pub mod probe;
mod routes;
pub mod server;
pub mod views;

// The wire types and the client are the `ipq-api` crate's (no aya, no registry), shared
// with the CLI and the CNI plugins.
pub use ipq_api::{client, model};
