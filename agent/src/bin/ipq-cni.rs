//! `ipq-cni`: the chained CNI plugin. With `install` / `uninstall` as first argument it is the
//! conflist installer of the DaemonSet's init step instead.

use std::{
    io::{Read as _, Write as _},
    process::ExitCode,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(
        args.first().map(String::as_str),
        Some("install" | "uninstall")
    ) {
        return ipq::cni::conflist::main(args);
    }
    // Logs go to stderr, which runtimes keep apart from the result on stdout.
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("IPQ_CNI_LOG", "warn"))
        .format_timestamp(None)
        .format_target(false)
        .init();
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        log::warn!("reading stdin: {e}");
    }
    let outcome = ipq::cni::plugin::run(|name| std::env::var_os(name), &stdin);
    let mut stdout = std::io::stdout().lock();
    if !outcome.stdout.is_empty() {
        let written = stdout
            .write_all(outcome.stdout.as_bytes())
            .and_then(|()| stdout.write_all(b"\n"))
            .and_then(|()| stdout.flush());
        if let Err(e) = written {
            log::error!("writing the result to stdout: {e}");
            return ExitCode::FAILURE;
        }
    }
    if outcome.success {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
