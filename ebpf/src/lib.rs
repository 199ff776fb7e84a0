//! Host-side stub: the programs live in the `ipq` binary target, built for the bpf target by
//! the agent's build script. This library exists so that cargo tracks the crate as the agent's
//! build dependency and rebuilds the agent when it changes.
#![no_std]
