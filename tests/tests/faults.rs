//! The fault matrix: what an adversary or an accident injects, and what must hold afterwards.
//! Every row runs against the real kernel and the real `ipq-agent` process in the lab's
//! namespaces, and each one failed before its fix.
//!
//! Each area keeps its rows in `faults/<area>.rs`; every test there starts with a doc line
//! of the form `Injected: ... / Holds: ...`, so a reader can scan this matrix from the top.

// state: the registry owns all enforcement state (observe across restarts, node-owned
// addresses, durability before answers, a full registry)
#[path = "faults/state.rs"]
mod state;

// edge: listeners, files and inputs (idle connections, half-close, peer groups, owned
// directories, FIFOs, CNI and claim inputs, log floods)
#[path = "faults/edge.rs"]
mod edge;

// kernel: interfaces that could not be attached (retries, unprotected gauge, readiness)
#[path = "faults/kernel.rs"]
mod kernel;

// datapath: crafted frames from a fenced pod
#[path = "faults/datapath.rs"]
mod datapath;

// hygiene: conntrack and neighbour clean-up under fault
#[path = "faults/hygiene.rs"]
mod hygiene;
