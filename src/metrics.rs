//! Prometheus metrics (`GET /metrics`): counters and a histogram fed as things happen, gauges
//! filled from the store when scraped.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabel {
    /// `memory` or `disk`.
    pub tier: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SetLabel {
    pub set: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CollectorLabel {
    pub collector: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CollectorOutcomeLabel {
    pub collector: String,
    pub outcome: &'static str,
}

pub struct Metrics {
    registry: Registry,
    /// Records a collector has read since it was configured, by outcome (from its saved state).
    pub collect_records: Family<CollectorOutcomeLabel, Gauge>,
    /// When a collector's last run ended well (Unix seconds; 0 before the first).
    pub collect_last_success: Family<CollectorLabel, Gauge>,
    /// 1 while a collector's last run failed or it is stopped (a 401/403), else 0.
    pub collect_failing: Family<CollectorLabel, Gauge>,
    /// 1 while a collector works in this process.
    pub collect_running: Family<CollectorLabel, Gauge>,
    /// Delivery attempts by outcome: delivered, retry, given_up, gone.
    pub deliveries: Family<OutcomeLabel, Counter>,
    /// Duration of delivery attempts.
    pub delivery_seconds: Histogram,
    /// Requests answered 503 because the store was unavailable, and failed background writes.
    pub store_errors: Counter,
    pub queue_depth: Gauge,
    pub subscriptions: Family<StateLabel, Gauge>,
    /// 1 while this process notifies (always on the embedded store; on a shared store, while
    /// it holds the leader lease), else 0.
    pub delivering: Gauge,
    /// Delivery partitions this process holds (on the embedded store, 1: everything).
    pub partitions_held: Gauge,
    /// How long the oldest external document not yet adopted has waited (0 when none).
    pub adoption_lag_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Documents generated, by kind (a page served from the cache is not counted).
    pub pages_built: Family<KindLabel, Counter>,
    /// Resource List pages built from their last build and the changes since, rather than
    /// whole from the store (also counted in `pages_built`).
    pub pages_brought_up_to_date: Counter,
    /// ListRecords pages sent as they were kept on disk, rather than made for their request.
    pub oai_list_pages_kept: Counter,
    /// Page builds waiting for a build slot.
    pub build_queue: Gauge,
    /// Requests nginx sent back (`X-Rshub-No-Accel`) because it could not open the file an
    /// `X-Accel-Redirect` named, answered with the bytes from here. A few over a day are
    /// files removed by hand; a steady stream means nginx does not see the server's paths.
    pub accel_fallbacks: Counter,
    /// Delivery lanes that ended unexpectedly (a panic) and were started again.
    pub lanes_restarted: Counter,
    /// Workers (rollover, notifier, adoption, dumps, collectors) that ended unexpectedly and
    /// were started again.
    pub workers_restarted: Counter,
    /// Bytes held by the page cache, per tier (both forms of every page).
    pub page_cache_bytes: Family<TierLabel, Gauge>,
    /// Requests answered from the page cache, per tier.
    pub page_cache_hits: Family<TierLabel, Counter>,
    /// Age in seconds of the oldest change not yet notified (0 when none), per set.
    pub poller_lag_seconds: Family<SetLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Connections open to the server (at most `server.max_connections`).
    pub open_connections: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("rshub");
        let deliveries = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "deliveries",
            "Delivery attempts by outcome",
            deliveries.clone(),
        );
        let delivery_seconds = Histogram::new([
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ]);
        registry.register(
            "delivery_seconds",
            "Duration of delivery attempts",
            delivery_seconds.clone(),
        );
        let store_errors = Counter::default();
        registry.register(
            "store_errors",
            "Store operations that failed (503 answers, failed background writes)",
            store_errors.clone(),
        );
        let queue_depth = Gauge::default();
        registry.register(
            "queue_depth",
            "Messages waiting for delivery, over all live subscriptions",
            queue_depth.clone(),
        );
        let subscriptions = Family::<StateLabel, Gauge>::default();
        registry.register(
            "subscriptions",
            "Subscriptions by state",
            subscriptions.clone(),
        );
        let pages_built = Family::<KindLabel, Counter>::default();
        registry.register(
            "pages_built",
            "Documents generated (not served from a cache), by kind",
            pages_built.clone(),
        );
        let pages_brought_up_to_date = Counter::default();
        registry.register(
            "pages_brought_up_to_date",
            "Resource List pages built from their last build and the changes since (also in pages_built)",
            pages_brought_up_to_date.clone(),
        );
        let oai_list_pages_kept = Counter::default();
        registry.register(
            "oai_list_pages_kept",
            "OAI-PMH ListRecords pages sent as kept on disk (not made for their request)",
            oai_list_pages_kept.clone(),
        );
        let accel_fallbacks = Counter::default();
        registry.register(
            "accel_fallbacks",
            "Requests nginx sent back because it could not open the file X-Accel-Redirect named (answered with the bytes from here)",
            accel_fallbacks.clone(),
        );
        let lanes_restarted = Counter::default();
        registry.register(
            "lanes_restarted",
            "Delivery lanes that ended unexpectedly and were started again (the admin API's subscription says why)",
            lanes_restarted.clone(),
        );
        let workers_restarted = Counter::default();
        registry.register(
            "workers_restarted",
            "Workers that ended unexpectedly and were started again (the log says which and why)",
            workers_restarted.clone(),
        );
        let build_queue = Gauge::default();
        registry.register(
            "build_queue",
            "Page builds waiting for a build slot",
            build_queue.clone(),
        );
        let page_cache_bytes = Family::<TierLabel, Gauge>::default();
        registry.register(
            "page_cache_bytes",
            "Bytes held by the page cache (identity and gzip forms), per tier",
            page_cache_bytes.clone(),
        );
        let page_cache_hits = Family::<TierLabel, Counter>::default();
        registry.register(
            "page_cache_hits",
            "Documents served from the page cache without a build, per tier",
            page_cache_hits.clone(),
        );
        let delivering = Gauge::default();
        registry.register(
            "delivering",
            "1 while this process notifies (holds the leader lease on a shared store)",
            delivering.clone(),
        );
        let adoption_lag_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "adoption_lag_seconds",
            "How long the oldest document written straight into Elasticsearch and not yet adopted has waited (0 when none)",
            adoption_lag_seconds.clone(),
        );
        let partitions_held = Gauge::default();
        registry.register(
            "partitions_held",
            "Delivery partitions this process holds (1 on the embedded store: everything)",
            partitions_held.clone(),
        );
        let poller_lag_seconds =
            Family::<SetLabel, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "poller_lag_seconds",
            "Age of the oldest change not yet notified, per set",
            poller_lag_seconds.clone(),
        );
        let open_connections = Gauge::default();
        registry.register(
            "open_connections",
            "Connections open to the server (at most server.max_connections; more wait to be accepted)",
            open_connections.clone(),
        );
        let collect_records = Family::<CollectorOutcomeLabel, Gauge>::default();
        registry.register(
            "collect_records",
            "Records an OAI-PMH collector has read since it was configured, by outcome (seen, created, updated, deleted, unchanged, quarantined)",
            collect_records.clone(),
        );
        let collect_last_success = Family::<CollectorLabel, Gauge>::default();
        registry.register(
            "collect_last_success_timestamp_seconds",
            "When the collector's last run ended well (Unix seconds; 0 before the first)",
            collect_last_success.clone(),
        );
        let collect_failing = Family::<CollectorLabel, Gauge>::default();
        registry.register(
            "collect_failing",
            "1 while the collector's last run failed or it is stopped by a 401/403, else 0",
            collect_failing.clone(),
        );
        let collect_running = Family::<CollectorLabel, Gauge>::default();
        registry.register(
            "collect_running",
            "1 while the collector works in this process",
            collect_running.clone(),
        );
        Metrics {
            collect_records,
            collect_last_success,
            collect_failing,
            collect_running,
            open_connections,
            registry,
            deliveries,
            delivery_seconds,
            store_errors,
            queue_depth,
            subscriptions,
            delivering,
            partitions_held,
            adoption_lag_seconds,
            pages_built,
            pages_brought_up_to_date,
            oai_list_pages_kept,
            build_queue,
            accel_fallbacks,
            lanes_restarted,
            workers_restarted,
            page_cache_bytes,
            page_cache_hits,
            poller_lag_seconds,
        }
    }
}

impl Metrics {
    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }
}
