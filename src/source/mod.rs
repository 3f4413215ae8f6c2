//! The pull side of ResourceSync: Source Description, Capability Lists, Resource Lists (and their
//! index), Change Lists (and their index), generated from the store on request and kept in a
//! page cache that regenerates a page only when the data under it changed.

mod cache;

use std::sync::Arc;

use bytes::Bytes;
use md5::{Digest, Md5};

pub use cache::PageCache;

use crate::config::{Config, SITEMAP_MAX_BYTES};
use crate::digest::hex_digest;
use crate::model::{Change, ChangeType, Link, Resource, SetConfig, SetName, Timestamp};
use crate::sitemap::{Ln, Md, Root, SitemapWriter};
use crate::store::{ChangeListInfo, ListPolicy, PartInfo, Store, StoreError};

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
        }
    }
}

/// A generated document with its HTTP validators.
#[derive(Debug)]
pub struct Doc {
    pub body: Bytes,
    /// A strong ETag (quoted MD5 of the body).
    pub etag: String,
    pub last_modified: Timestamp,
    /// What the page was generated from; a different version means regenerate.
    version: String,
    /// Number of `<url>`/`<sitemap>` entries.
    pub entries: usize,
    /// The gzip form, made on first request for it.
    gzip: std::sync::OnceLock<Bytes>,
}

impl Doc {
    /// The body gzipped (computed once; CPU-heavy for large pages, so call it off the async
    /// threads).
    pub fn gzipped(&self) -> &Bytes {
        self.gzip.get_or_init(|| {
            use std::io::Write;
            let mut enc = flate2::write::GzEncoder::new(
                Vec::with_capacity(self.body.len() / 4),
                flate2::Compression::fast(),
            );
            enc.write_all(&self.body).expect("writing to memory");
            Bytes::from(enc.finish().expect("writing to memory"))
        })
    }

    pub fn has_gzip(&self) -> bool {
        self.gzip.get().is_some()
    }

    /// The strong ETag of the gzip form: a different representation has a different tag.
    pub fn gzip_etag(&self) -> String {
        format!("{}-gzip\"", self.etag.trim_end_matches('"'))
    }
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
    pub fn ingest(&self, set: &SetName) -> String {
        format!("{}/api/v1/resource-sets/{set}/changes", self.base)
    }
}

