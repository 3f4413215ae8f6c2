//! `harvest.toml`: what the destination follows, where it keeps its state and writes its
//! output, how hard it fetches, and how it is pushed to. Unknown keys are refused by name;
//! `resourcesync-hub harvest config` prints the commented defaults.

use std::path::{Path, PathBuf};

use figment::providers::{Format, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

/// The commented defaults, the first layer (and the reference).
pub const HARVEST_DEFAULTS_TOML: &str = include_str!("harvest.default.toml");

/// The commented defaults (`harvest config`), with `source.url` set to `url` when given.
pub fn defaults_for(url: Option<&str>) -> String {
    let Some(url) = url else {
        return HARVEST_DEFAULTS_TOML.to_string();
    };
    let mut done = false;
    HARVEST_DEFAULTS_TOML
        .lines()
        .map(|l| {
            if !done && l.starts_with("url = ") {
                done = true;
                // A JSON string is a TOML basic string (the same escapes).
                format!("url = {}", serde_json::Value::from(url))
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HarvestConfig {
    pub source: SourceSection,
    /// Many sources in one harvester (an aggregator): one `[[sources]]` table each. When
    /// given, `[source]` is not.
    #[serde(default)]
    pub sources: Vec<NamedSource>,
    pub state: StateSection,
    pub output: OutputSection,
    pub fetch: FetchSection,
    pub push: PushSection,
    pub follow: FollowSection,
    pub console: ConsoleSection,
}

/// `[console]`: the harvester's console in a browser.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleSection {
    /// `""`: on the callback server when that listens on loopback; `"off"`; or an address.
    pub listen: String,
    /// The environment variable holding the sign-in token (for a non-loopback address).
    pub token_env: String,
}

/// Where the harvester's console is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsoleAt {
    Off,
    /// On the callback server (a loopback address).
    Callback,
    Own(std::net::SocketAddr),
}

impl HarvestConfig {
    /// Where the console is served, and the token it needs (`console.token_env`'s; `None` on
    /// loopback without one). An address other hosts can reach without a token is an error
    /// naming the key.
    pub fn console_at(&self) -> Result<(ConsoleAt, Option<String>), HarvestConfigError> {
        let bad = |m: String| Err(HarvestConfigError::Invalid(m));
        let (at, ip) = match self.console.listen.trim() {
            "off" => return Ok((ConsoleAt::Off, None)),
            "" => match self.push.listen.parse::<std::net::SocketAddr>() {
                Ok(a) if self.push.enabled && a.ip().is_loopback() => (ConsoleAt::Callback, a.ip()),
                _ => return Ok((ConsoleAt::Off, None)),
            },
            other => match other.parse::<std::net::SocketAddr>() {
                Ok(a) => (ConsoleAt::Own(a), a.ip()),
                Err(_) => {
                    return bad(format!(
                    "console.listen {other:?} is not an address like 127.0.0.1:8901 (or \"off\")"
                ))
                }
            },
        };
        let var = self.console.token_env.trim();
        if var.is_empty() && ip.is_loopback() {
            return Ok((at, None));
        }
        if var.is_empty() {
            return bad(format!(
                "console.listen {:?} is reachable from other hosts: name the environment variable holding its sign-in token in console.token_env",
                self.console.listen
            ));
        }
        match std::env::var(var) {
            Ok(t) if t.len() >= 16 => Ok((at, Some(t))),
            Ok(_) => bad(format!(
                "console.token_env names {var}, whose token is shorter than 16 characters"
            )),
            Err(_) => bad(format!("console.token_env names {var}, which is not set")),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSection {
    /// A Source Description URL, a Capability List URL, or a base URL to discover from.
    pub url: String,
    /// Which sets to follow: Capability List URLs, or the set names in their paths; empty =
    /// every Capability List of the Source Description.
    pub sets: Vec<String>,
    /// What the baseline reads: the Resource List (one GET per resource) or the Resource
    /// Dump (a few large resumable downloads).
    pub baseline: BaselineFrom,
    /// Hosts besides the source's own authority that its documents and resources may lie
    /// on (`host`, `host:port`, `*.domain`); everything else is refused before connecting.
    pub allow_hosts: Vec<String>,
}

/// One source of many (`[[sources]]`): `[source]`'s keys, a name, and its own credentials.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NamedSource {
    /// Unique; used in status, logs and the state. Letters, digits, `-`, `_`, `.`.
    pub name: String,
    pub url: String,
    #[serde(default)]
    pub sets: Vec<String>,
    #[serde(default = "resource_list")]
    pub baseline: BaselineFrom,
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// The name of an environment variable holding a bearer token, sent as
    /// `Authorization: Bearer …` to this source's own authority only.
    #[serde(default)]
    pub token_env: String,
    /// Ingestion 3 output: this source's provider token (default: its name; with one source,
    /// `output.provider` when set).
    #[serde(default)]
    pub provider: String,
    /// Its share of the walks (baselines, discovery) when sources contend, relative to the
    /// others' (1 to 1000, default 1): a source of weight 2 walks twice as much as one of
    /// weight 1.
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

fn resource_list() -> BaselineFrom {
    BaselineFrom::ResourceList
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BaselineFrom {
    ResourceList,
    Dump,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StateSection {
    pub dir: PathBuf,
}

/// Where the Ingestion 3 archive puts a harvest activity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum Layout {
    /// The storage specification (seed 004): `harvest/<yyyymmdd>/<ts>-<provider>-OriginalRecord.v1.avro/`.
    #[serde(rename = "spec")]
    Spec,
    /// What DPLA's ingestion3 code reads today (`InputHelper.mostRecent`, `ingest.sh`): no
    /// date level, no `.v1`: `harvest/<ts>-<provider>-OriginalRecord.avro/`.
    #[serde(rename = "ingestion3-code")]
    Ingestion3Code,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputKind {
    Mirror,
    /// DPLA's Ingestion 3 archive (Avro snapshots per provider).
    Ingestion3,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSection {
    pub kind: OutputKind,
    /// The mirror folder.
    pub dir: PathBuf,
    /// `URI prefix = folder` pairs (as `resync-sync URI=DIR`); a resource under none of them
    /// goes to `<dir>/<host>[_<port>]/<path>`.
    pub map: Vec<MapEntry>,
    /// Keep deleted resources' files (and only record the deletion).
    pub keep_deleted: bool,
    /// A command run (by `sh -c`) for every applied change, with the change as JSON on its
    /// standard input; a failure counts as a failed apply and is retried. Empty: none.
    pub exec: String,
    /// Ingestion 3: the provider token (the archive's top folder, and in file names).
    pub provider: String,
    /// Ingestion 3: the journal's file under `state.dir` (set per source, not configured).
    #[serde(skip)]
    pub journal: Option<String>,
    /// Ingestion 3: the folder layout of harvest activities.
    pub layout: Layout,
    /// Ingestion 3: where the archive is kept: a local folder, or `s3://bucket/prefix`.
    pub root: String,
    /// Ingestion 3 on S3: endpoint (empty: AWS), region, path-style addressing. Credentials
    /// come from the standard AWS environment variables.
    pub s3_endpoint: String,
    pub s3_region: String,
    pub s3_path_style: bool,
    /// Ingestion 3: a new complete snapshot this often (0: only on `harvest snapshot`).
    pub snapshot_interval_secs: u64,
    /// Ingestion 3: Avro part files are cut at about this size.
    pub part_max_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MapEntry {
    pub uri: String,
    pub dir: PathBuf,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FetchSection {
    pub concurrency: usize,
    pub timeout_secs: u64,
    /// Attempts per fetch within one pass (with backoff; `Retry-After` honoured).
    pub attempts: u32,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    /// Passes over a pending resource before it is listed as failed.
    pub max_tries: u32,
    /// Move the position past a failed resource (and say so) instead of waiting for it.
    pub skip_failed: bool,
    /// Longer URLs are refused (and never logged whole).
    pub max_url_length: usize,
    /// The largest document (list, index, manifest) read, after decompression.
    pub max_document_bytes: u64,
    /// The largest resource read when its list gives no length (a listed length is a limit
    /// of its own: never more than it plus one byte is read).
    pub max_resource_bytes: u64,
    /// The longest wait for response headers or for the next bytes of a body; a body must
    /// also bring `min_bytes_per_sec` × this in every such window, or it is cut off.
    pub idle_timeout_secs: u64,
    pub min_bytes_per_sec: u64,
    /// Requests in flight to one authority (scheme, host, port), over every source.
    pub per_host_concurrency: usize,
    /// The least time between two request starts at one authority.
    pub per_host_delay_ms: u64,
    /// A contact put in the `User-Agent` (`resourcesync-hub-harvest/<version> (<this>)`),
    /// such as `mailto:ops@example.org`; empty: none.
    pub user_agent: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PushSection {
    pub enabled: bool,
    /// Where the callback server listens.
    pub listen: String,
    /// The callback URL the hub calls (it must reach `listen`); empty: `http://<listen>`.
    pub callback_url: String,
    pub lease_secs: u64,
    /// The largest delivery read; larger ones are answered 413 unread.
    pub max_body_bytes: u64,
    /// Deliveries read at once; more are answered 503 with Retry-After.
    pub max_concurrent_deliveries: usize,
    /// Verified deliveries kept (on disk, in the state) until applied, in bytes; past it a
    /// delivery is answered 503 with Retry-After.
    pub max_queued_bytes: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FollowSection {
    /// How often the open Change List is read to catch up when push is silent.
    pub check_interval_secs: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum HarvestConfigError {
    #[error("harvest configuration file {0} does not exist")]
    MissingFile(PathBuf),
    #[error("harvest configuration: {0}")]
    Invalid(String),
}

impl HarvestConfig {
    /// The defaults, then the file.
    pub fn load(file: Option<&Path>) -> Result<HarvestConfig, HarvestConfigError> {
        let mut fig = Figment::from(Toml::string(HARVEST_DEFAULTS_TOML));
        if let Some(f) = file {
            if !f.exists() {
                return Err(HarvestConfigError::MissingFile(f.to_path_buf()));
            }
            fig = fig.merge(Toml::file_exact(f));
        }
        let mut c: HarvestConfig = fig.extract().map_err(|e| {
            let lines: Vec<String> = e
                .into_iter()
                .map(|e| {
                    let key = e.path.join(".");
                    let origin = match e.metadata.as_ref().and_then(|m| m.source.as_ref()) {
                        Some(figment::Source::File(p)) => format!(" (in {})", p.display()),
                        _ => String::new(),
                    };
                    if key.is_empty() {
                        format!("{}{origin}", e.kind)
                    } else {
                        format!("{key}: {}{origin}", e.kind)
                    }
                })
                .collect();
            HarvestConfigError::Invalid(lines.join("; "))
        })?;
        if !c.sources.is_empty() {
            let from_file = |key: &str| {
                matches!(
                    fig.find_metadata(key).and_then(|m| m.source.as_ref()),
                    Some(figment::Source::File(_))
                )
            };
            if [
                "source.url",
                "source.sets",
                "source.baseline",
                "source.allow_hosts",
            ]
            .iter()
            .any(|k| from_file(k))
            {
                return Err(HarvestConfigError::Invalid(
                    "give either [source] (one source) or [[sources]] tables (many), not both"
                        .into(),
                ));
            }
        }
        // Relative paths in the file are taken from its folder.
        crate::config::beside_file(&fig, "state.dir", &mut c.state.dir);
        crate::config::beside_file(&fig, "output.dir", &mut c.output.dir);
        for m in &mut c.output.map {
            crate::config::beside_file(&fig, "output.map", &mut m.dir);
        }
        if !c.output.root.contains("://") {
            let mut root = PathBuf::from(&c.output.root);
            crate::config::beside_file(&fig, "output.root", &mut root);
            c.output.root = root.display().to_string();
        }
        c.validate()?;
        Ok(c)
    }

    /// The defaults alone (tests start here).
    pub fn defaults() -> HarvestConfig {
        Figment::from(Toml::string(HARVEST_DEFAULTS_TOML))
            .extract()
            .expect("compiled-in defaults parse")
    }

    /// The sources followed: the `[[sources]]` tables, or `[source]` as the one source
    /// (named `""`).
    pub fn source_list(&self) -> Vec<NamedSource> {
        if !self.sources.is_empty() {
            return self.sources.clone();
        }
        vec![NamedSource {
            name: String::new(),
            url: self.source.url.clone(),
            sets: self.source.sets.clone(),
            baseline: self.source.baseline,
            allow_hosts: self.source.allow_hosts.clone(),
            token_env: String::new(),
            provider: String::new(),
            weight: 1,
        }]
    }

    /// This configuration as one source's: `[source]` is that source.
    pub fn for_source(&self, s: &NamedSource) -> HarvestConfig {
        let mut c = self.clone();
        c.source = SourceSection {
            url: s.url.clone(),
            sets: s.sets.clone(),
            baseline: s.baseline,
            allow_hosts: s.allow_hosts.clone(),
        };
        if self.output.kind == OutputKind::Ingestion3 {
            if let Ok(p) = self.provider_of(s) {
                // The provider of `output.provider` keeps the journal it had as the only one.
                if p != self.output.provider {
                    c.output.journal = Some(format!("ingestion3-{p}.sqlite"));
                }
                c.output.provider = p;
            }
        }
        c.sources = Vec::new();
        c
    }

    /// The Ingestion 3 provider of a `[[sources]]` entry: its `provider`; else, as the only
    /// source, `output.provider` when set; else its name.
    pub fn provider_of(&self, s: &NamedSource) -> Result<String, String> {
        if !s.provider.is_empty() {
            return Ok(s.provider.clone());
        }
        if !self.output.provider.is_empty() {
            return match self.sources.len() {
                0 | 1 => Ok(self.output.provider.clone()),
                _ => Err(format!(
                    "source {}: give it a provider (output.provider names the provider of a single source)",
                    s.name
                )),
            };
        }
        Ok(s.name.clone())
    }

    /// The Ingestion 3 output's journal (of the single source, or of one `for_source`).
    pub fn ingestion3_journal(&self) -> PathBuf {
        self.state.dir.join(
            self.output
                .journal
                .as_deref()
                .unwrap_or("ingestion3.sqlite"),
        )
    }

    pub fn validate(&self) -> Result<(), HarvestConfigError> {
        let bad = |m: String| Err(HarvestConfigError::Invalid(m));
        let mut names = std::collections::HashSet::new();
        for s in &self.sources {
            if s.name.is_empty()
                || s.name.len() > 64
                || !s
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return bad(format!(
                    "[[sources]] name {:?} must be 1-64 letters, digits, '-', '_' or '.'",
                    s.name
                ));
            }
            if !names.insert(s.name.as_str()) {
                return bad(format!("[[sources]] name {:?} is given twice", s.name));
            }
            if !(1..=1000).contains(&s.weight) {
                return bad(format!(
                    "source {}: weight {} must be 1 to 1000 (its share of the walks when sources contend, relative to the others')",
                    s.name, s.weight
                ));
            }
            self.for_source(s).validate_source().map_err(|e| match e {
                HarvestConfigError::Invalid(m) => {
                    HarvestConfigError::Invalid(format!("source {}: {m}", s.name))
                }
                e => e,
            })?;
            // An unset token_env stops `harvest` when it starts that source (naming it), not
            // the commands that only read the state: an operator looks from any shell.
        }
        if self.output.kind == OutputKind::Ingestion3 {
            let mut providers = std::collections::HashMap::new();
            for s in &self.sources {
                let p = self.provider_of(s).map_err(HarvestConfigError::Invalid)?;
                if !is_provider_token(&p) {
                    return bad(format!(
                        "source {}: provider {p:?} must be a token like cdl or mdl: lowercase letters and digits only (DPLA's tools find no other){}",
                        s.name,
                        if s.provider.is_empty() { "; give it a provider = \"...\"" } else { "" }
                    ));
                }
                if let Some(other) = providers.insert(p.clone(), s.name.as_str()) {
                    return bad(format!(
                        "sources {other} and {} have one provider ({p}): each source archives as its own provider",
                        s.name
                    ));
                }
            }
        }
        if self.sources.is_empty() {
            self.validate_source()?;
        }
        self.validate_rest()
    }

    /// The `[source]` table's checks.
    fn validate_source(&self) -> Result<(), HarvestConfigError> {
        let bad = |m: String| Err(HarvestConfigError::Invalid(m));
        match url::Url::parse(&self.source.url) {
            Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
            _ => {
                return bad(format!(
                    "source.url {:?} is not an http(s) URL",
                    self.source.url
                ))
            }
        }
        if let Err(e) = self.scope() {
            return bad(e);
        }
        Ok(())
    }

    /// Everything but the source.
    fn validate_rest(&self) -> Result<(), HarvestConfigError> {
        let bad = |m: String| Err(HarvestConfigError::Invalid(m));
        if self.fetch.concurrency == 0 || self.fetch.attempts == 0 || self.fetch.max_tries == 0 {
            return bad(
                "fetch.concurrency, fetch.attempts and fetch.max_tries must be at least 1".into(),
            );
        }
        if self.fetch.per_host_concurrency == 0 {
            return bad("fetch.per_host_concurrency must be at least 1".into());
        }
        if self.fetch.user_agent.chars().any(|c| c.is_control()) {
            return bad("fetch.user_agent holds a control character".into());
        }
        if self.fetch.timeout_secs == 0 || self.fetch.idle_timeout_secs == 0 {
            return bad("fetch.timeout_secs and fetch.idle_timeout_secs must be at least 1".into());
        }
        if self.fetch.max_url_length < 64 {
            return bad("fetch.max_url_length must be at least 64".into());
        }
        if self.fetch.max_document_bytes < 1024 || self.fetch.max_resource_bytes == 0 {
            return bad(
                "fetch.max_document_bytes must be at least 1024 and fetch.max_resource_bytes at least 1"
                    .into(),
            );
        }
        if self.follow.check_interval_secs == 0 {
            return bad("follow.check_interval_secs must be at least 1".into());
        }
        if self.push.enabled {
            match self.push.listen.parse::<std::net::SocketAddr>() {
                Err(_) => return bad(format!("push.listen {:?} is not an address like 0.0.0.0:8900", self.push.listen)),
                Ok(a) if a.ip().is_unspecified() && self.push.callback_url.is_empty() => {
                    return bad(format!(
                        "push.listen {:?} listens on every interface: set push.callback_url to the URL the hub can call back",
                        self.push.listen
                    ))
                }
                Ok(_) => {}
            }
            if !self.push.callback_url.is_empty()
                && url::Url::parse(&self.push.callback_url).is_err()
            {
                return bad(format!(
                    "push.callback_url {:?} is not a URL",
                    self.push.callback_url
                ));
            }
            if self.push.lease_secs < 60 {
                return bad("push.lease_secs must be at least 60".into());
            }
            if self.push.max_body_bytes < 1024 || self.push.max_concurrent_deliveries == 0 {
                return bad("push.max_body_bytes must be at least 1024 and push.max_concurrent_deliveries at least 1".into());
            }
            if self.push.max_queued_bytes < self.push.max_body_bytes {
                return bad(format!(
                    "push.max_queued_bytes ({}) must hold at least one delivery of push.max_body_bytes ({})",
                    self.push.max_queued_bytes, self.push.max_body_bytes
                ));
            }
        }
        if self.output.kind == OutputKind::Ingestion3 {
            let p = &self.output.provider;
            // With `[[sources]]`, each source's provider is checked above.
            if self.sources.is_empty() && !is_provider_token(p) {
                return bad(format!(
                    "output.provider {p:?} must be a token like cdl or mdl: lowercase letters and digits only (DPLA's tools find no other)"
                ));
            }
            if self.output.root.is_empty() {
                return bad("output.root must be a folder or s3://bucket/prefix".into());
            }
            if self.output.part_max_bytes < 1024 {
                return bad("output.part_max_bytes must be at least 1024".into());
            }
        }
        for m in &self.output.map {
            if url::Url::parse(&m.uri).is_err() {
                return bad(format!("output.map: {:?} is not a URI prefix", m.uri));
            }
        }
        Ok(())
    }

    /// The source's trust boundary: its authority, widened by `source.allow_hosts`.
    pub fn scope(&self) -> Result<super::scope::Scope, String> {
        super::scope::Scope::new(
            &self.source.url,
            &self.source.allow_hosts,
            self.fetch.max_url_length,
        )
    }

    pub fn database_path(&self) -> PathBuf {
        self.state.dir.join("harvest.sqlite")
    }
}

/// DPLA's activity paths (`\d{8}_\d{6}-[A-Za-z0-9]*-…`) take no `_` or `-` in a provider:
/// lowercase letters and digits.
fn is_provider_token(p: &str) -> bool {
    !p.is_empty()
        && p.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_defaults_with_a_url_name_that_source_and_change_nothing_else() {
        let url = "http://127.0.0.1:41234/.well-known/resourcesync?a=\"b\"";
        let text = defaults_for(Some(url));
        let cfg: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(cfg["source"]["url"].as_str(), Some(url));
        let plain: toml::Value = toml::from_str(HARVEST_DEFAULTS_TOML).unwrap();
        let mut other = cfg.clone();
        other["source"]["url"] = plain["source"]["url"].clone();
        assert_eq!(other, plain);
        assert_eq!(defaults_for(None), HARVEST_DEFAULTS_TOML);
    }

    #[test]
    fn a_console_other_hosts_can_reach_needs_a_token() {
        let mut c = HarvestConfig::defaults();
        assert_eq!(c.console_at().unwrap(), (ConsoleAt::Callback, None));
        c.console.listen = "off".into();
        assert_eq!(c.console_at().unwrap().0, ConsoleAt::Off);
        c.console.listen = "0.0.0.0:8901".into();
        let e = c.console_at().unwrap_err().to_string();
        assert!(e.contains("console.token_env"), "{e}");
        c.console.token_env = "HARVEST_CONSOLE_TEST_TOKEN_UNSET".into();
        let e = c.console_at().unwrap_err().to_string();
        assert!(e.contains("which is not set"), "{e}");
        c.console.listen = "nonsense".into();
        let e = c.console_at().unwrap_err().to_string();
        assert!(e.contains("not an address"), "{e}");
        c.console.listen = String::new();
        c.push.listen = "0.0.0.0:8900".into();
        c.console.token_env = String::new();
        assert_eq!(
            c.console_at().unwrap().0,
            ConsoleAt::Off,
            "not on a public callback server"
        );
    }
    use super::*;

    #[test]
    fn defaults_validate_and_unknown_keys_are_refused() {
        HarvestConfig::defaults().validate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("h.toml");
        std::fs::write(&f, "[fetch]\nconcurency = 3\n").unwrap();
        let e = HarvestConfig::load(Some(&f)).unwrap_err().to_string();
        assert!(
            e.contains("concurency") && e.contains(&f.display().to_string()),
            "{e}"
        );
        std::fs::write(&f, "[source]\nurl = \"ftp://x\"\n").unwrap();
        assert!(HarvestConfig::load(Some(&f))
            .unwrap_err()
            .to_string()
            .contains("source.url"));
        std::fs::write(&f, "[push]\nlisten = \"0.0.0.0:8900\"\n").unwrap();
        assert!(HarvestConfig::load(Some(&f))
            .unwrap_err()
            .to_string()
            .contains("push.callback_url"));
    }
}
