//! Resource Dumps and Change Dumps (ResourceSync §11, §13): a set's bitstreams in ZIP
//! packages, so a destination copies millions of resources in a few large downloads.
//!
//! ```text
//! <dumps.dir>/<set>/rd/<generation>/      resourcedump.xml (or an index + dump-N.xml),
//!                                          00000.zip, 00000-manifest.xml, …, info.json
//! <dumps.dir>/<set>/rd/current.json        which generation is served, its at/completed
//! <dumps.dir>/<set>/cd/<list no>/          changedump.xml, 00000.zip, 00000-manifest.xml, …
//! <dumps.dir>/<set>/cd/index.xml           the Change Dump Index
//! ```
//!
//! - **Resource Dump**: built in the background when the set has none, when the last is
//!   `dumps.interval_secs` old and the set changed since, or when more than
//!   `dumps.change_fraction` of it changed. Written by streaming (one package's manifest
//!   entries in memory) into a folder of its own, then switched to by renaming
//!   `current.json`: package URLs name their generation, so a download in progress (or one
//!   resumed with `Range`) goes on reading the package it started on, for
//!   `dumps.keep_replaced_secs` after the switch.
//! - **Change Dump**: one per closed Change List (same interval), built once it closes, from
//!   the files as they are then; never changed afterwards. A resource changed again since is
//!   packed as it is now (the manifest's hash and length describe exactly what is packed); one
//!   gone since has no bitstream (its entry has no `path`; its deletion follows in a later
//!   Change List).
//! - A set offers a Resource Dump only when the server can read every resource: files under
//!   `resource_root_dir`, and resources at other URLs fetched through the hub's guarded
//!   client with `dumps.fetch_remote`.
//! - New dumps are announced by framework notifications (`resourcedump` created;
//!   `changedump` created; the Capability List updated when it first offers one).
//!   Announcements are recorded in the dump's own files and repeated after a crash.
//! - With several processes on one store, only the one delivering hub messages builds; each
//!   serves what its `dumps.dir` holds (share that folder between them).

use anyhow::Context as _;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::context::{Context, Urls};
use crate::hub::{AddressPolicy, Hub};
use crate::model::websub::Topic;
use crate::model::{ChangeType, ResourceKey, SetConfig, SetName, Timestamp};
use crate::notify::render::{framework_notification, FrameworkEntry};
use crate::package::{Body, Kind, Options, Package, Packer};
use crate::sitemap::{Ln, Md, Root, SitemapWriter};
use crate::store::{ChangeListInfo, Counts, Store};

/// How much earlier than the store recorded a file must the file's modification time be for
/// the store's md5 to be taken for it (µs): a second, well past the kernel's clock tick.
const MTIME_SLACK_MICROS: i64 = 1_000_000;

/// The served Resource Dump of a set (`rd/current.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResourceDumpInfo {
    /// The base URL its documents were written under (a restart under another one rebuilds).
    #[serde(default)]
    pub base_url: String,
    pub generation: String,
    pub at: Timestamp,
    pub completed: Timestamp,
    /// The set's change count when the dump started (how much changed since decides the next).
    pub changes: u64,
    pub resources: u64,
    /// Listed resources whose file was missing (left out, logged).
    pub missing: u64,
    pub packages: Vec<Package>,
    pub notified: bool,
}

/// The Change Dump of one closed Change List (`cd/<no>/info.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChangeDumpInfo {
    #[serde(default)]
    pub base_url: String,
    pub no: u32,
    pub from: Timestamp,
    pub until: Timestamp,
    pub packages: Vec<Package>,
    /// Created or updated entries whose resource was gone when the dump was built.
    pub without_bitstream: u64,
    pub notified: bool,
}

/// A file a request names.
#[derive(Debug, Clone, Copy)]
pub enum DumpFile<'a> {
    ResourceDump,
    ResourceDumpFile { generation: &'a str, name: &'a str },
    ChangeDumpIndex,
    ChangeDump(u32),
    ChangeDumpFile { no: u32, name: &'a str },
}

