//! Privileged test support for ipq: network namespaces, crafted frames, the lab.
pub mod api;
pub mod attach;
pub mod attachments;
pub mod cluster;
pub mod cni;
pub mod containerd;
pub mod cri;
pub mod cri_node;
pub mod flows;
pub mod lab;
pub mod mountns;
pub mod netns;
pub mod oci;
pub mod packets;
pub mod podman;
pub mod prometheus;
pub mod time;
