//! `ipq-cni`, the chained CNI plugin (owner: the CNI work of issue #4), and the conflist
//! installer the DaemonSet's init step runs (issue #5).

pub mod conflist;
pub mod spool;
