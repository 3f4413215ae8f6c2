//! Layered configuration: compiled-in commented defaults -> `--config` file -> `RSHUB_*`
//! environment -> command-line flags; validated once at load so the rest of the crate can trust it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::model::websub::SignatureAlg;
pub use crate::model::{DescribedBy, SetConfig};

/// The commented defaults file, the first configuration layer (also the reference docs).
pub const DEFAULTS_TOML: &str = include_str!("../config.default.toml");

/// The sitemap protocol's hard limit on entries per document.
pub const SITEMAP_MAX_ITEMS: u32 = 50_000;
/// The sitemap protocol's 50 MB limit, less a margin for the document's own envelope.
/// The highest per-subscriber delivery rate one may set (`hub.max_per_sec_per_subscriber`, the
/// admin API's `max_per_sec`): above it, a limit means nothing.
pub const MAX_PER_SEC: f64 = 10_000.0;

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
    pub dumps: DumpsConfig,
    pub set_defaults: SetDefaults,
    pub oai: OaiConfig,
    #[serde(default)]
    pub sets: BTreeMap<String, SetOverrides>,
    /// `[collect.NAME]`: OAI-PMH repositories feeding the resource set NAME.
    #[serde(default)]
    pub collect: BTreeMap<String, CollectConfig>,
    /// The LDN inbox for COAR Notify announcements (`/inbox`).
    pub inbox: InboxConfig,
}

/// `[inbox]`: the LDN inbox taking COAR Notify announcements from declared services.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InboxConfig {
    pub enabled: bool,
    /// The largest notification taken, in bytes (413 beyond).
    pub max_notification_bytes: usize,
    /// Notifications kept (the oldest go first).
    pub keep: u32,
    /// Days a notification is kept.
    pub keep_days: u64,
    /// Notifications a minute from one sender (429 beyond).
    pub per_sender_per_minute: u32,
    /// Notifications per page of the inbox's listing.
    pub page_size: u32,
    /// Tries of an answer to a sender's inbox (pauses from 1 s, doubling, at most 5 min).
    pub reply_attempts: u32,
    /// `[inbox.senders.NAME]`: the services whose notifications are taken.
    #[serde(default)]
    pub senders: BTreeMap<String, SenderConfig>,
}

/// `[inbox.senders.NAME]`: a service that announces, tied to the collector of its repository.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SenderConfig {
    /// Its `origin.id` in the notifications it sends.
    pub id: String,
    /// Its LDN inbox, where the answers go.
    pub inbox: String,
    /// The `[collect.NAME]` collecting its repository.
    pub collect: String,
    /// The networks it posts from (CIDRs); empty: any, when a token is required.
    #[serde(default)]
    pub networks: Vec<ipnet::IpNet>,
    /// The environment variable holding the bearer token it sends (`""`: none asked).
    #[serde(default)]
    pub token_env: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ServerConfig {
    pub listen: String,
    pub base_url: String,
    pub data_dir: PathBuf,
    pub shutdown_grace_secs: u64,
    pub idle_timeout_secs: u64,
    pub max_connections: u32,
    /// The internal nginx location's prefix for `X-Accel-Redirect` (`""`: off).
    pub accel_redirect: String,
}

