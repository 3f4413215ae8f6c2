//! The WebSub hub: subscription requests and verification of intent, publishing (thin and fat
//! pings, and internal publishes), signed distribution with per-subscriber ordered queues,
//! retries and leases. Everything that must survive a crash lives in the store; this module
//! holds only queues that are rebuilt from it at start. It never imports axum.
//!
//! Concurrency: every subscription has one *lane*, a task delivering its queue in order, so a
//! failing subscriber holds up only itself. A lane's queue is its topic's message log after its
//! cursor, read a bounded batch at a time; published messages are also handed to it directly.
//! Publishing (the store write and the hand-off) is serialised by its own async mutex, so lanes
//! receive messages in number order; the lane map is a plain mutex never held across I/O, so
//! verification, removal and admin calls never wait on a publish's store write.
//!
//! Steering (`steer`): a lane whose subscription is held (paused, or disabled after failing for
//! `hub.disable_after_secs`) sends nothing and its queue waits in the log; a lane paces itself
//! to the subscriber's rate limit and slows down on overload answers (`delivery`). A lane's
//! way to its receiver (`auth`): the hub's client, or one with the subscription's client
//! certificate, and its OAuth2 token.

pub mod admin;
mod auth;
mod delivery;
mod partition;
mod policy;
mod request;
mod steer;
mod verify;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use crate::model::websub::{signature, SignatureAlg};
pub use auth::Clients;
pub use partition::assign;
pub use policy::{guarded_client, is_internal, AddressPolicy};
pub use request::{link_targets, parse_form, HubRequest, SubscribeRequest, MAX_SECRET_BYTES};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::model::websub as model;
use crate::model::Timestamp;
use crate::store::{NotifyState, Store, StoreError};
use delivery::Lane;
use model::{Intent, IntentMode, SubscriptionId, Topic, TopicInfo};

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    TooManyRequests(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// Over a bound of work in flight: try again shortly (503 with Retry-After).
    #[error("{0}")]
    Busy(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The hub's settings, taken from `[hub]` and `[server]` once at start.
#[derive(Debug, Clone)]
pub struct HubSettings {
    pub hub_url: String,
    pub topic_base: String,
    pub base_url: String,
    pub alg: SignatureAlg,
    /// Signed deliveries also carry the Standard Webhooks signature.
    pub standard_webhooks: bool,
    pub lease_default: u64,
    pub lease_min: u64,
    pub lease_max: u64,
    pub topic_prefixes: Vec<String>,
    pub retry_schedule: Vec<Duration>,
    pub retry_jitter: f64,
    pub max_retry_after: Duration,
    pub request_timeout: Duration,
    pub max_concurrent: usize,
    /// An attempt longer than this makes its subscriber "slow" (the suspect pool).
    pub slow_delivery: Duration,
    pub max_per_host: usize,
    pub max_body_bytes: usize,
    pub requests_per_minute: u32,
    pub requests_per_host_per_minute: u32,
    pub max_subscriptions_per_host: u64,
    pub max_verifications: usize,
    pub max_verifications_per_host: usize,
    pub history: Duration,
    /// Messages are kept at least this long (redelivery windows start no earlier).
    pub retention: Duration,
    /// Delivery partitions wanted on a shared store (the store's count wins).
    pub partitions: u32,
    pub partition_lease: Duration,
    /// How long a subscription's previous secret still signs deliveries after a new one.
    pub secret_grace: Duration,
    /// A subscription failing this long with no success is disabled (`None`: never).
    pub disable_after: Option<Duration>,
    /// Deliveries a second at most to a subscription without its own limit (`None`: none).
    pub max_per_sec: Option<f64>,
}

impl HubSettings {
    pub fn from_config(c: &Config) -> HubSettings {
        let h = &c.hub;
        HubSettings {
            hub_url: c.hub_url(),
            topic_base: c.topic_base(),
            base_url: c.base_url(),
            alg: h.signature_algorithm,
            standard_webhooks: h.standard_webhooks,
            lease_default: h.lease_default_secs,
            lease_min: h.lease_min_secs,
            lease_max: h.lease_max_secs,
            topic_prefixes: h.topic_prefixes.clone(),
            retry_schedule: h
                .retry_schedule_secs
                .iter()
                .map(|s| Duration::from_secs(*s))
                .collect(),
            retry_jitter: h.retry_jitter,
            max_retry_after: Duration::from_secs(h.max_retry_after_secs),
            request_timeout: Duration::from_secs(h.request_timeout_secs),
            max_concurrent: h.max_concurrent_deliveries,
            slow_delivery: Duration::from_millis(h.slow_delivery_ms),
            max_per_host: h.max_concurrent_deliveries_per_host,
            max_body_bytes: h.max_body_bytes,
            requests_per_minute: h.requests_per_callback_per_minute,
            requests_per_host_per_minute: h.requests_per_host_per_minute,
            max_subscriptions_per_host: h.max_subscriptions_per_host,
            max_verifications: h.max_concurrent_verifications,
            max_verifications_per_host: h.max_verifications_per_host,
            history: Duration::from_secs(h.history_days * 86_400),
            retention: Duration::from_secs(h.retention_hours * 3_600),
            partitions: h.partitions,
            secret_grace: Duration::from_secs(h.secret_grace_secs),
            max_per_sec: (h.max_per_sec_per_subscriber > 0.0)
                .then_some(h.max_per_sec_per_subscriber),
            disable_after: (h.disable_after_secs > 0)
                .then(|| Duration::from_secs(h.disable_after_secs)),
            partition_lease: Duration::from_secs(h.partition_lease_secs),
        }
    }

    /// The lease granted for a requested one: the default when none, else clamped.
    pub fn lease(&self, requested: Option<u64>) -> u64 {
        requested
            .unwrap_or(self.lease_default)
            .clamp(self.lease_min, self.lease_max)
    }

    /// Whether the topic is one this hub serves itself.
    pub fn is_own_topic(&self, topic: &Topic) -> bool {
        topic.as_str().starts_with(&format!("{}/", self.topic_base))
    }

    /// Why a subscription to `topic` is refused by policy, if it is.
    pub fn topic_refusal(&self, topic: &Topic) -> Option<String> {
        if self.topic_prefixes.is_empty() || self.is_own_topic(topic) {
            return None;
        }
        if self
            .topic_prefixes
            .iter()
            .any(|p| topic.as_str().starts_with(p.as_str()))
        {
            return None;
        }
        Some("this hub does not relay that topic".into())
    }

    /// The wait before retry number `attempt` (1-based), stretched by `random` in [0, 1)
    /// through the jitter, and at least the subscriber's `Retry-After` (capped). `None` when
    /// the schedule is exhausted.
    pub fn retry_delay(
        &self,
        attempt: u32,
        retry_after: Option<Duration>,
        random: f64,
    ) -> Option<Duration> {
        let base = *self.retry_schedule.get(attempt.checked_sub(1)? as usize)?;
        let factor = 1.0 + self.retry_jitter * (2.0 * random - 1.0);
        let wait = base.mul_f64(factor.max(0.0));
        Some(match retry_after {
            Some(ra) => wait.max(ra.min(self.max_retry_after)),
            None => wait,
        })
    }
}

/// A uniformly random number in [0, 1).
pub fn random_unit() -> f64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the OS random source works");
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}

/// A random single-use challenge: 32 hex digits from the OS random source.
pub fn challenge() -> String {
    crate::digest::random_hex().expect("the OS random source works")
}

/// Keys (callbacks, callback addresses) tracked at most by a [`RateLimiter`]: past this, those
/// not heard from lately are forgotten first, and at the cap a new key shares one budget with
/// every other newcomer (a flood of fresh keys costs a fixed amount of memory).
const LIMITED_KEYS_MAX: usize = 100_000;

/// Requests a minute per key, by `governor` (a burst of the minute's budget, then one as
/// each share of the minute passes), with at most [`LIMITED_KEYS_MAX`] keys tracked.
pub struct RateLimiter {
    keyed: governor::DefaultKeyedRateLimiter<String>,
}

impl RateLimiter {
    pub fn new(per_minute: u32) -> RateLimiter {
        let quota = governor::Quota::per_minute(
            std::num::NonZeroU32::MIN.saturating_add(per_minute.saturating_sub(1)),
        );
        RateLimiter {
            keyed: governor::RateLimiter::keyed(quota),
        }
    }

    /// Counts a request; `Err(seconds until one more is allowed)` when over the limit.
    pub fn check(&self, key: &str) -> Result<(), u64> {
        let mut key = key;
        if self.keyed.len() >= LIMITED_KEYS_MAX {
            self.keyed.retain_recent();
            if self.keyed.len() >= LIMITED_KEYS_MAX {
                key = "";
            }
        }
        let Err(not_until) = self.keyed.check_key(&key.to_string()) else {
            return Ok(());
        };
        use governor::clock::{Clock as _, DefaultClock};
        Err(not_until
            .wait_time_from(DefaultClock::default().now())
            .as_secs()
            .max(1))
    }
}

/// Verifications requested and not finished: in all and per callback address.
#[derive(Default)]
struct Verifying {
    by_key: Mutex<HashMap<String, usize>>,
}

/// A verification's place in [`Verifying`], given back when dropped.
struct Ticket {
    of: Arc<Verifying>,
    key: String,
}

impl Verifying {
    /// A place for one more verification for `key`, or 503 when `total` are waiting or in
    /// flight already, or `per_key` for this address.
    fn reserve(
        self: &Arc<Self>,
        key: &str,
        total: usize,
        per_key: usize,
    ) -> Result<Ticket, HubError> {
        let mut m = self.by_key.lock().expect("verifying lock");
        let all: usize = m.values().sum();
        let here = m.get(key).copied().unwrap_or(0);
        if here >= per_key {
            return Err(HubError::Busy(format!(
                "{here} verifications for callbacks at {key} are waiting or in flight (hub.max_verifications_per_host); try again shortly"
            )));
        }
        if all >= total {
            return Err(HubError::Busy(format!(
                "{all} verifications are waiting or in flight; try again shortly"
            )));
        }
        *m.entry(key.to_string()).or_default() += 1;
        Ok(Ticket {
            of: self.clone(),
            key: key.to_string(),
        })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut m = self.of.by_key.lock().expect("verifying lock");
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

pub struct Hub {
    settings: HubSettings,
    store: Store,
    /// Its HTTP clients and the address policy they go through.
    clients: auth::Clients,
    /// The lanes: a plain mutex, never held across I/O (only to look lanes up, start, stop
    /// or feed them).
    lanes: Mutex<HashMap<SubscriptionId, Lane>>,
    /// Serialises publishing (the store write and the hand-off to the lanes), so that lanes
    /// receive messages in number order; nothing else waits on it.
    publish_order: tokio::sync::Mutex<()>,
    /// Delivery outcomes on their way to the store (bounded: see `OUTCOME_BUFFER`).
    outcomes: mpsc::Sender<delivery::Recording>,
    /// Delivery slots of healthy subscribers.
    permits: Arc<Semaphore>,
    /// Delivery slots of new, failing and slow subscribers: hung callbacks wait here, never
    /// in the healthy pool.
    suspect_permits: Arc<Semaphore>,
    /// Delivery slots per callback host.
    host_permits: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// Lanes' log reads under way (`delivery::LOG_READS`).
    log_reads: Semaphore,
    /// Messages lanes hold, by number: lanes reading the same part of the log share one copy.
    loaded: Mutex<HashMap<model::MessageId, std::sync::Weak<model::Message>>>,
    limiter: RateLimiter,
    host_limiter: RateLimiter,
    /// Verifications in flight (`hub.max_concurrent_verifications`); the rest wait here.
    verify_permits: Arc<Semaphore>,
    /// Verifications waiting or in flight: in all, and per callback address (the requests'
    /// own, counted while their tickets live).
    verifying: Arc<Verifying>,
    /// Stops lanes, verifications and fetches.
    cancel: CancellationToken,
    tasks: TaskTracker,
    writer_stop: CancellationToken,
    writer: Mutex<Option<JoinHandle<()>>>,
    metrics: Arc<Metrics>,
    attempts: admin::AttemptLog,
    /// Attempts per minute over the last hour (the console's chart).
    minutes: Mutex<std::collections::VecDeque<admin::Minute>>,
    /// How this process shares the store with others: leadership and delivery partitions.
    sharing: partition::Sharing,
    /// When a failing subscription is disabled, and whom that is told (`hub.operator_webhook`).
    steering: steer::Steering,
    /// Lanes of this process that ended unexpectedly and were started again.
    lane_failures: Mutex<HashMap<model::SubscriptionId, LaneFailure>>,
}

/// A delivery lane that ended unexpectedly (and was started again): how often, when last, why.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct LaneFailure {
    pub restarts: u32,
    pub last_at: String,
    pub last_reason: String,
}

/// Outcomes buffered for the writer before lanes wait for it.
const OUTCOME_BUFFER: usize = 10_000;

/// On a shared store one process at a time notifies (and redoes stale verifications, adopts
/// external writes, builds dumps): the holder of this lease. Delivery is spread over the
/// processes by partition (see [`partition`]).
const DELIVERY_LEASE: &str = "delivery";
/// How long the lease lasts unrenewed: a dead holder is replaced after at most this.
const LEASE_SECS: u64 = 10;
const RENEW_EVERY: Duration = Duration::from_secs(2);
/// How often a process that delivers picks up subscriptions and messages other processes wrote.
const SYNC_EVERY: Duration = Duration::from_millis(250);

/// How the hub's HTTP clients are made (deliveries, verifications, topic fetches, tokens).
fn client_builder(policy: &Arc<AddressPolicy>, timeout: Duration) -> reqwest::ClientBuilder {
    policy::guarded_client(
        policy,
        concat!(
            "resourcesync-hub/",
            env!("CARGO_PKG_VERSION"),
            " (WebSub hub)"
        ),
    )
    .no_gzip()
    // The hub retries on its own schedule; reqwest's retries are for HTTP/2's refusals (not
    // spoken here), and its policy copies every request's headers in case it retries.
    .retry(reqwest::retry::never().max_retries_per_request(0))
    .timeout(timeout)
    .connect_timeout(timeout.min(Duration::from_secs(5)))
    .pool_idle_timeout(Duration::from_secs(60))
}

impl Hub {
    /// Builds the hub, restores every subscription's queue from the store and restarts
    /// verifications that were under way.
    pub async fn start(config: &Config, store: Store) -> anyhow::Result<Arc<Hub>> {
        let settings = HubSettings::from_config(config);
        let proxy = (!config.hub.egress_proxy.is_empty())
            .then(|| url::Url::parse(&config.hub.egress_proxy))
            .transpose()?;
        let policy = Arc::new(AddressPolicy::new(&config.hub.allow_networks).through(proxy));
        let clients = auth::Clients::new(policy, settings.request_timeout)?;
        let steering = steer::Steering::from_config(config, settings.disable_after)?;
        let (tx, rx) = mpsc::channel(OUTCOME_BUFFER);
        let writer_stop = CancellationToken::new();
        let metrics = Arc::new(Metrics::default());
        let sharing =
            partition::Sharing::new(store.clone(), metrics.clone(), settings.partition_lease);
        let writer = tokio::spawn(delivery::run_writer(
            store.clone(),
            rx,
            writer_stop.clone(),
            metrics.clone(),
        ));
        let hub = Arc::new(Hub {
            permits: Arc::new(Semaphore::new(settings.max_concurrent)),
            suspect_permits: Arc::new(Semaphore::new((settings.max_concurrent / 4).max(1))),
            host_permits: Mutex::new(HashMap::new()),
            log_reads: Semaphore::new(delivery::LOG_READS),
            loaded: Mutex::new(HashMap::new()),
            limiter: RateLimiter::new(settings.requests_per_minute),
            host_limiter: RateLimiter::new(settings.requests_per_host_per_minute),
            verify_permits: Arc::new(Semaphore::new(settings.max_verifications)),
            verifying: Default::default(),
            settings,
            store,
            clients,
            lanes: Mutex::new(HashMap::new()),
            publish_order: tokio::sync::Mutex::new(()),
            outcomes: tx,
            cancel: CancellationToken::new(),
            tasks: TaskTracker::new(),
            writer_stop,
            writer: Mutex::new(Some(writer)),
            metrics,
            attempts: Mutex::new(std::collections::VecDeque::new()),
            lane_failures: Mutex::new(HashMap::new()),
            minutes: Mutex::new(std::collections::VecDeque::new()),
            sharing,
            steering,
        });
        if hub.store.is_shared() {
            let leader = hub.clone();
            hub.tasks
                .spawn(async move { leader.run_leadership().await });
            let deliverer = hub.clone();
            hub.tasks
                .spawn(async move { deliverer.run_partitions().await });
        } else {
            hub.sharing.delivering.store(true, Ordering::SeqCst);
            hub.restore_lanes().await?;
            hub.restore_intents(None).await?;
        }
        let pruner = hub.clone();
        hub.tasks.spawn(async move { pruner.run_pruner().await });
        Ok(hub)
    }

    /// Whether this process delivers and notifies (see [`DELIVERY_LEASE`]).
    /// This process's name in leases on a shared store.
    pub fn owner(&self) -> &str {
        &self.sharing.owner
    }

    /// Whether (and why) the subscription's lane in this process ended unexpectedly.
    pub fn lane_failure(&self, id: model::SubscriptionId) -> Option<LaneFailure> {
        self.lane_failures
            .lock()
            .expect("the lane failures")
            .get(&id)
            .cloned()
    }

    pub fn is_delivering(&self) -> bool {
        self.sharing.delivering.load(Ordering::SeqCst)
    }

    /// Starts a lane for every subscription (one process: the embedded store).
    async fn restore_lanes(self: &Arc<Self>) -> Result<(), StoreError> {
        let subs = self.store.hub_subscriptions().await?;
        // Lanes read their own queues from the log; messages after this one reach them as
        // they are published.
        let last = self.store.hub_last_message().await?;
        let subscriptions = {
            let mut lanes = self.lanes();
            self.sharing.synced_through.store(last, Ordering::SeqCst);
            for sub in subs {
                // Restored subscribers start healthy unless they were failing.
                let suspect = sub.attempts > 0;
                lanes.insert(
                    sub.id,
                    Lane::spawn(self, sub, suspect, self.sharing.everything.clone()),
                );
            }
            lanes.len()
        };
        // What the lanes will read from the log (a count, not the messages).
        let pending = self.store.hub_totals(Timestamp::now()).await?.queue_depth;
        tracing::info!(
            subscriptions,
            pending_deliveries = pending,
            hub = %self.settings.hub_url,
            "hub started"
        );
        Ok(())
    }

    /// Redoes verifications (on a shared store, only those older than `intents_older_than`:
    /// younger ones are under way in another process).
    async fn restore_intents(
        self: &Arc<Self>,
        intents_older_than: Option<Duration>,
    ) -> Result<(), StoreError> {
        let mut intents = self.store.hub_intents().await?;
        if let Some(age) = intents_older_than {
            let cut = Timestamp::now().micros() - age.as_micros() as i64;
            intents.retain(|i| i.requested_at.micros() < cut);
        }
        if !intents.is_empty() {
            tracing::info!(
                verifications = intents.len(),
                "verifications under way before a stop: redoing them"
            );
        }
        for intent in intents {
            self.spawn_verification(intent);
        }
        Ok(())
    }

    /// On a shared store: holds or waits for the leader lease (notifying, stale verifications,
    /// adoption); delivery is [`Hub::run_partitions`]'s.
    async fn run_leadership(self: Arc<Self>) {
        let mut last_renewal: Option<Instant> = None;
        let mut tick = tokio::time::interval(SYNC_EVERY);
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            if last_renewal.is_none_or(|t| t.elapsed() >= RENEW_EVERY) || !self.is_delivering() {
                match self
                    .store
                    .lease(DELIVERY_LEASE, &self.sharing.owner, LEASE_SECS)
                    .await
                {
                    Ok(true) => {
                        last_renewal = Some(Instant::now());
                        if !self.is_delivering() {
                            self.take_over().await;
                        }
                    }
                    Ok(false) => {
                        last_renewal = None;
                        if self.is_delivering() {
                            tracing::warn!(
                                "the leader lease passed to another process: no longer notifying"
                            );
                            self.stand_down().await;
                        }
                    }
                    Err(e) => {
                        self.metrics.store_errors.inc();
                        tracing::warn!(error = %e, "renewing the leader lease failed");
                        // Stop before another process may have taken over.
                        if self.is_delivering()
                            && last_renewal.is_none_or(|t| {
                                t.elapsed() >= Duration::from_secs(LEASE_SECS) - 2 * RENEW_EVERY
                            })
                        {
                            tracing::warn!("leader lease about to lapse: no longer notifying");
                            self.stand_down().await;
                        }
                    }
                }
            }
        }
    }

    async fn take_over(self: &Arc<Self>) {
        self.sharing.delivering.store(true, Ordering::SeqCst);
        tracing::info!(owner = %self.sharing.owner, "this process holds the leader lease: notifying");
        if let Err(e) = self.restore_intents(Some(Duration::from_secs(30))).await {
            tracing::warn!(error = %e, "hub: redoing verifications failed");
        }
    }

    async fn stand_down(&self) {
        self.sharing.delivering.store(false, Ordering::SeqCst);
    }

    /// Brings the lanes in line with the store: lanes for new subscriptions, none for removed
    /// ones, renewals handed over, messages from other processes queued (a lane skips what it
    /// already has).
    async fn sync(self: &Arc<Self>) -> Result<(), StoreError> {
        let started = tokio::time::Instant::now();
        let subs = self.store.hub_subscriptions().await?;
        let all: HashSet<SubscriptionId> = subs.iter().map(|s| s.id).collect();
        {
            let grants: Vec<(model::Subscription, Option<Arc<partition::Grant>>)> = subs
                .into_iter()
                .map(|s| {
                    let g = self.sharing.grant_for(s.id);
                    (s, g)
                })
                .collect();
            let mut lanes = self.lanes();
            let ids: HashSet<SubscriptionId> = grants
                .iter()
                .filter(|(_, g)| g.is_some())
                .map(|(s, _)| s.id)
                .collect();
            lanes.retain(|id, lane| {
                !lane.grant.is_lost() && (ids.contains(id) || lane.born > started)
            });
            for (sub, grant) in grants {
                let Some(grant) = grant else { continue };
                match lanes.get_mut(&sub.id) {
                    Some(lane) => {
                        if lane.renewed(&sub) {
                            lane.update(sub);
                        }
                    }
                    None => {
                        let suspect = sub.attempts > 0;
                        lanes.insert(sub.id, Lane::spawn(self, sub, suspect, grant));
                    }
                }
            }
        }
        // Messages other processes appended since the last look: only those are read.
        {
            let _order = self.publish_order.lock().await;
            self.dispatch_new(Timestamp::now()).await?;
        }
        self.take_redeliveries(&all).await
    }

    /// The lane map (a short critical section: never held across an await).
    fn lanes(&self) -> std::sync::MutexGuard<'_, HashMap<SubscriptionId, Lane>> {
        self.lanes.lock().expect("the lane map")
    }

    pub fn settings(&self) -> &HubSettings {
        &self.settings
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// On a shared store, the live delivering processes as this one last saw them, each with
    /// the partitions it is assigned (this process's name is [`Hub::owner`]); empty alone.
    pub fn processes(&self) -> Vec<(String, usize)> {
        self.sharing.processes()
    }

    /// Delivery partitions held now (1 on the embedded store).
    pub fn partitions_held(&self) -> usize {
        self.sharing.partitions_held()
    }

    /// Its HTTP clients, the address policy they go through and the check of a delivery auth.
    pub fn clients(&self) -> &Clients {
        &self.clients
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Handles a subscribe or unsubscribe request: checks it, records the intent and starts
    /// verification (or a denial) in the background. The caller answers 202.
    pub async fn request(
        self: &Arc<Self>,
        mode: IntentMode,
        req: SubscribeRequest,
    ) -> Result<(), HubError> {
        let cb_url = req.callback.url();
        self.clients
            .policy()
            .check_url(&cb_url, "hub.callback")
            .map_err(HubError::BadRequest)?;
        if !self.settings.is_own_topic(&req.topic) {
            self.clients
                .policy()
                .check_url(&req.topic.url(), "hub.topic")
                .map_err(HubError::BadRequest)?;
        }
        if let Err(wait) = self.limiter.check(req.callback.as_str()) {
            return Err(HubError::TooManyRequests(format!(
                "too many requests for this callback; try again in {wait} seconds"
            )));
        }
        let host = cb_url.host_str().unwrap_or("").to_ascii_lowercase();
        // Kept by address: the names of one machine share one budget.
        let key = policy::budget_key(&cb_url).await;
        if let Err(wait) = self.host_limiter.check(&key) {
            return Err(HubError::TooManyRequests(format!(
                "too many requests for callbacks on {host} (address {key}); try again in {wait} seconds"
            )));
        }
        if mode == IntentMode::Subscribe
            && self
                .store
                .hub_subscription(&req.topic, &req.callback)
                .await?
                .is_none()
        {
            // Every subscription whose callback is on this host, whatever the scheme and port
            // (callbacks are kept in normal form: scheme and host in lower case).
            let host = cb_url.host_str().unwrap_or("").to_ascii_lowercase();
            let mut held = 0;
            for scheme in ["http", "https"] {
                for sep in ["/", ":"] {
                    held += self
                        .store
                        .hub_count_callbacks(&format!("{scheme}://{host}{sep}"))
                        .await?;
                }
            }
            if held >= self.settings.max_subscriptions_per_host {
                return Err(HubError::Forbidden(format!(
                    "{host} holds {held} subscriptions already, the most this hub allows one callback host (hub.max_subscriptions_per_host)"
                )));
            }
        }
        let (mode, reason) = match (mode, self.settings.topic_refusal(&req.topic)) {
            (IntentMode::Subscribe, Some(reason)) => (IntentMode::Denied, Some(reason)),
            (m, _) => (m, None),
        };
        let mut intent = Intent {
            id: 0,
            mode,
            lease_secs: self.settings.lease(req.lease_seconds),
            alg: if req.legacy {
                SignatureAlg::Sha1
            } else {
                self.settings.alg
            },
            topic: req.topic,
            callback: req.callback,
            secret: req.secret,
            reason,
            requested_at: Timestamp::now(),
            verify_token: req.verify_token,
        };
        let ticket = self.verifying.reserve(
            &key,
            self.settings.max_verifications * 16,
            self.settings.max_verifications_per_host,
        )?;
        intent.id = self.store.hub_add_intent(intent.clone()).await?;
        tracing::info!(mode = mode.as_str(), topic = %intent.topic, callback = %intent.callback, "hub request accepted");
        self.spawn_verification_with(intent, Some(ticket));
        Ok(())
    }

    fn spawn_verification(self: &Arc<Self>, intent: Intent) {
        self.spawn_verification_with(intent, None)
    }

    /// Verifies in the background, once one of `hub.max_concurrent_verifications` places is
    /// free (hung callbacks hold those places, not descriptors beyond them).
    fn spawn_verification_with(self: &Arc<Self>, intent: Intent, ticket: Option<Ticket>) {
        let hub = self.clone();
        self.tasks.spawn(async move {
            let _ticket = ticket;
            let _place = tokio::select! {
                _ = hub.cancel.cancelled() => return,
                p = hub.verify_permits.clone().acquire_owned() => p,
            };
            tokio::select! {
                _ = hub.cancel.cancelled() => {}
                _ = verify::verify(&hub, intent) => {}
            }
        });
    }

    /// Publishes a payload to a topic: appends it to the log as the topic's latest and hands
    /// it, in order, to every subscription whose lease has not ended. Returns how many.
    pub async fn publish(
        &self,
        topic: Topic,
        content_type: String,
        body: Bytes,
    ) -> Result<usize, StoreError> {
        let counts = self
            .publish_all(vec![(topic, content_type, body)], None)
            .await?;
        Ok(counts[0])
    }

    /// Publishes several payloads in one store transaction (with a notifier state update, see
    /// [`Store::hub_publish`]); returns the subscribers reached per payload.
    pub async fn publish_all(
        &self,
        payloads: Vec<(Topic, String, Bytes)>,
        state: Option<(i64, NotifyState)>,
    ) -> Result<Vec<usize>, StoreError> {
        let _order = self.publish_order.lock().await;
        let now = Timestamp::now();
        let messages = self.store.hub_publish(payloads, state, now).await?;
        if self.store.is_shared() {
            return self.catch_up(&messages, now).await;
        }
        let mut lanes = self.lanes();
        let mut counts = Vec::with_capacity(messages.len());
        for message in messages {
            let message = Arc::new(message);
            let mut n = 0;
            for lane in lanes.values_mut() {
                if lane.wants(&message.topic, now) {
                    lane.push(message.clone());
                    n += 1;
                }
            }
            tracing::debug!(topic = %message.topic, message = message.id, subscribers = n, "published");
            counts.push(n);
        }
        Ok(counts)
    }

    /// On a shared store, other processes (and a notifier's recovered outbox) append to the
    /// log too: lanes take every message after what they have from the log, in number order,
    /// so one published here never overtakes an older one published elsewhere. Returns how
    /// many lanes took each of `messages`.
    async fn catch_up(
        &self,
        messages: &[model::Message],
        now: Timestamp,
    ) -> Result<Vec<usize>, StoreError> {
        let taken = self.dispatch_new(now).await?;
        Ok(messages
            .iter()
            .map(|m| taken.get(&m.id).copied().unwrap_or(0))
            .collect())
    }

    /// Hands the lanes every message appended to the log after the last one handed, in
    /// number order, a bounded batch at a time (a lane keeps what it has room for and reads
    /// the rest from the log itself). Returns how many lanes took each message.
    /// The batch with each message replaced by the copy another lane already holds, if any.
    fn shared(&self, batch: Vec<Arc<model::Message>>) -> Vec<Arc<model::Message>> {
        let mut loaded = self.loaded.lock().expect("loaded lock");
        let out = batch
            .into_iter()
            .map(
                |m| match loaded.get(&m.id).and_then(std::sync::Weak::upgrade) {
                    Some(held) => held,
                    None => {
                        loaded.insert(m.id, Arc::downgrade(&m));
                        m
                    }
                },
            )
            .collect();
        if loaded.len() > 4 * delivery::LANE_BATCH {
            loaded.retain(|_, w| w.strong_count() > 0);
        }
        out
    }

    /// Callers hold `publish_order`.
    async fn dispatch_new(
        &self,
        now: Timestamp,
    ) -> Result<HashMap<model::MessageId, usize>, StoreError> {
        const BATCH: usize = 1000;
        let mut taken: HashMap<model::MessageId, usize> = HashMap::new();
        loop {
            let after = self.sharing.synced_through.load(Ordering::SeqCst);
            let batch = self
                .store
                .hub_messages_after(None, after, BATCH, delivery::LANE_BYTES * 4)
                .await?;
            let mut lanes = self.lanes();
            for m in &batch {
                for lane in lanes.values_mut() {
                    if lane.wants(&m.topic, now) && lane.push(m.clone()) {
                        *taken.entry(m.id).or_default() += 1;
                    }
                }
                self.sharing
                    .synced_through
                    .fetch_max(m.id, Ordering::SeqCst);
            }
            if batch.len() < BATCH {
                return Ok(taken);
            }
        }
    }

    /// A WebSub ping: fetches each topic that has subscribers, in the background, and
    /// publishes what it got with its Content-Type.
    pub fn ping(self: &Arc<Self>, topics: Vec<Topic>) -> Result<(), HubError> {
        for t in &topics {
            // The hub's own topics are published by the hub alone (the notifier, or an
            // authenticated fat ping): an anonymous ping would only make it send the latest
            // payload to every subscriber again.
            if self.settings.is_own_topic(t) {
                return Err(HubError::Forbidden(format!(
                    "{t} is published by this hub itself; a ping for it is refused (it would re-send its latest notification to every subscriber)"
                )));
            }
        }
        for t in &topics {
            {
                self.clients
                    .policy()
                    .check_url(&t.url(), "hub.topic")
                    .map_err(HubError::BadRequest)?;
            }
        }
        for topic in topics {
            let hub = self.clone();
            self.tasks.spawn(async move {
                tokio::select! {
                    _ = hub.cancel.cancelled() => {}
                    _ = hub.fetch_and_publish(topic) => {}
                }
            });
        }
        Ok(())
    }

    async fn fetch_and_publish(&self, topic: Topic) {
        match self.store.hub_topic(&topic).await {
            Ok(Some(info)) if info.subscribers > 0 => {}
            Ok(_) => {
                tracing::info!(topic = %topic, "ping for a topic without subscribers: nothing to do");
                return;
            }
            Err(e) => {
                tracing::error!(topic = %topic, error = %e, "ping not handled");
                return;
            }
        }
        match delivery::fetch(
            self.clients.client(),
            self.clients.policy(),
            &topic,
            self.settings.max_body_bytes,
        )
        .await
        {
            Ok((content_type, body)) => {
                if let Err(e) = self.publish(topic.clone(), content_type, body).await {
                    tracing::error!(topic = %topic, error = %e, "ping not published");
                }
            }
            Err(e) => tracing::warn!(topic = %topic, error = %e, "ping: fetching the topic failed"),
        }
    }

    /// Makes one of the hub's own topics known so that its URI answers before a publish.
    pub async fn register_topic(&self, topic: Topic) -> Result<(), StoreError> {
        self.store.hub_register_topic(topic, Timestamp::now()).await
    }

    pub async fn topic(&self, topic: &Topic) -> Result<Option<TopicInfo>, StoreError> {
        self.store.hub_topic(topic).await
    }

    /// Removes delivered messages and failure records older than `hub.history_days`, hourly.
    async fn run_pruner(&self) {
        loop {
            let before = Timestamp::now().micros() - self.settings.history.as_micros() as i64;
            match self
                .store
                .hub_prune(Timestamp(before), Timestamp::now())
                .await
            {
                Ok(n) if n > 0 => tracing::info!(removed = n, "old messages pruned"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "pruning deliveries failed"),
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
            }
        }
    }

    /// Stops taking work, lets lanes and verifications end (a delivery in flight is dropped
    /// and stays pending), then writes the outcomes still buffered.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        self.stand_down().await;
        self.lanes().clear();
        self.writer_stop.cancel();
        let writer = self.writer.lock().expect("writer handle").take();
        if let Some(w) = writer {
            let _ = w.await;
        }
        // Outcomes are written: another process may take over at once.
        if self.store.is_shared() {
            self.sharing.release_all().await;
            if let Err(e) = self
                .store
                .release(DELIVERY_LEASE, &self.sharing.owner)
                .await
            {
                tracing::warn!(error = %e, "releasing the leader lease failed; it lapses by itself");
            }
        }
    }
}