/// Why a set offers no dump.
#[derive(Debug, thiserror::Error)]
enum BuildError {
    #[error("{0}")]
    Unavailable(String),
    #[error("interrupted by shutdown")]
    Stopped,
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl From<std::io::Error> for BuildError {
    fn from(e: std::io::Error) -> Self {
        BuildError::Other(e.into())
    }
}

impl From<crate::store::StoreError> for BuildError {
    fn from(e: crate::store::StoreError) -> Self {
        BuildError::Other(e.into())
    }
}

pub struct Dumps {
    config: Arc<Config>,
    ctx: Arc<Context>,
    hub: Arc<Hub>,
    dir: PathBuf,
    /// Fetches resources at other URLs (`dumps.fetch_remote`).
    remote: Option<(reqwest::Client, Arc<AddressPolicy>)>,
    /// Sets offering no dumps: the reason, and the set's change count then.
    unavailable: Mutex<HashMap<SetName, (String, u64)>>,
    stop: AtomicBool,
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

/// Writes a small file whole: a temporary file beside it, then a rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// A file name a request may ask for: letters, digits, `.`, `-`, `_`, not starting with `.`.
fn plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
}

impl Dumps {
    pub fn open(
        config: Arc<Config>,
        ctx: Arc<Context>,
        hub: Arc<Hub>,
    ) -> anyhow::Result<Arc<Dumps>> {
        let dir = config.dumps_dir();
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create dumps.dir {}", dir.display()))?;
        let remote = if config.dumps.fetch_remote {
            let policy = Arc::new(AddressPolicy::new(&config.hub.allow_networks));
            let client = crate::hub::guarded_client(
                &policy,
                concat!("resourcesync-hub/", env!("CARGO_PKG_VERSION"), " (dumps)"),
            )
            .no_gzip()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(60))
            .build()?;
            Some((client, policy))
        } else {
            None
        };
        Ok(Arc::new(Dumps {
            config,
            ctx,
            hub,
            dir,
            remote,
            unavailable: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
        }))
    }

    fn store(&self) -> &Store {
        self.ctx.store()
    }

    fn urls(&self) -> &Urls {
        self.ctx.urls()
    }

    fn set_dir(&self, set: &SetName) -> PathBuf {
        self.dir.join(set.as_str())
    }

    /// The Resource Dump being served, if any.
    pub fn resource_dump(&self, set: &SetName) -> Option<ResourceDumpInfo> {
        read_json(&self.set_dir(set).join("rd/current.json"))
    }

    /// The Change Dump of closed Change List `no`, if built.
    pub fn change_dump(&self, set: &SetName, no: u32) -> Option<ChangeDumpInfo> {
        read_json(&self.set_dir(set).join(format!("cd/{no}/info.json")))
    }