/// Which store the server keeps its state in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// SQLite at `<data_dir>/rshub.sqlite`.
    Embedded,
    /// Elasticsearch / OpenSearch indices, shareable by several processes.
    Elasticsearch,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct StoreConfig {
    pub backend: Backend,
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
    pub token: crate::model::Secret,
    pub max_body_bytes: usize,
    pub max_future_skew_secs: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct SourceConfig {
    pub describedby: String,
    pub cache_max_bytes: usize,
    pub memory_page_max_bytes: usize,
    pub cache_dir: String,
    pub disk_cache_max_bytes: u64,
    pub rebuild_interval_ms: u64,
    pub max_concurrent_file_reads: usize,
    pub store_page_size: usize,
    pub max_concurrent_builds: usize,
    pub max_queued_builds: usize,
    pub rollover_check_secs: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct HubConfig {
    pub path: String,
    pub topic_path: String,
    pub publisher_token: crate::model::Secret,
    pub signature_algorithm: SignatureAlg,
    pub standard_webhooks: bool,
    pub lease_default_secs: u64,
    pub lease_min_secs: u64,
    pub lease_max_secs: u64,
    pub topic_prefixes: Vec<String>,
    pub allow_networks: Vec<ipnet::IpNet>,
    pub retry_schedule_secs: Vec<u64>,
    pub retry_jitter: f64,
    pub max_retry_after_secs: u64,
    pub request_timeout_secs: u64,
    pub max_concurrent_deliveries: usize,
    pub slow_delivery_ms: u64,
    pub max_concurrent_deliveries_per_host: usize,
    pub max_body_bytes: usize,
    pub requests_per_callback_per_minute: u32,
    pub requests_per_host_per_minute: u32,
    pub max_subscriptions_per_host: u64,
    pub max_concurrent_verifications: usize,
    pub max_verifications_per_host: usize,
    pub history_days: u64,
    pub retention_hours: u64,
    pub partitions: u32,
    pub partition_lease_secs: u64,
    pub secret_grace_secs: u64,
    pub disable_after_secs: u64,
    pub max_per_sec_per_subscriber: f64,
    pub operator_webhook: String,
    pub operator_webhook_secret: crate::model::Secret,
    pub egress_proxy: String,
}

/// The shortest `admin.token` accepted (the harvester's console insists on the same).
pub const MIN_ADMIN_TOKEN: usize = 16;

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct AdminConfig {
    pub token: crate::model::Secret,
    /// Wrong tokens a client address may give a minute before it is refused (429).
    pub wrong_tokens_per_minute: u32,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct NotifyConfig {
    pub enabled: bool,
    pub poll_interval_ms: u64,
    pub max_entries: usize,
    pub max_delay_ms: u64,
    pub hold_back_secs: u64,
}

/// How bitstreams are packed in dump packages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DumpCompression {
    Deflate,
    Stored,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct DumpsConfig {
    pub enabled: bool,
    pub dir: String,
    pub package_max_bytes: u64,
    pub package_max_entries: u32,
    pub compression: DumpCompression,
    pub compression_level: u32,
    pub interval_secs: u64,
    pub change_fraction: f64,
    pub check_interval_secs: u64,
    pub keep_replaced_secs: u64,
    pub fetch_remote: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct SetDefaults {
    pub url_prefix: String,
    pub max_items_in_list: u32,
    pub changelist_rollover_secs: u64,
}

/// `[oai]`: the OAI-PMH repository at `/oai`.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct OaiConfig {
    pub enabled: bool,
    pub page_size: usize,
    /// Bytes of ListRecords pages kept on disk to be sent again (0: none kept).
    pub list_cache_max_bytes: u64,
    pub repository_name: String,
    pub admin_email: String,
}

/// A set's records as OAI-PMH serves them (`[sets.NAME.oai]`): their metadata format.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OaiFormat {
    pub metadata_prefix: String,
    pub schema: String,
    pub namespace: String,
}

impl OaiFormat {
    /// Dublin Core as OAI-PMH defines it: the format every repository serves.
    pub fn oai_dc() -> OaiFormat {
        OaiFormat {
            metadata_prefix: "oai_dc".into(),
            schema: "http://www.openarchives.org/OAI/2.0/oai_dc.xsd".into(),
            namespace: "http://www.openarchives.org/OAI/2.0/oai_dc/".into(),
        }
    }
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
    /// Served by the OAI-PMH repository in this format.
    pub oai: Option<OaiFormat>,
}

/// A `[collect.NAME]` table: an OAI-PMH repository that keeps the resource set NAME current.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CollectConfig {
    /// The source's URL: an OAI-PMH base URL (without a query), a ResourceSync Source
    /// Description or Capability List, an activity stream, a sitemap (or sitemap index), or
    /// a site's base URL to discover one of these from.
    pub url: String,
    /// What `url` is: `oai-pmh`, `resourcesync`, `activity` (IIIF Change Discovery) or
    /// `sitemap`; absent: discovered from `url` (see `admin collect NAME`).
    #[serde(default)]
    pub kind: Option<CollectKind>,
    /// ResourceSync, activity stream and sitemap sources: `mirror` (the default) keeps each
    /// resource's bytes under the set's folder and serves them from this server (checked
    /// against the source's md5 and length, with a `via` link to the original); `link` keeps
    /// the original's URL as the resource's location (its bytes are still fetched once to
    /// check and measure them).
    #[serde(default)]
    pub bytes: CollectBytes,
    /// The metadata format harvested.
    #[serde(default = "CollectConfig::default_prefix")]
    pub metadata_prefix: String,
    /// An OAI set (`setSpec`) to harvest instead of the whole repository.
    #[serde(default)]
    pub set: Option<String>,
    /// Seconds between the starts of two incremental runs.
    #[serde(default = "CollectConfig::default_interval")]
    pub interval_secs: u64,
    /// Seconds between reconcile passes (`ListIdentifiers`, recording as deleted what the
    /// repository no longer lists); 0 = on demand only. Passes run only for repositories
    /// whose `deletedRecord` is `no` or `transient`, or when asked.
    #[serde(default = "CollectConfig::default_reconcile")]
    pub reconcile_secs: u64,
    /// One request's time limit, the body included.
    #[serde(default = "CollectConfig::default_timeout")]
    pub request_timeout_secs: u64,
    /// The largest response read (a page with its records), in bytes.
    #[serde(default = "CollectConfig::default_max_response")]
    pub max_response_bytes: u64,
    /// Attempts of one request before the run stops with the reason (timeouts, 5xx, pages
    /// that are not OAI-PMH); 503 with `Retry-After` waits as told without using one.
    #[serde(default = "CollectConfig::default_attempts")]
    pub attempts: u32,
    /// The first retry's delay in milliseconds, doubled on each further retry, with jitter.
    #[serde(default = "CollectConfig::default_retry_base")]
    pub retry_base_ms: u64,
    /// The longest `Retry-After` honoured, in seconds (a longer one is waited for this long).
    #[serde(default = "CollectConfig::default_max_retry_after")]
    pub max_retry_after_secs: u64,
    /// The most requests started per second at the source's host, over every process of the
    /// server (with two in flight at most, always); 0 = no limit but that. Collectors at one
    /// host keep the lowest of theirs.
    #[serde(default)]
    pub requests_per_sec: f64,
}

/// What a `[collect.NAME]` source is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CollectKind {
    OaiPmh,
    Resourcesync,
    /// An activity stream: IIIF Change Discovery 1.0 (`OrderedCollection` of pages of
    /// Create/Update/Delete/Remove/Move activities).
    Activity,
    /// A sitemap or sitemap index (sitemaps.org), read whole with its `lastmod`s.
    Sitemap,
}

impl CollectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CollectKind::OaiPmh => "oai-pmh",
            CollectKind::Resourcesync => "resourcesync",
            CollectKind::Activity => "activity",
            CollectKind::Sitemap => "sitemap",
        }
    }
}

