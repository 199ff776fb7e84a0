//! `ipq`: the operator's command line over the agent's API.

fn main() -> std::process::ExitCode {
    eprintln!("ipq: the command line is not built yet");
    std::process::ExitCode::FAILURE
}
