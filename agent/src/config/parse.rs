//! Reading one configuration value: each conversion names the key and the value it refuses,
//! as the operator wrote them. A setting that is one of a few words (`mode`, `on_early_reuse`,
//! `ipam_on_exhausted`, `tc_attach`, `bpf_watcher`) is read by one conversion,
//! [`Parser::choice`], from its type's [`Choice`]: the words it takes and how one is read.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use toml::Value;

use super::{
    BpfWatcher, ConfigError, EarlyReusePolicy, Globs, Mode, TcAttach, MAX_ANNOUNCE_PER_SECOND,
    MAX_CAPACITY,
};

/// A setting written as one of a few words.
pub(super) trait Choice: Sized {
    /// The words, as an error that refuses any other lists them.
    const WORDS: &'static str;
    fn from_word(word: &str) -> Option<Self>;
}

impl Choice for Mode {
    const WORDS: &'static str = "\"enforce\" or \"observe\"";
    fn from_word(word: &str) -> Option<Self> {
        word.parse().ok()
    }
}

impl Choice for EarlyReusePolicy {
    const WORDS: &'static str = "\"fence-old\", \"refuse-new\" or \"observe\"";
    fn from_word(word: &str) -> Option<Self> {
        word.parse().ok()
    }
}

impl Choice for ipq_api::OnExhausted {
    const WORDS: &'static str = "\"wait\" or \"release-quietest\"";
    fn from_word(word: &str) -> Option<Self> {
        Self::parse_setting(word)
    }
}

impl Choice for TcAttach {
    const WORDS: &'static str = "\"auto\", \"tcx\" or \"netlink\"";
    fn from_word(word: &str) -> Option<Self> {
        match word {
            "auto" => Some(Self::Auto),
            "tcx" => Some(Self::Tcx),
            "netlink" => Some(Self::Netlink),
            _ => None,
        }
    }
}

impl Choice for BpfWatcher {
    const WORDS: &'static str = "\"trampolines\", \"auto\" or \"off\"";
    fn from_word(word: &str) -> Option<Self> {
        match word {
            "auto" => Some(Self::Auto),
            "trampolines" => Some(Self::Trampolines),
            "off" => Some(Self::Off),
            _ => None,
        }
    }
}

/// Converts one key's value, naming the key and the value in every error.
pub(super) struct Parser<'a> {
    pub(super) source_name: &'a str,
}

