//! `ipq-cni`, the chained CNI plugin (spec 0.4.0, 1.0.0, 1.1.0), and the conflist installer
//! the DaemonSet's init step runs (issue #5).
//!
//! A runtime runs `ipq-cni` after the plugin that creates the container's interface (bridge,
//! ptp...): ADD claims the addresses of `prevResult` for the host-side interface and passes the
//! result on, DEL drains them (spooled to disk while the agent is down), CHECK verifies the
//! claim still stands, GC drains attachments the runtime no longer lists, STATUS reports
//! whether the agent is ready. The conflist entry:
//!
//! ```json
//! {"type": "ipq-cni", "socket": "/run/ipq/ipq.sock", "stateDir": "/var/lib/ipq",
//!  "onUnavailable": "fail", "timeoutMs": 2000}
//! ```
//!
//! This crate is everything the plugins run; it links `ipq-api` for the wire, `ipq-fs` for the
//! files it shares with the agent (the spools, ipq-ipam's records, their directories) and no
//! eBPF, registry or netlink crate, so a runtime's plugin binary stays small and its trust
//! narrow. The agent's side of ipq-ipam (the releaser, the trust in delegate binaries) lives
//! in the agent, which does not link this crate: both run a delegate through `ipq-delegate`
//! ([`ipam::delegate`]), which also holds the CNI error object ([`error`]).

pub mod agent_error;
pub mod commands;
pub mod config;
pub mod conflist;
pub mod env;
/// The CNI error object, shared with the delegate runner in `ipq-delegate`.
pub use ipq_delegate::error;
pub mod host_if;
pub mod ifname;
pub mod ipam;
pub mod plugin;
pub mod result;
