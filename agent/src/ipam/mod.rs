//! The agent's side of ipq-ipam (the plugin itself is the `ipq-cni` crate's `ipam`): the
//! releaser that runs a held allocation's delegate DEL once its addresses are free, the thread
//! that stores held releases off the owner loop, the table of what is held, and which delegate
//! binaries the agent trusts to run as root.

pub mod holds;
pub mod records;
pub mod releaser;
pub mod store;
pub mod trust;
