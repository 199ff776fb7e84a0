//! The file-system layer ipq's agent and its CNI plugins share under the agent's `state_dir`:
//! directories and files opened without following a link another user could plant
//! ([`safe_fs`]), the spools of DELs and releases written while the agent is away ([`spool`]),
//! ipq-ipam's allocation records ([`records`]) and where each lives ([`paths`]).
//!
//! Both sides write and read the same files, so both take them from here: the agent does not
//! link the plugins' crate for its formats, and the plugins link nothing of the agent (no eBPF,
//! registry or netlink crate).

pub mod paths;
pub mod records;
pub mod safe_fs;
pub mod spool;