    /// The Change Dumps built, oldest first.
    pub fn change_dumps(&self, set: &SetName) -> Vec<ChangeDumpInfo> {
        let mut nos: Vec<u32> = std::fs::read_dir(self.set_dir(set).join("cd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        nos.sort_unstable();
        nos.into_iter()
            .filter_map(|n| self.change_dump(set, n))
            .collect()
    }

    /// The file behind a request, when it exists.
    pub fn file(&self, set: &SetName, f: DumpFile) -> Option<PathBuf> {
        let sd = self.set_dir(set);
        let path = match f {
            DumpFile::ResourceDump => sd
                .join("rd")
                .join(self.resource_dump(set)?.generation)
                .join("resourcedump.xml"),
            DumpFile::ResourceDumpFile { generation, name } => {
                if !plain_name(generation) || !plain_name(name) || name == "info.json" {
                    return None;
                }
                sd.join("rd").join(generation).join(name)
            }
            DumpFile::ChangeDumpIndex => sd.join("cd/index.xml"),
            DumpFile::ChangeDump(no) => sd.join(format!("cd/{no}/changedump.xml")),
            DumpFile::ChangeDumpFile { no, name } => {
                if !plain_name(name) || name == "info.json" {
                    return None;
                }
                sd.join(format!("cd/{no}")).join(name)
            }
        };
        path.is_file().then_some(path)
    }

    /// Advertises what is on disk (after a restart), announces what a crash left
    /// unannounced, and removes builds a crash interrupted.
    pub async fn restore(&self) {
        let sets = match self.store().sets().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "dumps: cannot list the sets; restored at the next pass");
                return;
            }
        };
        for s in sets {
            // Documents written under another base URL advertise addresses that are gone:
            // rebuilt under this one.
            let base = self.urls().base();
            let stale = self
                .resource_dump(&s.name)
                .is_some_and(|d| d.base_url != base)
                || self
                    .change_dumps(&s.name)
                    .iter()
                    .any(|d| d.base_url != base);
            if stale {
                tracing::info!(set = %s.name, "dumps written under another base URL: rebuilt");
                let _ = std::fs::remove_dir_all(self.set_dir(&s.name));
            }
            for sub in ["rd", "cd"] {
                for e in std::fs::read_dir(self.set_dir(&s.name).join(sub))
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    if e.file_name().to_string_lossy().starts_with(".building-") {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
            self.advertise(&s.name);
            if let Err(e) = self.announce_pending(&s.name).await {
                tracing::warn!(set = %s.name, error = %e, "dumps: announcing failed; retried at the next pass");
            }
        }
    }

    /// Tells the source what the set offers now; whether its Capability List changed.
    fn advertise(&self, set: &SetName) -> bool {
        let rd = self
            .resource_dump(set)
            .map(|_| self.urls().resource_dump(set));
        let cd = self
            .set_dir(set)
            .join("cd/index.xml")
            .is_file()
            .then(|| self.urls().change_dump(set));
        let a = self.ctx.advertise(set, "resourcedump", rd);
        let b = self.ctx.advertise(set, "changedump", cd);
        a || b
    }

    /// Builds what is due until cancelled, every `dumps.check_interval_secs` (call
    /// [`Dumps::restore`] first).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let every = Duration::from_secs(self.config.dumps.check_interval_secs);
        let stopper = {
            let this = self.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                cancel.cancelled().await;
                this.stop.store(true, Ordering::Relaxed);
            })
        };
        loop {
            if !self.store().is_shared() || self.hub.is_delivering() {
                if let Err(e) = self.pass().await {
                    tracing::warn!(error = %format!("{e:#}"), "dumps: a pass failed; retried at the next");
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
        }
        let _ = stopper.await;
    }

    /// One look at every set: a Resource Dump when due, Change Dumps of newly closed lists,
    /// replaced generations past their time removed.
    pub async fn pass(self: &Arc<Self>) -> anyhow::Result<()> {
        for s in self.store().sets().await? {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            // One set's trouble (a remote resource that cannot be fetched, say) never holds
            // up the others' dumps.
            if let Err(e) = self.pass_set(&s.name).await {
                tracing::warn!(set = %s.name, error = %format!("{e:#}"), "dumps: building failed; retried at the next pass");
            }
        }
        Ok(())
    }

    async fn pass_set(self: &Arc<Self>, set: &SetName) -> anyhow::Result<()> {
        let counts = self.store().counts(set).await?;
        let unchanged_since_refused = self
            .unavailable
            .lock()
            .expect("unavailable")
            .get(set)
            .is_some_and(|(_, at)| *at == counts.changes);
        if unchanged_since_refused {
            return Ok(());
        }
        // The Resource Dump first: a new destination baselines from it.
        if let Some(why) = self.resource_dump_due(set, counts) {
            tracing::info!(set = %set, why, "building a Resource Dump");
            match self.build_resource_dump(set, counts.changes).await {
                Ok(info) => {
                    tracing::info!(set = %set, generation = %info.generation, resources = info.resources, missing = info.missing, packages = info.packages.len(), "Resource Dump built");
                    self.unavailable.lock().expect("unavailable").remove(set);
                    self.announce_pending(set).await?;
                }
                Err(BuildError::Unavailable(why)) => {
                    self.note_unavailable(set, why, counts.changes)
                }
                Err(BuildError::Stopped) => return Ok(()),
                Err(BuildError::Other(e)) => return Err(e),
            }
        }
        for list in self.store().changelists(set).await? {
            if list.until.is_none() || self.change_dump(set, list.no).is_some() {
                continue;
            }
            match self.build_change_dump(set, &list).await {
                Ok(Some(info)) => {
                    tracing::info!(set = %set, list = list.no, packages = info.packages.len(), "Change Dump built");
                    self.announce_pending(set).await?;
                }
                Ok(None) => {}
                Err(BuildError::Unavailable(why)) => {
                    self.note_unavailable(set, why, counts.changes);
                    break;
                }
                Err(BuildError::Stopped) => return Ok(()),
                Err(BuildError::Other(e)) => return Err(e),
            }
        }
        self.remove_replaced(set);
        Ok(())
    }

    /// Records why a set offers no dumps (logged when the reason is new); it is tried again
    /// once the set changed.
    fn note_unavailable(&self, set: &SetName, why: String, changes: u64) {
        let mut u = self.unavailable.lock().expect("unavailable");
        if u.get(set).map(|(w, _)| w) != Some(&why) {
            tracing::warn!(set = %set, reason = %why, "this set offers no dumps");
        }
        u.insert(set.clone(), (why, changes));
    }

    /// Why a new Resource Dump is due, if it is (`counts`: the set's, now).
    fn resource_dump_due(&self, set: &SetName, counts: Counts) -> Option<&'static str> {
        if counts.resources == 0 {
            return None;
        }
        let Some(cur) = self.resource_dump(set) else {
            return Some("the set has none yet");
        };
        let changed = counts.changes.saturating_sub(cur.changes);
        if changed == 0 {
            return None;
        }
        let d = &self.config.dumps;
        if Timestamp::now() >= cur.completed.plus_secs(d.interval_secs) {
            return Some("dumps.interval_secs passed and the set changed");
        }
        if changed as f64 > d.change_fraction * cur.resources.max(1) as f64 {
            return Some("more than dumps.change_fraction of the set changed");
        }
        None
    }

    fn options(&self) -> Options {
        let d = &self.config.dumps;
        Options {
            max_bytes: d.package_max_bytes,
            max_entries: d.package_max_entries as usize,
            compression: d.compression,
            level: d.compression_level,
        }
    }

    /// The bitstream of a resource: its file under the set's root, or (with
    /// `dumps.fetch_remote`) its URL fetched through the guarded client. `Ok(None)`: gone.
    /// `meta` and `recorded` are what the store holds and when it wrote it: the stored md5 is
    /// the file's when the file has the recorded length and was last modified no later than
    /// that (else it is measured while packing).
    fn open_bitstream(
        &self,
        sc: &SetConfig,
        key: &ResourceKey,
        meta: &crate::model::ResourceMeta,
        recorded: Timestamp,
        rt: &tokio::runtime::Handle,
    ) -> Result<Option<Bitstream>, BuildError> {
        if let (Some(rel), Some(root)) = (key.0.strip_prefix("path:"), sc.root_dir()) {
            return match std::fs::File::open(root.join(rel)) {
                Ok(f) => {
                    let m = f.metadata()?;
                    // A file's modification time comes from the kernel's coarse clock, which
                    // lags the clock the store dates by up to a tick or more: only a file last
                    // modified well before the store recorded it is taken as recorded.
                    let unchanged = meta.length == Some(m.len())
                        && m.modified().is_ok_and(|t| {
                            Timestamp::from_system_time(t)
                                .is_some_and(|t| t.0 + MTIME_SLACK_MICROS <= recorded.0)
                        });
                    Ok(Some((
                        Body {
                            reader: Box::new(std::io::BufReader::with_capacity(64 * 1024, f)),
                            size: m.len(),
                            md5: meta.md5.clone().filter(|_| unchanged),
                        },
                        rel.to_string(),
                    )))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(anyhow::Error::new(e)
                    .context(format!("cannot read {}", root.join(rel).display()))
                    .into()),
            };
        }
        let url = key.url(&sc.url_prefix);
        let Some((client, policy)) = &self.remote else {
            return Err(BuildError::Unavailable(format!(
                "{url} is not a file under the set's resource_root_dir, and dumps.fetch_remote is off (a dump must hold every resource of the Resource List)"
            )));
        };
        let resp = rt
            .block_on(client.get(&url).send())
            .map_err(|e| anyhow::Error::new(e.without_url()).context(format!("fetching {url}")))?;
        // The address policy's refusal is words only: no cause is lost.
        policy
            .check_peer(&resp)
            .map_err(|e| anyhow::Error::msg(e).context(format!("fetching {url}")))?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND
            || resp.status() == reqwest::StatusCode::GONE
        {
            return Ok(None);
        }
        if !resp.status().is_success() {
            return Err(anyhow::anyhow!("fetching {url}: {}", resp.status()).into());
        }
        let len = resp.content_length().unwrap_or(0);
        let name = {
            use sha2::Digest;
            let mut h = crate::digest::hex_digest(sha2::Sha256::digest(url.as_bytes()));
            h.truncate(32);
            format!("remote/{h}")
        };
        Ok(Some((
            Body {
                reader: Box::new(RemoteBody {
                    rt: rt.clone(),
                    resp,
                    buf: Bytes::new(),
                }),
                size: len,
                md5: None,
            },
            name,
        )))
    }

    fn check_stop(&self) -> Result<(), BuildError> {
        if self.stop.load(Ordering::Relaxed) {
            return Err(BuildError::Stopped);
        }
        Ok(())
    }

    /// Builds a new Resource Dump generation and switches to it (`changes`: the set's change
    /// count as the build starts).
    async fn build_resource_dump(
        self: &Arc<Self>,
        set: &SetName,
        changes: u64,
    ) -> Result<ResourceDumpInfo, BuildError> {
        let store = self.store().clone();
        // As for the Resource List: just after the newest change seen, so a change committed
        // after a page was read is dated after `at` and reaches the destination through the
        // Change Lists.
        let now = Timestamp::now();
        let at = store
            .latest_change(set)
            .await?
            .map_or(now, |c| Timestamp(c.datetime.0 + 1).min(now));
        let generation = now.0.to_string();
        let rd = self.set_dir(set).join("rd");
        let building = rd.join(format!(".building-{generation}"));
        std::fs::create_dir_all(&building)?;
        let result = self
            .write_resource_dump(set, &building, &generation, at, changes)
            .await;
        let info = match result {
            Ok(i) => i,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&building);
                return Err(e);
            }
        };
        std::fs::rename(&building, rd.join(&generation))?;
        write_atomic(
            &rd.join("current.json"),
            &serde_json::to_vec(&info).map_err(anyhow::Error::from)?,
        )?;
        self.advertise(set);
        Ok(info)
    }

    async fn write_resource_dump(
        self: &Arc<Self>,
        set: &SetName,
        dir: &Path,
        generation: &str,
        at: Timestamp,
        changes: u64,
    ) -> Result<ResourceDumpInfo, BuildError> {
        let sc = self.ctx.set_config(set);
        let up = self.urls().capability_list(set);
        let mut packer = Packer::new(dir, self.options(), Kind::Resources, up.clone(), None);
        let (mut resources, mut missing) = (0u64, 0u64);
        let page_size = self.config.source.store_page_size;
        let read = |after| {
            let (store, set) = (self.store().clone(), set.clone());
            tokio::spawn(async move { store.resources(&set, None, after, page_size).await })
        };
        let mut reading = read(None);
        loop {
            self.check_stop()?;
            let page = reading.await.context("a dump task failed")??;
            // The next page is read from the store while this one is packed, so the packing
            // lanes do not wait for the store between pages.
            let next = page.next.map(|c| read(Some(c)));
            let rt = tokio::runtime::Handle::current();
            let items = page.items;
            let (sc2, this) = (sc.clone(), self.clone());
            // The packing of one store page, off the async threads.
            let (p, r, m) = tokio::task::spawn_blocking(move || {
                let (mut r, mut m) = (0u64, 0u64);
                for res in &items {
                    this.check_stop()?;
                    let loc = res.key.url(&sc2.url_prefix);
                    match this.open_bitstream(&sc2, &res.key, &res.meta, res.timestamp, &rt)? {
                        None => {
                            tracing::warn!(set = %sc2.name, loc = %loc, "a listed resource's file is missing: left out of the Resource Dump");
                            m += 1;
                        }
                        Some((body, name)) => {
                            packer.add(
                                loc,
                                res.meta.lastmod,
                                res.meta.mime.clone(),
                                None,
                                None,
                                &format!("resources/{name}"),
                                body,
                            )?;
                            r += 1;
                            if packer.is_full() {
                                packer.close(None)?;
                            }
                        }
                    }
                }
                Ok::<_, BuildError>((packer, r, m))
            })
            .await
            .context("a dump task failed")??;
            packer = p;
            resources += r;
            missing += m;
            match next {
                Some(r) => reading = r,
                None => break,
            }
        }
        let packages = tokio::task::spawn_blocking(move || packer.finish(None))
            .await
            .context("a dump task failed")??;
        let completed = Timestamp::now();
        self.write_resource_dump_documents(set, dir, generation, at, completed, &packages, &up)?;
        let info = ResourceDumpInfo {
            base_url: self.urls().base().to_string(),
            generation: generation.to_string(),
            at,
            completed,
            changes,
            resources,
            missing,
            packages,
            notified: false,
        };
        std::fs::write(
            dir.join("info.json"),
            serde_json::to_vec(&info).map_err(anyhow::Error::from)?,
        )?;
        Ok(info)
    }

    /// `resourcedump.xml`: the packages, or (more than a document holds) an index of
    /// `dump-N.xml` documents.
    #[allow(clippy::too_many_arguments)]
    fn write_resource_dump_documents(
        &self,
        set: &SetName,
        dir: &Path,
        generation: &str,
        at: Timestamp,
        completed: Timestamp,
        packages: &[Package],
        up: &str,
    ) -> std::io::Result<()> {
        let per_doc = self.ctx.set_config(set).max_items_in_list.max(1) as usize;
        let top = Md {
            capability: Some("resourcedump"),
            at: Some(at),
            completed: Some(completed),
            ..Md::default()
        };
        let up_ln = Ln {
            rel: "up",
            href: up,
            mime: None,
        };
        let urls = self.urls();
        let write_doc = |packages: &[Package], index: Option<&str>| {
            let mut links = vec![up_ln];
            if let Some(i) = index {
                links.push(Ln {
                    rel: "index",
                    href: i,
                    mime: None,
                });
            }
            let mut w = SitemapWriter::new(Root::Urlset, &top, &links);
            for p in packages {
                package_entry(&mut w, p, |name| {
                    urls.resource_dump_file(set, generation, name)
                });
            }
            w.finish()
        };
        if packages.len() <= per_doc {
            return std::fs::write(dir.join("resourcedump.xml"), write_doc(packages, None));
        }
        let index_url = urls.resource_dump(set);
        let mut index = SitemapWriter::new(Root::SitemapIndex, &top, &[up_ln]);
        for (i, chunk) in packages.chunks(per_doc).enumerate() {
            let name = format!("dump-{i}.xml");
            std::fs::write(dir.join(&name), write_doc(chunk, Some(&index_url)))?;
            index.entry(
                &urls.resource_dump_file(set, generation, &name),
                None,
                &Md::default(),
                &[],
            );
        }
        std::fs::write(dir.join("resourcedump.xml"), index.finish())
    }

    /// Builds the Change Dump of a closed Change List (`None` when the list is empty).
    async fn build_change_dump(
        self: &Arc<Self>,
        set: &SetName,
        list: &ChangeListInfo,
    ) -> Result<Option<ChangeDumpInfo>, BuildError> {
        let until = list.until.expect("a closed list");
        let sc = self.ctx.set_config(set);
        let up = self.urls().capability_list(set);
        let cd = self.set_dir(set).join("cd");
        let building = cd.join(format!(".building-{}", list.no));
        let _ = std::fs::remove_dir_all(&building);
        std::fs::create_dir_all(&building)?;
        let packer = Packer::new(
            &building,
            self.options(),
            Kind::Changes,
            up.clone(),
            Some(list.from),
        );
        let (packer, entries) = match self.pack_changes(set, list, &sc, packer).await {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&building);
                return Err(e);
            }
        };
        if entries.0 == 0 {
            let _ = std::fs::remove_dir_all(&building);
            return Ok(None);
        }
        let without = entries.1;
        let packages = tokio::task::spawn_blocking(move || packer.finish(Some(until)))
            .await
            .context("a dump task failed")??;
        let urls = self.urls();
        let mut w = SitemapWriter::new(
            Root::Urlset,
            &Md {
                capability: Some("changedump"),
                from: Some(list.from),
                until: Some(until),
                ..Md::default()
            },
            &[
                Ln {
                    rel: "up",
                    href: &up,
                    mime: None,
                },
                Ln {
                    rel: "index",
                    href: &urls.change_dump(set),
                    mime: None,
                },
            ],
        );
        for p in &packages {
            package_entry(&mut w, p, |name| urls.change_dump_file(set, list.no, name));
        }
        std::fs::write(building.join("changedump.xml"), w.finish())?;
        let info = ChangeDumpInfo {
            base_url: self.urls().base().to_string(),
            no: list.no,
            from: list.from,
            until,
            packages,
            without_bitstream: without,
            notified: false,
        };
        std::fs::write(
            building.join("info.json"),
            serde_json::to_vec(&info).map_err(anyhow::Error::from)?,
        )?;
        std::fs::rename(&building, cd.join(list.no.to_string()))?;
        self.write_change_dump_index(set)?;
        self.advertise(set);
        Ok(Some(info))
    }

    /// Packs a closed list's changes, store page by store page; returns the packer and the
    /// (entries, entries without a bitstream) counts.
    async fn pack_changes(
        self: &Arc<Self>,
        set: &SetName,
        list: &ChangeListInfo,
        sc: &SetConfig,
        mut packer: Packer,
    ) -> Result<(Packer, (u64, u64)), BuildError> {
        let mut cursor = None;
        let (mut entries, mut without) = (0u64, 0u64);
        let mut last_dt: Option<Timestamp> = None;
        let page_size = self.config.source.store_page_size;
        loop {
            self.check_stop()?;
            let page = self
                .store()
                .changes(set, list.from, list.until, cursor, page_size)
                .await?;
            let rt = tokio::runtime::Handle::current();
            let items = page.items;
            // Each resource is packed as it is now, so the md5 the store may vouch for is its
            // current one (a change's own md5 is of bytes a later change may have replaced,
            // with the same length, even in the same batch).
            let keys: Vec<ResourceKey> = items
                .iter()
                .filter(|c| c.change != ChangeType::Deleted)
                .map(|c| c.key.clone())
                .collect();
            let now: HashMap<ResourceKey, crate::model::Resource> = self
                .store()
                .resources_by_key(set, &keys)
                .await?
                .into_iter()
                .flatten()
                .map(|r| (r.key.clone(), r))
                .collect();
            let (sc2, this) = (sc.clone(), self.clone());
            let (p, n, w, dt) = tokio::task::spawn_blocking(move || {
                let (mut n, mut w) = (0u64, 0u64);
                for c in &items {
                    this.check_stop()?;
                    // Cut only between datetimes: a package's interval holds all of the
                    // changes dated inside it.
                    if packer.is_full() && last_dt != Some(c.datetime) {
                        packer.close(Some(c.datetime))?;
                    }
                    last_dt = Some(c.datetime);
                    n += 1;
                    let loc = c.key.url(&sc2.url_prefix);
                    let body = match (c.change, now.get(&c.key)) {
                        (ChangeType::Deleted, _) | (_, None) => None,
                        (_, Some(r)) => {
                            this.open_bitstream(&sc2, &r.key, &r.meta, r.timestamp, &rt)?
                        }
                    };
                    match body {
                        Some((body, name)) => packer.add(
                            loc,
                            c.meta.lastmod,
                            c.meta.mime.clone(),
                            Some(c.change),
                            Some(c.datetime),
                            &format!("changes/{}/{name}", c.id),
                            body,
                        )?,
                        None => {
                            if c.change != ChangeType::Deleted {
                                w += 1;
                            }
                            packer.add_without_bitstream(loc, c.change, c.datetime)?
                        }
                    }
                }
                Ok::<_, BuildError>((packer, n, w, last_dt))
            })
            .await
            .context("a dump task failed")??;
            packer = p;
            entries += n;
            without += w;
            last_dt = dt;
            match page.next {
                Some(c) => cursor = Some(c),
                None => return Ok((packer, (entries, without))),
            }
        }
    }

    /// `cd/index.xml`: every Change Dump with its interval, oldest first.
    fn write_change_dump_index(&self, set: &SetName) -> std::io::Result<()> {
        let dumps = self.change_dumps(set);
        let urls = self.urls();
        let up = urls.capability_list(set);
        let mut w = SitemapWriter::new(
            Root::SitemapIndex,
            &Md {
                capability: Some("changedump"),
                from: dumps.first().map(|d| d.from),
                ..Md::default()
            },
            &[Ln {
                rel: "up",
                href: &up,
                mime: None,
            }],
        );
        for d in &dumps {
            w.entry(
                &urls.change_dump_no(set, d.no),
                None,
                &Md {
                    from: Some(d.from),
                    until: Some(d.until),
                    ..Md::default()
                },
                &[],
            );
        }
        write_atomic(
            &self.set_dir(set).join("cd/index.xml"),
            w.finish().as_bytes(),
        )
    }

    /// Framework notifications for dumps not announced yet (after a build, or after a crash
    /// between a build and its announcement).
    async fn announce_pending(&self, set: &SetName) -> anyhow::Result<()> {
        if !self.config.notify.enabled {
            return Ok(());
        }
        let urls = self.urls();
        let topic =
            Topic::parse(&self.config.framework_topic(set.as_str())).map_err(anyhow::Error::msg)?;
        let mut entries = Vec::new();
        let rd = self.resource_dump(set).filter(|d| !d.notified);
        if let Some(d) = &rd {
            // The Framework Notification table: a Resource Dump is only ever created (each
            // build is a new snapshot).
            entries.push(FrameworkEntry {
                loc: urls.resource_dump(set),
                change: ChangeType::Created,
                capability: "resourcedump",
                datetime: d.completed,
                index: None,
            });
        }
        let cds: Vec<ChangeDumpInfo> = self
            .change_dumps(set)
            .into_iter()
            .filter(|d| !d.notified)
            .collect();
        for d in &cds {
            entries.push(FrameworkEntry {
                loc: urls.change_dump_no(set, d.no),
                change: ChangeType::Created,
                capability: "changedump",
                datetime: d.until,
                index: Some(urls.change_dump(set)),
            });
        }
        if entries.is_empty() {
            return Ok(());
        }
        let mut payloads = vec![(
            topic.clone(),
            "application/xml".to_string(),
            Bytes::from(framework_notification(
                Some(&urls.capability_list(set)),
                &entries,
            )),
        )];
        // The first dump of a kind changes the Capability List.
        let first_rd = rd.is_some() && !self.set_dir(set).join("rd/.announced").exists();
        let first_cd = !cds.is_empty() && !self.set_dir(set).join("cd/.announced").exists();
        if first_rd || first_cd {
            let sd = urls.source_description();
            payloads.push((
                topic,
                "application/xml".to_string(),
                Bytes::from(framework_notification(
                    Some(&sd),
                    &[FrameworkEntry {
                        loc: urls.capability_list(set),
                        change: ChangeType::Updated,
                        capability: "capabilitylist",
                        datetime: Timestamp::now(),
                        index: None,
                    }],
                )),
            ));
        }
        self.hub.publish_all(payloads, None).await?;
        if let Some(mut d) = rd {
            d.notified = true;
            write_atomic(
                &self.set_dir(set).join("rd/current.json"),
                &serde_json::to_vec(&d)?,
            )?;
            std::fs::write(self.set_dir(set).join("rd/.announced"), b"")?;
        }
        for mut d in cds {
            d.notified = true;
            write_atomic(
                &self.set_dir(set).join(format!("cd/{}/info.json", d.no)),
                &serde_json::to_vec(&d)?,
            )?;
            std::fs::write(self.set_dir(set).join("cd/.announced"), b"")?;
        }
        Ok(())
    }

    /// Removes Resource Dump generations replaced more than `dumps.keep_replaced_secs` ago.
    fn remove_replaced(&self, set: &SetName) {
        let rd = self.set_dir(set).join("rd");
        let Some(current) = self.resource_dump(set) else {
            return;
        };
        let mut gens: Vec<(i64, String)> = std::fs::read_dir(&rd)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().to_str()?.to_string();
                Some((n.parse().ok()?, n))
            })
            .collect();
        gens.sort();
        let keep = self.config.dumps.keep_replaced_secs;
        for w in gens.windows(2) {
            let (old, newer) = (&w[0].1, &w[1].1);
            if *old == current.generation {
                continue;
            }
            let replaced_at = read_json::<ResourceDumpInfo>(&rd.join(newer).join("info.json"))
                .map(|i| i.completed);
            if replaced_at.is_some_and(|t| Timestamp::now() >= t.plus_secs(keep)) {
                tracing::info!(set = %set, generation = %old, "removing a replaced Resource Dump");
                let _ = std::fs::remove_dir_all(rd.join(old));
            }
        }
    }
}

