//! `ipq`: the operator's command line over the agent's API. Everything is in `ipq::cli`.

fn main() -> std::process::ExitCode {
    ipq::cli::main().into()
}
