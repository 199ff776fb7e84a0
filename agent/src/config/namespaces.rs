//! Observe by namespace (`observe_namespaces`, or the reverse, `enforce_namespaces`): which
//! pods' addresses the datapath only counts ("would drop") instead of dropping, decided from the
//! pod namespace the CNI gave (`K8S_POD_NAMESPACE`).
//!
//! A holder whose namespace is not known (an interface seen only on netlink, an API claim
//! without a pod) is enforced under both keys: without a namespace there is nothing to match,
//! and ipq never stops enforcing in silence on a guess.

use std::collections::BTreeSet;

/// Which namespaces are only observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NamespaceScope {
    /// Every namespace is enforced (or, under `mode = observe`, observed): the default.
    #[default]
    Everywhere,
    /// `observe_namespaces`: these are observed, the rest enforced.
    Observe(BTreeSet<String>),
    /// `enforce_namespaces`: these are enforced, every other known namespace observed.
    EnforceOnly(BTreeSet<String>),
}

impl NamespaceScope {
    /// Whether a holder in `namespace` (`None`: not known) is only observed. O(log n).
    pub fn observes(&self, namespace: Option<&str>) -> bool {
        match (self, namespace) {
            (Self::Everywhere, _) | (_, None) => false,
            (Self::Observe(listed), Some(ns)) => listed.contains(ns),
            (Self::EnforceOnly(listed), Some(ns)) => !listed.contains(ns),
        }
    }

    /// The namespaces observed, and those enforced, as `ipq status` shows them.
    pub fn lists(&self) -> (Vec<String>, Vec<String>) {
        match self {
            Self::Everywhere => (Vec::new(), Vec::new()),
            Self::Observe(listed) => (listed.iter().cloned().collect(), Vec::new()),
            Self::EnforceOnly(listed) => (Vec::new(), listed.iter().cloned().collect()),
        }
    }
}

/// Whether `name` can be a Kubernetes namespace (an RFC 1123 label): a reason when not.
pub fn namespace_problem(name: &str) -> Option<&'static str> {
    let label = name.len() <= 63
        && !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    (!label).then_some(
        "is not a namespace name (lower-case letters, digits and '-', at most 63, starting and \
         ending with a letter or digit)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn both_directions_and_the_unknown_namespace() {
        let observe = NamespaceScope::Observe(set(&["audit"]));
        assert!(observe.observes(Some("audit")));
        assert!(!observe.observes(Some("prod")));
        assert!(!observe.observes(None), "unknown namespace: enforced");
        let enforce = NamespaceScope::EnforceOnly(set(&["prod"]));
        assert!(!enforce.observes(Some("prod")));
        assert!(enforce.observes(Some("audit")));
        assert!(!enforce.observes(None), "unknown namespace: enforced");
        assert!(!NamespaceScope::Everywhere.observes(Some("audit")));
    }

    #[test]
    fn namespace_names_are_checked() {
        assert_eq!(namespace_problem("kube-system"), None);
        for bad in ["", "Prod", "-a", "a-", "a_b", &"a".repeat(64)] {
            assert!(namespace_problem(bad).is_some(), "{bad:?}");
        }
    }
}
