//! A real-world conflist takes the entry once, last, laid out like its neighbours, and
//! gives it back byte for byte.

use super::*;

#[test]
fn real_world_conflists_take_the_entry_once_last_and_give_it_back_byte_for_byte() {
    for name in REAL_WORLD {
        let original = fixture(name);
        let node = Node::fixture(name);

        let first = node.install().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            first.config_changed && first.binary_changed,
            "{name}: {first}"
        );
        let installed = node.read(name);
        let mut doc = json(&installed);
        let list = plugins(&doc);
        assert_eq!(list.len(), plugins(&json(&original)).len() + 1, "{name}");
        assert_eq!(list.last(), Some(&entry().to_value()), "{name}: not last");
        doc["plugins"].as_array_mut().unwrap().pop();
        assert_eq!(
            doc,
            json(&original),
            "{name}: anything besides the entry changed"
        );
        assert_eq!(
            fs::read(node.bin.join("ipq-cni")).unwrap(),
            fs::read(&node.binary).unwrap()
        );
        assert_eq!(node.read(&format!("{name}{BACKUP_SUFFIX}")), original);

        let second = node.install().unwrap();
        assert!(
            !second.config_changed && !second.binary_changed,
            "{name}: {second}"
        );
        assert!(second.to_string().contains("nothing changed"), "{second}");
        assert_eq!(node.read(name), installed, "{name}: second install wrote");

        let removed = node.uninstall().unwrap();
        assert!(removed.config_changed, "{name}: {removed}");
        assert_eq!(
            node.read(name),
            original,
            "{name}: not restored byte for byte"
        );
        assert_eq!(
            node.conf_names(),
            [name],
            "{name}: backup or temp file left behind"
        );

        let again = node.uninstall().unwrap();
        assert!(!again.config_changed, "{name}: {again}");
        assert_eq!(node.read(name), original);
    }
}

#[test]
fn the_entry_is_laid_out_like_its_neighbours() {
    let node = Node::fixture("10-calico.conflist");
    node.install().unwrap();
    let text = node.read("10-calico.conflist");
    let want = "      \"capabilities\": {\"portMappings\": true}\n    },\n    {\n      \
                \"type\": \"ipq-cni\",\n      \"socket\": \"/run/ipq/ipq.sock\",\n      \
                \"onUnavailable\": \"fail\"\n    }\n  ]\n}\n";
    assert!(text.ends_with(want), "{text}");

    let node = Node::fixture("30-compact.conflist");
    node.install().unwrap();
    assert!(node.read("30-compact.conflist").ends_with(
        r#"{"type":"firewall"}, {"type": "ipq-cni", "socket": "/run/ipq/ipq.sock", "onUnavailable": "fail"}]}"#
    ));
}
