//! Inserts `ipq-cni` into a node's existing conflist and takes it out again (owner: the
//! deployment work of issue #5). `ipq-cni install|uninstall ...` lands here.

use std::process::ExitCode;

/// `ipq-cni install|uninstall ...`: `args` are the arguments after the program name.
pub fn main(args: Vec<String>) -> ExitCode {
    eprintln!(
        "ipq-cni {}: the conflist installer is not built yet",
        args.join(" ")
    );
    ExitCode::FAILURE
}