impl Parser<'_> {
    pub(super) fn invalid(&self, key: &str, value: &Value, reason: &str) -> ConfigError {
        ConfigError::Invalid {
            source_name: self.source_name.to_owned(),
            key: key.to_owned(),
            value: value.to_string(),
            reason: reason.to_owned(),
        }
    }

    pub(super) fn unknown(&self, key: &str, known: String) -> ConfigError {
        ConfigError::UnknownKey {
            source_name: self.source_name.to_owned(),
            key: key.to_owned(),
            known,
        }
    }

    pub(super) fn string<'v>(&self, key: &str, value: &'v Value) -> Result<&'v str, ConfigError> {
        value
            .as_str()
            .ok_or_else(|| self.invalid(key, value, "must be a string"))
    }

    /// One of the words `T` is spelled with.
    pub(super) fn choice<T: Choice>(&self, key: &str, value: &Value) -> Result<T, ConfigError> {
        T::from_word(self.string(key, value)?)
            .ok_or_else(|| self.invalid(key, value, &format!("must be {}", T::WORDS)))
    }

    pub(super) fn duration(&self, key: &str, value: &Value) -> Result<Duration, ConfigError> {
        let text = self.string(key, value)?;
        let duration = humantime::parse_duration(text).map_err(|e| {
            self.invalid(
                key,
                value,
                &format!("not a duration ({e}); write e.g. \"30s\", \"500ms\" or \"5m\""),
            )
        })?;
        if duration.is_zero() {
            return Err(self.invalid(key, value, "must be longer than zero"));
        }
        Ok(duration)
    }

    pub(super) fn boolean(&self, key: &str, value: &Value) -> Result<bool, ConfigError> {
        value
            .as_bool()
            .ok_or_else(|| self.invalid(key, value, "must be true or false"))
    }

    pub(super) fn rate(&self, key: &str, value: &Value) -> Result<u32, ConfigError> {
        let n = value
            .as_integer()
            .ok_or_else(|| self.invalid(key, value, "must be a whole number per second"))?;
        if n < 1 || n > i64::from(MAX_ANNOUNCE_PER_SECOND) {
            return Err(self.invalid(
                key,
                value,
                &format!(
                    "must be between 1 and {MAX_ANNOUNCE_PER_SECOND} (set announce = false to \
                     turn announcements off)"
                ),
            ));
        }
        Ok(n as u32)
    }

    pub(super) fn capacity(&self, key: &str, value: &Value) -> Result<u32, ConfigError> {
        let n = value
            .as_integer()
            .ok_or_else(|| self.invalid(key, value, "must be a whole number of entries"))?;
        if n < 1 || n > i64::from(MAX_CAPACITY) {
            return Err(self.invalid(key, value, &format!("must be between 1 and {MAX_CAPACITY}")));
        }
        Ok(n as u32)
    }

    pub(super) fn abs_path(&self, key: &str, value: &Value) -> Result<PathBuf, ConfigError> {
        let path = PathBuf::from(self.string(key, value)?);
        if !path.is_absolute() {
            return Err(self.invalid(key, value, "must be an absolute path"));
        }
        Ok(path)
    }

    /// A non-empty list of absolute paths.
    pub(super) fn abs_paths(&self, key: &str, value: &Value) -> Result<Vec<PathBuf>, ConfigError> {
        let paths = self
            .strings(key, value)?
            .into_iter()
            .map(|path| self.abs_path(key, &Value::String(path)))
            .collect::<Result<Vec<_>, _>>()?;
        if paths.is_empty() {
            return Err(self.invalid(key, value, "must name at least one directory"));
        }
        Ok(paths)
    }

    /// A group name as `groupadd` accepts them, or a numeric gid.
    pub(super) fn group(&self, key: &str, value: &Value) -> Result<String, ConfigError> {
        let name = self.string(key, value)?;
        let valid = !name.is_empty()
            && name.len() <= 32
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            && !name.starts_with('-');
        if !valid {
            return Err(self.invalid(
                key,
                value,
                "must be a group name (letters, digits, _ - .) or a numeric gid",
            ));
        }
        Ok(name.to_owned())
    }

    pub(super) fn socket_addr(&self, key: &str, value: &Value) -> Result<SocketAddr, ConfigError> {
        self.string(key, value)?.parse().map_err(|_| {
            self.invalid(
                key,
                value,
                "must be an address and port, e.g. \"127.0.0.1:9740\" or \"[::1]:9740\"",
            )
        })
    }

    /// A list of namespace names, each checked.
    pub(super) fn namespaces(
        &self,
        key: &str,
        value: &Value,
    ) -> Result<std::collections::BTreeSet<String>, ConfigError> {
        let names = self.strings(key, value)?;
        for name in &names {
            if let Some(problem) = super::namespaces::namespace_problem(name) {
                return Err(self.invalid(key, value, &format!("\"{name}\" {problem}")));
            }
        }
        Ok(names.into_iter().collect())
    }

    pub(super) fn strings(&self, key: &str, value: &Value) -> Result<Vec<String>, ConfigError> {
        let array = value
            .as_array()
            .ok_or_else(|| self.invalid(key, value, "must be a list of strings"))?;
        array
            .iter()
            .map(|item| {
                item.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| self.invalid(key, item, "must be a string"))
            })
            .collect()
    }

    pub(super) fn globs(&self, key: &str, value: &Value) -> Result<Globs, ConfigError> {
        let globs = self.strings(key, value)?;
        if let Some(empty) = globs.iter().find(|g| g.is_empty()) {
            let item = Value::String(empty.clone());
            return Err(self.invalid(key, &item, "an empty glob matches nothing"));
        }
        Globs::parse(&globs).map_err(|(glob, e)| {
            self.invalid(key, &Value::String(glob), &format!("not a glob: {e}"))
        })
    }

    pub(super) fn ifnames(&self, key: &str, value: &Value) -> Result<Vec<String>, ConfigError> {
        let names = self.strings(key, value)?;
        for name in &names {
            // IFNAMSIZ is 16 with the terminating NUL; '/', ':' and white space are refused by
            // the kernel's dev_valid_name().
            let valid = !name.is_empty()
                && name.len() < 16
                && name != "."
                && name != ".."
                && !name
                    .chars()
                    .any(|c| c == '/' || c == ':' || c.is_whitespace());
            if !valid {
                return Err(self.invalid(
                    key,
                    &Value::String(name.clone()),
                    "not an interface name (1 to 15 characters, no '/', ':' or spaces)",
                ));
            }
        }
        Ok(names)
    }
}
