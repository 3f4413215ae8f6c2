//! The destination's durable state, an SQLite database in the state directory: per set the
//! position (every change dated before it has been applied and verified), the record of each
//! resource held, the log of applied changes (so that nothing is applied twice), the queue of
//! changes still to apply with their failures, the push subscription, and counters.
//!
//! Changes go through `pending` before they are applied: a change read from a notification or
//! a Change List is queued (once: the queue and the log are keyed by uri, change and datetime),
//! then applied in order per resource; only success moves it to `applied`. A process killed at
//! any point restarts from this queue and from its position.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

pub use crate::model::ChangeType;
use crate::model::Timestamp;

/// One change to apply (from a Change List or a notification).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub uri: String,
    pub change: ChangeType,
    pub datetime: Timestamp,
    pub md5: Option<String>,
    pub length: Option<u64>,
    pub lastmod: Option<Timestamp>,
}

impl Change {
    /// Whether this entry's `lastmod` is newer than what is held (by more than a second, as
    /// `resync` compares): for lists without md5, the only sign of a same-length update.
    pub fn newer_than(&self, held: &Held) -> bool {
        match (self.lastmod, held.lastmod) {
            (Some(l), Some(h)) => l.0 > h.0 + 1_000_000,
            (Some(_), None) => true,
            _ => false,
        }
    }

    /// Whether bytes of `length` with `md5` are what this entry lists (what it omits is
    /// not checked); `Err` says how they differ.
    pub fn check(&self, length: u64, md5: &str) -> Result<(), String> {
        match (self.length, self.md5.as_deref()) {
            (Some(l), _) if l != length => {
                Err(format!("length {length} instead of the listed {l}"))
            }
            (_, Some(m)) if !m.eq_ignore_ascii_case(md5) => {
                Err(format!("md5 {md5} instead of the listed {m}"))
            }
            _ => Ok(()),
        }
    }
}

/// A queued change with its history.
#[derive(Debug, Clone)]
pub struct Pending {
    pub id: i64,
    pub change: Change,
    pub tries: u32,
    pub last_error: Option<String>,
    pub standing: Standing,
    /// Not tried again before this (a backoff after a failed try).
    pub not_before: Option<Timestamp>,
}

/// Where a queued change stands after its tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Not tried yet, or tried fewer than `fetch.max_tries` times: tried again.
    Trying,
    /// Tried `fetch.max_tries` times: it holds the position and is retried at every check.
    Failed,
    /// Given up on (`fetch.skip_failed`): the position moves past it; listed in the status.
    Skipped,
}

impl Standing {
    fn of(failed: bool, skipped: bool) -> Standing {
        match (failed, skipped) {
            (_, true) => Standing::Skipped,
            (true, false) => Standing::Failed,
            (false, false) => Standing::Trying,
        }
    }

    /// The stored flags: (failed, skipped).
    fn flags(self) -> (bool, bool) {
        match self {
            Standing::Trying => (false, false),
            Standing::Failed => (true, false),
            Standing::Skipped => (true, true),
        }
    }
}

/// A set the destination follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetRow {
    pub id: i64,
    pub capability: String,
    pub name: String,
    /// Every change dated before this has been applied; `None` before the baseline.
    pub position: Option<Timestamp>,
    pub baseline_done: bool,
    /// The newest change datetime seen at the source.
    pub source_latest: Option<Timestamp>,
    pub checked_at: Option<Timestamp>,
    pub last_push_at: Option<Timestamp>,
    /// The newest change datetime a push has brought (not when it came: a late delivery of
    /// old changes says nothing about whether push still works).
    pub pushed_latest: Option<Timestamp>,
    /// Why the last baseline or catch-up of the set failed (cleared by the next success).
    pub last_error: Option<String>,
    /// The source it belongs to (`""`: the single `[source]`).
    pub source: String,
}

/// The push subscription of a set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub set_id: i64,
    pub hub: String,
    pub topic: String,
    pub callback: String,
    pub secret: crate::model::Secret,
    pub state: SubState,
    pub requested_at: Timestamp,
    pub verified_at: Option<Timestamp>,
    pub lease_secs: Option<u64>,
    pub reason: Option<String>,
}

/// Where a subscription stands (kept as its name in the state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubState {
    /// Asked for; the hub has not verified it yet.
    Requested,
    /// Verified: deliveries come.
    Active,
    /// The hub said no (its reason is kept).
    Denied,
}

impl SubState {
    pub fn as_str(self) -> &'static str {
        match self {
            SubState::Requested => "requested",
            SubState::Active => "active",
            SubState::Denied => "denied",
        }
    }

    fn parse(s: &str) -> SubState {
        match s {
            "active" => SubState::Active,
            "denied" => SubState::Denied,
            // Anything else is asked for again.
            _ => SubState::Requested,
        }
    }
}

impl std::fmt::Display for SubState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the destination holds of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub md5: Option<String>,
    pub length: Option<u64>,
    pub path: String,
    /// The `lastmod` of the entry it was fetched for (what a list without md5 is compared by).
    pub lastmod: Option<Timestamp>,
}

/// A URL the harvester refused (outside the source's scope, too long, a list document listed
/// as a resource, a file name another resource has): not fetched, not waited for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub set_id: i64,
    /// The URL, shortened when it was longer than any URL limit.
    pub uri: String,
    pub reason: String,
    pub count: u64,
    pub last_at: Timestamp,
}

/// How many URLs each set (by id; `0`: the source) had refused.
pub type RefusedCounts = Vec<(i64, u64)>;

/// Refusals kept per set; past this only counted (a hostile list cannot fill the disk).
const MAX_REFUSED_ROWS: i64 = 10_000;

/// The state database itself: synchronous calls, for code already off the async threads
/// (the commands that only read it, tests, and [`Handle::run`]'s closures).
pub struct State {
    conn: Mutex<Connection>,
}

/// The running harvester's way to its state: every read and write runs on the blocking pool
/// (a commit may wait for a checkpoint, a read for another process's write), never on an
/// async thread, where it would hold up every source's work. Several calls that belong
/// together go in one closure, one trip.
#[derive(Clone)]
pub struct Handle(std::sync::Arc<State>);

