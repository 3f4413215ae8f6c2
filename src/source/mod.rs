//! The pull side of ResourceSync: Source Description, Capability Lists, Resource Lists (and their
//! index), Change Lists (and their index), generated from the store on request and kept in a
//! page cache that regenerates a page only when the data under it changed.
//!
//! The page cache has two tiers: every page and its gzip form as files on disk ([`disk`],
//! surviving restarts, with a byte budget), and the small hot pages in memory ([`cache`]).

pub mod activity;
mod cache;
pub mod disk;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use sha2::Digest;

pub use cache::{MemPage, PageCache};
pub use disk::{DiskCache, PageMeta, Spool};

use crate::config::{Config, SITEMAP_MAX_BYTES};
use crate::digest::hex_digest;
use crate::model::{Change, ChangeType, Link, Resource, SetConfig, SetName, Timestamp};
use crate::sitemap::{Ln, Md, Root, SitemapWriter};
use crate::store::{Built, ChangeListInfo, ListPolicy, PartDelta, PartInfo, Store, StoreError};

/// A document the source serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DocKind {
    SourceDescription,
    CapabilityList(SetName),
    /// The Resource List, or its index when the set spans more than one part.
    ResourceList(SetName),
    ResourceListPart(SetName, u32),
    /// The only Change List, or the Change List Index once a list has been closed.
    ChangeList(SetName),
    ChangeListNo(SetName, u32),
    /// The IIIF Change Discovery collection of a set's changes.
    Activity(SetName),
    /// One of its pages: the activities of Change List `no`.
    ActivityPage(SetName, u32),
}

impl DocKind {
    /// The label of `rshub_pages_built_total{kind}`.
    pub fn label(&self) -> &'static str {
        match self {
            DocKind::SourceDescription => "source_description",
            DocKind::CapabilityList(_) => "capability_list",
            DocKind::ResourceList(_) => "resource_list",
            DocKind::ResourceListPart(..) => "resource_list_part",
            DocKind::ChangeList(_) => "change_list",
            DocKind::ChangeListNo(..) => "change_list_no",
            DocKind::Activity(_) => "activity",
            DocKind::ActivityPage(..) => "activity_page",
        }
    }

    /// The media type the document is served as.
    pub fn media_type(&self) -> &'static str {
        match self {
            DocKind::Activity(_) | DocKind::ActivityPage(..) => activity::MEDIA_TYPE,
            _ => "application/xml",
        }
    }
}

/// A document ready to serve: its validators, and where its bytes are (memory for small hot
/// pages, else the disk cache's files).
#[derive(Debug, Clone)]
pub struct Doc {
    pub meta: Arc<PageMeta>,
    mem: Option<Arc<MemPage>>,
}

impl Doc {
    /// Number of `<url>`/`<sitemap>` entries.
    pub fn entries(&self) -> usize {
        self.meta.entries
    }

    pub fn last_modified(&self) -> Timestamp {
        Timestamp(self.meta.last_modified)
    }

    /// The strong ETag of one form (the gzip form has its own).
    pub fn etag(&self, gzip: bool) -> &str {
        if gzip {
            &self.meta.gzip_etag
        } else {
            &self.meta.etag
        }
    }

    /// Length of one form in bytes.
    pub fn len(&self, gzip: bool) -> u64 {
        if gzip {
            self.meta.gzip_len
        } else {
            self.meta.len
        }
    }

    pub fn is_empty(&self) -> bool {
        self.meta.len == 0
    }

    /// One form's bytes when the page is held in memory.
    pub fn in_memory(&self, gzip: bool) -> Option<Bytes> {
        self.mem.as_ref().map(|m| {
            if gzip {
                m.gzip.clone()
            } else {
                m.identity.clone()
            }
        })
    }

    /// The file holding one form. It may be replaced by a newer version at any moment: open
    /// it and read from the open file ([`Source::open_document`] retries when it is already gone).
    pub fn path(&self, gzip: bool) -> &Path {
        self.meta.path(gzip)
    }

    /// One form, whole (for tools and benchmarks; the server streams from the file).
    pub fn read(&self, gzip: bool) -> std::io::Result<Bytes> {
        match self.in_memory(gzip) {
            Some(b) => Ok(b),
            None => std::fs::read(self.path(gzip)).map(Bytes::from),
        }
    }
}

/// A document opened for one response: its bytes in memory, or its file opened.
pub enum Opened {
    Memory(Doc, Bytes),
    File(Doc, std::fs::File),
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{0}")]
    NotFound(String),
    /// Every build slot is taken and the queue is full: try again shortly.
    #[error("{0}")]
    Busy(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The page cache's files could not be written or read (disk full, permissions).
    #[error("page cache: {0}")]
    Cache(String),
}

impl From<std::io::Error> for SourceError {
    fn from(e: std::io::Error) -> Self {
        SourceError::Cache(e.to_string())
    }
}

/// Runs blocking file and formatting work on tokio's blocking pool, off the async threads
/// that ingest, the notifier and the hub run on.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SourceError> + Send + 'static,
) -> Result<T, SourceError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SourceError::Cache(format!("a page task failed: {e}")))?
}

/// The URL map, in one place.
#[derive(Debug, Clone)]
pub struct Urls {
    base: String,
}

impl Urls {
    pub fn new(base_url: &str) -> Urls {
        Urls {
            base: base_url.trim_end_matches('/').to_string(),
        }
    }
    pub fn base(&self) -> &str {
        &self.base
    }
    pub fn source_description(&self) -> String {
        format!("{}/.well-known/resourcesync", self.base)
    }
    pub fn capability_list(&self, set: &SetName) -> String {
        format!("{}/sets/{set}/capabilitylist.xml", self.base)
    }
    pub fn resource_list(&self, set: &SetName) -> String {
        format!("{}/sets/{set}/resourcelist.xml", self.base)
    }
    pub fn resource_list_part(&self, set: &SetName, no: u32) -> String {
        format!("{}/sets/{set}/resourcelist/{no}.xml", self.base)
    }
    pub fn change_list(&self, set: &SetName) -> String {
        format!("{}/sets/{set}/changelist.xml", self.base)
    }
    pub fn change_list_no(&self, set: &SetName, no: u32) -> String {
        format!("{}/sets/{set}/changelist/{no}.xml", self.base)
    }
    pub fn resource_dump(&self, set: &SetName) -> String {
        format!("{}/sets/{set}/resourcedump.xml", self.base)
    }
    /// A file of one Resource Dump generation (a package, a manifest copy, an index part).
    pub fn resource_dump_file(&self, set: &SetName, generation: &str, name: &str) -> String {
        format!("{}/sets/{set}/resourcedump/{generation}/{name}", self.base)
    }
    pub fn change_dump(&self, set: &SetName) -> String {
        format!("{}/sets/{set}/changedump.xml", self.base)
    }
    pub fn change_dump_no(&self, set: &SetName, no: u32) -> String {
        format!("{}/sets/{set}/changedump/{no}.xml", self.base)
    }
    /// A file of the Change Dump of closed Change List `no` (a package, a manifest copy).
    pub fn change_dump_file(&self, set: &SetName, no: u32, name: &str) -> String {
        format!("{}/sets/{set}/changedump/{no}/{name}", self.base)
    }
    pub fn activity(&self, set: &SetName) -> String {
        format!("{}/sets/{set}/activity.json", self.base)
    }
    pub fn activity_page(&self, set: &SetName, no: u32) -> String {
        format!("{}/sets/{set}/activity/{no}.json", self.base)
    }
    pub fn oai(&self) -> String {
        format!("{}/oai", self.base)
    }
    pub fn ingest(&self, set: &SetName) -> String {
        format!("{}/api/v1/resource-sets/{set}/changes", self.base)
    }
}

