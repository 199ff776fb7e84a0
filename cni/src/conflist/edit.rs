//! Adding ipq-cni's entry to a conflist's text and taking it out again, or refusing to touch a
//! file whose shape is not understood.
//!
//! ipq-cni goes last in `plugins`: it needs `prevResult` with the addresses the main plugin and
//! its IPAM assigned, and meta plugins (portmap, bandwidth, tuning, cilium-cni chaining, ...)
//! pass that result on unchanged. Runtimes call DEL in reverse order, so last also means
//! ipq-cni's DEL runs first and drains the addresses while the pod's interface still exists.

use serde_json::{Map, Value};
use thiserror::Error;

use super::scan::{plugins_layout, PluginsLayout};

/// The `type` of ipq-cni's entry: the runtime runs the binary of that name from the bin dir.
pub const PLUGIN_TYPE: &str = "ipq-cni";

/// What `ipq-cni` does on ADD when the agent cannot be reached.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    clap::ValueEnum,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
)]
#[strum(serialize_all = "lowercase")]
pub enum OnUnavailable {
    /// Fail the ADD with CNI error 11 ("try again later"): the runtime retries the sandbox.
    Fail,
    /// Pass `prevResult` on unclaimed: the agent still learns the address from netlink later.
    Allow,
}

/// ipq-cni's entry in `plugins`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The agent's API socket as seen from the host (where the runtime runs the plugin).
    pub socket: String,
    pub on_unavailable: OnUnavailable,
    /// Where the plugin spools (the agent's `state_dir`); written only when it is not the
    /// default, so entries of a default install stay as they were.
    pub state_dir: Option<String>,
}

impl Entry {
    fn fields(&self) -> Vec<(&'static str, Value)> {
        let mut fields = vec![
            ("type", Value::from(PLUGIN_TYPE)),
            ("socket", Value::from(self.socket.as_str())),
            ("onUnavailable", Value::from(self.on_unavailable.as_ref())),
        ];
        if let Some(dir) = &self.state_dir {
            fields.push(("stateDir", Value::from(dir.as_str())));
        }
        fields
    }

    /// The entry as a JSON object, to compare with what a conflist already holds.
    pub fn to_value(&self) -> Value {
        Value::Object(
            self.fields()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect::<Map<_, _>>(),
        )
    }

    /// The entry as text: on one line, or (with `indent`, the indentation of the element it
    /// follows, and `step`, one more level) laid out like its neighbours. Written by hand so
    /// that `type` comes first, as in every conflist people read.
    fn render(&self, layout: Option<(&str, &str)>) -> String {
        let fields: Vec<String> = self
            .fields()
            .iter()
            .map(|(k, v)| format!("{}: {v}", Value::from(*k)))
            .collect();
        match layout {
            None => format!("{{{}}}", fields.join(", ")),
            Some((indent, step)) => {
                let sep = format!(",\n{indent}{step}");
                format!("{{\n{indent}{step}{}\n{indent}}}", fields.join(&sep))
            }
        }
    }
}

/// Why a file is left untouched.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum Refusal {
    #[error(
        "not valid JSON ({0}); runtimes read strict JSON (no comments, no trailing commas), so \
         this is not a config ipq-cni can safely edit"
    )]
    NotJson(String),
    #[error("the top level is not a JSON object")]
    NotAnObject,
    #[error("no `plugins` key: this is not a conflist (a single-plugin config cannot chain)")]
    NoPlugins,
    #[error("`plugins` is not an array")]
    PluginsNotArray,
    #[error("`plugins` has no plugin besides ipq-cni: there is no main plugin to chain after")]
    NoMainPlugin,
    #[error("plugins[{0}] is not an object with a string `type`")]
    UntypedPlugin(usize),
    #[error(
        "a .conf or .json file holds a single plugin's config and runtimes chain only the \
         plugins of a .conflist; have the network plugin write a .conflist, or name one with \
         --conflist"
    )]
    SinglePluginFile,
    #[error("the `plugins` array could not be located in the text")]
    Unlocatable,
    #[error("--hold-ipam: {0}")]
    Ipam(#[from] super::wrap::WrapRefusal),
}

