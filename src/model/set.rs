//! Resource sets: their names, and their effective configuration (the defaults merged with a
//! set's own `[sets.NAME]` table, built by `config`), which locations resolve against.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A resource set's name: 1-64 of `A-Z a-z 0-9 . _ -`, not starting with `.`. It appears in
/// URLs and file names, so nothing else is allowed.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SetName(String);

/// Shown as the quoted name (`"papers"`), so messages that quote a set never show a Rust type.
impl std::fmt::Debug for SetName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl SetName {
    pub fn parse(s: &str) -> Result<SetName, String> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && !s.starts_with('.')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
        if ok {
            Ok(SetName(s.to_string()))
        } else {
            Err(format!(
                "resource set name {s:?} must be 1-64 characters of A-Z, a-z, 0-9, '.', '_', '-' and not start with '.'"
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SetName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct DescribedBy {
    pub href: String,
    #[serde(rename = "type", default)]
    pub mime: Option<String>,
}

/// A resource set's effective configuration (defaults merged with its own table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetConfig {
    pub name: String,
    /// Always ends with '/'.
    pub url_prefix: String,
    pub resource_root_dir: Option<PathBuf>,
    pub max_items_in_list: u32,
    pub changelist_rollover_secs: u64,
    pub describedby: Vec<DescribedBy>,
}

impl SetConfig {
    /// The path part of `url_prefix` when the prefix lies under `base_url`, i.e. when this
    /// server can serve the set's files itself.
    pub fn served_path(&self, base_url: &str) -> Option<String> {
        let base = format!("{}/", base_url.trim_end_matches('/'));
        let rest = self.url_prefix.strip_prefix(&base)?;
        self.resource_root_dir.as_ref()?;
        Some(format!("/{}", rest.trim_end_matches('/')))
    }

    pub fn root_dir(&self) -> Option<&Path> {
        self.resource_root_dir.as_deref()
    }
}
