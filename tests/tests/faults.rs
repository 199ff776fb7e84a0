//! The fault matrix: what an adversary or an accident injects, and what must hold afterwards.
//! Every row runs against the real kernel and the real `ipq-agent` (or `ipq-cni`) process in
//! the lab's namespaces, and each one failed before its fix. Issue 10's row names are in
//! brackets.
//!
//! | area | injected | what must hold |
//! |---|---|---|
//! | state | `on_early_reuse = observe`, an early reuse, then a SIGTERM restart, then one with the journal deleted [H1] | the observed old holder delivers 20/20 both ways, v4 and v6, after each |
//! | state | the Debian ptp plugin dual-stack: its IPv6 gateway as a `proto kernel` /128 on every veth [M1] | the gateway is never a holder; one dual-stack reuse counts exactly 2 |
//! | state | `state_dir` on a full tmpfs while claims and a spooled DEL arrive [M2] | `503 unavailable` naming why, spool file kept, failures counted; durable once space is back |
//! | state | a full registry (capacity 4), then a fifth routed address [M3] | counted unprotected; claimed and enforced as soon as an entry frees |
//! | edge | 1100 idle TCP connections to /metrics from 200 peer addresses and 200 to the API, soft fd limit 1024 [H2] | fd limit raised, claims answered and saved, log small, idle ones closed |
//! | edge | one peer address holds 8 idle connections to /metrics and opens more | its 9th closed at once and logged; other peers served; it is served again once one ends |
//! | edge | claims from clients that half-close their write side [L1] | every one answered 200 |
//! | edge | the agent in its own PID namespace, a client in `api_group` only as a supplementary group [L2] | allowed; others still refused and closed at once |
//! | edge | a `bpffs_dir`/`state_dir` owned by another user, or left 0777 [L3] | refused naming it, or tightened; the pins cannot be removed by that user |
//! | edge | a FIFO at the journal path and in the CNI spool [L4] | set aside and reported; the loop never blocks |
//! | edge | ipq-cni with 16-byte and 100 kB host interface names, a relative `stateDir` [L5] | CNI code 7 naming the field, no panic |
//! | edge | claims of multicast, broadcast, loopback, link-local, unspecified addresses [L6] | `invalid_argument` naming the address, nothing registered |
//! | edge | a 5 MB config value; 40 veths gone before their attach [L7] | a short error naming the key; no ERROR lines for benign races |
//! | kernel | another tool's filter in ipq's tc place on a new veth | counted in `ipq_datapath_unprotected_interfaces`, named in status, not ready; protected once it is gone |
//! | kernel | EMFILE when a new veth appears [H2] | logged not protected, retried with backoff, protected once fds are back |
//! | datapath | a fenced pod's NA behind a hop-by-hop header [M4] | every one dropped at TC ingress and counted; an unfenced pod's pass |
//! | datapath | a fenced pod's 5 KB NA behind a 64-byte destination-options header, skb head not linear [M4] | pulled linear, found and dropped |
//! | hygiene | a new holder on a bridge whose MAC nobody knows | the announce failure counted and alerted on, the claim answered with what failed, conntrack and neighbours still flushed |
//! | publish | the NodeQuarantine's API server on a closed port, then an early reuse | fenced as ever; failures counted as `unreachable`, backed off, shown in `ipq status` |
//!
//! Each area keeps its rows in `faults/<area>.rs`; every test there starts with a doc line
//! of the form `Injected: ... / Holds: ...`.

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

// publish: the NodeQuarantine's API server unreachable (#30)
#[path = "faults/publish.rs"]
mod publish;

// publish: the whereabouts projection's API server unreachable (#30)
#[path = "faults/whereabouts.rs"]
mod whereabouts;

// hygiene: conntrack and neighbour clean-up under fault
#[path = "faults/hygiene.rs"]
mod hygiene;
