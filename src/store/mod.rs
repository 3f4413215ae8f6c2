//! The storage contract every backend fulfils, as two traits ([`SetStore`], and the hub's
//! [`HubStore`]) behind one handle ([`Store`]): resource sets, the current
//! resources of a set in stable partitions with keyset paging, the change log by (datetime, id)
//! with keyset paging, Change List bookkeeping, and one atomic *apply* that writes a resource
//! document and its change document together. No offsets and no in-process joins, so a search
//! engine backend can implement the same calls. The rules of applying a change are one pure
//! planner (`plan`); each backend persists what it plans.

pub mod elastic;
mod embedded;
pub(crate) mod hub;
pub(crate) mod plan;
mod rules;

use std::path::Path;
use std::sync::Arc;

use embedded::EmbeddedStore;
pub use hub::{HubStore, PartitionLease};
pub use rules::SetRules;
pub(crate) use rules::{fold, sub_state};

use crate::model::{Change, NewChange, Resource, ResourceKey, SetName, Timestamp};

/// What went wrong in a store. Each variant's words are whole (a log line or an admin's answer
/// printing it alone loses nothing), and the underlying error stays its `source()`, so
/// [`crate::cause::chain`] prints it once and code can look at it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend cannot do it now (down, unreachable, overloaded): it may pass.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The embedded store's database failed (a full disk, a locked or unreadable file).
    #[error("{what}: {source}")]
    Sqlite {
        what: String,
        #[source]
        source: rusqlite::Error,
    },
    /// A file of the store could not be made, read, written or synced.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// What the store holds is not what it wrote: retrying will not help.
    #[error("store data is corrupt: {0}")]
    Corrupt(String),
    /// An optimistic write lost: someone else changed the record first.
    #[error("conflict: {0}")]
    Conflict(String),
}

impl StoreError {
    /// A file operation of the store that failed, with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> StoreError {
        StoreError::Io {
            what: what.into(),
            source,
        }
    }

    /// Whether the store cannot serve now but may later (a 503 with `Retry-After`), as
    /// opposed to data that is wrong (a 500) or a lost race.
    pub fn may_pass(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_) | StoreError::Sqlite { .. } | StoreError::Io { .. }
        )
    }

    /// The embedded store's database failed at `what` (a corrupt file is [`StoreError::Corrupt`]).
    pub fn sqlite(what: impl Into<String>, e: rusqlite::Error) -> StoreError {
        use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
        match e.sqlite_error_code() {
            Some(DatabaseCorrupt | NotADatabase) => {
                StoreError::Corrupt(format!("{}: {e}", what.into()))
            }
            _ => StoreError::Sqlite {
                what: what.into(),
                source: e,
            },
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::sqlite("embedded store", e)
    }
}

/// Why a batch was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// Change number `index` (0-based) of the batch cannot be applied; nothing was written.
    #[error("change {index}: {reason}")]
    Rejected { index: usize, reason: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How a set's lists are cut, taken from the set's configuration at apply time.
#[derive(Debug, Clone, Copy)]
pub struct ListPolicy {
    pub max_items: u32,
    pub max_bytes: u64,
    /// Close the open Change List once it is this old (0: only when full).
    pub rollover_secs: u64,
    /// How far in the future a change's `datetime` may lie.
    pub max_future_skew_secs: u64,
}

/// The open Change List's running totals, as every backend tracks them while applying.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpenTotals {
    pub from: i64,
    pub count: u64,
    pub bytes: u64,
    pub max_dt: Option<i64>,
}

impl OpenTotals {
    /// When the list closes: after its newest entry, not before now nor its own start, so
    /// every entry lies inside `[from, until)`.
    pub fn close_time(&self, now: Timestamp) -> i64 {
        self.max_dt
            .map_or(now.0, |m| now.0.max(m + 1))
            .max(self.from)
    }
}

