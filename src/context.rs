//! What the server's parts share: the configuration, the store, the metrics, the URL map, the
//! build slots and the capabilities offered beside a set's lists. The collectors, `/oai`, the
//! notifier, dumps, ingest and the workers are handed this plain context; only the HTTP layer
//! and the application hold the page generator (`source`) as well.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use crate::config::{Config, SITEMAP_MAX_BYTES};
use crate::metrics::Metrics;
use crate::model::{SetConfig, SetName, Timestamp};
use crate::store::{ListPolicy, Store};

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

/// Every page build slot is taken and the queue is full: try again shortly (a 503).
#[derive(Debug, Clone, thiserror::Error)]
#[error("every page build slot is taken and the queue is full; try again shortly")]
pub struct Busy;

/// A set's capabilities beside its lists: capability -> (URL, when it last changed).
type Offers = std::collections::BTreeMap<&'static str, (String, Timestamp)>;

/// The shared context (see the module's documentation).
pub struct Context {
    config: Arc<Config>,
    store: Store,
    metrics: Arc<Metrics>,
    urls: Urls,
    /// Build slots (`source.max_concurrent_builds`), shared by the documents and `/oai`'s pages.
    builds: Arc<tokio::sync::Semaphore>,
    /// Builds waiting for a slot (at most `source.max_queued_builds`).
    queued: AtomicUsize,
    /// Capabilities offered beside the lists, per set (`resourcedump`, `changedump` -> URL),
    /// told by the module that builds them: part of the Capability List and its version.
    offers: Mutex<std::collections::BTreeMap<SetName, Offers>>,
    /// Moves on whenever something a document depends on besides the store changed here (a
    /// capability offered or withdrawn, a set created): what was found current before is
    /// looked at again.
    epoch: AtomicU64,
}

impl Context {
    pub fn new(config: Arc<Config>, store: Store, metrics: Arc<Metrics>) -> Context {
        let urls = Urls::new(&config.base_url());
        let builds = Arc::new(tokio::sync::Semaphore::new(
            config.source.max_concurrent_builds,
        ));
        Context {
            config,
            store,
            metrics,
            urls,
            builds,
            queued: AtomicUsize::new(0),
            offers: Default::default(),
            epoch: AtomicU64::new(0),
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The configuration, to keep.
    pub fn config_arc(&self) -> &Arc<Config> {
        &self.config
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The counters the parts add to (the server's, for `/metrics`).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn urls(&self) -> &Urls {
        &self.urls
    }

    pub fn set_config(&self, set: &SetName) -> SetConfig {
        self.config.set_config(set.as_str())
    }

    /// How the store cuts this set's lists.
    pub fn list_policy(&self, set: &SetName) -> ListPolicy {
        list_policy(&self.config, set)
    }

    /// A build slot, waiting in the bounded queue when all are taken; [`Busy`] when the queue
    /// is full. Held for as long as the page is being made (an OAI-PMH page: until it is
    /// written out).
    pub async fn build_slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Busy> {
        if let Ok(p) = self.builds.clone().try_acquire_owned() {
            return Ok(p);
        }
        if self.queued.fetch_add(1, SeqCst) >= self.config.source.max_queued_builds {
            self.queued.fetch_sub(1, SeqCst);
            return Err(Busy);
        }
        self.metrics.build_queue.inc();
        let p = self.builds.clone().acquire_owned().await;
        self.queued.fetch_sub(1, SeqCst);
        self.metrics.build_queue.dec();
        Ok(p.expect("the build semaphore is never closed"))
    }

    /// Offers (`Some(url)`) or withdraws (`None`) a capability of a set beside its lists in
    /// its Capability List; returns whether that changed the Capability List.
    pub fn advertise(&self, set: &SetName, capability: &'static str, url: Option<String>) -> bool {
        let mut all = self.offers.lock().expect("offers");
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
            // Known at once: the Capability List is looked at again by its next reader.
            self.epoch.fetch_add(1, SeqCst);
        }
        changed
    }

    /// The capabilities advertised beside a set's lists, with when each was last changed.
    pub fn advertised(&self, set: &SetName) -> Vec<(&'static str, String, Timestamp)> {
        self.offers
            .lock()
            .expect("offers")
            .get(set)
            .map(|m| m.iter().map(|(k, (u, t))| (*k, u.clone(), *t)).collect())
            .unwrap_or_default()
    }

    /// A set was created here: the next Source Description lists it.
    pub fn set_created(&self) {
        self.epoch.fetch_add(1, SeqCst);
    }

    /// See the field: equal epochs mean nothing besides the store changed in between.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(SeqCst)
    }
}

/// How external writers' documents are keyed and cut (the Elasticsearch backend adopts them).
impl crate::store::SetRules for Context {
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

    fn context() -> (Context, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_embedded(&dir.path().join("db.sqlite")).unwrap();
        (
            Context::new(
                Arc::new(Config::defaults()),
                store,
                Arc::new(Metrics::default()),
            ),
            dir,
        )
    }

    #[test]
    fn an_offer_moves_the_epoch_only_when_it_changes_the_capability_list() {
        let (cx, _d) = context();
        let set = SetName::parse("papers").unwrap();
        let e0 = cx.epoch();
        assert!(cx.advertise(&set, "resourcedump", Some("http://x/rd.xml".into())));
        let e1 = cx.epoch();
        assert!(e1 > e0);
        assert!(!cx.advertise(&set, "resourcedump", Some("http://x/rd.xml".into())));
        assert_eq!(cx.epoch(), e1, "the same offer again changes nothing");
        assert_eq!(cx.advertised(&set).len(), 1);
        assert!(cx.advertise(&set, "resourcedump", None));
        assert!(cx.epoch() > e1);
        assert!(!cx.advertise(&set, "resourcedump", None));
        assert!(cx.advertised(&set).is_empty());
        cx.set_created();
        assert!(cx.epoch() > e1 + 1);
    }
}