/// Where a collected resource's bytes are served from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CollectBytes {
    #[default]
    Mirror,
    Link,
}

impl CollectConfig {
    fn default_prefix() -> String {
        "oai_dc".into()
    }
    fn default_interval() -> u64 {
        3600
    }
    fn default_reconcile() -> u64 {
        7 * 86400
    }
    fn default_timeout() -> u64 {
        120
    }
    fn default_max_response() -> u64 {
        64 * 1024 * 1024
    }
    fn default_attempts() -> u32 {
        5
    }
    fn default_retry_base() -> u64 {
        2000
    }
    fn default_max_retry_after() -> u64 {
        3600
    }

    /// A collector of `url` with every other key at its default.
    pub fn new(url: &str) -> CollectConfig {
        CollectConfig {
            url: url.into(),
            kind: None,
            bytes: CollectBytes::Mirror,
            metadata_prefix: Self::default_prefix(),
            set: None,
            interval_secs: Self::default_interval(),
            reconcile_secs: Self::default_reconcile(),
            request_timeout_secs: Self::default_timeout(),
            max_response_bytes: Self::default_max_response(),
            attempts: Self::default_attempts(),
            retry_base_ms: Self::default_retry_base(),
            max_retry_after_secs: Self::default_max_retry_after(),
            requests_per_sec: 0.0,
        }
    }
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
    /// Values of the wrong type, one line per key: `key: problem (where it came from)`.
    #[error("configuration: {0}")]
    Load(String),
    #[error("configuration file {0} does not exist")]
    MissingFile(PathBuf),
    /// Keys or `RSHUB_*` variables nothing reads, each with the nearest known one.
    #[error("configuration: {0}")]
    Unknown(String),
    #[error("configuration: {0}")]
    Invalid(String),
}

/// `RSHUB_*` variables read by the command line itself, not by the configuration.
const CLI_VARIABLES: &[&str] = &["RSHUB_ADMIN_URL"];

/// The keys of a `[sets.NAME]` table.
const SET_KEYS: &[&str] = &[
    "url_prefix",
    "resource_root_dir",
    "max_items_in_list",
    "changelist_rollover_secs",
    "describedby",
    "oai",
];

/// The keys of a `[collect.NAME]` table.
const COLLECT_KEYS: &[&str] = &[
    "url",
    "kind",
    "bytes",
    "metadata_prefix",
    "set",
    "interval_secs",
    "reconcile_secs",
    "request_timeout_secs",
    "max_response_bytes",
    "attempts",
    "retry_base_ms",
    "max_retry_after_secs",
    "requests_per_sec",
];

/// The open-ended tables, whose names the operator chooses, and the keys each name's table has.
const NAMED_TABLES: &[(&str, &[&str])] = &[("sets", SET_KEYS), ("collect", COLLECT_KEYS)];