/// Generates and caches the documents of every set.
pub struct Source {
    config: Arc<Config>,
    store: Store,
    urls: Urls,
    memory: PageCache,
    disk: Arc<DiskCache>,
    /// What every page depends on besides the store (software version, URLs, set
    /// configuration): part of every page's version, so a restart with another configuration
    /// does not serve pages made under the old one.
    fingerprint: String,
    metrics: Arc<crate::metrics::Metrics>,
    /// Build slots (`source.max_concurrent_builds`).
    builds: Arc<tokio::sync::Semaphore>,
    /// Builds waiting for a slot (at most `source.max_queued_builds`).
    queued: std::sync::atomic::AtomicUsize,
    /// Per Resource List page, what its last build here left for the next one to start from.
    bases: std::sync::Mutex<std::collections::HashMap<String, Arc<PartBase>>>,
    /// One lock per page being built: concurrent requests for it wait for that one build.
    inflight: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per page, the version last found current (or built) and when: within
    /// `source.rebuild_interval_ms` of that, the page is served without asking the store.
    checked: std::sync::Mutex<std::collections::HashMap<String, (String, std::time::Instant)>>,
    /// Reads of page files under way at once, server-wide (`source.max_concurrent_file_reads`).
    file_reads: Arc<tokio::sync::Semaphore>,
    /// Capabilities offered beside the lists, per set (`resourcedump`, `changedump` -> URL),
    /// told by the module that builds them: part of the Capability List and its version.
    /// When one changed is the Capability List's Last-Modified.
    advertised: std::sync::Mutex<std::collections::BTreeMap<SetName, Advertised>>,
    /// The store's sets as last read, and when: every document asks, and reading them is a
    /// store query (a point-in-time scan on Elasticsearch). See [`Source::sets`].
    sets: std::sync::Mutex<Option<(std::time::Instant, Arc<Vec<crate::store::SetInfo>>)>>,
}

/// Pages remembered as recently checked before the stale ones are dropped.
const CHECKED_MAX: usize = 4096;

/// Entries of the Resource List pages whose last build is kept as the start of the next, all
/// pages together (16 bytes an entry: 16 MB; 800 KB for a part of 50,000).
const BASES_MAX_ENTRIES: usize = 1 << 20;

/// Entry bytes gathered before they are moved to the spool.
const SPOOL_AT: usize = 1 << 20;

/// Where each entry of a page being built lies, for the next build of it: the change it is
/// current to, and (position in the part, length) of every entry in order.
struct Base {
    last_seq: i64,
    entries: Vec<(i64, u32)>,
}

/// A Resource List part as last built here: its identity file, where its first entry starts,
/// and where each entry lies ([`Base`]). The next build copies the entries no change touched
/// since then instead of reading them from the store and writing them again.
struct PartBase {
    file: PathBuf,
    head: u64,
    built: Base,
}

/// `g`, a part's page being built, made from `base` (the part's page as built before) and
/// `delta` (what changed since): entries no change touched are copied from the old file.
/// `None` when the two do not fit together (the file gone or not as remembered, a resource
/// in neither): the page is then built whole.
fn merge(
    mut g: Gen<SitemapWriter>,
    base: &PartBase,
    delta: PartDelta,
    sc: &SetConfig,
) -> Option<Gen<SitemapWriter>> {
    match merge_into(&mut g, base, delta, sc) {
        Ok(true) => Some(g),
        Ok(false) => {
            tracing::debug!(file = %base.file.display(), "page built whole: its last build does not fit the changes since");
            None
        }
        Err(e) => {
            tracing::debug!(file = %base.file.display(), error = %e, "page built whole: its last build could not be read");
            None
        }
    }
}

fn merge_into(
    g: &mut Gen<SitemapWriter>,
    base: &PartBase,
    delta: PartDelta,
    sc: &SetConfig,
) -> std::io::Result<bool> {
    let mut old = Stretch::new(std::fs::File::open(&base.file)?, base.head);
    let mut entries = base.built.entries.iter().copied().peekable();
    let mut changed = delta.changed.into_iter().peekable();
    // No resource came or went since: the positions are the last build's.
    let positions = delta
        .positions
        .unwrap_or_else(|| base.built.entries.iter().map(|&(p, _)| p).collect());
    let mut kept = Vec::with_capacity(positions.len());
    let mut loc = String::new();
    for pos in positions {
        // Entries of resources gone since.
        while let Some((_, len)) = entries.next_if(|&(p, _)| p < pos) {
            if !old.pass(len, &mut g.w)? {
                return Ok(false);
            }
        }
        let was = entries.next_if(|&(p, _)| p == pos);
        if let Some((_, r)) = changed.next_if(|(p, _)| *p == pos) {
            // The untouched entries before it go first.
            if !old.pass(was.map_or(0, |(_, len)| len), &mut g.w)? {
                return Ok(false);
            }
            let before = g.w.pending();
            write_resource(&mut g.w, sc, &r, &mut loc);
            kept.push((pos, (g.w.pending() - before) as u32));
        } else if let Some((_, len)) = was {
            old.keep(len);
            kept.push((pos, len));
        } else {
            // Neither changed nor in the last build.
            return Ok(false);
        }
        if changed.peek().is_some_and(|(p, _)| *p < pos) {
            return Ok(false);
        }
        if old.bytes >= SPOOL_AT && !old.copy(&mut g.w)? {
            return Ok(false);
        }
        if g.w.pending() >= SPOOL_AT {
            g.spool_entries()?;
        }
    }
    if changed.next().is_some() || !old.copy(&mut g.w)? {
        return Ok(false);
    }
    g.spool_entries()?;
    g.base = Some(Base {
        last_seq: delta.last_seq,
        entries: kept,
    });
    Ok(true)
}

