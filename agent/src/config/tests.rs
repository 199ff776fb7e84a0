use super::*;

fn err(text: &str) -> String {
    Config::from_toml(text, "test.toml")
        .unwrap_err()
        .to_string()
}

#[test]
fn empty_file_gives_defaults() {
    assert_eq!(
        Config::from_toml("", "test.toml").unwrap(),
        Config::default()
    );
}

/// The default watcher never puts a raw tracepoint on every system call of the node: the
/// workloads beside the agent pay nothing for it unless the operator asks for `auto`.
#[test]
fn the_default_watcher_taxes_no_other_system_call() {
    assert_eq!(Config::default().bpf_watcher, BpfWatcher::Trampolines);
}

#[test]
fn every_key_is_read() {
    let config = Config::from_toml(
        r#"
        mode = "observe"
        on_early_reuse = "refuse-new"
        cooldown = "45s"
        quiet_period = "5s"
        max_cooldown = "10m"
        capacity = 1000
        bpffs_dir = "/sys/fs/bpf/other"
        state_dir = "/tmp/state"
        api_socket = "/tmp/ipq.sock"
        metrics_addr = "[::1]:9999"
        tc_attach = "netlink"
        bpf_watcher = "auto"
        verify_interval = "2s"
        ipam_on_exhausted = "release-quietest"
        ipam_cni_bin_dirs = ["/opt/cni/bin", "/usr/lib/cni"]
        [interfaces]
        workload = ["lxc*", "veth?x"]
        uplink = ["eth0", "bond0"]
        "#,
        "test.toml",
    )
    .unwrap();
    assert_eq!(config.mode, Mode::Observe);
    assert_eq!(config.on_early_reuse, EarlyReusePolicy::RefuseNew);
    assert_eq!(config.cooldown, Duration::from_secs(45));
    assert_eq!(config.quiet_period, Duration::from_secs(5));
    assert_eq!(config.max_cooldown, Duration::from_secs(600));
    assert_eq!(config.capacity, 1000);
    assert_eq!(config.bpffs_dir, PathBuf::from("/sys/fs/bpf/other"));
    assert_eq!(config.state_dir, PathBuf::from("/tmp/state"));
    assert_eq!(config.api_socket, PathBuf::from("/tmp/ipq.sock"));
    assert_eq!(config.metrics_addr, "[::1]:9999".parse().unwrap());
    assert_eq!(config.interfaces.workload.as_strs(), ["lxc*", "veth?x"]);
    assert_eq!(config.interfaces.uplink, ["eth0", "bond0"]);
    assert_eq!(config.workload_glob_matching("lxc123"), Some("lxc*"));
    assert_eq!(config.workload_glob_matching("eth0"), None);
    assert!(config.is_uplink("bond0"));
    assert_eq!(config.tc_attach, TcAttach::Netlink);
    assert_eq!(config.bpf_watcher, BpfWatcher::Auto);
    assert_eq!(config.verify_interval, Duration::from_secs(2));
    assert_eq!(
        config.ipam_on_exhausted,
        ipq_api::OnExhausted::ReleaseQuietest
    );
    assert_eq!(
        config.ipam_cni_bin_dirs,
        [PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
    );
}

#[test]
fn ipam_cni_bin_dirs_are_absolute_and_at_least_one() {
    for (text, needle) in [
        ("ipam_cni_bin_dirs = [\"bin\"]", "absolute"),
        ("ipam_cni_bin_dirs = []", "at least one"),
        ("ipam_cni_bin_dirs = \"/opt/cni/bin\"", "list"),
    ] {
        let e = err(text);
        assert!(
            e.contains("`ipam_cni_bin_dirs`") && e.contains(needle),
            "{text}: {e}"
        );
    }
}

#[test]
fn errors_name_the_key_the_value_and_why() {
    let e = err(r#"mode = "drop""#);
    assert!(
        e.contains("`mode`") && e.contains("\"drop\"") && e.contains("enforce"),
        "{e}"
    );

    let e = err(r#"cooldown = "30""#);
    assert!(
        e.contains("`cooldown`") && e.contains("\"30\"") && e.contains("duration"),
        "{e}"
    );

    let e = err(r#"cooldown = 30"#);
    assert!(e.contains("`cooldown`") && e.contains("string"), "{e}");

    let e = err(r#"capacity = 0"#);
    assert!(e.contains("`capacity`") && e.contains("between 1"), "{e}");

    let e = err(r#"state_dir = "var/lib/ipq""#);
    assert!(e.contains("`state_dir`") && e.contains("absolute"), "{e}");

    let e = err(r#"metrics_addr = "localhost""#);
    assert!(
        e.contains("`metrics_addr`") && e.contains("\"localhost\""),
        "{e}"
    );

    let e = err(r#"on_early_reuse = "fence_old""#);
    assert!(
        e.contains("`on_early_reuse`") && e.contains("fence-old"),
        "{e}"
    );

    let e = err("[interfaces]\nworkload = [\"veth[\"]");
    assert!(
        e.contains("`interfaces.workload`") && e.contains("not a glob"),
        "{e}"
    );

    let e = err("[interfaces]\nuplink = [\"a/b\"]");
    assert!(
        e.contains("`interfaces.uplink`") && e.contains("\"a/b\""),
        "{e}"
    );

    // `unknown` is how an answer of a newer agent's policy reads, never a setting.
    for bad in ["unknown", "release_quietest"] {
        let e = err(&format!("ipam_on_exhausted = \"{bad}\""));
        assert!(
            e.contains("`ipam_on_exhausted`") && e.contains(bad) && e.contains("release-quietest"),
            "{e}"
        );
    }

    let e = err(r#"tc_attach = "tc""#);
    assert!(
        e.contains("`tc_attach`") && e.contains("\"tc\"") && e.contains("\"netlink\""),
        "{e}"
    );

    let e = err("interfaces = 3");
    assert!(e.contains("`interfaces`") && e.contains("table"), "{e}");
}

/// A setting that is one of a few words refuses any other naming the file, the key, the value
/// and every word it takes.
#[test]
fn a_choice_refuses_another_word_listing_the_words() {
    for (text, words) in [
        (r#"mode = "drop""#, r#""enforce" or "observe""#),
        (
            r#"on_early_reuse = "drop""#,
            r#""fence-old", "refuse-new" or "observe""#,
        ),
        (
            r#"ipam_on_exhausted = "drop""#,
            r#""wait" or "release-quietest""#,
        ),
        (r#"tc_attach = "drop""#, r#""auto", "tcx" or "netlink""#),
        (
            r#"bpf_watcher = "drop""#,
            r#""trampolines", "auto" or "off""#,
        ),
    ] {
        let key = text.split(' ').next().unwrap();
        assert_eq!(
            err(text),
            format!("config test.toml: `{key}` = \"drop\": must be {words}")
        );
    }
    // `unknown` is how an older client reads a newer agent's word, never a setting.
    assert_eq!(
        err(r#"ipam_on_exhausted = "unknown""#),
        r#"config test.toml: `ipam_on_exhausted` = "unknown": must be "wait" or "release-quietest""#
    );
}

#[test]
fn unknown_keys_are_refused() {
    let e = err(r#"cooldwn = "30s""#);
    assert!(
        e.contains("unknown key `cooldwn`") && e.contains("cooldown"),
        "{e}"
    );
    let e = err("[interfaces]\nuplinks = [\"eth0\"]");
    assert!(e.contains("unknown key `interfaces.uplinks`"), "{e}");
}

#[test]
fn syntax_errors_are_reported() {
    let e = err("mode = ");
    assert!(
        e.contains("test.toml") && e.contains("not valid TOML"),
        "{e}"
    );
}

#[test]
fn keys_are_checked_together() {
    let e = err("cooldown = \"10m\"\nmax_cooldown = \"5m\"");
    assert!(
        e.contains("`max_cooldown`") && e.contains("at least cooldown"),
        "{e}"
    );
    let e = err("quiet_period = \"10m\"");
    assert!(e.contains("`quiet_period`"), "{e}");
    let e = err("[interfaces]\nuplink = [\"veth0\"]");
    assert!(
        e.contains("`interfaces.uplink`") && e.contains("veth*"),
        "{e}"
    );
}

#[test]
fn flags_override_keys_and_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, "mode = \"observe\"\ncooldown = \"1m\"\n").unwrap();
    let overrides = Overrides {
        values: vec![
            ("mode", "enforce".into()),
            ("capacity", "42".into()),
            ("tc_attach", "tcx".into()),
            ("bpf_watcher", "off".into()),
            ("interfaces.workload", "pod*".into()),
            ("interfaces.uplink", "eth9".into()),
            ("interfaces.workload", "lxc*".into()),
        ],
    };
    let config = Config::load(Some(&path), &overrides).unwrap();
    assert_eq!(config.mode, Mode::Enforce);
    assert_eq!(config.cooldown, Duration::from_secs(60));
    assert_eq!(config.capacity, 42);
    assert_eq!(config.tc_attach, TcAttach::Tcx);
    assert_eq!(config.bpf_watcher, BpfWatcher::Off);
    // A list's flag repeats, and the flags together replace the file's list.
    assert_eq!(config.interfaces.workload.as_strs(), ["pod*", "lxc*"]);
    assert_eq!(config.interfaces.uplink, ["eth9"]);

    let bad = Overrides {
        values: vec![("cooldown", "soon".into())],
    };
    let e = Config::load(Some(&path), &bad).unwrap_err().to_string();
    assert!(e.contains("`--cooldown`") && e.contains("\"soon\""), "{e}");
}

#[test]
fn missing_explicit_file_is_an_error() {
    let e = Config::load(
        Some(Path::new("/nonexistent/agent.toml")),
        &Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("/nonexistent/agent.toml"), "{e}");
}

#[test]
fn the_key_table_is_the_one_list_of_keys() {
    use super::keys::{known_keys, known_keys_of, KEYS};
    // Every key is named in the unknown-key error (of its table, for a table's key), has a flag
    // spelled after it, and is read from TOML: a wrong value is refused naming that key.
    let known = known_keys();
    for key in KEYS {
        let (listed, name) = match key.name.split_once('.') {
            Some((table, name)) => (known_keys_of(table), name),
            None => (known.clone(), key.name),
        };
        assert!(listed.contains(name), "{} missing from {listed}", key.name);
        assert_eq!(key.flag, key.name.replace(['_', '.'], "-"));
        // A string where every key wants something else (a dotted name is its table's key).
        let e = err(&format!("{} = [1]", key.name));
        assert!(e.contains(&format!("`{}`", key.name)), "{e}");
    }
    assert!(
        known.ends_with("[interfaces], [hygiene], [kubernetes]"),
        "{known}"
    );
    assert_eq!(
        super::keys::tables(),
        ["interfaces", "hygiene", "kubernetes"]
    );
    // A flag of a key not in the table is an error, not a panic.
    let bad = Overrides {
        values: vec![("colour", "blue".into())],
    };
    let e = Config::load(None, &bad).unwrap_err().to_string();
    assert!(e.contains("unknown key `colour`"), "{e}");
    // A number given on the command line for a number key is read as one.
    let capacity = KEYS.iter().find(|k| k.name == "capacity").unwrap();
    assert_eq!(capacity.value_of("7"), toml::Value::Integer(7));
    assert_eq!(capacity.value_of("x"), toml::Value::String("x".into()));
}

#[test]
fn echoed_values_and_keys_are_cut() {
    let huge = "x".repeat(5 << 20);
    for text in [
        format!("mode = \"{huge}\""),
        format!("{huge} = 1"),
        format!("mode = {huge}"),
    ] {
        let e = err(&text);
        assert!(e.len() < 1024, "{} bytes: {}", e.len(), &e[..200]);
    }
    let e = err(&format!("mode = \"{huge}\""));
    // The value as written, quotes included.
    assert!(e.contains(&format!("… ({} bytes)", huge.len() + 2)), "{e}");
    assert!(e.contains("`mode`"), "{e}");
}

#[test]
fn hygiene_keys_are_read_and_checked() {
    let config = Config::from_toml(
        "[hygiene]\nflush = false\nfiltered_flush = false\nannounce = false\n\
         announce_per_second = 7\nannounce_on_uplinks = true",
        "test.toml",
    )
    .unwrap();
    assert_eq!(
        config.hygiene,
        HygieneConfig {
            flush: false,
            filtered_flush: false,
            announce: false,
            announce_per_second: 7,
            announce_on_uplinks: true,
        }
    );
    let defaults = Config::default().hygiene;
    assert!(defaults.flush && defaults.filtered_flush);
    assert!(defaults.announce && !defaults.announce_on_uplinks);

    let e = err("[hygiene]\nannounce_per_second = 0");
    assert!(
        e.contains("`hygiene.announce_per_second`") && e.contains("between 1 and"),
        "{e}"
    );
    let e = err("[hygiene]\nflush = \"yes\"");
    assert!(
        e.contains("`hygiene.flush`") && e.contains("true or false"),
        "{e}"
    );
    let e = err("[hygiene]\nannounce_rate = 5");
    assert!(
        e.contains("unknown key `hygiene.announce_rate`") && e.contains("announce_per_second"),
        "{e}"
    );
    let e = err("hygiene = true");
    assert!(e.contains("`hygiene`") && e.contains("table"), "{e}");
}

#[test]
fn hygiene_keys_have_flags_and_a_bad_flag_value_is_named() {
    let overrides = Overrides {
        values: vec![
            ("hygiene.flush", "false".into()),
            ("hygiene.announce_per_second", "7".into()),
        ],
    };
    let mut config = Config::default();
    config.apply(&overrides).unwrap();
    assert!(!config.hygiene.flush);
    assert_eq!(config.hygiene.announce_per_second, 7);
    let bad = Overrides {
        values: vec![("hygiene.flush", "maybe".into())],
    };
    let e = Config::default().apply(&bad).unwrap_err().to_string();
    assert!(
        e.contains("--hygiene-flush") && e.contains("true or false"),
        "{e}"
    );
    // Written at the top level with its table in a quoted name, it is not the table's key.
    let e = Config::from_toml("\"hygiene.flush\" = false", "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("hygiene.flush"), "{e}");
}

#[test]
fn the_kubernetes_table_names_the_node_and_the_kubeconfig() {
    let config = Config::from_toml(
        "[kubernetes]\nnode_name = \"node-a\"\nkubeconfig = \"/etc/ipq/kubeconfig\"\n",
        "test",
    )
    .unwrap();
    assert_eq!(config.kubernetes.node_name.as_deref(), Some("node-a"));
    assert_eq!(
        config.kubernetes.kubeconfig.as_deref(),
        Some(Path::new("/etc/ipq/kubeconfig"))
    );
    let e = err("[kubernetes]\nnode_name = \"\"");
    assert!(
        e.contains("`kubernetes.node_name`") && e.contains("empty"),
        "{e}"
    );
    let e = err("[kubernetes]\nkubeconfig = \"relative\"");
    assert!(e.contains("`kubernetes.kubeconfig`"), "{e}");
    // Nothing configured: no publisher unless NODE_NAME is set.
    assert_eq!(Config::default().kubernetes, Default::default());
}

#[test]
fn the_whereabouts_projection_is_off_unless_asked_for() {
    assert!(!Config::default().kubernetes.whereabouts);
    let config = Config::from_toml(
        "[kubernetes]\nwhereabouts = true\nwhereabouts_namespace = \"wb\"\n\
         whereabouts_network_name = \"net-a\"\n",
        "test",
    )
    .unwrap();
    assert!(config.kubernetes.whereabouts);
    assert_eq!(
        config.kubernetes.whereabouts_namespace.as_deref(),
        Some("wb")
    );
    assert_eq!(config.kubernetes.whereabouts_network_name, "net-a");
    let e = err("[kubernetes]\nwhereabouts = \"yes\"");
    assert!(e.contains("`kubernetes.whereabouts`"), "{e}");
    let e = err("[kubernetes]\nwhereabouts_namespace = \"\"");
    assert!(
        e.contains("`kubernetes.whereabouts_namespace`") && e.contains("empty"),
        "{e}"
    );
}

#[test]
fn pod_events_are_on_by_default_and_their_interval_is_bounded() {
    let defaults = Config::default().kubernetes;
    assert!(defaults.pod_events);
    assert_eq!(defaults.pod_events_interval, Duration::from_secs(60));
    let config = Config::from_toml(
        "[kubernetes]\npod_events = false\npod_events_interval = \"5s\"\n",
        "test",
    )
    .unwrap();
    assert!(!config.kubernetes.pod_events);
    assert_eq!(
        config.kubernetes.pod_events_interval,
        Duration::from_secs(5)
    );
    for bad in ["\"500ms\"", "\"2h\"", "\"often\"", "60"] {
        let e = err(&format!("[kubernetes]\npod_events_interval = {bad}"));
        assert!(e.contains("`kubernetes.pod_events_interval`"), "{bad}: {e}");
    }
}

#[test]
fn observe_by_namespace_takes_one_direction_and_checks_the_names() {
    assert_eq!(Config::default().namespaces, NamespaceScope::Everywhere);
    let observe = Config::from_toml("observe_namespaces = [\"audit\", \"dev\"]\n", "test").unwrap();
    assert!(observe.namespaces.observes(Some("dev")));
    assert!(!observe.namespaces.observes(Some("prod")));
    let enforce = Config::from_toml("enforce_namespaces = [\"prod\"]\n", "test").unwrap();
    assert!(enforce.namespaces.observes(Some("dev")));
    assert!(!enforce.namespaces.observes(Some("prod")));
    let e = err("observe_namespaces = [\"a\"]\nenforce_namespaces = [\"b\"]\n");
    assert!(
        e.contains("_namespaces`") && e.contains("cannot be set with"),
        "{e}"
    );
    let e = err("observe_namespaces = [\"Not_A_Namespace\"]\n");
    assert!(
        e.contains("`observe_namespaces`") && e.contains("\"Not_A_Namespace\" is not a namespace"),
        "{e}"
    );
}
