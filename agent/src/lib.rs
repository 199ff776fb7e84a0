//! The ipq agent library: configuration, the kernel datapath (loading, pinning, attaching and
//! the typed maps), and metrics. The binaries in `src/bin` are thin edges over it.

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
pub mod listen;
pub mod metrics;
pub mod netdev;
pub mod netlink;
pub mod paths;
pub mod readiness;
pub mod registry;
pub mod series;
pub mod tracker;

#[cfg(test)]
mod vocabulary_tests;
