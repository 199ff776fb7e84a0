//! `ipq-ipam`: the delegating IPAM plugin that holds an allocation until its quarantine is over
//! (see `ipq_cni::ipam`).

fn main() -> std::process::ExitCode {
    ipq_cni::plugin::serve(|stdin| ipq_cni::ipam::plugin::run(|name| std::env::var_os(name), stdin))
}
