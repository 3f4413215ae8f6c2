//! The pull side of ResourceSync: Source Description, Capability Lists, Resource Lists (and their
//! index), Change Lists (and their index), generated from the store on request and kept in a
//! page cache that regenerates a page only when the data under it changed.
//!
//! The page cache has two tiers: every page and its gzip form as files on disk ([`disk`],
//! surviving restarts, with a byte budget), and the small hot pages in memory ([`cache`]).

pub mod activity;
mod cache;
pub mod disk;
mod doc;
mod generate;
mod parts;
mod plan;

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use sha2::Digest;

pub use cache::{MemPage, PageCache};
pub use disk::{DiskCache, PageMeta, Spool};

use crate::config::{Config, SITEMAP_MAX_BYTES};
use crate::context::{Context, Urls};
use crate::digest::hex_digest;
use crate::model::{Change, SetConfig, SetName, Timestamp};
use crate::sitemap::entry::{write_change, write_resource};
use crate::sitemap::{Ln, Md, Root, SitemapWriter};
use crate::store::{Built, ChangeListInfo, PartDelta, PartInfo, Store};
pub use doc::{Doc, DocKind, Opened, SourceError};

use doc::blocking;
use generate::{Gen, PageWriter};
use parts::Base;
use parts::PartBase;
use plan::{Nav, Plan};

/// The store's sets as read at an instant, in an epoch of the context.
type SetsRead = (std::time::Instant, u64, Arc<Vec<crate::store::SetInfo>>);

/// Generates and caches the documents of every set.
pub struct Source {
    /// What the server's parts share (configuration, store, metrics, URLs, build slots,
    /// offers).
    ctx: Arc<Context>,
    memory: PageCache,
    disk: Arc<DiskCache>,
    /// What every page depends on besides the store (software version, URLs, set
    /// configuration): part of every page's version, so a restart with another configuration
    /// does not serve pages made under the old one.
    fingerprint: String,
    /// Per Resource List page, what its last build here left for the next one to start from.
    bases: std::sync::Mutex<std::collections::HashMap<String, Arc<PartBase>>>,
    /// One lock per page being built: concurrent requests for it wait for that one build.
    inflight: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per page, the version last found current (or built), when, and in which of the
    /// context's epochs: within `source.rebuild_interval_ms` of that and in the same epoch,
    /// the page is served without asking the store.
    checked: std::sync::Mutex<std::collections::HashMap<String, (String, std::time::Instant, u64)>>,
    /// Reads of page files under way at once, server-wide (`source.max_concurrent_file_reads`).
    file_reads: Arc<tokio::sync::Semaphore>,
    /// The store's sets as last read, when, and in which epoch: every document asks, and
    /// reading them is a store query (a point-in-time scan on Elasticsearch). See
    /// [`Source::sets`].
    sets: std::sync::Mutex<Option<SetsRead>>,
}

/// Pages remembered as recently checked before the stale ones are dropped.
const CHECKED_MAX: usize = 4096;

/// How long a read of the store's sets is used for the Source Description. A set another
/// process creates (on a shared Elasticsearch store) is listed at most this late; one created
/// here, or one asked for by name, at once.
const SETS_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(1);
impl Source {
    /// Opens the source with its page cache directory (`source.cache_dir`, by default
    /// `<data_dir>/pages`), reading back the pages a previous run left there.
    pub fn open(ctx: Arc<Context>) -> Result<Source, SourceError> {
        let config = ctx.config();
        let dir = config.page_cache_dir();
        let disk = DiskCache::open(&dir, config.source.disk_cache_max_bytes).map_err(|e| {
            SourceError::Cache(format!(
                "cannot open the page cache directory {} (source.cache_dir): {e}",
                dir.display()
            ))
        })?;
        let fingerprint = {
            let inputs = serde_json::json!({
                "software": env!("CARGO_PKG_VERSION"),
                "base_url": config.base_url(),
                "describedby": config.source.describedby,
                "hub": config.hub_url(),
                "topic_path": config.hub.topic_path,
                "notify": config.notify.enabled,
                "set_defaults": config.set_defaults,
                "sets": config.sets,
                "oai": config.oai.enabled,
                "oai_formats": config
                    .configured_sets()
                    .into_iter()
                    .map(|n| (n, config.oai_format(n)))
                    .collect::<Vec<_>>(),
            });
            let mut h = hex_digest(sha2::Sha256::digest(inputs.to_string().as_bytes()));
            h.truncate(16);
            h
        };
        let memory = PageCache::new(config.source.cache_max_bytes);
        let file_reads = Arc::new(tokio::sync::Semaphore::new(
            config.source.max_concurrent_file_reads,
        ));
        let source = Source {
            ctx,
            memory,
            disk: Arc::new(disk),
            fingerprint,
            inflight: std::sync::Mutex::new(std::collections::HashMap::new()),
            bases: std::sync::Mutex::new(std::collections::HashMap::new()),
            checked: std::sync::Mutex::new(std::collections::HashMap::new()),
            file_reads,
            sets: std::sync::Mutex::new(None),
        };
        source.update_cache_gauges();
        Ok(source)
    }