impl Handle {
    pub fn open(path: &Path) -> R<Handle> {
        Ok(Handle(std::sync::Arc::new(State::open(path)?)))
    }

    /// Runs `f` on the state on the blocking pool.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&State) -> R<T> + Send + 'static,
    ) -> R<T> {
        let state = self.0.clone();
        tokio::task::spawn_blocking(move || f(&state))
            .await
            .map_err(StateError::Task)?
    }

    /// The state itself, for code that runs on the blocking pool already (unpacking a dump
    /// package); never to be called from an async task.
    pub fn in_blocking_task(&self) -> &State {
        &self.0
    }

    /// As [`Handle::run`], for closures that fail with more than the state's errors.
    pub async fn run_any<T: Send + 'static>(
        &self,
        f: impl FnOnce(&State) -> anyhow::Result<T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let state = self.0.clone();
        tokio::task::spawn_blocking(move || f(&state)).await?
    }
}

/// The state database failed; the words are whole ("harvest state: database is locked") and
/// the cause stays its `source()`.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("harvest state: {0}")]
    Sqlite(#[source] rusqlite::Error),
    #[error("harvest state: {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The blocking task running a state call panicked or was cancelled.
    #[error("harvest state: the task writing it did not finish")]
    Task(#[source] tokio::task::JoinError),
}

impl From<rusqlite::Error> for StateError {
    fn from(e: rusqlite::Error) -> Self {
        StateError::Sqlite(e)
    }
}

type R<T> = Result<T, StateError>;

impl State {
    pub fn open(path: &Path) -> R<State> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| StateError::Io {
                what: format!("cannot create {}", dir.display()),
                source: e,
            })?;
        }
        let conn = Connection::open(path)?;
        // Before anything else: `harvest status` and tests open it while the harvester writes.
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        // Switching a new database to WAL takes a lock that does not wait for another process
        // doing the same (a `harvest status` beside a starting harvester): tried again briefly.
        for attempt in 0.. {
            match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0)) {
                Ok(_) => break,
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy && attempt < 100 =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                Err(e) => return Err(e.into()),
            }
        }
        // The schema and its upgrades in one write transaction: two processes opening the
        // state at once take turns.
        let mut conn = conn;
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS sets (
               id INTEGER PRIMARY KEY, capability TEXT NOT NULL UNIQUE, name TEXT NOT NULL,
               position INTEGER, baseline_done INTEGER NOT NULL DEFAULT 0,
               source_latest INTEGER, checked_at INTEGER, last_push_at INTEGER);
             CREATE TABLE IF NOT EXISTS resources (
               set_id INTEGER NOT NULL, uri TEXT NOT NULL, md5 TEXT, length INTEGER, path TEXT NOT NULL,
               PRIMARY KEY (set_id, uri));
             CREATE TABLE IF NOT EXISTS applied (
               set_id INTEGER NOT NULL, uri TEXT NOT NULL, change TEXT NOT NULL, datetime INTEGER NOT NULL,
               applied_at INTEGER NOT NULL, PRIMARY KEY (set_id, uri, change, datetime));
             CREATE TABLE IF NOT EXISTS pending (
               id INTEGER PRIMARY KEY AUTOINCREMENT, set_id INTEGER NOT NULL, uri TEXT NOT NULL,
               change TEXT NOT NULL, datetime INTEGER NOT NULL, md5 TEXT, length INTEGER, lastmod INTEGER,
               tries INTEGER NOT NULL DEFAULT 0, last_error TEXT, failed INTEGER NOT NULL DEFAULT 0,
               skipped INTEGER NOT NULL DEFAULT 0, UNIQUE (set_id, uri, change, datetime));
             CREATE TABLE IF NOT EXISTS subscriptions (
               set_id INTEGER PRIMARY KEY, hub TEXT NOT NULL, topic TEXT NOT NULL, callback TEXT NOT NULL,
               secret TEXT NOT NULL, state TEXT NOT NULL, requested_at INTEGER NOT NULL,
               verified_at INTEGER, lease_secs INTEGER, reason TEXT);
             CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS inbox (
               id INTEGER PRIMARY KEY AUTOINCREMENT, set_id INTEGER NOT NULL, body BLOB NOT NULL,
               received_at INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS sources (
               name TEXT PRIMARY KEY, last_error TEXT, failing_since INTEGER, ok_at INTEGER);
             CREATE TABLE IF NOT EXISTS refused (
               set_id INTEGER NOT NULL, uri TEXT NOT NULL, reason TEXT NOT NULL,
               count INTEGER NOT NULL, first_at INTEGER NOT NULL, last_at INTEGER NOT NULL,
               PRIMARY KEY (set_id, uri));",
        )?;
        add_column(&tx, "resources", "lastmod", "INTEGER")?;
        add_column(&tx, "pending", "not_before", "INTEGER")?;
        add_column(&tx, "sets", "last_error", "TEXT")?;
        add_column(&tx, "sets", "source", "TEXT NOT NULL DEFAULT ''")?;
        add_column(&tx, "sets", "pushed_latest", "INTEGER")?;
        // The bytes the inbox holds, kept as deliveries come and go (so a delivery is not
        // answered after summing every one waiting); counted once for a state from before.
        tx.execute(
            "INSERT OR IGNORE INTO counters (name, value) \
             SELECT 'inbox_bytes', COALESCE(SUM(length(body)), 0) FROM inbox",
            [],
        )?;
        // Which URI has which file: two URIs never share one. Keyed by path alone (no rowid:
        // one b-tree to write per resource held). Filled from the resources held when the
        // table is new (a state made before it existed), or copied from the first version's
        // table (with a rowid).
        let claims: Option<String> = tx
            .query_row(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'claims'",
                [],
                |r| r.get(0),
            )
            .optional()?;
        if !claims
            .as_deref()
            .is_some_and(|s| s.contains("WITHOUT ROWID"))
        {
            tx.execute_batch(
                "CREATE TABLE claims_new (path TEXT PRIMARY KEY, uri TEXT NOT NULL) WITHOUT ROWID;",
            )?;
            let from = if claims.is_some() {
                "claims"
            } else {
                "resources"
            };
            tx.execute(
                &format!(
                    "INSERT OR IGNORE INTO claims_new (path, uri) SELECT path, uri FROM {from}"
                ),
                [],
            )?;
            tx.execute_batch(
                "DROP TABLE IF EXISTS claims; ALTER TABLE claims_new RENAME TO claims;",
            )?;
        }
        tx.commit()?;
        conn.execute_batch("PRAGMA synchronous = NORMAL;")?;
        Ok(State {
            conn: Mutex::new(conn),
        })
    }

    fn c(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().expect("state lock")
    }

    /// The set of this Capability List, recorded for `source` when new. A set recorded by
    /// the single `[source]` table (source '') is taken over by the first named source that
    /// leads to it (a configuration moved to `[[sources]]`); one of another named source is
    /// returned as it is (the caller refuses to share it).
    pub fn set(&self, source: &str, capability: &str, name: &str) -> R<SetRow> {
        let c = self.c();
        c.execute(
            "INSERT OR IGNORE INTO sets (capability, name, source) VALUES (?1, ?2, ?3)",
            params![capability, name, source],
        )?;
        c.execute(
            "UPDATE sets SET source = ?2 WHERE capability = ?1 AND source = ''",
            params![capability, source],
        )?;
        Ok(c.query_row(
            &format!("{SET_COLS} WHERE capability = ?1"),
            [capability],
            set_row,
        )?)
    }

    pub fn sets(&self) -> R<Vec<SetRow>> {
        let c = self.c();
        let mut st = c.prepare(&format!("{SET_COLS} ORDER BY id"))?;
        let rows = st.query_map([], set_row)?.collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn set_by_id(&self, id: i64) -> R<Option<SetRow>> {
        Ok(self
            .c()
            .query_row(&format!("{SET_COLS} WHERE id = ?1"), [id], set_row)
            .optional()?)
    }

    pub fn finish_baseline(&self, set_id: i64, position: Timestamp) -> R<()> {
        self.c().execute(
            "UPDATE sets SET baseline_done = 1, position = ?2 WHERE id = ?1",
            params![set_id, position.0],
        )?;
        Ok(())
    }

    /// Moves the position forward (never back).
    pub fn advance(&self, set_id: i64, to: Timestamp) -> R<()> {
        self.c().execute(
            "UPDATE sets SET position = MAX(COALESCE(position, ?2), ?2) WHERE id = ?1",
            params![set_id, to.0],
        )?;
        Ok(())
    }

    /// Records (or, with `None`, clears) why the set's last baseline or catch-up failed.
    pub fn set_error(&self, set_id: i64, error: Option<&str>) -> R<()> {
        self.c().execute(
            "UPDATE sets SET last_error = ?2 WHERE id = ?1",
            params![set_id, error.map(|e| super::scope::short(e).into_owned())],
        )?;
        Ok(())
    }

    /// Keeps a verified delivery until it is applied (a crash after the hub got its answer
    /// loses nothing); `false`, keeping nothing, when the deliveries waiting already hold
    /// `max_bytes`.
    pub fn inbox_put(&self, set_id: i64, body: &[u8], max_bytes: u64) -> R<bool> {
        let mut c = self.c();
        let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        // A day old and still here: its set is no longer followed (the Change Lists cover
        // anything it said).
        let gone: i64 = tx
            .prepare_cached("DELETE FROM inbox WHERE received_at < ?1 RETURNING length(body)")?
            .query_map([Timestamp::now().0 - 86_400_000_000], |r| {
                r.get::<_, i64>(0)
            })?
            .sum::<rusqlite::Result<i64>>()?;
        let held = add_inbox_bytes(&tx, -gone)?;
        if held as u64 + body.len() as u64 > max_bytes {
            tx.commit()?;
            return Ok(false);
        }
        tx.execute(
            "INSERT INTO inbox (set_id, body, received_at) VALUES (?1, ?2, ?3)",
            params![set_id, body, Timestamp::now().0],
        )?;
        add_inbox_bytes(&tx, body.len() as i64)?;
        tx.commit()?;
        Ok(true)
    }

    /// The oldest delivery waiting for one of the sets `set_ids`: its id, set and body.
    pub fn inbox_next(&self, set_ids: &[i64]) -> R<Option<(i64, i64, Vec<u8>)>> {
        if set_ids.is_empty() {
            return Ok(None);
        }
        let marks = vec!["?"; set_ids.len()].join(", ");
        let args: Vec<&dyn rusqlite::ToSql> = set_ids.iter().map(|i| i as _).collect();
        Ok(self
            .c()
            .query_row(
                &format!(
                    "SELECT id, set_id, body FROM inbox WHERE set_id IN ({marks}) ORDER BY id LIMIT 1"
                ),
                &args[..],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?)
    }

    /// A delivery handled (applied, or found wanting: the Change Lists fill in).
    pub fn inbox_done(&self, id: i64) -> R<()> {
        let mut c = self.c();
        let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let gone: Option<i64> = tx
            .query_row(
                "DELETE FROM inbox WHERE id = ?1 RETURNING length(body)",
                [id],
                |r| r.get(0),
            )
            .optional()?;
        add_inbox_bytes(&tx, -gone.unwrap_or(0))?;
        tx.commit()?;
        Ok(())
    }

    /// Deliveries waiting, and their bytes.
    pub fn inbox_size(&self) -> R<(u64, u64)> {
        Ok(self.c().query_row(
            "SELECT COUNT(*), COALESCE(SUM(length(body)), 0) FROM inbox",
            [],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
        )?)
    }

    /// Records that the source (by name; `""` for the single `[source]`) could not be read,
    /// and since when; `None`: it answered.
    pub fn source_error(&self, name: &str, error: Option<&str>) -> R<()> {
        let now = Timestamp::now().0;
        match error {
            Some(e) => self.c().execute(
                "INSERT INTO sources (name, last_error, failing_since) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name) DO UPDATE SET last_error = ?2, failing_since = COALESCE(failing_since, ?3)",
                params![name, super::scope::short(e).into_owned(), now],
            )?,
            None => self.c().execute(
                "INSERT INTO sources (name, ok_at) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET last_error = NULL, failing_since = NULL, ok_at = ?2",
                params![name, now],
            )?,
        };
        Ok(())
    }

    /// The source's last error and since when it fails, if it does.
    pub fn source_failing(&self, name: &str) -> R<Option<(String, Timestamp)>> {
        Ok(self
            .c()
            .query_row(
                "SELECT last_error, failing_since FROM sources WHERE name = ?1 AND last_error IS NOT NULL",
                [name],
                |r| Ok((r.get(0)?, Timestamp(r.get(1)?))),
            )
            .optional()?)
    }

    pub fn checked(&self, set_id: i64, source_latest: Option<Timestamp>) -> R<()> {
        self.c().execute(
            "UPDATE sets SET checked_at = ?2, source_latest = MAX(COALESCE(source_latest, 0), COALESCE(?3, 0)) WHERE id = ?1",
            params![set_id, Timestamp::now().0, source_latest.map(|t| t.0)],
        )?;
        Ok(())
    }

    pub fn pushed(&self, set_id: i64, newest: Option<Timestamp>) -> R<()> {
        self.c().execute(
            "UPDATE sets SET last_push_at = ?2, source_latest = MAX(COALESCE(source_latest, 0), COALESCE(?3, 0)),
             pushed_latest = MAX(COALESCE(pushed_latest, 0), COALESCE(?3, 0)) WHERE id = ?1",
            params![set_id, Timestamp::now().0, newest.map(|t| t.0)],
        )?;
        Ok(())
    }

    pub fn held(&self, set_id: i64, uri: &str) -> R<Option<Held>> {
        held(&self.c(), set_id, uri)
    }

    /// Whether the resource is held as `c` lists it and its file still exists: with the
    /// listed md5 and length, or, for a list without md5, with the listed length and a
    /// `lastmod` no older than the listed one. A resumed baseline does not fetch (or unpack)
    /// it again.
    pub fn holds_as_listed(&self, set_id: i64, c: &Change) -> R<bool> {
        Ok(as_listed(c, self.held(set_id, &c.uri)?))
    }

    /// [`State::holds_as_listed`] for many, in one read transaction (a walk's batch).
    pub fn hold_as_listed<'a>(
        &self,
        set_id: i64,
        changes: impl IntoIterator<Item = &'a Change>,
    ) -> R<Vec<bool>> {
        let mut c = self.c();
        let tx = c.transaction()?;
        let r = changes
            .into_iter()
            .map(|ch| Ok(as_listed(ch, held(&tx, set_id, &ch.uri)?)))
            .collect();
        tx.commit()?;
        r
    }

    /// Records resources as held, with their files' claims, in one transaction (the
    /// baselines' batches).
    pub fn hold_many(&self, set_id: i64, held: &[(String, Held)]) -> R<()> {
        let mut c = self.c();
        let tx = c.transaction()?;
        {
            for (uri, h) in held {
                put_held(&tx, set_id, uri, h)?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Every resource held, in URI order (for the audit).
    pub fn held_uris(&self, set_id: i64) -> R<Vec<String>> {
        let c = self.c();
        let mut st = c.prepare("SELECT uri FROM resources WHERE set_id = ?1 ORDER BY uri")?;
        let rows = st
            .query_map([set_id], |r| r.get(0))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn count_held(&self, set_id: i64) -> R<u64> {
        Ok(self.c().query_row(
            "SELECT COUNT(*) FROM resources WHERE set_id = ?1",
            [set_id],
            |r| r.get::<_, i64>(0),
        )? as u64)
    }

    /// Queues changes not yet applied nor queued; returns how many were new.
    pub fn enqueue(&self, set_id: i64, changes: &[Change]) -> R<usize> {
        let mut c = self.c();
        let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let mut n = 0;
        {
            let mut done = tx.prepare_cached("SELECT 1 FROM applied WHERE set_id = ?1 AND uri = ?2 AND change = ?3 AND datetime = ?4")?;
            let mut ins = tx.prepare_cached(
                "INSERT OR IGNORE INTO pending (set_id, uri, change, datetime, md5, length, lastmod) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            for ch in changes {
                if done.exists(params![set_id, ch.uri, ch.change.as_str(), ch.datetime.0])? {
                    continue;
                }
                n += ins.execute(params![
                    set_id,
                    ch.uri,
                    ch.change.as_str(),
                    ch.datetime.0,
                    ch.md5,
                    ch.length.map(|n| n as i64),
                    ch.lastmod.map(|t| t.0)
                ])?;
            }
        }
        tx.commit()?;
        Ok(n)
    }

    /// Records a failed first try of queued changes (the baseline's failures): their error,
    /// and no new try before `not_before`.
    pub fn defer(&self, set_id: i64, failed: &[(Change, String)], not_before: Timestamp) -> R<()> {
        let mut c = self.c();
        let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        {
            let mut st = tx.prepare_cached(
                "UPDATE pending SET tries = tries + 1, last_error = ?5, not_before = ?6
                 WHERE set_id = ?1 AND uri = ?2 AND change = ?3 AND datetime = ?4",
            )?;
            for (ch, error) in failed {
                st.execute(params![
                    set_id,
                    ch.uri,
                    ch.change.as_str(),
                    ch.datetime.0,
                    error,
                    not_before.0
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The queue of a set, oldest first (skipped ones left out).
    pub fn pending(&self, set_id: i64) -> R<Vec<Pending>> {
        let c = self.c();
        let mut st = c.prepare(
            "SELECT id, uri, change, datetime, md5, length, lastmod, tries, last_error, failed, skipped, not_before FROM pending
             WHERE set_id = ?1 AND skipped = 0 ORDER BY datetime, id",
        )?;
        let rows = st
            .query_map([set_id], pending_row)?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// Failed and skipped changes of every set (for `harvest status`).
    pub fn problems(&self) -> R<Vec<(i64, Pending)>> {
        let c = self.c();
        let mut st = c.prepare(
            "SELECT id, uri, change, datetime, md5, length, lastmod, tries, last_error, failed, skipped, not_before, set_id FROM pending
             WHERE failed = 1 OR skipped = 1 OR tries > 0 ORDER BY set_id, datetime, id LIMIT 200",
        )?;
        let rows = st
            .query_map([], |r| Ok((r.get(12)?, pending_row(r)?)))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn count_pending(&self, set_id: i64) -> R<u64> {
        Ok(self.c().query_row(
            "SELECT COUNT(*) FROM pending WHERE set_id = ?1 AND skipped = 0",
            [set_id],
            |r| r.get::<_, i64>(0),
        )? as u64)
    }

    /// The datetime of the oldest change still waiting (what holds the position).
    pub fn oldest_pending(&self, set_id: i64) -> R<Option<Timestamp>> {
        Ok(self
            .c()
            .query_row(
                "SELECT MIN(datetime) FROM pending WHERE set_id = ?1 AND skipped = 0",
                [set_id],
                |r| r.get::<_, Option<i64>>(0),
            )?
            .map(Timestamp))
    }

    /// A change applied: out of the queue, into the log, and the resource's record updated,
    /// in one transaction.
    pub fn applied(&self, set_id: i64, p: &Pending, held: Option<&Held>) -> R<()> {
        let mut c = self.c();
        let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute("DELETE FROM pending WHERE id = ?1", [p.id])?;
        tx.execute(
            "INSERT OR IGNORE INTO applied (set_id, uri, change, datetime, applied_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![set_id, p.change.uri, p.change.change.as_str(), p.change.datetime.0, Timestamp::now().0],
        )?;
        match held {
            Some(h) => put_held(&tx, set_id, &p.change.uri, h)?,
            None => {
                // By the path it holds (claims are keyed by path), unless another set holds it too.
                tx.execute(
                    "DELETE FROM claims WHERE uri = ?1 AND path = (SELECT path FROM resources WHERE set_id = ?2 AND uri = ?1) \
                     AND NOT EXISTS (SELECT 1 FROM resources WHERE uri = ?1 AND set_id != ?2)",
                    params![p.change.uri, set_id],
                )?;
                tx.execute(
                    "DELETE FROM resources WHERE set_id = ?1 AND uri = ?2",
                    params![set_id, p.change.uri],
                )?
            }
        };
        tx.commit()?;
        Ok(())
    }

    /// A failed attempt: counted; `failed` once `max_tries` is reached, and then `skipped`
    /// too when the configuration says to move on.
    /// Not tried again before `not_before` (a backoff: a slow or broken resource does not take
    /// a fetch slot at every pass).
    pub fn attempt_failed(
        &self,
        p: &Pending,
        error: &str,
        max_tries: u32,
        skip: bool,
        not_before: Timestamp,
    ) -> R<Pending> {
        let tries = p.tries + 1;
        let standing = match (tries >= max_tries, skip) {
            (false, _) => Standing::Trying,
            (true, false) => Standing::Failed,
            (true, true) => Standing::Skipped,
        };
        let (failed, skipped) = standing.flags();
        self.c().execute(
            "UPDATE pending SET tries = ?2, last_error = ?3, failed = ?4, skipped = ?5, not_before = ?6 WHERE id = ?1",
            params![p.id, tries, error, failed, skipped, not_before.0],
        )?;
        Ok(Pending {
            tries,
            last_error: Some(error.to_string()),
            standing,
            ..p.clone()
        })
    }

    /// How many times each (uri, change, datetime) was applied: always at most once.
    pub fn applied_count(&self, set_id: i64) -> R<u64> {
        Ok(self.c().query_row(
            "SELECT COUNT(*) FROM applied WHERE set_id = ?1",
            [set_id],
            |r| r.get::<_, i64>(0),
        )? as u64)
    }

    pub fn subscription(&self, set_id: i64) -> R<Option<Subscription>> {
        Ok(self
            .c()
            .query_row(
                "SELECT set_id, hub, topic, callback, secret, state, requested_at, verified_at, lease_secs, reason
                 FROM subscriptions WHERE set_id = ?1",
                [set_id],
                sub_row,
            )
            .optional()?)
    }

    /// A subscription request sent (or about to be): replaces the previous one, keeping the
    /// reason the previous one did not work (until the hub verifies this one).
    pub fn requested(&self, s: &Subscription) -> R<()> {
        self.c().execute(
            "INSERT INTO subscriptions (set_id, hub, topic, callback, secret, state, requested_at, verified_at, lease_secs, reason)
             VALUES (?1, ?2, ?3, ?4, ?5, 'requested', ?6, NULL, NULL, NULL)
             ON CONFLICT (set_id) DO UPDATE SET hub = ?2, topic = ?3, callback = ?4, secret = ?5,
               state = 'requested', requested_at = ?6, verified_at = NULL, lease_secs = NULL",
            params![s.set_id, s.hub, s.topic, s.callback, s.secret.expose(), s.requested_at.0],
        )?;
        Ok(())
    }

    /// Why a subscription does not work yet (the hub refused it, or never verified it);
    /// `true` when the reason is new (then it is worth a log line).
    pub fn subscription_problem(&self, set_id: i64, reason: &str) -> R<bool> {
        Ok(self.c().execute(
            "UPDATE subscriptions SET reason = ?2 WHERE set_id = ?1 AND reason IS NOT ?2",
            params![set_id, reason],
        )? > 0)
    }

    pub fn verified(&self, set_id: i64, lease_secs: u64) -> R<()> {
        self.c().execute(
            "UPDATE subscriptions SET state = 'active', verified_at = ?2, lease_secs = ?3, reason = NULL WHERE set_id = ?1",
            params![set_id, Timestamp::now().0, lease_secs as i64],
        )?;
        Ok(())
    }

    pub fn denied(&self, set_id: i64, reason: &str) -> R<()> {
        self.c().execute(
            "UPDATE subscriptions SET state = 'denied', reason = ?2 WHERE set_id = ?1",
            params![set_id, reason],
        )?;
        Ok(())
    }

    /// Records a refused URL of a set (`0`: the source as a whole); `true` when it is new
    /// (then it is worth a log line; a refusal seen again is only counted).
    pub fn refuse(&self, set_id: i64, uri: &str, reason: &str) -> R<bool> {
        let uri = super::scope::short(uri);
        let mut c = self.c();
        let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let now = Timestamp::now().0;
        let seen = tx.execute(
            "UPDATE refused SET count = count + 1, last_at = ?3, reason = ?4 WHERE set_id = ?1 AND uri = ?2",
            params![set_id, uri, now, reason],
        )? > 0;
        if !seen {
            let rows: i64 = tx.query_row(
                "SELECT COUNT(*) FROM refused WHERE set_id = ?1",
                [set_id],
                |r| r.get(0),
            )?;
            if rows < MAX_REFUSED_ROWS {
                tx.execute(
                    "INSERT INTO refused (set_id, uri, reason, count, first_at, last_at) VALUES (?1, ?2, ?3, 1, ?4, ?4)",
                    params![set_id, uri, reason, now],
                )?;
            } else {
                tx.execute(
                    "INSERT INTO counters (name, value) VALUES (?1, 1) ON CONFLICT(name) DO UPDATE SET value = value + 1",
                    [format!("refused_more_{set_id}")],
                )?;
            }
        }
        tx.commit()?;
        Ok(!seen)
    }

    /// Whether this URL of the set was refused before.
    pub fn is_refused(&self, set_id: i64, uri: &str) -> R<bool> {
        Ok(self
            .c()
            .query_row(
                "SELECT 1 FROM refused WHERE set_id = ?1 AND uri = ?2",
                params![set_id, super::scope::short(uri)],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// A queued change refused when applied (a redirect off the source, a file name another
    /// resource has): out of the queue (it no longer holds the position), into `refused`.
    pub fn refuse_change(&self, set_id: i64, p: &Pending, reason: &str) -> R<bool> {
        self.c()
            .execute("DELETE FROM pending WHERE id = ?1", [p.id])?;
        self.refuse(set_id, &p.change.uri, reason)
    }

    /// The refusals, newest first (at most `limit` per set), and how many there are per set.
    pub fn refusals(&self, limit: usize) -> R<(Vec<Refused>, RefusedCounts)> {
        let (rows, mut counts) = {
            let c = self.c();
            let mut st = c.prepare(
                "SELECT set_id, uri, reason, count, last_at FROM (
                   SELECT *, ROW_NUMBER() OVER (PARTITION BY set_id ORDER BY last_at DESC, uri) AS n FROM refused)
                 WHERE n <= ?1 ORDER BY set_id, last_at DESC, uri",
            )?;
            let rows = st
                .query_map([limit as i64], |r| {
                    Ok(Refused {
                        set_id: r.get(0)?,
                        uri: r.get(1)?,
                        reason: r.get(2)?,
                        count: r.get::<_, i64>(3)? as u64,
                        last_at: Timestamp(r.get(4)?),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut st =
                c.prepare("SELECT set_id, COUNT(*) FROM refused GROUP BY set_id ORDER BY set_id")?;
            let counts = st
                .query_map([], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)? as u64))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            (rows, counts)
        };
        for (set, n) in &mut counts {
            *n += self.counter(&format!("refused_more_{set}"))?;
        }
        Ok((rows, counts))
    }

    /// The URI whose file (or folder) stands in the way of `path` (in the output folder `root`)
    /// for `uri`: another URI has
    /// that file, a file where `path` needs a folder, or a folder where it needs a file. A
    /// held resource's file is its claim (recorded with it); two URIs never share one file.
    pub fn claim_conflict(&self, root: &str, path: &str, uri: &str) -> R<Option<String>> {
        conflict(&mut Recorded::new(&self.c()), root, path, uri)
    }

    /// [`State::claim_conflict`] for many `(root, path, uri)`, in one read transaction; a
    /// folder shared by several of them is looked up once.
    pub fn claim_conflicts(&self, items: &[(&str, &str, &str)]) -> R<Vec<Option<String>>> {
        let mut c = self.c();
        let tx = c.transaction()?;
        let mut recorded = Recorded::new(&tx);
        let r = items
            .iter()
            .map(|(root, path, uri)| conflict(&mut recorded, root, path, uri))
            .collect();
        drop(recorded);
        tx.commit()?;
        r
    }

    /// The URI that has the file `path`, if any.
    pub fn claimant(&self, path: &str) -> R<Option<String>> {
        Ok(self
            .c()
            .query_row("SELECT uri FROM claims WHERE path = ?1", [path], |r| {
                r.get(0)
            })
            .optional()?)
    }

    /// This state's own id (12 hex digits, made once, kept): callback paths carry it, so
    /// two harvesters never take each other's deliveries for their own.
    pub fn harvester_id(&self) -> R<String> {
        let mut b = [0u8; 6];
        getrandom::fill(&mut b)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        let fresh = b.iter().fold(0i64, |n, x| n << 8 | *x as i64);
        let c = self.c();
        c.execute(
            "INSERT OR IGNORE INTO counters (name, value) VALUES ('harvester_id', ?1)",
            [fresh],
        )?;
        let id: i64 = c.query_row(
            "SELECT value FROM counters WHERE name = 'harvester_id'",
            [],
            |r| r.get(0),
        )?;
        Ok(format!("{id:012x}"))
    }

    pub fn bump(&self, counter: &str) -> R<()> {
        self.c().execute(
            "INSERT INTO counters (name, value) VALUES (?1, 1) ON CONFLICT(name) DO UPDATE SET value = value + 1",
            [counter],
        )?;
        Ok(())
    }

    pub fn counter(&self, counter: &str) -> R<u64> {
        Ok(self
            .c()
            .query_row(
                "SELECT value FROM counters WHERE name = ?1",
                [counter],
                |r| r.get::<_, i64>(0),
            )
            .optional()?
            .unwrap_or(0) as u64)
    }
}

/// Where the output's files are claimed, by path: the claims recorded with held resources,
/// or those of files being written now (in memory).
pub trait Claims {
    type Error;
    /// The URI whose file `path` is.
    fn at(&mut self, path: &str) -> Result<Option<String>, Self::Error>;
    /// A URI other than `uri` with a file under the folder `path`.
    fn under(&mut self, path: &str, uri: &str) -> Result<Option<String>, Self::Error>;
}

/// The one rule of files: the URI other than `uri` that has the file `path`, a file on the
/// way to it from the output folder `root` (it needs a folder there), or a file under it (it
/// would need to be a folder). Two URIs never share one file.
pub fn conflict<C: Claims>(
    claims: &mut C,
    root: &str,
    path: &str,
    uri: &str,
) -> Result<Option<String>, C::Error> {
    for p in Path::new(path)
        .ancestors()
        .filter_map(|p| p.to_str())
        .take_while(|p| p.len() > root.len() && p.starts_with(root))
    {
        if let Some(owner) = claims.at(p)?.filter(|o| o != uri) {
            return Ok(Some(owner));
        }
    }
    claims.under(path, uri)
}

/// Files being written now, by path, with the URI each is for (ordered by path, so each check
/// is a lookup, not a scan: an aggregator has many thousands in flight).
impl Claims for std::collections::BTreeMap<String, String> {
    type Error = std::convert::Infallible;
    fn at(&mut self, path: &str) -> Result<Option<String>, Self::Error> {
        Ok(self.get(path).cloned())
    }
    fn under(&mut self, path: &str, uri: &str) -> Result<Option<String>, Self::Error> {
        Ok(self
            .range(format!("{path}/")..format!("{path}0"))
            .find(|(_, u)| *u != uri)
            .map(|(_, u)| u.clone()))
    }
}

/// The claims recorded, read within one transaction; a folder on the way to many paths is
/// looked up once.
struct Recorded<'a> {
    c: &'a Connection,
    folders: std::collections::HashMap<String, Option<String>>,
}

impl<'a> Recorded<'a> {
    fn new(c: &'a Connection) -> Recorded<'a> {
        Recorded {
            c,
            folders: Default::default(),
        }
    }
}

impl Claims for Recorded<'_> {
    type Error = StateError;
    fn at(&mut self, path: &str) -> R<Option<String>> {
        if let Some(o) = self.folders.get(path) {
            return Ok(o.clone());
        }
        let o: Option<String> = self
            .c
            .prepare_cached("SELECT uri FROM claims WHERE path = ?1")?
            .query_row(params![path], |r| r.get(0))
            .optional()?;
        self.folders.insert(path.to_string(), o.clone());
        Ok(o)
    }
    fn under(&mut self, path: &str, uri: &str) -> R<Option<String>> {
        Ok(self
            .c
            .prepare_cached(
                "SELECT uri FROM claims WHERE path > ?1 || '/' AND path < ?1 || '0' AND uri != ?2 LIMIT 1",
            )?
            .query_row(params![path, uri], |r| r.get(0))
            .optional()?)
    }
}

fn held(c: &Connection, set_id: i64, uri: &str) -> R<Option<Held>> {
    Ok(c.prepare_cached(
        "SELECT md5, length, path, lastmod FROM resources WHERE set_id = ?1 AND uri = ?2",
    )?
    .query_row(params![set_id, uri], |r| {
        Ok(Held {
            md5: r.get(0)?,
            length: r.get::<_, Option<i64>>(1)?.map(|n| n as u64),
            path: r.get(2)?,
            lastmod: r.get::<_, Option<i64>>(3)?.map(Timestamp),
        })
    })
    .optional()?)
}

/// Whether `held` is the resource as `c` lists it and its file still exists.
fn as_listed(c: &Change, held: Option<Held>) -> bool {
    held.is_some_and(|h| {
        let same = match (&c.md5, &h.md5) {
            (Some(_), Some(_)) => h.md5 == c.md5,
            (None, _) => c.lastmod.is_some() && !c.newer_than(&h),
            (Some(_), None) => false,
        };
        same && h.length == c.length && std::path::Path::new(&h.path).exists()
    })
}

/// Records `uri` as held by set `set_id` with its file's claim (inside the caller's
/// transaction). Returns the rows written.
fn put_held(c: &Connection, set_id: i64, uri: &str, h: &Held) -> R<usize> {
    c.prepare_cached("INSERT OR REPLACE INTO claims (path, uri) VALUES (?1, ?2)")?
        .execute(params![h.path, uri])?;
    Ok(c
        .prepare_cached(
            "INSERT OR REPLACE INTO resources (set_id, uri, md5, length, path, lastmod) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            set_id,
            uri,
            h.md5,
            h.length.map(|n| n as i64),
            h.path,
            h.lastmod.map(|t| t.0)
        ])?)
}

/// Adds a column to a table made by an earlier version.
/// Adds `n` (may be negative) to the inbox's running total of bytes; returns the new total.
fn add_inbox_bytes(c: &Connection, n: i64) -> R<i64> {
    Ok(c.query_row(
        "UPDATE counters SET value = MAX(0, value + ?1) WHERE name = 'inbox_bytes' RETURNING value",
        [n],
        |r| r.get(0),
    )?)
}

fn add_column(c: &Connection, table: &str, column: &str, decl: &str) -> R<()> {
    let has: bool = c.query_row(
        &format!("SELECT COUNT(*) > 0 FROM pragma_table_info('{table}') WHERE name = ?1"),
        [column],
        |r| r.get(0),
    )?;
    if !has {
        c.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
    }
    Ok(())
}

const SET_COLS: &str = "SELECT id, capability, name, position, baseline_done, source_latest, checked_at, last_push_at, last_error, source, pushed_latest FROM sets";

fn set_row(r: &rusqlite::Row) -> rusqlite::Result<SetRow> {
    Ok(SetRow {
        id: r.get(0)?,
        capability: r.get(1)?,
        name: r.get(2)?,
        position: r.get::<_, Option<i64>>(3)?.map(Timestamp),
        baseline_done: r.get(4)?,
        source_latest: r
            .get::<_, Option<i64>>(5)?
            .filter(|t| *t > 0)
            .map(Timestamp),
        checked_at: r.get::<_, Option<i64>>(6)?.map(Timestamp),
        last_push_at: r.get::<_, Option<i64>>(7)?.map(Timestamp),
        last_error: r.get(8)?,
        source: r.get(9)?,
        pushed_latest: r
            .get::<_, Option<i64>>(10)?
            .filter(|t| *t > 0)
            .map(Timestamp),
    })
}

fn pending_row(r: &rusqlite::Row) -> rusqlite::Result<Pending> {
    Ok(Pending {
        id: r.get(0)?,
        change: Change {
            uri: r.get(1)?,
            change: {
                let s: String = r.get(2)?;
                ChangeType::parse(&s).ok_or_else(|| {
                    rusqlite::Error::FromSqlConversionFailure(
                        2,
                        rusqlite::types::Type::Text,
                        format!("not a change: {s}").into(),
                    )
                })?
            },
            datetime: Timestamp(r.get(3)?),
            md5: r.get(4)?,
            length: r.get::<_, Option<i64>>(5)?.map(|n| n as u64),
            lastmod: r.get::<_, Option<i64>>(6)?.map(Timestamp),
        },
        tries: r.get(7)?,
        last_error: r.get(8)?,
        standing: Standing::of(r.get(9)?, r.get(10)?),
        not_before: r.get::<_, Option<i64>>(11)?.map(Timestamp),
    })
}

fn sub_row(r: &rusqlite::Row) -> rusqlite::Result<Subscription> {
    Ok(Subscription {
        set_id: r.get(0)?,
        hub: r.get(1)?,
        topic: r.get(2)?,
        callback: r.get(3)?,
        secret: r.get::<_, String>(4)?.into(),
        state: SubState::parse(&r.get::<_, String>(5)?),
        requested_at: Timestamp(r.get(6)?),
        verified_at: r.get::<_, Option<i64>>(7)?.map(Timestamp),
        lease_secs: r.get::<_, Option<i64>>(8)?.map(|n| n as u64),
        reason: r.get(9)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(uri: &str, change: &str, dt: i64) -> Change {
        Change {
            uri: uri.into(),
            change: ChangeType::parse(change).unwrap(),
            datetime: Timestamp(dt),
            md5: None,
            length: None,
            lastmod: None,
        }
    }

    #[test]
    fn a_change_is_queued_once_and_applied_once() {
        let dir = tempfile::tempdir().unwrap();
        let s = State::open(&dir.path().join("h.sqlite")).unwrap();
        let set = s.set("", "http://h/cap.xml", "papers").unwrap();
        assert_eq!(
            s.enqueue(
                set.id,
                &[
                    ch("http://h/a", "created", 1),
                    ch("http://h/b", "created", 2)
                ]
            )
            .unwrap(),
            2
        );
        assert_eq!(
            s.enqueue(set.id, &[ch("http://h/a", "created", 1)])
                .unwrap(),
            0,
            "queued already"
        );
        let p = s.pending(set.id).unwrap();
        assert_eq!(s.oldest_pending(set.id).unwrap(), Some(Timestamp(1)));
        s.applied(
            set.id,
            &p[0],
            Some(&Held {
                md5: None,
                length: Some(1),
                path: "a".into(),
                lastmod: None,
            }),
        )
        .unwrap();
        assert_eq!(
            s.enqueue(set.id, &[ch("http://h/a", "created", 1)])
                .unwrap(),
            0,
            "applied already"
        );
        let now = Timestamp::now();
        let failed = s
            .attempt_failed(&p[1], "md5 mismatch", 2, false, now)
            .unwrap();
        assert_eq!(failed.standing, Standing::Trying);
        let failed = s
            .attempt_failed(&failed, "md5 mismatch", 2, false, now)
            .unwrap();
        assert_eq!(failed.standing, Standing::Failed);
        assert_eq!(
            s.oldest_pending(set.id).unwrap(),
            Some(Timestamp(2)),
            "a failed change holds the position"
        );
        s.advance(set.id, Timestamp(10)).unwrap();
        s.advance(set.id, Timestamp(5)).unwrap();
        assert_eq!(
            s.set_by_id(set.id).unwrap().unwrap().position,
            Some(Timestamp(10)),
            "never back"
        );
    }

    #[test]
    fn two_uris_never_claim_one_file_nor_a_file_and_a_folder() {
        let dir = tempfile::tempdir().unwrap();
        let s = State::open(&dir.path().join("h.sqlite")).unwrap();
        let held = |path: &str| Held {
            md5: None,
            length: None,
            path: path.into(),
            lastmod: None,
        };
        let conflict = |path: &str, uri: &str| s.claim_conflict("/m", path, uri).unwrap();
        assert_eq!(conflict("/m/h/dir/index", "http://h/dir/"), None);
        s.hold_many(1, &[("http://h/dir/".into(), held("/m/h/dir/index"))])
            .unwrap();
        assert_eq!(conflict("/m/h/dir/index", "http://h/dir/"), None, "its own");
        let first = Some("http://h/dir/".to_string());
        assert_eq!(conflict("/m/h/dir/index", "http://h/dir/index"), first);
        assert_eq!(
            conflict("/m/h/dir/index/x", "http://h/dir/index/x"),
            first,
            "a file where a folder is needed"
        );
        assert_eq!(
            conflict("/m/h/dir", "http://h/dir"),
            first,
            "a folder where a file is needed"
        );
        assert_eq!(conflict("/m/h/dir0", "http://h/dir0"), None);
        assert!(s.refuse(1, "http://x/a", "off").unwrap());
        assert!(!s.refuse(1, "http://x/a", "off").unwrap(), "seen before");
        assert!(s.is_refused(1, "http://x/a").unwrap());
        let (rows, counts) = s.refusals(10).unwrap();
        assert_eq!((rows[0].count, counts), (2, vec![(1, 1)]));
    }

    /// The inbox refuses a delivery that would take it past its limit, gives the room back
    /// when one is handled, and keeps its total across a restart (as the bodies sum).
    #[test]
    fn the_inbox_keeps_its_total_as_deliveries_come_and_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        let s = State::open(&path).unwrap();
        assert!(s.inbox_put(1, &[b'a'; 400], 1000).unwrap());
        assert!(s.inbox_put(1, &[b'b'; 500], 1000).unwrap());
        assert!(
            !s.inbox_put(1, &[b'c'; 200], 1000).unwrap(),
            "900 + 200 > 1000"
        );
        let (first, _, _) = s.inbox_next(&[1]).unwrap().unwrap();
        s.inbox_done(first).unwrap();
        assert!(s.inbox_put(1, &[b'c'; 200], 1000).unwrap(), "500 + 200 fit");
        drop(s);
        let s = State::open(&path).unwrap();
        assert_eq!(s.inbox_size().unwrap(), (2, 700));
        assert_eq!(s.counter("inbox_bytes").unwrap(), 700);
        assert!(!s.inbox_put(1, &[b'd'; 301], 1000).unwrap());
        assert!(s.inbox_put(1, &[b'd'; 300], 1000).unwrap());
    }
}
