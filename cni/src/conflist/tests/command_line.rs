//! `ipq-cni install|uninstall` as the init container runs it: the exit status says.

use super::*;

#[test]
fn the_command_line_installs_and_reports_refusals_with_a_failure() {
    let node = Node::fixture("10-calico.conflist");
    let args = |verb: &str| -> Vec<String> {
        let mut args = vec![
            verb.to_owned(),
            "--cni-conf-dir".into(),
            node.conf.display().to_string(),
            "--cni-bin-dir".into(),
            node.bin.display().to_string(),
        ];
        if verb == "install" {
            args.extend(["--binary".into(), node.binary.display().to_string()]);
            args.extend(["--on-unavailable".into(), "allow".into()]);
        }
        args
    };
    assert_eq!(main(args("install")), std::process::ExitCode::SUCCESS);
    let doc = json(&node.read("10-calico.conflist"));
    assert_eq!(plugins(&doc).last().unwrap()["onUnavailable"], "allow");
    assert_eq!(main(args("uninstall")), std::process::ExitCode::SUCCESS);
    assert_eq!(
        node.read("10-calico.conflist"),
        fixture("10-calico.conflist")
    );

    fs::write(node.conf.join("10-calico.conflist"), "{ // no").unwrap();
    assert_eq!(main(args("install")), std::process::ExitCode::FAILURE);
    assert_eq!(node.read("10-calico.conflist"), "{ // no");
}
