//! `ipq-cni`: the chained CNI plugin. With `install` / `uninstall` as first argument it is the
//! conflist installer of the DaemonSet's init step instead.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(
        args.first().map(String::as_str),
        Some("install" | "uninstall")
    ) {
        return ipq_cni::conflist::main(args);
    }
    ipq_cni::plugin::serve(|stdin| ipq_cni::plugin::run(|name| std::env::var_os(name), stdin))
}
