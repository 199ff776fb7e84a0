//! Privileged test support for ipq: network namespaces, crafted frames, the lab.
pub mod lab;
pub mod netns;
pub mod packets;
pub mod prometheus;