/// The outcome of [`install`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Installed {
    /// The same entry is already last in `plugins`: nothing to write.
    AlreadyPresent,
    /// The entry was appended; the new text.
    Inserted(String),
    /// An ipq-cni entry with other settings (or not last) was replaced; the new text.
    Updated(String),
}

/// Checks that `text` is a conflist this module understands; returns its plugins.
fn plugins(text: &str) -> Result<Vec<Value>, Refusal> {
    let doc: Value = serde_json::from_str(text).map_err(|e| Refusal::NotJson(e.to_string()))?;
    let object = doc.as_object().ok_or(Refusal::NotAnObject)?;
    let plugins = object
        .get("plugins")
        .ok_or(Refusal::NoPlugins)?
        .as_array()
        .ok_or(Refusal::PluginsNotArray)?;
    for (i, plugin) in plugins.iter().enumerate() {
        if !plugin.get("type").is_some_and(Value::is_string) {
            return Err(Refusal::UntypedPlugin(i));
        }
    }
    Ok(plugins.clone())
}

fn is_ours(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

fn layout(text: &str) -> Result<PluginsLayout, Refusal> {
    plugins_layout(text).ok_or(Refusal::Unlocatable)
}

/// Appends `entry` to the conflist `text`, unless it is already there, last and the same.
pub fn install(text: &str, entry: &Entry) -> Result<Installed, Refusal> {
    let plugins = plugins(text)?;
    if plugins.iter().all(is_ours) {
        return Err(Refusal::NoMainPlugin);
    }
    let ours = plugins.iter().filter(|p| is_ours(p)).count();
    if ours == 1 && plugins.last() == Some(&entry.to_value()) {
        return Ok(Installed::AlreadyPresent);
    }
    let base = match remove_entries(text)? {
        Some(without) => without,
        None => text.to_owned(),
    };
    let inserted = append(&base, entry)?;
    Ok(if ours == 0 {
        Installed::Inserted(inserted)
    } else {
        Installed::Updated(inserted)
    })
}

/// Removes every ipq-cni entry from the conflist `text`; `None` if it has none.
pub fn uninstall(text: &str) -> Result<Option<String>, Refusal> {
    plugins(text)?;
    remove_entries(text)
}

fn remove_entries(text: &str) -> Result<Option<String>, Refusal> {
    let ours: Vec<usize> = plugins(text)?
        .iter()
        .enumerate()
        .filter(|(_, p)| is_ours(p))
        .map(|(i, _)| i)
        .collect();
    if ours.is_empty() {
        return Ok(None);
    }
    let mut text = text.to_owned();
    // From the back, so the indices of the entries still to remove do not move.
    for &i in ours.iter().rev() {
        let elements = layout(&text)?.elements;
        let cut = match i {
            // From the end of the previous element: takes the separating comma with it, which is
            // exactly what `append` added.
            i if i > 0 => elements[i - 1].end..elements[i].end,
            _ if elements.len() > 1 => elements[0].start..elements[1].start,
            _ => elements[0].clone(),
        };
        text.replace_range(cut, "");
    }
    Ok(Some(text))
}

/// Inserts `entry` after the last element of `plugins`, laid out like that element.
fn append(text: &str, entry: &Entry) -> Result<String, Refusal> {
    let layout = layout(text)?;
    let last = layout.elements.last().ok_or(Refusal::NoMainPlugin)?.clone();
    let line_start = text[..last.start].rfind('\n').map_or(0, |i| i + 1);
    let indent = &text[line_start..last.start];
    let rendered = if line_start > 0 && indent.chars().all(|c| c == ' ' || c == '\t') {
        let step = inner_step(&text[last.clone()], indent);
        format!(",\n{indent}{}", entry.render(Some((indent, &step))))
    } else {
        format!(", {}", entry.render(None))
    };
    let mut out = text.to_owned();
    out.insert_str(last.end, &rendered);
    Ok(out)
}

/// One indentation level inside an element that starts at `indent`: what its second line adds.
fn inner_step(element: &str, indent: &str) -> String {
    element
        .lines()
        .nth(1)
        .and_then(|line| line.strip_prefix(indent))
        .map(|rest| {
            rest.chars()
                .take_while(|c| *c == ' ' || *c == '\t')
                .collect::<String>()
        })
        .filter(|step| !step.is_empty())
        .unwrap_or_else(|| "  ".to_owned())
}
