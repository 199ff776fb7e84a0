//! `ipq-ipam`: the delegating IPAM plugin that holds an allocation until its quarantine is over
//! (see `ipq::cni::ipam`).

fn main() -> std::process::ExitCode {
    ipq::cni::plugin::serve(|stdin| {
        ipq::cni::ipam::plugin::run(|name| std::env::var_os(name), stdin)
    })
}
