//! What a collector keeps in the store, as two documents so that their writers never race:
//! - [`Saved`] (`collect:NAME`), written only by the process that holds the collector: the
//!   window (`from`), the run under way with its resumption token (checkpointed after every
//!   page), counters, the quarantine and the last error. Its version fences a process that
//!   lost the collector to another.
//! - [`Control`] (`collect-control:NAME`), written only by admins: pause, and counters of
//!   "run now", "reconcile now" and "resume" requests, which the collector answers by
//!   remembering how many it has answered.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::store::{Store, StoreError};

/// The most quarantined records kept (the newest).
pub const QUARANTINE_KEPT: usize = 1000;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Counts {
    /// Records read (deleted headers included).
    pub seen: u64,
    pub created: u64,
    pub updated: u64,
    pub deleted: u64,
    /// Records read that changed nothing (the same bytes, or the deletion of a record the set
    /// never held).
    pub unchanged: u64,
    pub quarantined: u64,
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        self.seen += o.seen;
        self.created += o.created;
        self.updated += o.updated;
        self.deleted += o.deleted;
        self.unchanged += o.unchanged;
        self.quarantined += o.quarantined;
    }
}

/// A record kept aside, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QuarantineEntry {
    /// The OAI identifier, when it could be read.
    pub identifier: Option<String>,
    pub reason: String,
    /// When (RFC 3339).
    pub at: String,
}

/// A run under way: where it started and where it stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunPoint {
    /// The repository's `responseDate` when the run started: the next run's `from` once this
    /// one completes.
    pub started: String,
    /// The `from` this run asks for (none: everything).
    pub from: Option<String>,
    /// The resumption token to ask for next (none: the list's first page).
    pub token: Option<String>,
    /// Pages read so far.
    pub pages: u64,
    /// Times the list was started again after a refused token.
    pub restarts: u32,
    pub counts: Counts,
}

/// What the repository said of itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Identified {
    pub repository_name: String,
    /// `YYYY-MM-DD` or `YYYY-MM-DDThh:mm:ssZ`.
    pub granularity: String,
    pub earliest_datestamp: String,
    /// `no`, `transient` or `persistent`.
    pub deleted_record: String,
}

/// The collector's own document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Saved {
    /// The `responseDate` at the start of the last run that completed.
    pub from: Option<String>,
    pub run: Option<RunPoint>,
    pub identify: Option<Identified>,
    /// When the last run started and ended (RFC 3339).
    pub last_started: Option<String>,
    pub last_ended: Option<String>,
    /// How the last run ended, in words ("complete", or why not).
    pub last_outcome: Option<String>,
    /// The last error in words; cleared by a run that completes.
    pub last_error: Option<String>,
    /// The last completed run's counts.
    pub last: Counts,
    /// Every run's counts, added up.
    pub totals: Counts,
    /// The newest quarantined records (at most [`QUARANTINE_KEPT`]).
    #[schema(value_type = Vec<QuarantineEntry>)]
    pub quarantine: VecDeque<QuarantineEntry>,
    /// When the last reconcile pass completed (RFC 3339), and what it marked deleted.
    pub last_reconcile: Option<String>,
    pub last_reconcile_deleted: u64,
    /// Why the collector stopped itself (a 401 or 403), and the resume count it stopped at:
    /// it goes on once an admin resumes it.
    pub stopped: Option<(String, u64)>,
    /// Requests answered so far (see [`Control`]).
    pub runs_answered: u64,
    pub reconciles_answered: u64,
    /// The layout of the set's file paths (`crate::model::origin`) the records were collected
    /// under: a set collected under an older one is collected again, then reconciled.
    #[serde(default)]
    pub layout: u32,
    /// A reconcile pass is owed once a complete run has collected the set again (the old
    /// layout's resources are then the ones the repository no longer lists).
    #[serde(default)]
    pub reconcile_owed: bool,
    /// What discovery found at the collector's URL and chose (a collector without `kind`).
    #[serde(default)]
    pub discovered: Option<super::discover::Discovered>,
    /// An activity stream: the `endTime` of the newest activity the last complete run read;
    /// the next run reads back from the stream's last page until it.
    #[serde(default)]
    pub newest_activity: Option<String>,
}

impl Saved {
    /// Keeps a quarantined record (its identifier and reason cut to a few hundred bytes: a
    /// peer's text); returns the entry as kept.
    pub fn quarantine(
        &mut self,
        identifier: Option<String>,
        reason: String,
        at: &str,
    ) -> &QuarantineEntry {
        if self.quarantine.len() >= QUARANTINE_KEPT {
            self.quarantine.pop_front();
        }
        self.quarantine.push_back(QuarantineEntry {
            identifier: identifier.map(|i| crate::cause::outsider(&i)),
            reason: crate::cause::cut(&reason, 2 * crate::cause::OUTSIDER_TEXT),
            at: at.to_string(),
        });
        self.quarantine.back().expect("just pushed")
    }
}

/// The admins' document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Control {
    pub paused: bool,
    pub run_requests: u64,
    pub reconcile_requests: u64,
    pub resumes: u64,
}

pub fn saved_key(name: &str) -> String {
    format!("collect:{name}")
}

pub fn control_key(name: &str) -> String {
    format!("collect-control:{name}")
}

fn corrupt(key: &str, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(format!(
        "the store's document {key} is not what this version wrote: {e}"
    ))
}

/// A document and the version it was read at (`None`: never written).
pub async fn load<T: Default + serde::de::DeserializeOwned>(
    store: &Store,
    key: &str,
) -> Result<(T, Option<i64>), StoreError> {
    match store.state(key).await? {
        None => Ok((T::default(), None)),
        Some((json, v)) => Ok((
            serde_json::from_str(&json).map_err(|e| corrupt(key, e))?,
            Some(v),
        )),
    }
}

/// Writes `doc` if the document is still at `version`; the new version, or `None` when
/// another writer moved it first.
pub async fn save<T: Serialize>(
    store: &Store,
    key: &str,
    doc: &T,
    version: Option<i64>,
) -> Result<Option<i64>, StoreError> {
    let json = serde_json::to_string(doc).expect("state serializes");
    store.save_state(key, &json, version).await
}

/// Changes the admins' document with `f`, retrying when another admin wrote it meanwhile.
pub async fn control(
    store: &Store,
    name: &str,
    f: impl Fn(&mut Control),
) -> Result<Control, StoreError> {
    let key = control_key(name);
    for _ in 0..20 {
        let (mut c, v) = load::<Control>(store, &key).await?;
        f(&mut c);
        if save(store, &key, &c, v).await?.is_some() {
            return Ok(c);
        }
    }
    Err(StoreError::Unavailable(format!(
        "{key} kept changing under this request; try again"
    )))
}