/// A part's last build read from where its entries begin: the untouched entries are copied
/// a stretch at a time, one read each, rather than one at a time (that copy was 14–23 of the
/// ~114 samples a second serving adds under `bench_load`).
struct Stretch {
    file: std::fs::File,
    /// Bytes to pass over before the stretch (entries of resources changed or gone).
    skip: u64,
    /// The stretch's entries' lengths, and their sum.
    lens: Vec<u32>,
    bytes: usize,
    buf: Vec<u8>,
}

impl Stretch {
    fn new(file: std::fs::File, at: u64) -> Stretch {
        Stretch {
            file,
            skip: at,
            lens: Vec::new(),
            bytes: 0,
            buf: Vec::new(),
        }
    }

    /// The next entry is copied.
    fn keep(&mut self, len: u32) {
        self.lens.push(len);
        self.bytes += len as usize;
    }

    /// The next entry (`len` bytes) is not: the stretch before it is copied to `w` first.
    fn pass(&mut self, len: u32, w: &mut SitemapWriter) -> std::io::Result<bool> {
        let ok = self.copy(w)?;
        self.skip += u64::from(len);
        Ok(ok)
    }

    /// Writes the stretch to `w`, checking each entry is one as written before: `false` when
    /// one is not (the file is not the build remembered).
    fn copy(&mut self, w: &mut SitemapWriter) -> std::io::Result<bool> {
        use std::io::{Read, Seek};
        if self.lens.is_empty() {
            return Ok(true);
        }
        if self.skip > 0 {
            self.file
                .seek(std::io::SeekFrom::Current(self.skip as i64))?;
            self.skip = 0;
        }
        self.buf.resize(self.bytes, 0);
        self.file.read_exact(&mut self.buf)?;
        let Ok(text) = std::str::from_utf8(&self.buf) else {
            return Ok(false);
        };
        let mut at = 0;
        for &len in &self.lens {
            let e = &text.as_bytes()[at..at + len as usize];
            if !(e.starts_with(b"  <url>") && e.ends_with(b"</url>\n")) {
                return Ok(false);
            }
            at += len as usize;
        }
        w.raw_entries(text, self.lens.len());
        self.lens.clear();
        self.bytes = 0;
        Ok(true)
    }
}

/// How long a read of the store's sets is used for the Source Description. A set another
/// process creates (on a shared Elasticsearch store) is listed at most this late; one created
/// here, or one asked for by name, at once.
const SETS_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// A set's capabilities beside its lists: capability -> (URL, when it last changed).
type Advertised = std::collections::BTreeMap<&'static str, (String, Timestamp)>;

/// How the store cuts a set's lists (the configuration's limits and the sitemap size limit).
pub fn list_policy(config: &Config, set: &SetName) -> ListPolicy {
    let sc = config.set_config(set.as_str());
    ListPolicy {
        max_items: sc.max_items_in_list,
        max_bytes: SITEMAP_MAX_BYTES,
        rollover_secs: sc.changelist_rollover_secs,
        max_future_skew_secs: config.ingest.max_future_skew_secs,
    }
}

impl Source {
    /// Opens the source with its page cache directory (`source.cache_dir`, by default
    /// `<data_dir>/pages`), reading back the pages a previous run left there.
    pub fn open(config: Arc<Config>, store: Store) -> Result<Source, SourceError> {
        Source::open_with_metrics(config, store, Arc::new(crate::metrics::Metrics::default()))
    }

