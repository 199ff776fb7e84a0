//! `ipq`: the operator's command line over the agent's API. Everything is in `ipq_cli`.

fn main() -> std::process::ExitCode {
    ipq_cli::main().into()
}
