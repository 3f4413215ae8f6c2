//! Layered configuration: compiled-in commented defaults -> `--config` file -> `RSHUB_*`
//! environment -> command-line flags; validated once at load so the rest of the crate can trust it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

pub use crate::model::{DescribedBy, SetConfig};

/// The commented defaults file, the first configuration layer (also the reference docs).
pub const DEFAULTS_TOML: &str = include_str!("../config.default.toml");

/// The sitemap protocol's hard limit on entries per document.
pub const SITEMAP_MAX_ITEMS: u32 = 50_000;
/// The sitemap protocol's 50 MB limit, less a margin for the document's own envelope.
pub const SITEMAP_MAX_BYTES: u64 = 50 * 1024 * 1024 - 64 * 1024;

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Config {
    pub server: ServerConfig,
    pub store: StoreConfig,
    pub ingest: IngestConfig,
    pub source: SourceConfig,
    pub hub: HubConfig,
    pub admin: AdminConfig,
    pub notify: NotifyConfig,
    pub set_defaults: SetDefaults,
    #[serde(default)]
    pub sets: BTreeMap<String, SetOverrides>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ServerConfig {
    pub listen: String,
    pub base_url: String,
    pub data_dir: PathBuf,
    pub shutdown_grace_secs: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct StoreConfig {
    pub backend: String,
    pub elasticsearch: ElasticConfig,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ElasticConfig {
    pub url: String,
    pub host: String,
    pub port: u16,
    pub username: String,
    pub password: String,
    pub index: String,
    pub resource_doc_type: String,
    pub change_doc_type: String,
    pub request_timeout_secs: u64,
}

impl ElasticConfig {
    /// The server URL: `http://host:port` when `host` is set, else `url`.
    pub fn server_url(&self) -> String {
        if self.host.is_empty() {
            self.url.trim_end_matches('/').to_string()
        } else {
            format!("http://{}:{}", self.host, self.port)
        }
    }

    pub fn resource_index(&self) -> String {
        format!("{}-{}", self.index, self.resource_doc_type)
    }

    pub fn change_index(&self) -> String {
        format!("{}-{}", self.index, self.change_doc_type)
    }

    /// The server's own bookkeeping index.
    pub fn meta_index(&self) -> String {
        format!("{}-meta", self.index)
    }

    /// The hub's subscriptions, message log and notifier state, shared by every process.
    pub fn hub_index(&self) -> String {
        format!("{}-hub", self.index)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct IngestConfig {
    pub token: String,
    pub max_body_bytes: usize,
    pub max_future_skew_secs: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct SourceConfig {
    pub describedby: String,
    pub cache_max_bytes: usize,
    pub store_page_size: usize,
    pub rollover_check_secs: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct HubConfig {
    pub path: String,
    pub topic_path: String,
    pub publisher_token: String,
    pub signature_algorithm: String,
    pub lease_default_secs: u64,
    pub lease_min_secs: u64,
    pub lease_max_secs: u64,
    pub topic_prefixes: Vec<String>,
    pub allow_networks: Vec<String>,
    pub retry_schedule_secs: Vec<u64>,
    pub retry_jitter: f64,
    pub max_retry_after_secs: u64,
    pub request_timeout_secs: u64,
    pub max_concurrent_deliveries: usize,
    pub max_body_bytes: usize,
    pub requests_per_callback_per_minute: u32,
    pub history_days: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct AdminConfig {
    pub token: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct NotifyConfig {
    pub enabled: bool,
    pub poll_interval_ms: u64,
    pub max_entries: usize,
    pub max_delay_ms: u64,
    pub hold_back_secs: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct SetDefaults {
    pub url_prefix: String,
    pub max_items_in_list: u32,
    pub changelist_rollover_secs: u64,
}

/// A `[sets.NAME]` table: every key optional, falling back to `[set_defaults]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SetOverrides {
    pub url_prefix: Option<String>,
    pub resource_root_dir: Option<PathBuf>,
    pub max_items_in_list: Option<u32>,
    pub changelist_rollover_secs: Option<u64>,
    #[serde(default)]
    pub describedby: Vec<DescribedBy>,
}

/// Command-line overrides, the last layer.
#[derive(Debug, Clone, Default)]
pub struct CliOverrides {
    pub config_file: Option<PathBuf>,
    pub listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub base_url: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("configuration file {0} does not exist")]
    MissingFile(PathBuf),
    #[error("configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Loads every layer and validates the result.
    pub fn load(cli: &CliOverrides) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Toml::string(DEFAULTS_TOML));
        if let Some(file) = &cli.config_file {
            if !file.exists() {
                return Err(ConfigError::MissingFile(file.clone()));
            }
            fig = fig.merge(Toml::file(file));
        }
        fig = fig.merge(env_provider());
        if let Some(v) = &cli.listen {
            fig = fig.merge(Serialized::default("server.listen", v));
        }
        if let Some(v) = &cli.data_dir {
            fig = fig.merge(Serialized::default("server.data_dir", v));
        }
        if let Some(v) = &cli.base_url {
            fig = fig.merge(Serialized::default("server.base_url", v));
        }
        let cfg: Config = fig.extract().map_err(Box::new)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The defaults alone (tests and examples start from here).
    pub fn defaults() -> Config {
        let cfg: Config = Figment::from(Toml::string(DEFAULTS_TOML))
            .extract()
            .expect("compiled-in defaults parse");
        cfg
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.server.listen.parse::<SocketAddr>().is_err() {
            return bad(format!(
                "server.listen {:?} is not an address like 127.0.0.1:8080",
                self.server.listen
            ));
        }
        if !self.server.base_url.is_empty() {
            match url::Url::parse(&self.server.base_url) {
                Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
                _ => {
                    return bad(format!(
                        "server.base_url {:?} is not an http(s) URL",
                        self.server.base_url
                    ))
                }
            }
        }
        match self.store.backend.as_str() {
            "embedded" => {}
            "elasticsearch" => {
                let es = &self.store.elasticsearch;
                if let Err(e) = url::Url::parse(&es.server_url()) {
                    return bad(format!("store.elasticsearch: {:?} is not a URL ({e}); set url, or host and port", es.server_url()));
                }
                if es.index.is_empty() || es.index.chars().any(|c| c.is_ascii_uppercase() || "\\/*?\"<>| ,#:".contains(c)) {
                    return bad(format!("store.elasticsearch.index {:?} is not a valid index name (lowercase, no \\/*?\"<>| ,#:)", es.index));
                }
            }
            other => return bad(format!("store.backend {other:?} is not supported (supported: \"embedded\", \"elasticsearch\")")),
        }
        if self.source.store_page_size == 0 {
            return bad("source.store_page_size must be at least 1".into());
        }
        self.validate_hub()?;
        let n = &self.notify;
        if n.poll_interval_ms == 0
            || n.max_entries == 0
            || n.max_entries > SITEMAP_MAX_ITEMS as usize
        {
            return bad(format!(
                "notify: poll_interval_ms must be at least 1 and max_entries between 1 and {SITEMAP_MAX_ITEMS}"
            ));
        }
        check_max_items("set_defaults", self.set_defaults.max_items_in_list)?;
        for (name, set) in &self.sets {
            if let Err(reason) = crate::model::SetName::parse(name) {
                return bad(format!("[sets.{name}]: {reason}"));
            }
            if let Some(n) = set.max_items_in_list {
                check_max_items(&format!("sets.{name}"), n)?;
            }
            if let Some(root) = &set.resource_root_dir {
                if !root.is_absolute() {
                    return bad(format!(
                        "sets.{name}.resource_root_dir {root:?} must be an absolute path"
                    ));
                }
            }
            let prefix = self.set_config(name).url_prefix;
            if url::Url::parse(&prefix)
                .map(|u| u.cannot_be_a_base())
                .unwrap_or(true)
            {
                return bad(format!(
                    "sets.{name}.url_prefix {prefix:?} is not an absolute URL"
                ));
            }
        }
        Ok(())
    }

    fn validate_hub(&self) -> Result<(), ConfigError> {
        let h = &self.hub;
        let bad = |m: String| Err(ConfigError::Invalid(m));
        for (key, p) in [("hub.path", &h.path), ("hub.topic_path", &h.topic_path)] {
            if !p.starts_with('/')
                || p.len() < 2
                || p.ends_with('/')
                || p.contains(['?', '#', '{', '}'])
            {
                return bad(format!(
                    "{key} {p:?} must be a path like \"/hub\" (leading '/', no trailing '/')"
                ));
            }
        }
        if crate::model::websub::SignatureAlg::parse(&h.signature_algorithm).is_none() {
            return bad(format!(
                "hub.signature_algorithm {:?} must be one of sha1, sha256, sha384, sha512",
                h.signature_algorithm
            ));
        }
        if h.lease_min_secs == 0 || h.lease_min_secs > h.lease_max_secs {
            return bad(format!(
                "hub leases: need 0 < lease_min_secs ({}) <= lease_max_secs ({})",
                h.lease_min_secs, h.lease_max_secs
            ));
        }
        if !(h.lease_min_secs..=h.lease_max_secs).contains(&h.lease_default_secs) {
            return bad(format!(
                "hub.lease_default_secs ({}) must lie between lease_min_secs and lease_max_secs",
                h.lease_default_secs
            ));
        }
        for net in &h.allow_networks {
            if net.parse::<ipnet::IpNet>().is_err() {
                return bad(format!(
                    "hub.allow_networks: {net:?} is not a network like 10.0.0.0/8 or ::1/128"
                ));
            }
        }
        for p in &h.topic_prefixes {
            match url::Url::parse(p) {
                Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
                _ => {
                    return bad(format!(
                        "hub.topic_prefixes: {p:?} is not an http(s) URL prefix"
                    ))
                }
            }
        }
        if !(0.0..=1.0).contains(&h.retry_jitter) {
            return bad(format!(
                "hub.retry_jitter {} must lie between 0 and 1",
                h.retry_jitter
            ));
        }
        if h.request_timeout_secs == 0
            || h.max_concurrent_deliveries == 0
            || h.requests_per_callback_per_minute == 0
        {
            return bad("hub.request_timeout_secs, max_concurrent_deliveries and requests_per_callback_per_minute must be at least 1".into());
        }
        Ok(())
    }

    /// The hub URL (`base_url` + `hub.path`).
    pub fn hub_url(&self) -> String {
        format!("{}{}", self.base_url(), self.hub.path)
    }

    /// The URL prefix of the topics this hub serves (no trailing slash).
    pub fn topic_base(&self) -> String {
        format!("{}{}", self.base_url(), self.hub.topic_path)
    }

    /// The topic of a set's change notifications.
    pub fn change_topic(&self, set: &str) -> String {
        format!("{}/{set}/changes", self.topic_base())
    }

    /// The topic of a set's framework notifications.
    pub fn framework_topic(&self, set: &str) -> String {
        format!("{}/{set}/framework", self.topic_base())
    }

    /// The public base URL, without a trailing slash.
    pub fn base_url(&self) -> String {
        if self.server.base_url.is_empty() {
            format!("http://{}", self.server.listen)
        } else {
            self.server.base_url.trim_end_matches('/').to_string()
        }
    }

    /// The effective configuration of a set, configured or not.
    pub fn set_config(&self, name: &str) -> SetConfig {
        let o = self.sets.get(name).cloned().unwrap_or_default();
        let template = o
            .url_prefix
            .unwrap_or_else(|| self.set_defaults.url_prefix.clone());
        let mut url_prefix = template
            .replace("{base_url}", &self.base_url())
            .replace("{set}", name);
        if !url_prefix.ends_with('/') {
            url_prefix.push('/');
        }
        SetConfig {
            name: name.to_string(),
            url_prefix,
            resource_root_dir: o.resource_root_dir,
            max_items_in_list: o
                .max_items_in_list
                .unwrap_or(self.set_defaults.max_items_in_list),
            changelist_rollover_secs: o
                .changelist_rollover_secs
                .unwrap_or(self.set_defaults.changelist_rollover_secs),
            describedby: o.describedby,
        }
    }

    pub fn database_path(&self) -> PathBuf {
        self.server.data_dir.join("rshub.sqlite")
    }
}

fn check_max_items(what: &str, n: u32) -> Result<(), ConfigError> {
    if n == 0 || n > SITEMAP_MAX_ITEMS {
        return Err(ConfigError::Invalid(format!(
            "{what}.max_items_in_list = {n}: must be between 1 and {SITEMAP_MAX_ITEMS}"
        )));
    }
    Ok(())
}

/// `RSHUB_SECTION_KEY` -> `section.key`; a double underscore splits explicitly
/// (`RSHUB_SETS__papers__URL_PREFIX` -> `sets.papers.url_prefix`).
fn env_provider() -> Env {
    Env::prefixed("RSHUB_").map(|k| {
        let k = k.as_str();
        if k.contains("__") {
            k.split("__").collect::<Vec<_>>().join(".").into()
        } else {
            k.replacen('_', ".", 1).into()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_and_validate() {
        let c = Config::defaults();
        c.validate().unwrap();
        assert_eq!(c.base_url(), "http://127.0.0.1:8080");
        let s = c.set_config("demo");
        assert_eq!(s.url_prefix, "http://127.0.0.1:8080/files/demo/");
        assert_eq!(s.max_items_in_list, 50_000);
        assert_eq!(
            s.served_path(&c.base_url()),
            None,
            "no root dir, nothing to serve"
        );
    }

    #[test]
    fn max_items_over_sitemap_limit_is_refused() {
        let mut c = Config::defaults();
        c.sets.insert(
            "a".into(),
            SetOverrides {
                max_items_in_list: Some(50_001),
                ..Default::default()
            },
        );
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("sets.a.max_items_in_list = 50001"), "{e}");
    }

    #[test]
    fn served_path_only_under_base_url() {
        let mut c = Config::defaults();
        c.server.base_url = "http://h:1/hub".into();
        c.sets.insert(
            "a".into(),
            SetOverrides {
                resource_root_dir: Some("/srv/a".into()),
                ..Default::default()
            },
        );
        c.sets.insert(
            "b".into(),
            SetOverrides {
                resource_root_dir: Some("/srv/b".into()),
                url_prefix: Some("http://other/b".into()),
                ..Default::default()
            },
        );
        assert_eq!(
            c.set_config("a").served_path(&c.base_url()).as_deref(),
            Some("/files/a"),
            "relative to base_url, like every route"
        );
        assert_eq!(c.set_config("b").url_prefix, "http://other/b/");
        assert_eq!(c.set_config("b").served_path(&c.base_url()), None);
    }
}