    /// A source that counts its builds and cache hits in `metrics` (the server's, for
    /// `/metrics`).
    pub fn open_with_metrics(
        config: Arc<Config>,
        store: Store,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Result<Source, SourceError> {
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
        let urls = Urls::new(&config.base_url());
        let memory = PageCache::new(config.source.cache_max_bytes);
        let builds = Arc::new(tokio::sync::Semaphore::new(
            config.source.max_concurrent_builds,
        ));
        let file_reads = Arc::new(tokio::sync::Semaphore::new(
            config.source.max_concurrent_file_reads,
        ));
        let source = Source {
            config,
            store,
            urls,
            memory,
            disk: Arc::new(disk),
            fingerprint,
            metrics,
            builds,
            queued: std::sync::atomic::AtomicUsize::new(0),
            inflight: std::sync::Mutex::new(std::collections::HashMap::new()),
            bases: std::sync::Mutex::new(std::collections::HashMap::new()),
            checked: std::sync::Mutex::new(std::collections::HashMap::new()),
            file_reads,
            advertised: Default::default(),
            sets: std::sync::Mutex::new(None),
        };
        source.update_cache_gauges();
        Ok(source)
    }

    pub fn urls(&self) -> &Urls {
        &self.urls
    }

    /// The counters it adds to (the server's, for `/metrics`).
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn set_config(&self, set: &SetName) -> SetConfig {
        self.config.set_config(set.as_str())
    }

    /// How the store cuts this set's lists.
    pub fn list_policy(&self, set: &SetName) -> ListPolicy {
        list_policy(&self.config, set)
    }

    /// Offers (`Some(url)`) or withdraws (`None`) a capability of a set beside its lists in
    /// its Capability List; returns whether that changed the Capability List.
    pub fn advertise(&self, set: &SetName, capability: &'static str, url: Option<String>) -> bool {
        let mut all = self.advertised.lock().expect("advertised");
        let caps = all.entry(set.clone()).or_default();
        let changed = match url {
            Some(u) if caps.get(capability).is_some_and(|(old, _)| *old == u) => false,
            Some(u) => {
                caps.insert(capability, (u, Timestamp::now()));
                true
            }
            None => caps.remove(capability).is_some(),
        };
        if changed {
            // Known here at once: the Capability List is looked at again by its next reader.
            self.checked.lock().expect("checked").clear();
        }
        changed
    }

    /// The capabilities advertised beside a set's lists, with when each was last changed.
    pub fn advertised(&self, set: &SetName) -> Vec<(&'static str, String, Timestamp)> {
        self.advertised
            .lock()
            .expect("advertised")
            .get(set)
            .map(|m| m.iter().map(|(k, (u, t))| (*k, u.clone(), *t)).collect())
            .unwrap_or_default()
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
        let g = &self.metrics.page_cache_bytes;
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
            self.note_checked(&key, &doc, std::time::Instant::now());
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
                        self.note_checked(&key, &doc, built);
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
            let _slot = self.build_slot().await?;
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
            self.metrics
                .pages_built
                .get_or_create(&crate::metrics::KindLabel { kind: kind.label() })
                .inc();
            let doc = self.remember(meta).await?;
            self.update_cache_gauges();
            self.note_checked(&key, &doc, std::time::Instant::now());
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
        std::time::Duration::from_millis(self.config.source.rebuild_interval_ms)
    }

    /// The page last found current or built, when that was less than
    /// `source.rebuild_interval_ms` ago and it is still held.
    async fn checked_lately(&self, key: &str) -> Result<Option<Doc>, SourceError> {
        let interval = self.rebuild_interval();
        if interval.is_zero() {
            return Ok(None);
        }
        let version = match self.checked.lock().expect("checked").get(key) {
            Some((v, at)) if at.elapsed() < interval => v.clone(),
            _ => return Ok(None),
        };
        self.cached(key, &version).await
    }

    /// `doc` is `key`'s page as of `at` (see [`Source::checked_lately`]).
    fn note_checked(&self, key: &str, doc: &Doc, at: std::time::Instant) {
        let interval = self.rebuild_interval();
        if interval.is_zero() {
            return;
        }
        let mut checked = self.checked.lock().expect("checked");
        if checked.len() >= CHECKED_MAX {
            // Bounded by the pages served within one interval, not by every page ever served.
            checked.retain(|_, (_, t)| t.elapsed() < interval);
        }
        checked.insert(key.to_string(), (doc.meta.version.clone(), at));
    }

    /// The page from the memory tier, else the disk tier (small pages found on disk are
    /// brought into memory).
    async fn cached(&self, key: &str, version: &str) -> Result<Option<Doc>, SourceError> {
        use crate::metrics::TierLabel;
        if let Some(page) = self.memory.get(key, version) {
            self.metrics
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
        self.metrics
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
        if meta.bytes() <= self.config.source.memory_page_max_bytes as u64 {
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

    /// A build slot, waiting in the bounded queue when all are taken; [`SourceError::Busy`]
    /// when the queue is full. Held for as long as the page is being made (an OAI-PMH page:
    /// until it is written out).
    pub async fn build_slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, SourceError> {
        use std::sync::atomic::Ordering::SeqCst;
        if let Ok(p) = self.builds.clone().try_acquire_owned() {
            return Ok(p);
        }
        if self.queued.fetch_add(1, SeqCst) >= self.config.source.max_queued_builds {
            self.queued.fetch_sub(1, SeqCst);
            return Err(SourceError::Busy(
                "every page build slot is taken and the queue is full; try again shortly".into(),
            ));
        }
        self.metrics.build_queue.inc();
        let p = self.builds.clone().acquire_owned().await;
        self.queued.fetch_sub(1, SeqCst);
        self.metrics.build_queue.dec();
        Ok(p.expect("the build semaphore is never closed"))
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
        if !fresh {
            if let Some((at, sets)) = &*self.sets.lock().expect("sets") {
                if at.elapsed() < SETS_FRESH_FOR {
                    return Ok(sets.clone());
                }
            }
        }
        let at = std::time::Instant::now();
        let sets = Arc::new(self.store.sets().await?);
        *self.sets.lock().expect("sets") = Some((at, sets.clone()));
        Ok(sets)
    }

    /// A set was created here: the next Source Description lists it.
    pub fn set_created(&self) {
        *self.sets.lock().expect("sets") = None;
        self.checked.lock().expect("checked").clear();
    }

    /// Works out, from the store's bookkeeping alone, what a document would be generated from.
    async fn plan(&self, kind: &DocKind) -> Result<Plan, SourceError> {
        match kind {
            DocKind::SourceDescription => {
                let sets = self.sets(false).await?;
                let names: Vec<&str> = sets.iter().map(|s| s.name.as_str()).collect();
                let last = sets
                    .iter()
                    .map(|s| s.created_at)
                    .max()
                    .unwrap_or(Timestamp(0));
                Ok(Plan::new(
                    format!("sets:{}:{}", names.join(","), last.0),
                    last,
                ))
            }
            DocKind::CapabilityList(set) => {
                let created = self.known_set(set).await?;
                let extra = self.advertised(set);
                let changed = extra.iter().map(|e| e.2).max().unwrap_or(created);
                let extra: Vec<String> = extra
                    .into_iter()
                    .map(|(c, u, _)| format!("{c}={u}"))
                    .collect();
                Ok(Plan::new(
                    format!("{}:capabilitylist:{}", created.0, extra.join(",")),
                    created.max(changed),
                ))
            }
            DocKind::ResourceList(set) | DocKind::ResourceListPart(set, _) => {
                let created = self.known_set(set).await?.0;
                let latest_change = self
                    .store
                    .changelists(set)
                    .await?
                    .iter()
                    .filter_map(|l| l.last_change)
                    .max();
                let parts: Vec<PartInfo> = self
                    .store
                    .parts(set)
                    .await?
                    .into_iter()
                    .filter(|p| p.count > 0)
                    .collect();
                let indexed = parts.len() > 1;
                let part = match kind {
                    DocKind::ResourceListPart(_, no) => {
                        Some(parts.iter().find(|p| p.no == *no).cloned().ok_or_else(|| {
                            SourceError::NotFound(format!(
                                "set {set} has no Resource List part {no}"
                            ))
                        })?)
                    }
                    _ if indexed => None,
                    _ => Some(parts.first().cloned().unwrap_or(PartInfo {
                        no: 0,
                        count: 0,
                        last_seq: 0,
                        last_change: Timestamp(0),
                    })),
                };
                match part {
                    Some(p) => Ok(Plan {
                        // The last change's time too: adopting an external writer's
                        // resource documents changes a part without a change of its own.
                        version: format!(
                            "{created}:part:{}:{}:{}:{indexed}",
                            p.no, p.last_seq, p.last_change.0
                        ),
                        last_modified: p.last_change,
                        part: Some(p),
                        indexed,
                        parts,
                        lists: vec![],
                        latest_change,
                        nav: None,
                    }),
                    None => {
                        let nos: Vec<String> = parts.iter().map(|p| p.no.to_string()).collect();
                        let last = parts
                            .iter()
                            .map(|p| p.last_change)
                            .max()
                            .unwrap_or(Timestamp(0));
                        Ok(Plan {
                            version: format!("{created}:index:{}", nos.join(",")),
                            last_modified: last,
                            part: None,
                            indexed,
                            parts,
                            lists: vec![],
                            latest_change,
                            nav: None,
                        })
                    }
                }
            }
            DocKind::ChangeList(set) | DocKind::ChangeListNo(set, _) => {
                let created = self.known_set(set).await?.0;
                let lists = self.store.changelists(set).await?;
                let indexed = lists.len() > 1;
                let list = match kind {
                    DocKind::ChangeListNo(_, no) => {
                        Some(lists.iter().find(|l| l.no == *no).cloned().ok_or_else(|| {
                            SourceError::NotFound(format!("set {set} has no Change List {no}"))
                        })?)
                    }
                    _ if indexed => None,
                    _ => lists.first().cloned(),
                };
                // The index lists each list's interval only: it changes when a list is
                // closed or opened, not with every change.
                let version = match &list {
                    Some(l) => format!(
                        "{created}:list:{}:{:?}:{}:{}:{indexed}",
                        l.no, l.until, l.count, l.last_seq
                    ),
                    None => format!(
                        "{created}:clindex:{}",
                        lists
                            .iter()
                            .map(|l| format!("{}/{:?}/{:?}", l.no, l.from, l.until))
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                };
                let last_modified = match &list {
                    Some(l) => l.until.or(l.last_change).unwrap_or(l.from),
                    None => lists
                        .iter()
                        .map(|l| l.until.unwrap_or(l.from))
                        .max()
                        .unwrap_or(Timestamp(0)),
                };
                let lists = list
                    .into_iter()
                    .chain(if indexed { lists } else { vec![] })
                    .collect();
                Ok(Plan {
                    version,
                    last_modified,
                    part: None,
                    indexed,
                    parts: vec![],
                    lists,
                    latest_change: None,
                    nav: None,
                })
            }
            DocKind::Activity(set) | DocKind::ActivityPage(set, _) => {
                let created = self.known_set(set).await?;
                let lists = self.store.changelists(set).await?;
                // Pages are the lists that hold changes: every closed list, and the open
                // one once it has any (a page has at least one activity).
                let pages: Vec<&ChangeListInfo> = lists.iter().filter(|l| l.count > 0).collect();
                let changed = |l: &ChangeListInfo| l.until.or(l.last_change).unwrap_or(l.from);
                match kind {
                    DocKind::ActivityPage(_, no) => {
                        let at = pages.iter().position(|l| l.no == *no).ok_or_else(|| {
                            SourceError::NotFound(format!(
                                "set {set} has no activity page {no} (pages are its Change Lists that hold changes)"
                            ))
                        })?;
                        let l = pages[at];
                        let nav = Nav {
                            start: pages[..at].iter().map(|l| l.count).sum(),
                            total: l.count,
                            prev: at.checked_sub(1).map(|p| pages[p].no),
                            next: pages.get(at + 1).map(|n| n.no),
                        };
                        Ok(Plan {
                            // A closed list's page changes once more: when a later page
                            // first gets its `next`.
                            version: format!(
                                "{}:activitypage:{}:{:?}:{}:{}:{:?}:{:?}:{}",
                                created.0,
                                l.no,
                                l.until,
                                l.count,
                                l.last_seq,
                                nav.prev,
                                nav.next,
                                nav.start
                            ),
                            last_modified: changed(l),
                            lists: vec![l.clone()],
                            nav: Some(nav),
                            ..Plan::new(String::new(), created)
                        })
                    }
                    _ => {
                        let nav = Nav {
                            start: 0,
                            total: pages.iter().map(|l| l.count).sum(),
                            prev: pages.first().map(|l| l.no),
                            next: pages.last().map(|l| l.no),
                        };
                        Ok(Plan {
                            version: format!(
                                "{}:activity:{}:{:?}:{:?}",
                                created.0, nav.total, nav.prev, nav.next
                            ),
                            last_modified: pages.last().map_or(created, |l| changed(l)),
                            nav: Some(nav),
                            ..Plan::new(String::new(), created)
                        })
                    }
                }
            }
        }
    }

    /// The page of `kind` (cache key `key`) as `plan` says.
    async fn generate(
        &self,
        kind: &DocKind,
        key: &str,
        plan: &Plan,
    ) -> Result<Gen<Pages>, SourceError> {
        // A Resource List's `at` is just after the newest change it reflects (L + 1µs) when
        // that is earlier than now. A change stamped before now but committed after this read
        // is dated after L (the store dates changes strictly increasingly), so it cannot fall
        // between the list and the Change List a destination reads next.
        let now = Timestamp::now();
        let at = plan
            .latest_change
            .map_or(now, |l| Timestamp(l.0 + 1).min(now));
        let out = match kind {
            DocKind::SourceDescription => {
                let describedby = &self.config.source.describedby;
                let oai = format!("{}?verb=Identify", self.urls.oai());
                let mut links: Vec<Ln> = (!describedby.is_empty())
                    .then(|| Ln {
                        rel: "describedby",
                        href: describedby,
                        mime: None,
                    })
                    .into_iter()
                    .collect();
                // The same sets over OAI-PMH (the repository's Identify).
                if self.config.oai.enabled {
                    links.push(Ln {
                        rel: "alternate",
                        href: &oai,
                        mime: Some("text/xml"),
                    });
                }
                let mut w = SitemapWriter::new(
                    Root::Urlset,
                    &Md {
                        capability: Some("description"),
                        ..Md::default()
                    },
                    &links,
                );
                for s in self.sets(false).await?.iter() {
                    let sc = self.set_config(&s.name);
                    let links: Vec<Ln> = sc
                        .describedby
                        .iter()
                        .map(|d| Ln {
                            rel: "describedby",
                            href: &d.href,
                            mime: d.mime.as_deref(),
                        })
                        .collect();
                    w.entry(
                        &self.urls.capability_list(&s.name),
                        None,
                        &Md {
                            capability: Some("capabilitylist"),
                            ..Md::default()
                        },
                        &links,
                    );
                }
                self.gen(w)?.boxed()
            }
            DocKind::CapabilityList(set) => {
                let sc = self.set_config(set);
                let sd = self.urls.source_description();
                let mut links: Vec<Ln> = sc
                    .describedby
                    .iter()
                    .map(|d| Ln {
                        rel: "describedby",
                        href: &d.href,
                        mime: d.mime.as_deref(),
                    })
                    .collect();
                links.push(Ln {
                    rel: "up",
                    href: &sd,
                    mime: None,
                });
                // The set's changes as IIIF Change Discovery activities, and its records
                // over OAI-PMH when it is served there.
                let activity = self.urls.activity(set);
                links.push(Ln {
                    rel: "alternate",
                    href: &activity,
                    mime: Some(activity::MEDIA_TYPE),
                });
                let oai = self
                    .config
                    .oai_format(set.as_str())
                    .filter(|_| self.config.oai.enabled)
                    .map(|f| {
                        format!(
                            "{}?verb=ListRecords&metadataPrefix={}&set={set}",
                            self.urls.oai(),
                            f.metadata_prefix
                        )
                    });
                if let Some(oai) = &oai {
                    links.push(Ln {
                        rel: "alternate",
                        href: oai,
                        mime: Some("text/xml"),
                    });
                }
                let mut w = SitemapWriter::new(
                    Root::Urlset,
                    &Md {
                        capability: Some("capabilitylist"),
                        ..Md::default()
                    },
                    &links,
                );
                w.entry(
                    &self.urls.resource_list(set),
                    None,
                    &Md {
                        capability: Some("resourcelist"),
                        ..Md::default()
                    },
                    &[],
                );
                w.entry(
                    &self.urls.change_list(set),
                    None,
                    &Md {
                        capability: Some("changelist"),
                        ..Md::default()
                    },
                    &[],
                );
                for (capability, url, _) in self.advertised(set) {
                    w.entry(
                        &url,
                        None,
                        &Md {
                            capability: Some(capability),
                            ..Md::default()
                        },
                        &[],
                    );
                }
                if self.config.notify.enabled {
                    // The notification channels: the topic is the <loc>, the hub an rs:ln.
                    let hub = self.config.hub_url();
                    let hub_ln = [Ln {
                        rel: "hub",
                        href: &hub,
                        mime: None,
                    }];
                    let change = self.config.change_topic(set.as_str());
                    let framework = self.config.framework_topic(set.as_str());
                    w.entry(
                        &change,
                        None,
                        &Md {
                            capability: Some("change-notification"),
                            ..Md::default()
                        },
                        &hub_ln,
                    );
                    w.entry(
                        &framework,
                        None,
                        &Md {
                            capability: Some("framework-notification"),
                            ..Md::default()
                        },
                        &hub_ln,
                    );
                }
                self.gen(w)?.boxed()
            }
            DocKind::ResourceList(set) | DocKind::ResourceListPart(set, _) => {
                let up = self.urls.capability_list(set);
                match &plan.part {
                    None => {
                        let mut w = SitemapWriter::new(
                            Root::SitemapIndex,
                            &Md {
                                capability: Some("resourcelist"),
                                at: Some(at),
                                ..Md::default()
                            },
                            &[Ln {
                                rel: "up",
                                href: &up,
                                mime: None,
                            }],
                        );
                        for p in &plan.parts {
                            w.entry(
                                &self.urls.resource_list_part(set, p.no),
                                None,
                                &Md::default(),
                                &[],
                            );
                        }
                        self.gen(w)?.boxed()
                    }
                    Some(part) => self
                        .resource_list_part(set, part, plan.indexed, at, key)
                        .await?
                        .boxed(),
                }
            }
            DocKind::ChangeList(set) | DocKind::ChangeListNo(set, _) => {
                let up = self.urls.capability_list(set);
                match (kind, plan.indexed) {
                    (DocKind::ChangeList(_), true) => {
                        let lists = &plan.lists[..];
                        let mut w = SitemapWriter::new(
                            Root::SitemapIndex,
                            &Md {
                                capability: Some("changelist"),
                                from: lists.first().map(|l| l.from),
                                ..Md::default()
                            },
                            &[Ln {
                                rel: "up",
                                href: &up,
                                mime: None,
                            }],
                        );
                        for l in lists {
                            w.entry(
                                &self.urls.change_list_no(set, l.no),
                                None,
                                &Md {
                                    from: Some(l.from),
                                    until: l.until,
                                    ..Md::default()
                                },
                                &[],
                            );
                        }
                        self.gen(w)?.boxed()
                    }
                    _ => {
                        let list = plan.lists.first().ok_or_else(|| {
                            SourceError::NotFound(format!("set {set} has no Change List"))
                        })?;
                        self.change_list(set, list, plan.indexed).await?.boxed()
                    }
                }
            }
            DocKind::Activity(set) => {
                let nav = plan.nav.expect("an activity plan has its nav");
                let page = |no: Option<u32>| no.map(|n| self.urls.activity_page(set, n));
                let (first, last) = (page(nav.prev), page(nav.next));
                self.gen(activity::ActivityWriter::collection(
                    &self.urls.activity(set),
                    nav.total,
                    first.as_deref(),
                    last.as_deref(),
                ))?
                .boxed()
            }
            DocKind::ActivityPage(set, no) => {
                let list = plan
                    .lists
                    .first()
                    .expect("an activity page plan has its list");
                let nav = plan.nav.expect("an activity plan has its nav");
                self.activity_page(set, *no, list, nav).await?.boxed()
            }
        };
        Ok(out)
    }

    /// A page's generation, with room in front of its entries for the head its writer has
    /// now (a head made again at the end must not be longer).
    fn gen<W: PageWriter>(&self, w: W) -> Result<Gen<W>, SourceError> {
        Ok(Gen {
            spool: self.disk.spool(w.head().len())?,
            w,
            bytes: 0,
            base: None,
        })
    }

    async fn resource_list_part(
        &self,
        set: &SetName,
        part: &PartInfo,
        indexed: bool,
        at: Timestamp,
        key: &str,
    ) -> Result<Gen<SitemapWriter>, SourceError> {
        let sc = Arc::new(self.set_config(set));
        let up = self.urls.capability_list(set);
        let index = self.urls.resource_list(set);
        let mut links = vec![Ln {
            rel: "up",
            href: &up,
            mime: None,
        }];
        if indexed {
            links.push(Ln {
                rel: "index",
                href: &index,
                mime: None,
            });
        }
        let md = |completed| Md {
            capability: Some("resourcelist"),
            at: Some(at),
            completed,
            ..Md::default()
        };
        // Its head is made again with `completed` at the end: begun with the longest one (a
        // time with microseconds), so the page leaves room for it.
        let new = || {
            self.gen(SitemapWriter::new(
                Root::Urlset,
                &md(Some(Timestamp(at.0 | 1))),
                &links,
            ))
        };
        let mut gen = None;
        if part.count > 0 {
            // The last build here, brought up to date: its entries copied where no change
            // touched them since, the others written anew.
            let base = self.bases.lock().expect("bases").get(key).cloned();
            if let Some(base) = base.filter(|b| b.built.last_seq <= part.last_seq) {
                let limit = (part.count as usize / 4).max(self.config.source.store_page_size);
                let built = Built {
                    count: base.built.entries.len(),
                    last_position: base.built.entries.last().map_or(0, |&(p, _)| p),
                };
                if let Some(delta) = self
                    .store
                    .part_delta(set, part.no, base.built.last_seq, built, limit)
                    .await?
                {
                    let (g, sc) = (new()?, sc.clone());
                    gen = blocking(move || Ok(merge(g, &base, delta, &sc)))
                        .await?
                        .inspect(|_| {
                            self.metrics.pages_brought_up_to_date.inc();
                        });
                }
            }
        }
        let mut gen = match gen {
            Some(g) => g,
            None if part.count == 0 => new()?,
            None => self.whole_part(new()?, set, part, sc).await?,
        };
        gen.w.set_header(&md(Some(Timestamp::now())), &links);
        Ok(gen)
    }

    /// Part `part` written whole, with where each entry lies when the store tells positions.
    async fn whole_part(
        &self,
        mut gen: Gen<SitemapWriter>,
        set: &SetName,
        part: &PartInfo,
        sc: Arc<SetConfig>,
    ) -> Result<Gen<SitemapWriter>, SourceError> {
        let limit = self.config.source.store_page_size;
        // Every change up to the part's `last_seq` as planned is in what is read from here on.
        gen.base = Some(Base {
            last_seq: part.last_seq,
            entries: Vec::with_capacity(part.count as usize),
        });
        let mut after = 0;
        loop {
            let Some(items) = self
                .store
                .part_resources(set, part.no, after, limit)
                .await?
            else {
                break;
            };
            let Some(&(last, _)) = items.last() else {
                return Ok(gen);
            };
            after = last;
            let full = items.len() == limit;
            let sc = sc.clone();
            gen = blocking(move || {
                let mut g = gen;
                let mut loc = String::new();
                let base = g.base.as_mut().expect("set above");
                for (pos, r) in &items {
                    let before = g.w.pending();
                    write_resource(&mut g.w, &sc, r, &mut loc);
                    base.entries.push((*pos, (g.w.pending() - before) as u32));
                }
                g.spool_entries()?;
                Ok(g)
            })
            .await?;
            if !full {
                return Ok(gen);
            }
        }
        // A backend without positions: pages of resources, nothing kept for the next build.
        gen.base = None;
        let mut cursor = None;
        loop {
            let page = self
                .store
                .resources(set, Some(part.no), cursor, limit)
                .await?;
            let (items, next) = (page.items, page.next);
            let sc = sc.clone();
            gen = gen
                .write_rows(move |w| {
                    let mut loc = String::new();
                    for r in &items {
                        write_resource(w, &sc, r, &mut loc);
                    }
                })
                .await?;
            match next {
                Some(c) => cursor = Some(c),
                None => return Ok(gen),
            }
        }
    }

    /// Keeps what the next build of `key` can start from, other pages' dropped past
    /// [`BASES_MAX_ENTRIES`] entries in all.
    fn keep_base(&self, key: &str, base: PartBase) {
        let mut bases = self.bases.lock().expect("bases");
        bases.remove(key);
        if base.built.entries.len() > BASES_MAX_ENTRIES {
            return;
        }
        let mut held: usize = bases.values().map(|b| b.built.entries.len()).sum();
        while held + base.built.entries.len() > BASES_MAX_ENTRIES {
            let Some(k) = bases.keys().next().cloned() else {
                break;
            };
            held -= bases.remove(&k).map_or(0, |b| b.built.entries.len());
        }
        bases.insert(key.to_string(), Arc::new(base));
    }

    async fn change_list(
        &self,
        set: &SetName,
        list: &ChangeListInfo,
        indexed: bool,
    ) -> Result<Gen<SitemapWriter>, SourceError> {
        let up = self.urls.capability_list(set);
        let index = self.urls.change_list(set);
        let mut links = vec![Ln {
            rel: "up",
            href: &up,
            mime: None,
        }];
        if indexed {
            links.push(Ln {
                rel: "index",
                href: &index,
                mime: None,
            });
        }
        let md = Md {
            capability: Some("changelist"),
            from: Some(list.from),
            until: list.until,
            ..Md::default()
        };
        let gen = self.gen(SitemapWriter::new(Root::Urlset, &md, &links))?;
        let gen = self.write_changes(gen, set, list, write_change).await?;
        if gen.bytes > SITEMAP_MAX_BYTES {
            tracing::warn!(set = %set, list = list.no, bytes = gen.bytes, "change list exceeds the sitemap size limit");
        }
        Ok(gen)
    }

    /// The activity page of Change List `no`: its changes as activities, oldest first.
    async fn activity_page(
        &self,
        set: &SetName,
        no: u32,
        list: &ChangeListInfo,
        nav: Nav,
    ) -> Result<Gen<activity::ActivityWriter>, SourceError> {
        let page = |n: Option<u32>| n.map(|n| self.urls.activity_page(set, n));
        let (prev, next) = (page(nav.prev), page(nav.next));
        let gen = self.gen(activity::ActivityWriter::page(
            &self.urls.activity_page(set, no),
            &self.urls.activity(set),
            nav.start,
            prev.as_deref(),
            next.as_deref(),
        ))?;
        self.write_changes(gen, set, list, |w, sc, c, loc| {
            loc.clear();
            c.key.to_url(&sc.url_prefix, loc);
            w.activity(c.change, loc, c.datetime);
        })
        .await
    }

    /// Writes the changes of Change List `list` into `gen` with `row`, a store page at a time
    /// (the Change List's entries, the activity page's activities).
    async fn write_changes<W: PageWriter>(
        &self,
        mut gen: Gen<W>,
        set: &SetName,
        list: &ChangeListInfo,
        row: fn(&mut W, &SetConfig, &Change, &mut String),
    ) -> Result<Gen<W>, SourceError> {
        let sc = Arc::new(self.set_config(set));
        let mut cursor = None;
        loop {
            let page = self
                .store
                .changes(
                    set,
                    list.from,
                    list.until,
                    cursor,
                    self.config.source.store_page_size,
                )
                .await?;
            let (items, next) = (page.items, page.next);
            let sc = sc.clone();
            gen = gen
                .write_rows(move |w| {
                    let mut loc = String::new();
                    for c in &items {
                        row(w, &sc, c, &mut loc);
                    }
                })
                .await?;
            match next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        Ok(gen)
    }
}

/// What the page cache needs of a document's writer: a head, the entries taken as they
/// accumulate, a tail (the sitemaps, the activity streams).
trait PageWriter: Send + 'static {
    fn head(&self) -> &str;
    fn take_entries(&mut self) -> String;
    fn tail(&self) -> String;
    fn entries(&self) -> usize;
}

impl PageWriter for SitemapWriter {
    fn head(&self) -> &str {
        SitemapWriter::head(self)
    }
    fn take_entries(&mut self) -> String {
        SitemapWriter::take_entries(self)
    }
    fn tail(&self) -> String {
        SitemapWriter::tail(self)
    }
    fn entries(&self) -> usize {
        SitemapWriter::entries(self)
    }
}

impl PageWriter for activity::ActivityWriter {
    fn head(&self) -> &str {
        activity::ActivityWriter::head(self)
    }
    fn take_entries(&mut self) -> String {
        activity::ActivityWriter::take_entries(self)
    }
    fn tail(&self) -> String {
        activity::ActivityWriter::tail(self)
    }
    fn entries(&self) -> usize {
        activity::ActivityWriter::entries(self)
    }
}

/// Any page's writer, once its entries are written.
type Pages = Box<dyn PageWriter>;

impl PageWriter for Pages {
    fn head(&self) -> &str {
        (**self).head()
    }
    fn take_entries(&mut self) -> String {
        (**self).take_entries()
    }
    fn tail(&self) -> String {
        (**self).tail()
    }
    fn entries(&self) -> usize {
        (**self).entries()
    }
}

/// A page being generated: the writer, and the spool its entries are moved to as they
/// accumulate, so a 50 MB page is never held in memory.
struct Gen<W> {
    w: W,
    spool: Spool,
    /// Entry bytes moved to the spool so far.
    bytes: u64,
    /// Where each entry lies, for the next build (Resource List parts).
    base: Option<Base>,
}

impl<W: PageWriter> Gen<W> {
    fn boxed(self) -> Gen<Pages> {
        Gen {
            w: Box::new(self.w),
            spool: self.spool,
            bytes: self.bytes,
            base: self.base,
        }
    }

    /// Moves the entries written so far to the spool.
    fn spool_entries(&mut self) -> std::io::Result<()> {
        let entries = self.w.take_entries();
        self.bytes += entries.len() as u64;
        self.spool.write(entries.as_bytes())
    }

    /// Formats one batch of rows and spools it, on the blocking pool.
    async fn write_rows(
        self,
        f: impl FnOnce(&mut W) + Send + 'static,
    ) -> Result<Gen<W>, SourceError> {
        blocking(move || {
            let mut g = self;
            f(&mut g.w);
            g.spool_entries()?;
            Ok(g)
        })
        .await
    }
}

/// What a document is generated from (computed before deciding whether to regenerate).
struct Plan {
    version: String,
    last_modified: Timestamp,
    part: Option<PartInfo>,
    indexed: bool,
    parts: Vec<PartInfo>,
    lists: Vec<ChangeListInfo>,
    /// Datetime of the newest change of the set visible when planning.
    latest_change: Option<Timestamp>,
    /// Where an activity page lies (for the collection: its first and last pages).
    nav: Option<Nav>,
}

/// An activity page's place in its collection: the activities before it and in it, its
/// neighbours. For the collection, `prev` and `next` are its first and last pages.
#[derive(Debug, Clone, Copy)]
struct Nav {
    start: u64,
    total: u64,
    prev: Option<u32>,
    next: Option<u32>,
}

impl Plan {
    fn new(version: String, last_modified: Timestamp) -> Plan {
        Plan {
            version,
            last_modified,
            part: None,
            indexed: false,
            parts: vec![],
            lists: vec![],
            latest_change: None,
            nav: None,
        }
    }
}

fn link_urls(sc: &SetConfig, ln: &[Link]) -> Vec<(String, String, Option<String>)> {
    ln.iter()
        .filter_map(|l| match l.href.key(sc) {
            Ok(k) => Some((l.rel.clone(), k.url(&sc.url_prefix), l.mime.clone())),
            Err(e) => {
                tracing::warn!(set = %sc.name, error = %e, "link left out: its href no longer resolves");
                None
            }
        })
        .collect()
}

fn write_resource(w: &mut SitemapWriter, sc: &SetConfig, r: &Resource, loc: &mut String) {
    loc.clear();
    r.key.to_url(&sc.url_prefix, loc);
    let md = Md {
        md5: r.meta.md5.as_deref(),
        length: r.meta.length,
        mime: r.meta.mime.as_deref(),
        ..Md::default()
    };
    if r.meta.ln.is_empty() {
        w.entry(loc, r.meta.lastmod, &md, &[]);
    } else {
        let links = link_urls(sc, &r.meta.ln);
        let lns: Vec<Ln> = links
            .iter()
            .map(|(rel, href, mime)| Ln {
                rel,
                href,
                mime: mime.as_deref(),
            })
            .collect();
        w.entry(loc, r.meta.lastmod, &md, &lns);
    }
}

/// Writes a change entry: `datetime` always, `lastmod` and resource metadata for
/// created/updated entries.
pub fn write_change(w: &mut SitemapWriter, sc: &SetConfig, c: &Change, loc: &mut String) {
    loc.clear();
    c.key.to_url(&sc.url_prefix, loc);
    let deleted = c.change == ChangeType::Deleted;
    let md = Md {
        change: Some(c.change.as_str()),
        datetime: Some(c.datetime),
        md5: if deleted { None } else { c.meta.md5.as_deref() },
        length: if deleted { None } else { c.meta.length },
        mime: if deleted {
            None
        } else {
            c.meta.mime.as_deref()
        },
        ..Md::default()
    };
    let lastmod = if deleted { None } else { c.meta.lastmod };
    if c.meta.ln.is_empty() || deleted {
        w.entry(loc, lastmod, &md, &[]);
    } else {
        let links = link_urls(sc, &c.meta.ln);
        let lns: Vec<Ln> = links
            .iter()
            .map(|(rel, href, mime)| Ln {
                rel,
                href,
                mime: mime.as_deref(),
            })
            .collect();
        w.entry(loc, lastmod, &md, &lns);
    }
}

/// How external writers' documents are keyed and cut (the Elasticsearch backend adopts them).
impl crate::store::SetRules for Source {
    fn key(
        &self,
        set: &SetName,
        location: &crate::model::Location,
    ) -> Result<crate::model::ResourceKey, String> {
        location.key(&self.set_config(set))
    }

    fn policy(&self, set: &SetName) -> ListPolicy {
        self.list_policy(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer() -> SitemapWriter {
        SitemapWriter::new(Root::Urlset, &Md::default(), &[])
    }

    /// Stretches of a last build are copied as they are, what lies between them passed over;
    /// a file whose entries are not where the build left them is refused (the page is then
    /// built whole), not copied.
    #[test]
    fn stretches_are_copied_whole_and_a_file_not_as_built_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            "  <url><loc>a</loc></url>\n",
            "  <url><loc>bb</loc></url>\n",
            "  <url><loc>ccc</loc></url>\n",
        );
        let file = dir.path().join("page");
        std::fs::write(&file, format!("HEAD{a}{b}{c}")).unwrap();
        let len = |e: &str| e.len() as u32;

        let mut old = Stretch::new(std::fs::File::open(&file).unwrap(), 4);
        let mut w = writer();
        old.keep(len(a));
        assert!(old.pass(len(b), &mut w).unwrap());
        old.keep(len(c));
        assert!(old.copy(&mut w).unwrap());
        assert_eq!((w.take_entries(), w.entries()), (format!("{a}{c}"), 2));

        // Lengths that cut the entries elsewhere than where they end.
        let mut old = Stretch::new(std::fs::File::open(&file).unwrap(), 4);
        let mut w = writer();
        old.keep(len(a) + 3);
        old.keep(len(b) - 3);
        assert!(!old.copy(&mut w).unwrap());
        assert_eq!(w.entries(), 0);

        // A file shorter than the build remembered.
        let mut old = Stretch::new(std::fs::File::open(&file).unwrap(), 4);
        old.keep(len(a) + len(b) + len(c) + 1);
        assert!(old.copy(&mut writer()).is_err());
    }
}
