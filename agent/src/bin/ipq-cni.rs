//! `ipq-cni`: the chained CNI plugin. With `install` / `uninstall` as first argument it is the
//! conflist installer of the DaemonSet's init step instead.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(
        args.first().map(String::as_str),
        Some("install" | "uninstall")
    ) {
        return ipq::cni::conflist::main(args);
    }
    eprintln!("ipq-cni: the plugin is not built yet");
    ExitCode::FAILURE
}