impl ListPolicy {
    /// Whether a non-empty open list has outlived its period.
    pub(crate) fn period_over(&self, open: &OpenTotals, now: Timestamp) -> bool {
        self.rollover_secs > 0
            && open.count > 0
            && now >= Timestamp(open.from).plus_secs(self.rollover_secs)
    }

    /// Whether a Resource List part holding `count` entries of about `bytes` takes one more
    /// entry of `entry_bytes`: the one rule of ingest on every backend and of adoption.
    pub(crate) fn part_has_room(&self, count: u64, bytes: u64, entry_bytes: u64) -> bool {
        count < self.max_items as u64 && (count == 0 || bytes + entry_bytes <= self.max_bytes)
    }

    /// Whether an entry of `entry_bytes` must go into a new list (full, too large, or too old).
    pub(crate) fn must_roll(&self, open: &OpenTotals, entry_bytes: u64, now: Timestamp) -> bool {
        open.count >= self.max_items as u64
            || (open.count > 0 && open.bytes + entry_bytes > self.max_bytes)
            || self.period_over(open, now)
    }

    /// The datetime a change is recorded at: its own, checked against the clock, the open
    /// list and (when given) what has been notified; or, with none, strictly after everything
    /// recorded so far — a reader that saw the newest change at L can promise that anything it
    /// did not see is dated after L. `Err` is the reason for refusing the change.
    pub(crate) fn change_datetime(
        &self,
        given: Option<Timestamp>,
        open: &OpenTotals,
        notified: Option<i64>,
        now: Timestamp,
    ) -> Result<Timestamp, String> {
        match given {
            Some(d) if d > now.plus_secs(self.max_future_skew_secs) => {
                Err(format!("datetime {d} lies more than {}s in the future (server time {now})", self.max_future_skew_secs))
            }
            Some(d) if d.0 < open.from => Err(format!(
                "datetime {d} precedes the open Change List, which starts at {}; closed Change Lists never change",
                Timestamp(open.from)
            )),
            Some(d) if notified.is_some_and(|w| d.0 < w) => Err(format!(
                "datetime {d} precedes {}, up to which change notifications for this set have been sent; \
                 changes may arrive at most notify.hold_back_secs late (omit datetime to use the time of arrival)",
                Timestamp(notified.unwrap_or_default())
            )),
            Some(d) => Ok(d),
            None => Ok(Timestamp(now.0.max(open.from).max(open.max_dt.map_or(i64::MIN, |m| m + 1)))),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ApplyOutcome {
    /// Whether the set did not exist before this batch.
    pub set_created: bool,
    /// `(index in batch, change id)` of every recorded change.
    pub applied: Vec<(usize, i64)>,
    /// `(index in batch, reason)` of changes that were valid but had nothing to do.
    pub ignored: Vec<(usize, String)>,
    /// Change Lists closed by this batch (rollover).
    pub closed_lists: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetInfo {
    pub name: SetName,
    pub created_at: Timestamp,
}

/// One partition of a set's Resource List. Boundaries never move: resources join the last
/// partition when first created and stay in theirs until deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartInfo {
    pub no: u32,
    pub count: u64,
    /// Id of the last change that touched a resource of this part: the cache validator.
    pub last_seq: i64,
    pub last_change: Timestamp,
}

/// What changed in one Resource List part after a change (see [`SetStore::part_delta`]), read
/// at one moment: enough to bring a page built from the part then up to now.
#[derive(Debug, Clone, Default)]
pub struct PartDelta {
    /// Every resource of the part now, as its position in the part's order, ascending;
    /// `None` when they are those of the build the delta was asked against ([`Built`]).
    pub positions: Option<Vec<i64>>,
    /// The part's resources that changes after it touched, with their positions, in order.
    pub changed: Vec<(i64, Resource)>,
    /// The last change the delta reflects: the part's `last_seq` now.
    pub last_seq: i64,
}

/// What a page built from a part held, for [`SetStore::part_delta`]: how many resources, and
/// the last one's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Built {
    pub count: usize,
    pub last_position: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeListInfo {
    pub no: u32,
    pub from: Timestamp,
    /// `None` for the open list.
    pub until: Option<Timestamp>,
    pub count: u64,
    pub last_seq: i64,
    pub last_change: Option<Timestamp>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub resources: u64,
    pub changes: u64,
}

/// An opaque keyset position, only meaningful to the backend that issued it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor(pub String);

#[derive(Debug, Clone)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Where the next page starts; `None` when this was the last.
    pub next: Option<Cursor>,
}

/// The store: one of the backends behind the [`SetStore`] and [`HubStore`] contracts. Callers
/// use the traits' methods on it (`use crate::store::{SetStore as _, HubStore as _}`); nothing
/// outside this module names a backend's own types.
#[derive(Clone)]
pub struct Store(Arc<dyn Backend>);

/// Both halves of the contract: what a backend is.
pub trait Backend: SetStore + HubStore + 'static {}
impl<T: SetStore + HubStore + 'static> Backend for T {}

impl std::ops::Deref for Store {
    type Target = dyn Backend;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl Store {
    /// A store over `backend`.
    pub fn new(backend: impl Backend) -> Store {
        Store(Arc::new(backend))
    }

    /// Opens (creating on first start) the embedded database at `path`.
    pub fn open_embedded(path: &Path) -> Result<Store, StoreError> {
        Ok(Store::new(EmbeddedStore::open(path)?))
    }

    /// Connects to Elasticsearch and creates or checks the indices; with the server's version.
    pub async fn open_elasticsearch(
        cfg: &crate::config::ElasticConfig,
    ) -> Result<(Store, String), StoreError> {
        let es = elastic::ElasticStore::open(cfg).await?;
        let version = es.es.version.clone();
        Ok((Store::new(es), version))
    }
}

/// The resource sets' part of the storage contract, which every backend fulfils.
#[async_trait::async_trait]
pub trait SetStore: Send + Sync {
    /// Registers a set if it is new; returns whether it was created.
    async fn ensure_set(&self, set: &SetName, now: Timestamp) -> Result<bool, StoreError>;

    /// Every set, in name order.
    async fn sets(&self) -> Result<Vec<SetInfo>, StoreError>;

    /// Applies a batch atomically: every change upserts or deletes its resource document and
    /// appends its change document, all or nothing.
    async fn apply(
        &self,
        set: &SetName,
        changes: Vec<NewChange>,
        policy: ListPolicy,
        now: Timestamp,
    ) -> Result<ApplyOutcome, ApplyError>;

    /// Finishes what a writer that stopped mid-batch left of a set (its committed changes
    /// applied to the resources), waiting for its claim to run out: after this, reading the
    /// set's resources shows every committed change. A writer taking a set over from a killed
    /// one (a collector) calls it before it reads what the set holds to decide what to record.
    /// A no-op where batches are atomic transactions (the embedded store).
    async fn recover_writes(&self, _set: &SetName) -> Result<(), StoreError> {
        Ok(())
    }

    /// Closes the open Change List if its period is over; returns the closed list's number.
    async fn rollover_if_due(
        &self,
        set: &SetName,
        policy: ListPolicy,
        now: Timestamp,
    ) -> Result<Option<u32>, StoreError>;

    /// A set's Resource List partitions, in number order.
    async fn parts(&self, set: &SetName) -> Result<Vec<PartInfo>, StoreError>;

    /// Resources of a set (one part, or all parts with `None`) in stable order.
    async fn resources(
        &self,
        set: &SetName,
        part: Option<u32>,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<Page<Resource>, StoreError>;

    /// A page of one part's resources, each with its position in the part's order (what
    /// [`SetStore::part_delta`] speaks of), from just after position `after`; `None` from a
    /// backend that has no such positions (its pages are then always built whole).
    async fn part_resources(
        &self,
        _set: &SetName,
        _part: u32,
        _after: i64,
        _limit: usize,
    ) -> Result<Option<Vec<(i64, Resource)>>, StoreError> {
        Ok(None)
    }

    /// What changed in part `part` after change `since` (a part's `last_seq` when a page was
    /// made from it, holding what `built` says): the part's positions now, unless they are
    /// still the build's, and the resources touched since. `None` when more than `limit`
    /// changes came after it (building the page whole is then cheaper), or from a backend that
    /// cannot tell.
    async fn part_delta(
        &self,
        _set: &SetName,
        _part: u32,
        _since: i64,
        _built: Built,
        _limit: usize,
    ) -> Result<Option<PartDelta>, StoreError> {
        Ok(None)
    }

    /// One resource by key; `None` when the set has none (or it was deleted).
    async fn resource(
        &self,
        set: &SetName,
        key: &ResourceKey,
    ) -> Result<Option<Resource>, StoreError>;

    /// Resources of a set by key, in the order asked (`None` where the set has none): one
    /// round trip for many, as a collector asks for a page of records.
    async fn resources_by_key(
        &self,
        set: &SetName,
        keys: &[ResourceKey],
    ) -> Result<Vec<Option<Resource>>, StoreError>;

    /// A set's Change Lists, oldest first, the open one last.
    async fn changelists(&self, set: &SetName) -> Result<Vec<ChangeListInfo>, StoreError>;

    /// Changes of a set with `from <= datetime < until`, ordered by (datetime, id).
    async fn changes(
        &self,
        set: &SetName,
        from: Timestamp,
        until: Option<Timestamp>,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<Page<Change>, StoreError>;

    /// The position just after the change (`datetime`, `id`) as this backend's cursor for
    /// [`SetStore::changes`]: a list resumed from a position kept elsewhere (a token).
    fn change_cursor(&self, datetime: Timestamp, id: i64) -> Cursor;

    /// How long after its datetime a change dated on arrival may still become visible to
    /// readers (µs): a reader that saw the log up to a moment (after [`SetStore::settle`]) has
    /// seen every such change dated this much before it. Elasticsearch: its refresh and the
    /// writers' clocks.
    fn visibility_lag_micros(&self) -> i64 {
        5_000_000
    }

    /// Waits until this process's batches dated before `until` are committed (or failed), so
    /// that a reader sees every change it will ever see dated before then. Elasticsearch:
    /// returns at once (writers are other processes too; see `visibility_lag_micros`).
    async fn settle(&self, until: Timestamp) {
        let _ = until;
    }

    /// For each key, the newest change of it dated before `until`, as (datetime, id); keys
    /// with none are left out.
    async fn latest_changes(
        &self,
        set: &SetName,
        keys: &[ResourceKey],
        until: Timestamp,
    ) -> Result<std::collections::HashMap<ResourceKey, (Timestamp, i64)>, StoreError>;

    /// How many resources and changes a set holds.
    async fn counts(&self, set: &SetName) -> Result<Counts, StoreError>;

    /// A set's newest recorded change.
    async fn latest_change(&self, set: &SetName) -> Result<Option<Change>, StoreError>;

    /// A mark of what the store has recorded for a set, every change up to it visible to reads
    /// now: every change recorded later (whatever its `datetime` says) is found by
    /// [`SetStore::earliest_recorded_after`] from it. What a structure made from the log notes
    /// before it reads, to know later, without trusting a clock, whether a write landed in what
    /// it covers. `None` when the store cannot vouch for that now (a search not yet refreshed):
    /// then nothing made now may be kept.
    async fn recorded_through(&self, set: &SetName) -> Result<Option<i64>, StoreError>;

    /// The earliest `datetime` among the set's changes recorded after `mark` and dated before
    /// `until`: `None` when none was; when the store cannot yet tell them all (a search not
    /// yet refreshed), `Some(Timestamp(i64::MIN))` (assume the worst).
    async fn earliest_recorded_after(
        &self,
        set: &SetName,
        mark: i64,
        until: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError>;

    /// Cheap liveness probe for `/readyz`.
    async fn ping(&self) -> Result<(), StoreError>;

    /// A set's notifier state; `None` before the notifier first saw the set.
    async fn notify_state(&self, set: &SetName) -> Result<Option<NotifyState>, StoreError>;

    /// Creates the state of a set that predates the notifier (nothing is replayed).
    async fn notify_init(&self, state: NotifyState) -> Result<(), StoreError>;

    /// Adopts documents external writers put straight into the store: the change documents
    /// adopted, and how long the oldest document not yet adopted has waited. Only a shared
    /// store has external writers; the others adopt nothing.
    async fn adopt_external(&self, _rules: &dyn SetRules) -> Result<Adoption, StoreError> {
        Ok(Adoption::default())
    }
}

/// What one round of adopting external writers' documents did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Adoption {
    /// Change documents adopted.
    pub adopted: usize,
    /// How long the oldest document not yet adopted has waited (by its writer's `timestamp`,
    /// or since this process first saw it); `None` when none waits.
    pub lag: Option<std::time::Duration>,
}

/// Where a set's notifications stand: change notifications cover every change dated before
/// `watermark`; framework notifications have covered Resource List parts up to `parts_seen`,
/// Change Lists up to `lists_seen`, and the set's creation once `announced`. `version` makes
/// updates optimistic, so several notifier processes never publish the same thing twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyState {
    pub set: SetName,
    pub watermark: Timestamp,
    pub parts_seen: u32,
    pub lists_seen: u32,
    pub announced: bool,
    pub version: i64,
    /// Not kept: when this state moves the watermark, how many changes the notification
    /// published with it holds (every change dated between the old watermark and the new).
    /// The embedded store refuses the move when it holds another number: a change recorded
    /// after the notifier read them and dated before the new watermark would never be
    /// notified, and later changes dated before it are refused.
    pub covers: Option<u64>,
}

/// A 32-byte secret shared by every process on the store, made by whichever asks first and
/// kept in the store's state under `name` (the OAI-PMH tokens' key, the console's cookie key):
/// what one process signs, every other and every restart accepts.
pub async fn shared_key(store: &Store, name: &str) -> Result<[u8; 32], StoreError> {
    loop {
        if let Some((hex, _)) = store.state(name).await? {
            let mut k = [0u8; 32];
            for (i, b) in k.iter_mut().enumerate() {
                *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("00"), 16).unwrap_or(0);
            }
            return Ok(k);
        }
        let mut k = [0u8; 32];
        getrandom::fill(&mut k).map_err(|e| {
            StoreError::Unavailable(format!("no randomness for the key {name}: {e}"))
        })?;
        store
            .save_state(name, &crate::digest::hex_digest(k), None)
            .await?;
    }
}

/// Where the first Change List of a set created by this batch starts: the batch's earliest
/// datetime when that is in the past, else now.
pub(crate) fn batch_start(changes: &[NewChange], now: Timestamp) -> Timestamp {
    changes
        .iter()
        .filter_map(|c| c.datetime)
        .min()
        .map_or(now, |d| d.min(now))
}

/// A conservative estimate of an entry's size in a sitemap, used to stay under 50 MB.
pub fn entry_bytes_estimate(c: &NewChange) -> u64 {
    entry_bytes(&c.key, c.meta.mime.as_deref(), &c.meta.ln)
}

/// The same estimate from a resource's parts (adoption reads them from foreign documents).
pub fn entry_bytes(
    key: &crate::model::ResourceKey,
    mime: Option<&str>,
    ln: &[crate::model::Link],
) -> u64 {
    let links: usize = ln
        .iter()
        .map(|l| 96 + 2 * l.href.value.len() + l.rel.len())
        .sum();
    (320 + 2 * key.0.len() + mime.map_or(0, str::len) + links) as u64
}
