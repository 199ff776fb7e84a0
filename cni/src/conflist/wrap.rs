//! `ipq-cni install --hold-ipam`: the main plugin's `ipam` section handed to `ipq-ipam` as its
//! `delegate`, so that the node's IPAM keeps a deleted pod's address allocated until its
//! quarantine is over.
//!
//! Like the rest of the installer it edits text, not a re-serialised document: the original
//! `ipam` object is embedded byte for byte as the delegate, and `uninstall` puts the delegate's
//! bytes back where the wrapper was, so the file is what it was. A conflist whose main plugin
//! has no `ipam` object with a `type` is left alone, and the refusal names why.

use serde_json::Value;
use thiserror::Error;

use super::{
    edit::PLUGIN_TYPE as IPQ_CNI,
    scan::{member, plugins_layout},
};
use crate::ipam::config::PLUGIN_TYPE as IPQ_IPAM;

/// Why the `ipam` section is not wrapped.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum WrapRefusal {
    #[error("no main plugin to wrap the IPAM of")]
    NoMainPlugin,
    #[error(
        "plugins[{index}] ({plugin}) has no `ipam` object with a `type`: there is no IPAM \
         section to hold addresses in (a plugin that allocates addresses itself cannot be \
         wrapped)"
    )]
    NoIpam { index: usize, plugin: String },
    #[error("the `ipam` section could not be located in the text")]
    Unlocatable,
}

/// The main plugin: the first that is not ipq-cni. Its index and its text's byte range.
fn main_plugin(text: &str) -> Result<(usize, std::ops::Range<usize>, Value), WrapRefusal> {
    let layout = plugins_layout(text).ok_or(WrapRefusal::Unlocatable)?;
    layout
        .elements
        .into_iter()
        .enumerate()
        .find_map(|(i, range)| {
            let value: Value = serde_json::from_str(&text[range.clone()]).ok()?;
            (value.get("type").and_then(Value::as_str) != Some(IPQ_CNI))
                .then_some((i, range, value))
        })
        .ok_or(WrapRefusal::NoMainPlugin)
}

/// Wraps the main plugin's `ipam` in ipq-ipam (talking to the agent at `socket`, spooling
/// under `state_dir` when it is not the default). `None` when it is wrapped already.
pub fn wrap(
    text: &str,
    socket: &str,
    state_dir: Option<&str>,
) -> Result<Option<String>, WrapRefusal> {
    let (index, range, plugin) = main_plugin(text)?;
    let name = plugin["type"].as_str().unwrap_or_default().to_owned();
    let ipam_type = plugin
        .get("ipam")
        .and_then(|ipam| ipam.get("type"))
        .and_then(Value::as_str);
    match ipam_type {
        None => {
            return Err(WrapRefusal::NoIpam {
                index,
                plugin: name,
            })
        }
        Some(IPQ_IPAM) => return Ok(None),
        Some(_) => {}
    }
    let ipam = member(text, range, "ipam").ok_or(WrapRefusal::Unlocatable)?;
    let state_dir = state_dir
        .map(|dir| format!(", \"stateDir\": {}", Value::from(dir)))
        .unwrap_or_default();
    let wrapper = format!(
        "{{\"type\": {}, \"socket\": {}{state_dir}, \"delegate\": {}}}",
        Value::from(IPQ_IPAM),
        Value::from(socket),
        &text[ipam.clone()]
    );
    let mut out = text.to_owned();
    out.replace_range(ipam, &wrapper);
    Ok(Some(out))
}

/// Puts the delegate back where ipq-ipam's wrapper is; `None` when nothing is wrapped.
pub fn unwrap(text: &str) -> Result<Option<String>, WrapRefusal> {
    let Ok((_, range, plugin)) = main_plugin(text) else {
        return Ok(None);
    };
    if plugin
        .get("ipam")
        .and_then(|ipam| ipam.get("type"))
        .and_then(Value::as_str)
        != Some(IPQ_IPAM)
    {
        return Ok(None);
    }
    let ipam = member(text, range, "ipam").ok_or(WrapRefusal::Unlocatable)?;
    let delegate = member(text, ipam.clone(), "delegate").ok_or(WrapRefusal::Unlocatable)?;
    let mut out = text.to_owned();
    let original = text[delegate].to_owned();
    out.replace_range(ipam, &original);
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BRIDGE: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.1.0.0/24"}]]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
"#;

    #[test]
    fn wrapping_embeds_the_ipam_byte_for_byte_and_unwrapping_gives_the_file_back() {
        let wrapped = wrap(BRIDGE, "/run/ipq/ipq.sock", None).unwrap().unwrap();
        let doc: Value = serde_json::from_str(&wrapped).unwrap();
        let ipam = &doc["plugins"][0]["ipam"];
        assert_eq!(ipam["type"], "ipq-ipam");
        assert_eq!(ipam["socket"], "/run/ipq/ipq.sock");
        assert_eq!(ipam["delegate"]["type"], "host-local");
        assert_eq!(doc["plugins"][1]["type"], "portmap", "the rest untouched");
        assert!(wrapped.contains(
            "\"delegate\": {\n        \"type\": \"host-local\",\n        \"ranges\": [[{\"subnet\": \"10.1.0.0/24\"}]]\n      }}"
        ));
        assert_eq!(
            wrap(&wrapped, "/run/ipq/ipq.sock", None).unwrap(),
            None,
            "idempotent"
        );
        assert_eq!(unwrap(&wrapped).unwrap().as_deref(), Some(BRIDGE));
        assert_eq!(unwrap(BRIDGE).unwrap(), None);
        let elsewhere = wrap(BRIDGE, "/s", Some("/srv/ipq")).unwrap().unwrap();
        let doc: Value = serde_json::from_str(&elsewhere).unwrap();
        assert_eq!(doc["plugins"][0]["ipam"]["stateDir"], "/srv/ipq");
        assert_eq!(unwrap(&elsewhere).unwrap().as_deref(), Some(BRIDGE));
    }

    #[test]
    fn a_main_plugin_without_an_ipam_section_is_left_alone_and_named() {
        let text = r#"{"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "cilium-cni"}, {"type": "ipq-cni"}]}"#;
        assert_eq!(
            wrap(text, "/run/ipq/ipq.sock", None),
            Err(WrapRefusal::NoIpam {
                index: 0,
                plugin: "cilium-cni".into()
            })
        );
        let untyped = r#"{"name": "n", "plugins": [{"type": "ptp", "ipam": {"ranges": []}}]}"#;
        assert!(matches!(
            wrap(untyped, "/s", None),
            Err(WrapRefusal::NoIpam { index: 0, .. })
        ));
    }
}