/// A key inside a named table (`sets.papers.url_prefix`): the table, the name, the key and
/// the keys that table has.
fn named_key(key: &str) -> Option<(&'static str, &str, &str, &'static [&'static str])> {
    NAMED_TABLES.iter().find_map(|(table, keys)| {
        let (name, k) = key
            .strip_prefix(table)?
            .strip_prefix('.')?
            .split_once('.')?;
        Some((*table, name, k, *keys))
    })
}

/// A relative path whose value came from a configuration file is taken from that file's
/// folder (not from the working directory); one from the defaults, the environment or the
/// command line stays relative to the working directory.
pub fn beside_file(fig: &Figment, key: &str, path: &mut PathBuf) {
    if path.is_absolute() {
        return;
    }
    if let Some(figment::Source::File(file)) =
        fig.find_metadata(key).and_then(|m| m.source.as_ref())
    {
        if let Some(folder) = std::path::absolute(file)
            .ok()
            .and_then(|f| f.parent().map(|p| p.to_path_buf()))
        {
            *path = folder.join(&*path);
        }
    }
}

impl Config {
    /// Loads every layer and validates the result. Unknown keys and variables, values of the
    /// wrong type and invalid values are all refused, naming the key and where it came from.
    pub fn load(cli: &CliOverrides) -> Result<Config, ConfigError> {
        let env = EnvMapping::read();
        let fig = Config::figment(cli, &env)?;
        let mut unknown = env.unknown.clone();
        unknown.extend(unknown_keys(&fig));
        if !unknown.is_empty() {
            return Err(ConfigError::Unknown(unknown.join("\n  ")));
        }
        let mut cfg: Config = fig
            .extract()
            .map_err(|e| ConfigError::Load(describe_errors(e, &env)))?;
        cfg.paths_beside_file(&fig);
        cfg.validate()?;
        Ok(cfg)
    }

    /// The layers, merged.
    fn figment(cli: &CliOverrides, env: &EnvMapping) -> Result<Figment, ConfigError> {
        let mut fig = Figment::from(Toml::string(DEFAULTS_TOML));
        if let Some(file) = &cli.config_file {
            if !file.exists() {
                return Err(ConfigError::MissingFile(file.clone()));
            }
            fig = fig.merge(Toml::file_exact(file));
        }
        fig = fig.merge(env.provider());
        if let Some(v) = &cli.listen {
            fig = fig.merge(Serialized::default("server.listen", v));
        }
        if let Some(v) = &cli.data_dir {
            fig = fig.merge(Serialized::default("server.data_dir", v));
        }
        if let Some(v) = &cli.base_url {
            fig = fig.merge(Serialized::default("server.base_url", v));
        }
        Ok(fig)
    }

    /// Where `server.data_dir` was set: `None` when it is the compiled-in default.
    pub fn data_dir_origin(cli: &CliOverrides) -> Option<String> {
        if cli.data_dir.is_some() {
            return Some("--data-dir".into());
        }
        let env = EnvMapping::read();
        if let Some(var) = env.var_of("server.data_dir") {
            return Some(format!("environment variable {var}"));
        }
        let fig = Config::figment(cli, &env).ok()?;
        match fig.find_metadata("server.data_dir")?.source.as_ref()? {
            figment::Source::File(p) => Some(p.display().to_string()),
            _ => None,
        }
    }

    /// Relative paths given in the configuration file are taken from the file's folder.
    fn paths_beside_file(&mut self, fig: &Figment) {
        beside_file(fig, "server.data_dir", &mut self.server.data_dir);
        for (key, value) in [
            ("source.cache_dir", &mut self.source.cache_dir),
            ("dumps.dir", &mut self.dumps.dir),
        ] {
            if !value.is_empty() {
                let mut p = PathBuf::from(value.as_str());
                beside_file(fig, key, &mut p);
                *value = p.display().to_string();
            }
        }
    }

    /// The defaults alone (tests and examples start from here).
    pub fn defaults() -> Config {
        let cfg: Config = Figment::from(Toml::string(DEFAULTS_TOML))
            .extract()
            .expect("compiled-in defaults parse");
        cfg
    }

    /// Refuses what cannot work or is unsafe, each in words naming the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let accel = &self.server.accel_redirect;
        let prefix_like = |a: &str| {
            a.starts_with('/')
                && a.ends_with('/')
                && a.len() > 2
                && a.bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'%' && b != b'?')
        };
        if !accel.is_empty() && !prefix_like(accel) {
            return bad(format!(
                "server.accel_redirect {accel:?} must be an nginx location prefix like \"/_rshub/\" (starting and ending with /)"
            ));
        }
        if !self.admin.token.is_empty() && self.admin.token.len() < MIN_ADMIN_TOKEN {
            return bad(format!(
                "admin.token is shorter than {MIN_ADMIN_TOKEN} characters: it opens the admin API and the console, so make it one nobody guesses (resourcesync-hub prints one: openssl rand -hex 16 does too)"
            ));
        }
        if !is_listen_address(&self.server.listen) {
            return bad(format!(
                "server.listen {:?} is not an address like 127.0.0.1:8080 or localhost:8080",
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
        if self.server.max_connections == 0 {
            return bad(
                "server.max_connections must be at least 1 (how many connections may be open at once)".into(),
            );
        }
        if self.server.idle_timeout_secs == 0 {
            return bad(
                "server.idle_timeout_secs must be at least 1 (how long a connection may sit with nothing moving)".into(),
            );
        }
        let d = &self.dumps;
        if d.package_max_entries == 0 || d.package_max_entries > SITEMAP_MAX_ITEMS {
            return bad(format!(
                "dumps.package_max_entries {} must be between 1 and {SITEMAP_MAX_ITEMS} (a manifest is a sitemap)",
                d.package_max_entries
            ));
        }
        if d.package_max_bytes < 1024 {
            return bad(format!(
                "dumps.package_max_bytes {} is smaller than 1024",
                d.package_max_bytes
            ));
        }
        if !(1..=9).contains(&d.compression_level) {
            return bad(format!(
                "dumps.compression_level {} must be 1 (fastest) to 9 (smallest)",
                d.compression_level
            ));
        }
        if !(d.change_fraction > 0.0 && d.change_fraction.is_finite()) {
            return bad(format!(
                "dumps.change_fraction {} must be a positive fraction such as 0.1",
                d.change_fraction
            ));
        }
        if d.check_interval_secs == 0 {
            return bad("dumps.check_interval_secs must be at least 1".into());
        }
        match self.store.backend {
            Backend::Embedded => {}
            Backend::Elasticsearch => {
                let es = &self.store.elasticsearch;
                if let Err(e) = url::Url::parse(&es.server_url()) {
                    return bad(format!(
                        "store.elasticsearch: {:?} is not a URL ({e}); set url, or host and port",
                        es.server_url()
                    ));
                }
                if es.index.is_empty()
                    || es
                        .index
                        .chars()
                        .any(|c| c.is_ascii_uppercase() || "\\/*?\"<>| ,#:".contains(c))
                {
                    return bad(format!("store.elasticsearch.index {:?} is not a valid index name (lowercase, no \\/*?\"<>| ,#:)", es.index));
                }
            }
        }
        if self.source.store_page_size == 0
            || self.source.max_concurrent_builds == 0
            || self.source.max_concurrent_file_reads == 0
        {
            return bad(
                "source.store_page_size, source.max_concurrent_builds and source.max_concurrent_file_reads must be at least 1".into(),
            );
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
        self.validate_collect()?;
        self.validate_inbox()
    }

    fn validate_collect(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.oai.page_size == 0 || self.oai.page_size > 10_000 {
            return bad(format!(
                "oai.page_size is {}: it must be between 1 and 10000",
                self.oai.page_size
            ));
        }
        if !self.oai.admin_email.contains('@') {
            return bad(format!(
                "oai.admin_email {:?} is not an e-mail address (OAI-PMH's Identify requires one)",
                self.oai.admin_email
            ));
        }
        for (name, set) in &self.sets {
            let Some(f) = &set.oai else { continue };
            let prefix_ok = !f.metadata_prefix.is_empty()
                && f.metadata_prefix
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.!~*'()".contains(c));
            if !prefix_ok {
                return bad(format!(
                    "sets.{name}.oai.metadata_prefix {:?} is not an OAI-PMH metadataPrefix (letters, digits and -_.!~*'())",
                    f.metadata_prefix
                ));
            }
            for (k, v) in [("schema", &f.schema), ("namespace", &f.namespace)] {
                if url::Url::parse(v).is_err() {
                    return bad(format!("sets.{name}.oai.{k} {v:?} is not an absolute URL"));
                }
            }
        }
        for (name, c) in &self.collect {
            if let Err(reason) = crate::model::SetName::parse(name) {
                return bad(format!(
                    "[collect.{name}]: {reason} (NAME is the resource set it feeds)"
                ));
            }
            match url::Url::parse(&c.url) {
                Ok(u) if (u.scheme() == "http" || u.scheme() == "https") && u.query().is_none() => {}
                Ok(u)
                    if (u.scheme() == "http" || u.scheme() == "https")
                        && c.kind.is_some_and(|k| k != CollectKind::OaiPmh) => {}
                _ if c.kind == Some(CollectKind::OaiPmh) => {
                    return bad(format!(
                        "collect.{name}.url {:?} is not an OAI-PMH base URL: http(s), without a query (the verbs are added to it)",
                        c.url
                    ))
                }
                _ => {
                    return bad(format!(
                        "collect.{name}.url {:?} is not a source's URL: http(s), and without a query unless kind names what it is",
                        c.url
                    ))
                }
            }
            if c.metadata_prefix.is_empty() || c.metadata_prefix.len() > 64 {
                return bad(format!(
                    "collect.{name}.metadata_prefix must be 1 to 64 characters (such as oai_dc)"
                ));
            }
            if c.interval_secs == 0 || c.request_timeout_secs == 0 || c.attempts == 0 {
                return bad(format!(
                    "collect.{name}: interval_secs, request_timeout_secs and attempts must be at least 1"
                ));
            }
            if !(c.requests_per_sec >= 0.0 && c.requests_per_sec <= 10_000.0) {
                return bad(format!(
                    "collect.{name}.requests_per_sec must be between 0 (no limit) and 10000"
                ));
            }
            if c.max_response_bytes < 64 * 1024 {
                return bad(format!(
                    "collect.{name}.max_response_bytes must be at least 65536 (one page of records)"
                ));
            }
        }
        Ok(())
    }

    fn validate_inbox(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let i = &self.inbox;
        if i.max_notification_bytes < 1024 || i.keep == 0 || i.keep_days == 0 {
            return bad("inbox.max_notification_bytes must be at least 1024, inbox.keep and inbox.keep_days at least 1".into());
        }
        if i.page_size == 0 || i.page_size > 1000 || i.per_sender_per_minute == 0 {
            return bad("inbox.page_size must be between 1 and 1000, inbox.per_sender_per_minute at least 1".into());
        }
        for (name, s) in &i.senders {
            if url::Url::parse(&s.id).is_err() {
                return bad(format!("inbox.senders.{name}.id {:?} is not an absolute URI (the origin.id its notifications carry)", s.id));
            }
            if !matches!(
                url::Url::parse(&s.inbox)
                    .map(|u| u.scheme().to_string())
                    .as_deref(),
                Ok("http" | "https")
            ) {
                return bad(format!(
                    "inbox.senders.{name}.inbox {:?} is not an http(s) URL (where answers go)",
                    s.inbox
                ));
            }
            if !self.collect.contains_key(&s.collect) {
                return bad(format!(
                    "inbox.senders.{name}.collect {:?} names no [collect.NAME] (the collector of the sender's repository)",
                    s.collect
                ));
            }
            if s.networks.is_empty() && s.token_env.is_empty() {
                return bad(format!(
                    "inbox.senders.{name}: give networks (the addresses it posts from) or token_env (the token it sends), or both: COAR Notify carries no signature, so anyone could claim its origin.id"
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
            || h.max_concurrent_deliveries_per_host == 0
            || h.requests_per_host_per_minute == 0
            || h.requests_per_callback_per_minute == 0
            || h.max_concurrent_verifications == 0
            || h.max_verifications_per_host == 0
            || h.retention_hours == 0
        {
            return bad("hub.request_timeout_secs, max_concurrent_deliveries, max_concurrent_deliveries_per_host, requests_per_callback_per_minute, max_concurrent_verifications, max_verifications_per_host and retention_hours must be at least 1".into());
        }
        if !(1..=4096).contains(&h.partitions) {
            return bad(format!(
                "hub.partitions is {}: it must be between 1 and 4096",
                h.partitions
            ));
        }
        if !(h.max_per_sec_per_subscriber >= 0.0 && h.max_per_sec_per_subscriber <= MAX_PER_SEC) {
            return bad(format!(
                "hub.max_per_sec_per_subscriber is {}: it must be between 0 (no limit) and {MAX_PER_SEC}",
                h.max_per_sec_per_subscriber
            ));
        }
        if !h.egress_proxy.is_empty() {
            match url::Url::parse(&h.egress_proxy) {
                Ok(u) if (u.scheme() == "http" || u.scheme() == "https")
                    && u.host().is_some()
                    && reqwest::Proxy::all(u.as_str()).is_ok() => {}
                _ => {
                    return bad(format!(
                        "hub.egress_proxy {:?} is not a proxy URL like \"http://proxy.example.org:3128\"",
                        h.egress_proxy
                    ))
                }
            }
        }
        if !h.operator_webhook.is_empty() {
            match url::Url::parse(&h.operator_webhook) {
                Ok(u) if (u.scheme() == "http" || u.scheme() == "https") && u.host().is_some() => {}
                _ => {
                    return bad(format!(
                        "hub.operator_webhook {:?} is not an http(s) URL",
                        h.operator_webhook
                    ))
                }
            }
        }
        if !(3..=300).contains(&h.partition_lease_secs) {
            return bad(format!(
                "hub.partition_lease_secs is {}: it must be between 3 and 300",
                h.partition_lease_secs
            ));
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
            resource_root_dir: o.resource_root_dir.or_else(|| {
                self.collect
                    .contains_key(name)
                    .then(|| self.collected_dir(name))
            }),
            max_items_in_list: o
                .max_items_in_list
                .unwrap_or(self.set_defaults.max_items_in_list),
            changelist_rollover_secs: o
                .changelist_rollover_secs
                .unwrap_or(self.set_defaults.changelist_rollover_secs),
            describedby: o.describedby,
        }
    }

    /// The format the OAI-PMH repository serves a set's records in: its `[sets.NAME.oai]`, or
    /// for a set collected in `oai_dc`, that; `None`: the set is not served over OAI-PMH.
    pub fn oai_format(&self, set: &str) -> Option<OaiFormat> {
        if let Some(f) = self.sets.get(set).and_then(|s| s.oai.clone()) {
            return Some(f);
        }
        self.collect
            .get(set)
            .filter(|c| {
                c.metadata_prefix == "oai_dc" && c.kind.is_none_or(|k| k == CollectKind::OaiPmh)
            })
            .map(|_| OaiFormat::oai_dc())
    }

    /// The sets the configuration names: `[sets.NAME]` and `[collect.NAME]` tables, in order.
    pub fn configured_sets(&self) -> std::collections::BTreeSet<&str> {
        self.sets
            .keys()
            .chain(self.collect.keys())
            .map(String::as_str)
            .collect()
    }

    /// Where a collected set keeps its records' files when `[sets.NAME]` names no
    /// `resource_root_dir`: `<data_dir>/collected/NAME`.
    pub fn collected_dir(&self, name: &str) -> PathBuf {
        self.server.data_dir.join("collected").join(name)
    }

    pub fn database_path(&self) -> PathBuf {
        self.server.data_dir.join("rshub.sqlite")
    }

    /// The dumps' directory: `dumps.dir`, or `<data_dir>/dumps` when empty.
    pub fn dumps_dir(&self) -> PathBuf {
        if self.dumps.dir.is_empty() {
            self.server.data_dir.join("dumps")
        } else {
            PathBuf::from(&self.dumps.dir)
        }
    }

    /// The page cache's directory: `source.cache_dir`, or `<data_dir>/pages` when empty.
    pub fn page_cache_dir(&self) -> PathBuf {
        if self.source.cache_dir.is_empty() {
            self.server.data_dir.join("pages")
        } else {
            PathBuf::from(&self.source.cache_dir)
        }
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

/// `host:port` (an IP address or a name such as `localhost`, and a port).
fn is_listen_address(s: &str) -> bool {
    if s.parse::<SocketAddr>().is_ok() {
        return true;
    }
    match s.rsplit_once(':') {
        Some((host, port)) => {
            port.parse::<u16>().is_ok()
                && !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        }
        None => false,
    }
}

/// Every key the defaults define, dotted (`hub.retry_schedule_secs`); `sets` is open-ended.
fn known_keys() -> Vec<String> {
    let fig = Figment::from(Toml::string(DEFAULTS_TOML));
    let mut out = Vec::new();
    if let Ok(data) = figment::Provider::data(&fig) {
        for dict in data.values() {
            flatten("", dict, &mut out);
        }
    }
    out.retain(|k| !NAMED_TABLES.iter().any(|(t, _)| t == k));
    out
}

fn flatten(prefix: &str, dict: &figment::value::Dict, out: &mut Vec<String>) {
    for (k, v) in dict {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            figment::value::Value::Dict(_, d) if NAMED_TABLES.iter().any(|(t, _)| *t == key) => {
                for (name, table) in d {
                    match table {
                        figment::value::Value::Dict(_, keys) => {
                            out.extend(keys.keys().map(|k| format!("{key}.{name}.{k}")));
                        }
                        _ => out.push(format!("{key}.{name}")),
                    }
                }
                out.push(key);
            }
            figment::value::Value::Dict(_, d) if !d.is_empty() => flatten(&key, d, out),
            _ => out.push(key),
        }
    }
}

/// The keys of the merged layers that nothing reads, each with where it came from and the
/// nearest known key.
fn unknown_keys(fig: &Figment) -> Vec<String> {
    let known = known_keys();
    let mut given = Vec::new();
    if let Ok(data) = figment::Provider::data(fig) {
        for dict in data.values() {
            flatten("", dict, &mut given);
        }
    }
    let mut out = Vec::new();
    for key in given {
        if known.contains(&key) || NAMED_TABLES.iter().any(|(t, _)| *t == key) {
            continue;
        }
        let named = named_key(&key);
        if let Some((_, _, k, keys)) = named {
            if keys.contains(&k) {
                continue;
            }
        }
        let origin = match fig.find_metadata(&key).and_then(|m| m.source.as_ref()) {
            Some(figment::Source::File(p)) => format!(" in {}", p.display()),
            _ => String::new(),
        };
        let candidates: Vec<String> = match named {
            Some((table, name, _, keys)) => {
                keys.iter().map(|k| format!("{table}.{name}.{k}")).collect()
            }
            None => known.clone(),
        };
        out.push(format!(
            "unknown key `{key}`{origin}{}",
            suggestion(&key, &candidates, |k| format!("`{k}`"))
        ));
    }
    out
}

/// "; did you mean X?" for the nearest candidate, when one is near enough.
fn suggestion(given: &str, candidates: &[String], show: impl Fn(&str) -> String) -> String {
    let best = candidates
        .iter()
        .map(|c| (edit_distance(given, c), c))
        .min();
    match best {
        Some((d, c)) if d <= 3.max(given.len() / 3) => format!("; did you mean {}?", show(c)),
        _ => String::new(),
    }
}

/// Levenshtein distance, for suggestions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push(
                (prev[j] + usize::from(ca != *cb))
                    .min(prev[j + 1] + 1)
                    .min(cur[j] + 1),
            );
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The one mapping from `RSHUB_*` variables to keys:
/// - `RSHUB_<KEY>` where `<KEY>` is a known key with `.` written as `_`, upper-case:
///   `RSHUB_INGEST_TOKEN` -> `ingest.token`, `RSHUB_SET_DEFAULTS_URL_PREFIX` ->
///   `set_defaults.url_prefix`, `RSHUB_STORE_ELASTICSEARCH_URL` -> `store.elasticsearch.url`;
/// - `RSHUB_<A>__<B>__<C>`: double underscores separate the parts explicitly, for keys no
///   table can list: `RSHUB_SETS__papers__URL_PREFIX` -> `sets.papers.url_prefix` (the set's
///   name keeps its case).
///
/// Any other `RSHUB_*` variable is an error naming the nearest known variable.
#[derive(Debug, Clone, Default)]
struct EnvMapping {
    /// (variable, key)
    vars: Vec<(String, String)>,
    unknown: Vec<String>,
}

impl EnvMapping {
    fn read() -> EnvMapping {
        EnvMapping::from_vars(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))
    }

    fn from_vars(names: impl Iterator<Item = String>) -> EnvMapping {
        let known = known_keys();
        let table: Vec<(String, String)> = known
            .iter()
            .map(|k| {
                (
                    format!("RSHUB_{}", k.replace('.', "_").to_ascii_uppercase()),
                    k.clone(),
                )
            })
            .collect();
        let mut m = EnvMapping::default();
        for var in names {
            let Some(rest) = var.strip_prefix("RSHUB_") else {
                continue;
            };
            if CLI_VARIABLES.contains(&var.as_str()) {
                continue;
            }
            if let Some((_, key)) = table.iter().find(|(v, _)| *v == var) {
                m.vars.push((var.clone(), key.clone()));
            } else if rest.contains("__") {
                let parts: Vec<&str> = rest.split("__").collect();
                let key = match parts.as_slice() {
                    [first, name, k]
                        if NAMED_TABLES
                            .iter()
                            .any(|(t, _)| first.eq_ignore_ascii_case(t)) =>
                    {
                        format!(
                            "{}.{name}.{}",
                            first.to_ascii_lowercase(),
                            k.to_ascii_lowercase()
                        )
                    }
                    _ => parts
                        .iter()
                        .map(|p| p.to_ascii_lowercase())
                        .collect::<Vec<_>>()
                        .join("."),
                };
                let ok = known.contains(&key)
                    || named_key(&key).is_some_and(|(_, _, k, keys)| keys.contains(&k));
                if ok {
                    m.vars.push((var.clone(), key));
                } else {
                    m.unknown.push(format!(
                        "environment variable {var} names no configuration key (`{key}`)"
                    ));
                }
            } else {
                let names: Vec<String> = table.iter().map(|(v, _)| v.clone()).collect();
                m.unknown.push(format!(
                    "unknown environment variable {var}{}",
                    suggestion(&var, &names, str::to_string)
                ));
            }
        }
        m
    }

    /// The variables as a figment provider, under the keys they map to.
    fn provider(&self) -> Env {
        let vars = self.vars.clone();
        Env::raw()
            .filter_map(move |k| {
                vars.iter()
                    .find(|(v, _)| k.as_str() == v)
                    .map(|(_, key)| key.clone().into())
            })
            .lowercase(false)
    }

    fn var_of(&self, key: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(_, k)| k == key)
            .map(|(v, _)| v.as_str())
    }
}

/// Figment's errors, one line per key, with the file or variable the value came from and
/// without figment's profile prefix.
fn describe_errors(e: figment::Error, env: &EnvMapping) -> String {
    let mut lines: Vec<String> = Vec::new();
    for err in e {
        let key = err.path.join(".");
        // The variable of the key or of the table/array holding it (`hub.allow_networks.0`).
        let var = (1..=err.path.len())
            .rev()
            .find_map(|n| env.var_of(&err.path[..n].join(".")));
        let origin = match (var, err.metadata.as_ref().and_then(|m| m.source.as_ref())) {
            (Some(var), _)
                if err
                    .metadata
                    .as_ref()
                    .is_some_and(|m| m.name.contains("environment")) =>
            {
                format!(" (environment variable {var})")
            }
            (_, Some(figment::Source::File(p))) => format!(" (in {})", p.display()),
            _ => String::new(),
        };
        let line = if key.is_empty() {
            format!("{}{origin}", err.kind)
        } else {
            format!("{key}: {}{origin}", err.kind)
        };
        if !lines.contains(&line) {
            lines.push(line);
        }
    }
    lines.join("\n  ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_accel_redirect_prefix_is_an_nginx_location() {
        let mut c = Config::defaults();
        c.server.accel_redirect = "/_rshub/".into();
        c.validate().unwrap();
        for bad in ["_rshub/", "/_rshub", "/", "/a b/", "/a%2f/"] {
            c.server.accel_redirect = bad.into();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("server.accel_redirect"), "{bad}: {e}");
        }
    }

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

    #[test]
    fn every_key_of_every_section_has_its_variable() {
        let keys = known_keys();
        let sections: std::collections::BTreeSet<&str> =
            keys.iter().filter_map(|k| k.split('.').next()).collect();
        for s in [
            "server",
            "store",
            "ingest",
            "source",
            "hub",
            "admin",
            "notify",
            "set_defaults",
        ] {
            assert!(sections.contains(s), "section {s} has keys");
        }
        let vars: Vec<String> = keys
            .iter()
            .map(|k| format!("RSHUB_{}", k.replace('.', "_").to_ascii_uppercase()))
            .collect();
        let m = EnvMapping::from_vars(vars.iter().cloned());
        assert!(m.unknown.is_empty(), "{:?}", m.unknown);
        for (var, key) in vars.iter().zip(&keys) {
            assert_eq!(m.var_of(key), Some(var.as_str()), "{key}");
        }
        assert_eq!(
            m.var_of("set_defaults.url_prefix"),
            Some("RSHUB_SET_DEFAULTS_URL_PREFIX")
        );
        assert_eq!(
            m.var_of("store.elasticsearch.url"),
            Some("RSHUB_STORE_ELASTICSEARCH_URL")
        );
    }

    #[test]
    fn explicit_paths_and_unknown_variables() {
        let m = EnvMapping::from_vars(
            [
                "RSHUB_SETS__Papers__URL_PREFIX",
                "RSHUB_SET_DEFAULTS__MAX_ITEMS_IN_LIST",
                "RSHUB_INGEST_TOKN",
                "RSHUB_SERVR__LISTEN",
                "HOME",
            ]
            .into_iter()
            .map(String::from),
        );
        assert_eq!(
            m.var_of("sets.Papers.url_prefix"),
            Some("RSHUB_SETS__Papers__URL_PREFIX"),
            "a set's name keeps its case"
        );
        assert_eq!(
            m.var_of("set_defaults.max_items_in_list"),
            Some("RSHUB_SET_DEFAULTS__MAX_ITEMS_IN_LIST")
        );
        assert_eq!(m.unknown.len(), 2, "{:?}", m.unknown);
        assert!(
            m.unknown[0].contains("RSHUB_INGEST_TOKN")
                && m.unknown[0].contains("did you mean RSHUB_INGEST_TOKEN?"),
            "{:?}",
            m.unknown
        );
        assert!(
            m.unknown[1].contains("RSHUB_SERVR__LISTEN"),
            "{:?}",
            m.unknown
        );
    }

    #[test]
    fn unknown_keys_are_named_with_their_file_and_the_nearest_key() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        std::fs::write(&f, "[hub]\nallow_network = [\"10.0.0.0/8\"]\n[servr]\nlisten = \"x\"\n[sets.p]\nurl_prefx = \"http://x/\"\n").unwrap();
        let cli = CliOverrides {
            config_file: Some(f.clone()),
            ..Default::default()
        };
        let e = Config::figment(&cli, &EnvMapping::default())
            .map(|fig| unknown_keys(&fig))
            .unwrap();
        let all = e.join("\n");
        assert!(
            all.contains("unknown key `hub.allow_network`")
                && all.contains("did you mean `hub.allow_networks`?"),
            "{all}"
        );
        assert!(
            all.contains("`servr.listen`") && all.contains("did you mean `server.listen`?"),
            "{all}"
        );
        assert!(
            all.contains("`sets.p.url_prefx`") && all.contains("did you mean `sets.p.url_prefix`?"),
            "{all}"
        );
        assert!(all.contains(&f.display().to_string()), "{all}");
    }

    #[test]
    fn type_errors_name_key_and_file_once_without_prefixes() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        std::fs::write(&f, "[store]\nbackend = \"postgres\"\n").unwrap();
        let cli = CliOverrides {
            config_file: Some(f.clone()),
            ..Default::default()
        };
        let fig = Config::figment(&cli, &EnvMapping::default()).unwrap();
        let e = describe_errors(fig.extract::<Config>().unwrap_err(), &EnvMapping::default());
        assert!(!e.contains("default."), "no figment profile prefix: {e}");
        assert!(
            e.contains("store.backend: ") && e.contains("postgres"),
            "{e}"
        );
        assert_eq!(e.matches("store.backend").count(), 1, "once: {e}");
        assert!(e.contains(&f.display().to_string()), "{e}");
        let cli_ok = |s: &str| {
            std::fs::write(&f, s).unwrap();
            Config::figment(&cli, &EnvMapping::default())
                .unwrap()
                .extract::<Config>()
                .map_err(|e| describe_errors(e, &EnvMapping::default()))
        };
        let e = cli_ok("[hub]\nsignature_algorithm = \"md5\"\n").unwrap_err();
        assert!(
            e.contains("hub.signature_algorithm: ") && e.contains("sha256"),
            "{e}"
        );
        let e = cli_ok("[hub]\nallow_networks = [\"10.0.0.0/33\"]\n").unwrap_err();
        assert!(e.contains("hub.allow_networks"), "{e}");
        let c = cli_ok("[hub]\nsignature_algorithm = \"sha512\"\nallow_networks = [\"10.0.0.0/8\"]\n[store]\nbackend = \"elasticsearch\"\n").unwrap();
        assert_eq!(
            (c.hub.signature_algorithm, c.store.backend),
            (SignatureAlg::Sha512, Backend::Elasticsearch)
        );
        assert!(
            is_listen_address("localhost:8080")
                && is_listen_address("[::1]:80")
                && !is_listen_address("localhost")
        );
    }
}
