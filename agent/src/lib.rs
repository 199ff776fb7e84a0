//! The ipq agent library: the agent's start-up phases and owner loop (`agent`), configuration,
//! the registry and its owner (the tracker, whose core decides without I/O), the kernel
//! datapath (loading, pinning, attaching, verifying, the maps' one writer), netlink, the
//! journal, the local API, reuse hygiene, ipq-ipam's releaser and records, the NodeQuarantine
//! publisher and its whereabouts projection, bounded queues, and metrics. The binary in
//! `src/bin` is a thin edge over it.

pub mod addr_class;
pub mod agent;
pub mod api;
pub mod config;
pub mod datapath;
pub mod heap;
pub mod hygiene;
#[cfg(test)]
mod invariant;
pub mod ipam;
pub mod journal;
pub mod kernel_clock;
pub mod listen;
pub mod metrics;
#[cfg(test)]
mod needs_root;
pub mod netdev;
pub mod netlink;
pub mod paths;
pub mod pod_events;
pub mod publish;
pub mod queues;
pub mod readiness;
pub mod registry;
pub mod remote_claim;
pub mod series;
pub mod tracker;

#[cfg(test)]
mod vocabulary_tests;