    /// What the server's parts share.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    fn urls(&self) -> &Urls {
        self.ctx.urls()
    }

    fn metrics(&self) -> &crate::metrics::Metrics {
        self.ctx.metrics()
    }

    fn store(&self) -> &Store {
        self.ctx.store()
    }

    fn config(&self) -> &Config {
        self.ctx.config()
    }

    fn set_config(&self, set: &SetName) -> SetConfig {
        self.ctx.set_config(set)
    }

    /// Permits for reading page files (see `http::documents`).
    pub fn file_reads(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.file_reads
    }

    /// Bytes held by the (memory, disk) tiers of the page cache.
    pub fn cache_bytes(&self) -> (usize, u64) {
        (self.memory.bytes(), self.disk.bytes())
    }

    fn update_cache_gauges(&self) {
        use crate::metrics::TierLabel;
        let (mem, disk) = self.cache_bytes();
        let g = &self.metrics().page_cache_bytes;
        g.get_or_create(&TierLabel { tier: "memory" })
            .set(mem as i64);
        g.get_or_create(&TierLabel { tier: "disk" })
            .set(disk as i64);
    }

    /// The document opened for one response: from memory, or with its file open (retrying
    /// when a newer version replaced the file between lookup and open).
    pub async fn open_document(&self, kind: &DocKind, gzip: bool) -> Result<Opened, SourceError> {
        let mut tries = 0;
        loop {
            let doc = self.document(kind).await?;
            if let Some(b) = doc.in_memory(gzip) {
                return Ok(Opened::Memory(doc, b));
            }
            match std::fs::File::open(doc.path(gzip)) {
                Ok(f) => return Ok(Opened::File(doc, f)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 3 => tries += 1,
                Err(e) => {
                    return Err(SourceError::Cache(format!(
                        "cannot open {}: {e}",
                        doc.path(gzip).display()
                    )))
                }
            }
        }
    }

    /// The document, from the page cache when nothing under it changed since it was
    /// generated. Pages are built once however many ask at the same moment (the others wait
    /// for that build), at most `source.max_concurrent_builds` at once, with a bounded queue
    /// beyond which the answer is [`SourceError::Busy`].
    pub async fn document(&self, kind: &DocKind) -> Result<Doc, SourceError> {
        let r = self.document_now(kind).await;
        if matches!(&r, Err(SourceError::Store(e)) if e.may_pass()) {
            // The store went away: no document is served from the set list read before it
            // did (the Source Description too answers 503 until the store is back).
            *self.sets.lock().expect("sets") = None;
        }
        r
    }

    async fn document_now(&self, kind: &DocKind) -> Result<Doc, SourceError> {
        let key = format!("{kind:?}");
        // Read before the plan: an offer or a set made while planning is seen by the next one.
        let epoch = self.ctx.epoch();
        let interval = self.rebuild_interval().as_micros() as i64;
        if let Some(doc) = self.checked_lately(&key).await? {
            // Found current (or built) less than `rebuild_interval_ms` ago: what a plan would
            // lead to anyway (the same page, or that last build while the interval runs), without
            // the store's bookkeeping being read for every request.
            return Ok(doc);
        }
        let plan = self.plan(kind).await?;
        let version = format!("{}|{}", self.fingerprint, plan.version);
        if let Some(doc) = self.cached(&key, &version).await? {
            self.note_checked(&key, &doc, std::time::Instant::now(), epoch);
            return Ok(doc);
        }
        // The page changed since it was built. Readers get the last build, at once, while it
        // is being rebuilt (at most one build old) and while it is younger than
        // `source.rebuild_interval_ms` (a page under a steady stream of changes is rebuilt at
        // most that often, not for every reader); its `at`/`completed`/`from` say what it
        // reflects, so a destination continuing from there misses nothing. The request that
        // starts a build waits for it.
        let building = self.inflight.lock().expect("inflight").contains_key(&key);
        if building || interval > 0 {
            if let Some(doc) = self.latest(&key).await? {
                let age = Timestamp::now().0 - doc.meta.built_at;
                if building || age < interval {
                    if !building {
                        // Served until the interval since its build runs out, as above.
                        let built = std::time::Instant::now()
                            .checked_sub(std::time::Duration::from_micros(age.max(0) as u64))
                            .unwrap_or_else(std::time::Instant::now);
                        self.note_checked(&key, &doc, built, epoch);
                    }
                    return Ok(doc);
                }
            }
        }
        let flight = self
            .inflight
            .lock()
            .expect("inflight")
            .entry(key.clone())
            .or_default()
            .clone();
        let result = async {
            let _one = flight.lock().await;
            if let Some(doc) = self.cached(&key, &version).await? {
                return Ok(doc);
            }
            let _slot = self.ctx.build_slot().await?;
            let gen = self.generate(kind, &key, &plan).await?;
            let disk = self.disk.clone();
            let last_modified = plan.last_modified.0;
            let (k, v) = (key.clone(), version.clone());
            // A Resource List (part) says when it was completed: no two builds have the same
            // bytes, so hashing them gives nothing a build's own ETag does not.
            let validator = match (kind, &plan.part) {
                (DocKind::ResourceList(_) | DocKind::ResourceListPart(..), Some(_)) => {
                    disk::Validator::Build
                }
                _ => disk::Validator::Content,
            };
            let (meta, base) = blocking(move || {
                let mut gen = gen;
                gen.spool_entries()?;
                let Gen { w, spool, base, .. } = gen;
                let page = spool.finish(
                    w.head().as_bytes(),
                    w.tail().as_bytes(),
                    w.entries(),
                    validator,
                )?;
                let head = page.entries_at;
                Ok((
                    disk.put(&k, &v, last_modified, page)?,
                    base.map(|b| (b, head)),
                ))
            })
            .await?;
            if let Some((built, head)) = base {
                self.keep_base(
                    &key,
                    PartBase {
                        file: meta.path(false).to_path_buf(),
                        head,
                        built,
                    },
                );
            }
            self.metrics()
                .pages_built
                .get_or_create(&crate::metrics::KindLabel { kind: kind.label() })
                .inc();
            let doc = self.remember(meta).await?;
            self.update_cache_gauges();
            self.note_checked(&key, &doc, std::time::Instant::now(), epoch);
            Ok(doc)
        }
        .await;
        let mut inflight = self.inflight.lock().expect("inflight");
        if Arc::strong_count(&flight) <= 2 {
            inflight.remove(&key);
        }
        result
    }

    /// `source.rebuild_interval_ms`.
    fn rebuild_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.config().source.rebuild_interval_ms)
    }

    /// The page last found current or built, when that was less than
    /// `source.rebuild_interval_ms` ago and it is still held.
    async fn checked_lately(&self, key: &str) -> Result<Option<Doc>, SourceError> {
        let interval = self.rebuild_interval();
        if interval.is_zero() {
            return Ok(None);
        }
        let version = match self.checked.lock().expect("checked").get(key) {
            Some((v, at, epoch)) if at.elapsed() < interval && *epoch == self.ctx.epoch() => {
                v.clone()
            }
            _ => return Ok(None),
        };
        self.cached(key, &version).await
    }

    /// `doc` is `key`'s page as of `at`, in `epoch` (see [`Source::checked_lately`]).
    fn note_checked(&self, key: &str, doc: &Doc, at: std::time::Instant, epoch: u64) {
        let interval = self.rebuild_interval();
        if interval.is_zero() {
            return;
        }
        let mut checked = self.checked.lock().expect("checked");
        if checked.len() >= CHECKED_MAX {
            // Bounded by the pages served within one interval, not by every page ever served.
            checked.retain(|_, (_, t, _)| t.elapsed() < interval);
        }
        checked.insert(key.to_string(), (doc.meta.version.clone(), at, epoch));
    }

    /// The page from the memory tier, else the disk tier (small pages found on disk are
    /// brought into memory).
    async fn cached(&self, key: &str, version: &str) -> Result<Option<Doc>, SourceError> {
        use crate::metrics::TierLabel;
        if let Some(page) = self.memory.get(key, version) {
            self.metrics()
                .page_cache_hits
                .get_or_create(&TierLabel { tier: "memory" })
                .inc();
            return Ok(Some(Doc {
                meta: page.meta.clone(),
                mem: Some(page),
            }));
        }
        let Some(meta) = self.disk.get(key, version) else {
            return Ok(None);
        };
        self.metrics()
            .page_cache_hits
            .get_or_create(&TierLabel { tier: "disk" })
            .inc();
        Ok(Some(self.remember(meta).await?))
    }

    /// The newest page held for `key`, whatever its version.
    async fn latest(&self, key: &str) -> Result<Option<Doc>, SourceError> {
        if let Some(page) = self.memory.latest(key) {
            return Ok(Some(Doc {
                meta: page.meta.clone(),
                mem: Some(page),
            }));
        }
        match self.disk.latest(key) {
            Some(meta) => Ok(Some(self.remember(meta).await?)),
            None => Ok(None),
        }
    }

    /// A document for a page on disk, kept in memory too when it is small.
    async fn remember(&self, meta: Arc<PageMeta>) -> Result<Doc, SourceError> {
        let paths = meta.files.clone();
        let mut doc = Doc {
            meta: meta.clone(),
            mem: None,
        };
        if meta.bytes() <= self.config().source.memory_page_max_bytes as u64 {
            let read = blocking(move || {
                Ok((
                    Bytes::from(std::fs::read(&paths[0])?),
                    Bytes::from(std::fs::read(&paths[1])?),
                ))
            })
            .await;
            // Replaced meanwhile: serve from the file (open_document retries).
            if let Ok((identity, gzip)) = read {
                let page = Arc::new(MemPage {
                    meta,
                    identity,
                    gzip,
                });
                self.memory.insert(page.clone());
                self.update_cache_gauges();
                doc.mem = Some(page);
            }
        }
        Ok(doc)
    }

    /// The set's creation time (part of its pages' versions: a set deleted and created again
    /// never matches pages cached from the old one), or NotFound.
    async fn known_set(&self, set: &SetName) -> Result<Timestamp, SourceError> {
        let find = |sets: &[crate::store::SetInfo]| {
            sets.iter().find(|s| &s.name == set).map(|s| s.created_at)
        };
        if let Some(t) = find(&self.sets(false).await?) {
            return Ok(t);
        }
        // Not among the sets last read: it may be new.
        find(&self.sets(true).await?)
            .ok_or_else(|| SourceError::NotFound(format!("no resource set named {set:?}")))
    }

    /// The store's sets, read again when `fresh` or when the last read is older than
    /// [`SETS_FRESH_FOR`]. Sets are only ever added, so a set found in an older read is there.
    async fn sets(&self, fresh: bool) -> Result<Arc<Vec<crate::store::SetInfo>>, SourceError> {
        let epoch = self.ctx.epoch();
        if !fresh {
            if let Some((at, e, sets)) = &*self.sets.lock().expect("sets") {
                if at.elapsed() < SETS_FRESH_FOR && *e == epoch {
                    return Ok(sets.clone());
                }
            }
        }
        let at = std::time::Instant::now();
        let sets = Arc::new(self.store().sets().await?);
        *self.sets.lock().expect("sets") = Some((at, epoch, sets.clone()));
        Ok(sets)
    }
}
