//! `ipq-ipam`, the delegating IPAM plugin (issue 18; DESIGN.md "Held by the IPAM").
//!
//! It wraps the node's real IPAM plugin, the way flannel's `delegate` does:
//!
//! ```json
//! "ipam": {"type": "ipq-ipam", "delegate": {"type": "host-local", "ranges": [...]},
//!          "socket": "/run/ipq/ipq.sock", "stateDir": "/var/lib/ipq", "timeoutMs": 2000}
//! ```
//!
//! ADD and CHECK run the delegate exactly as a runtime would (its binary found on `CNI_PATH`,
//! the same `CNI_*` environment, the network config with `ipam` replaced by the delegate's) and
//! pass its answer on. DEL never runs the delegate: it hands the release of the allocation to
//! the agent ([`release::HeldRelease`]), which runs the delegate's DEL once the addresses'
//! quarantine is over, so the IPAM never hands out an address whose holder may still live.
//! GC passes the delegate the held attachments too, and STATUS adds the agent's readiness
//! ([`gc`]).
//!
//! The agent's side (the releaser that runs the delegate's DEL, and which delegates it trusts)
//! is the agent's `ipam` module; what is here is what ipq-ipam runs.
//!
//! It is its own binary (`src/bin/ipq-ipam.rs`) rather than `ipq-cni` dispatching on `argv[0]`:
//! runtimes find plugins by file name, and a second name for one binary would need a symlink
//! or a copy that the installer, packages and tests must all keep in step; a bin sharing this
//! module costs nothing of that.

pub mod add;
pub mod config;
/// Running the delegate as a runtime would: `ipq-delegate`, which the agent links too.
pub use ipq_delegate as delegate;
pub mod gc;
pub mod plugin;
pub mod pressure;
pub mod recording;
pub mod release;
pub mod requested;