/// A package's entry in a Resource Dump or Change Dump: its URL, type, length, the interval
/// it covers (`at`/`completed` of a Resource Dump package, `from`/`until` of a Change Dump
/// one), and `rel="contents"` to its manifest copy; `url` maps a file name to its URL.
fn package_entry(w: &mut SitemapWriter, p: &Package, url: impl Fn(&str) -> String) {
    let changes = p.from.is_some();
    w.entry(
        &url(&p.zip),
        None,
        &Md {
            mime: Some("application/zip"),
            length: Some(p.length),
            at: (!changes).then_some(p.at),
            completed: (!changes).then_some(p.completed),
            from: p.from,
            until: p.until,
            ..Md::default()
        },
        &[Ln {
            rel: "contents",
            href: &url(&p.manifest),
            mime: Some("application/xml"),
        }],
    );
}

/// A resource's bytes to pack and its name in the package.
type Bitstream = (Body, String);

/// A remote resource's body as a blocking reader (the packer is synchronous).
struct RemoteBody {
    rt: tokio::runtime::Handle,
    resp: reqwest::Response,
    buf: Bytes,
}

impl Read for RemoteBody {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.buf.is_empty() {
            match self
                .rt
                .block_on(self.resp.chunk())
                .map_err(std::io::Error::other)?
            {
                Some(c) => self.buf = c,
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf[..n]);
        self.buf = self.buf.slice(n..);
        Ok(n)
    }
}