/// Generates and caches the documents of every set.
pub struct Source {
    config: Arc<Config>,
    store: Store,
    urls: Urls,
    cache: PageCache,
    metrics: Arc<crate::metrics::Metrics>,
    /// Build slots (`source.max_concurrent_builds`).
    builds: tokio::sync::Semaphore,
    /// Builds waiting for a slot (at most `source.max_queued_builds`).
    queued: std::sync::atomic::AtomicUsize,
    /// One lock per page being built: concurrent requests for it wait for that one build.
    inflight: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Source {
    pub fn new(config: Arc<Config>, store: Store) -> Source {
        Source::with_metrics(config, store, Arc::new(crate::metrics::Metrics::default()))
    }

    /// A source that counts its builds in `metrics` (the server's, for `/metrics`).
    pub fn with_metrics(
        config: Arc<Config>,
        store: Store,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Source {
        let urls = Urls::new(&config.base_url());
        let cache = PageCache::new(config.source.cache_max_bytes);
        let builds = tokio::sync::Semaphore::new(config.source.max_concurrent_builds);
        Source {
            config,
            store,
            urls,
            cache,
            metrics,
            builds,
            queued: std::sync::atomic::AtomicUsize::new(0),
            inflight: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    pub fn urls(&self) -> &Urls {
        &self.urls
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
        let sc = self.set_config(set);
        ListPolicy {
            max_items: sc.max_items_in_list,
            max_bytes: SITEMAP_MAX_BYTES,
            rollover_secs: sc.changelist_rollover_secs,
            max_future_skew_secs: self.config.ingest.max_future_skew_secs,
        }
    }

    pub fn cache(&self) -> &PageCache {
        &self.cache
    }

    /// The document, from the cache when nothing under it changed since it was generated.
    /// Pages are built once however many ask at the same moment (the others wait for that
    /// build), at most `source.max_concurrent_builds` at once, with a bounded queue beyond
    /// which the answer is [`SourceError::Busy`].
    pub async fn document(&self, kind: &DocKind) -> Result<Arc<Doc>, SourceError> {
        let plan = self.plan(kind).await?;
        let key = format!("{kind:?}");
        if let Some(doc) = self.cached(&key, &plan) {
            return Ok(doc);
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
            if let Some(doc) = self.cached(&key, &plan) {
                return Ok(doc);
            }
            let _slot = self.build_slot().await?;
            let (body, entries) = self.generate(kind, &plan).await?;
            self.metrics
                .pages_built
                .get_or_create(&crate::metrics::KindLabel { kind: kind.label() })
                .inc();
            let doc = Arc::new(Doc {
                etag: format!("\"{}\"", hex_digest(Md5::digest(body.as_bytes()))),
                body: Bytes::from(body),
                last_modified: plan.last_modified,
                version: plan.version.clone(),
                entries,
                gzip: std::sync::OnceLock::new(),
            });
            self.cache.insert(key.clone(), doc.clone());
            Ok(doc)
        }
        .await;
        let mut inflight = self.inflight.lock().expect("inflight");
        if Arc::strong_count(&flight) <= 2 {
            inflight.remove(&key);
        }
        result
    }

    fn cached(&self, key: &str, plan: &Plan) -> Option<Arc<Doc>> {
        self.cache.get(key).filter(|d| d.version == plan.version)
    }

    /// A build slot, waiting in the bounded queue when all are taken.
    async fn build_slot(&self) -> Result<tokio::sync::SemaphorePermit<'_>, SourceError> {
        use std::sync::atomic::Ordering::SeqCst;
        if let Ok(p) = self.builds.try_acquire() {
            return Ok(p);
        }
        if self.queued.fetch_add(1, SeqCst) >= self.config.source.max_queued_builds {
            self.queued.fetch_sub(1, SeqCst);
            return Err(SourceError::Busy(
                "every page build slot is taken and the queue is full; try again shortly".into(),
            ));
        }
        self.metrics.build_queue.inc();
        let p = self.builds.acquire().await;
        self.queued.fetch_sub(1, SeqCst);
        self.metrics.build_queue.dec();
        Ok(p.expect("the build semaphore is never closed"))
    }

    async fn known_set(&self, set: &SetName) -> Result<(), SourceError> {
        if self.store.sets().await?.iter().any(|s| &s.name == set) {
            Ok(())
        } else {
            Err(SourceError::NotFound(format!(
                "no resource set named {set:?}"
            )))
        }
    }

    /// Works out, from the store's bookkeeping alone, what a document would be generated from.
    async fn plan(&self, kind: &DocKind) -> Result<Plan, SourceError> {
        match kind {
            DocKind::SourceDescription => {
                let sets = self.store.sets().await?;
                let names: Vec<&str> = sets.iter().map(|s| s.name.as_str()).collect();
                let last = sets
                    .iter()
                    .map(|s| s.created_at)
                    .max()
                    .unwrap_or(Timestamp(0));
                Ok(Plan::new(format!("sets:{}", names.join(",")), last))
            }
            DocKind::CapabilityList(set) => {
                let created = self
                    .store
                    .sets()
                    .await?
                    .into_iter()
                    .find(|s| &s.name == set)
                    .ok_or_else(|| SourceError::NotFound(format!("no resource set named {set:?}")))?
                    .created_at;
                Ok(Plan::new("capabilitylist".into(), created))
            }
            DocKind::ResourceList(set) | DocKind::ResourceListPart(set, _) => {
                self.known_set(set).await?;
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
                        version: format!("part:{}:{}:{indexed}", p.no, p.last_seq),
                        last_modified: p.last_change,
                        part: Some(p),
                        indexed,
                        parts,
                        lists: vec![],
                        latest_change,
                    }),
                    None => {
                        let nos: Vec<String> = parts.iter().map(|p| p.no.to_string()).collect();
                        let last = parts
                            .iter()
                            .map(|p| p.last_change)
                            .max()
                            .unwrap_or(Timestamp(0));
                        Ok(Plan {
                            version: format!("index:{}", nos.join(",")),
                            last_modified: last,
                            part: None,
                            indexed,
                            parts,
                            lists: vec![],
                            latest_change,
                        })
                    }
                }
            }
            DocKind::ChangeList(set) | DocKind::ChangeListNo(set, _) => {
                self.known_set(set).await?;
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
                let version = match &list {
                    Some(l) => format!(
                        "list:{}:{:?}:{}:{}:{indexed}",
                        l.no, l.until, l.count, l.last_seq
                    ),
                    None => format!(
                        "clindex:{}:{}",
                        lists.len(),
                        lists.last().map_or(0, |l| l.last_seq)
                    ),
                };
                let last_modified = match &list {
                    Some(l) => l.until.or(l.last_change).unwrap_or(l.from),
                    None => lists
                        .iter()
                        .filter_map(|l| l.last_change.or(Some(l.from)))
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
                })
            }
        }
    }

    async fn generate(&self, kind: &DocKind, plan: &Plan) -> Result<(String, usize), SourceError> {
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
                let links: Vec<Ln> = (!describedby.is_empty())
                    .then(|| Ln {
                        rel: "describedby",
                        href: describedby,
                        mime: None,
                    })
                    .into_iter()
                    .collect();
                let mut w = SitemapWriter::new(
                    Root::Urlset,
                    &Md {
                        capability: Some("description"),
                        ..Md::default()
                    },
                    &links,
                );
                for s in self.store.sets().await? {
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
                (w.entries(), w.finish())
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
                (w.entries(), w.finish())
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
                        (w.entries(), w.finish())
                    }
                    Some(part) => self.resource_list_part(set, part, plan.indexed, at).await?,
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
                        (w.entries(), w.finish())
                    }
                    _ => {
                        let list = plan.lists.first().ok_or_else(|| {
                            SourceError::NotFound(format!("set {set} has no Change List"))
                        })?;
                        self.change_list(set, list, plan.indexed).await?
                    }
                }
            }
        };
        Ok((out.1, out.0))
    }

    async fn resource_list_part(
        &self,
        set: &SetName,
        part: &PartInfo,
        indexed: bool,
        at: Timestamp,
    ) -> Result<(usize, String), SourceError> {
        let sc = self.set_config(set);
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
        let mut w = SitemapWriter::with_capacity(
            Root::Urlset,
            &md(None),
            &links,
            256 * part.count as usize + 1024,
        );
        let mut loc = String::new();
        let mut cursor = None;
        if part.count > 0 {
            loop {
                let page = self
                    .store
                    .resources(
                        set,
                        Some(part.no),
                        cursor,
                        self.config.source.store_page_size,
                    )
                    .await?;
                for r in &page.items {
                    write_resource(&mut w, &sc, r, &mut loc);
                }
                match page.next {
                    Some(c) => cursor = Some(c),
                    None => break,
                }
            }
        }
        w.set_header(&md(Some(Timestamp::now())), &links);
        Ok((w.entries(), w.finish()))
    }

    async fn change_list(
        &self,
        set: &SetName,
        list: &ChangeListInfo,
        indexed: bool,
    ) -> Result<(usize, String), SourceError> {
        let sc = self.set_config(set);
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
        let mut w = SitemapWriter::with_capacity(
            Root::Urlset,
            &md,
            &links,
            300 * list.count as usize + 1024,
        );
        let mut loc = String::new();
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
            for c in &page.items {
                write_change(&mut w, &sc, c, &mut loc);
            }
            match page.next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        if w.len() as u64 > SITEMAP_MAX_BYTES {
            tracing::warn!(set = %set, list = list.no, bytes = w.len(), "change list exceeds the sitemap size limit");
        }
        Ok((w.entries(), w.finish()))
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
impl crate::store::elastic::SetRules for Source {
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
