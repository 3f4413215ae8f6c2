//! The embedded backend: one SQLite database (WAL, synchronous=FULL but for the hub's
//! messages and delivery records: see `Durability`) under the data directory.
//! One writer connection serialises applies; a small pool of readers serves documents. Every
//! call runs on tokio's blocking pool.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};

mod hub;
mod notify;
use super::plan;
use notify::state_from_row;

use super::{
    ApplyError, ApplyOutcome, Built, ChangeListInfo, Counts, Cursor, ListPolicy, NotifyState,
    OpenTotals, Page, PartDelta, PartInfo, SetInfo, SetStore, StoreError,
};
use crate::model::{
    Change, ChangeType, Link, Location, LocationType, NewChange, Resource, ResourceKey,
    ResourceMeta, SetName, Timestamp,
};

const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sets (name TEXT PRIMARY KEY, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS resources (
    rid INTEGER PRIMARY KEY AUTOINCREMENT,
    set_name TEXT NOT NULL,
    key TEXT NOT NULL,
    part INTEGER NOT NULL,
    loc_type TEXT NOT NULL,
    loc_value TEXT NOT NULL,
    length INTEGER, md5 TEXT, mime TEXT, lastmod INTEGER, ln TEXT,
    timestamp INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS resources_key ON resources (set_name, key);
CREATE INDEX IF NOT EXISTS resources_part ON resources (set_name, part, rid);
CREATE TABLE IF NOT EXISTS rl_parts (
    set_name TEXT NOT NULL, part INTEGER NOT NULL,
    count INTEGER NOT NULL, bytes INTEGER NOT NULL,
    last_seq INTEGER NOT NULL, last_change INTEGER NOT NULL,
    PRIMARY KEY (set_name, part)
);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    set_name TEXT NOT NULL,
    key TEXT NOT NULL,
    loc_type TEXT NOT NULL,
    loc_value TEXT NOT NULL,
    change TEXT NOT NULL,
    datetime INTEGER NOT NULL,
    length INTEGER, md5 TEXT, mime TEXT, lastmod INTEGER, ln TEXT,
    timestamp INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS changes_dt ON changes (set_name, datetime, seq);
CREATE INDEX IF NOT EXISTS changes_key ON changes (set_name, key, datetime, seq);
CREATE TABLE IF NOT EXISTS changelists (
    set_name TEXT NOT NULL, no INTEGER NOT NULL,
    from_ts INTEGER NOT NULL, until_ts INTEGER,
    count INTEGER NOT NULL, bytes INTEGER NOT NULL,
    last_seq INTEGER NOT NULL, max_dt INTEGER,
    PRIMARY KEY (set_name, no)
);
"#;

/// Additive: a database from an earlier build gains these tables on open.
const HUB_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS hub_intents (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    mode TEXT NOT NULL, topic TEXT NOT NULL, callback TEXT NOT NULL,
    lease_secs INTEGER NOT NULL, secret TEXT, alg TEXT NOT NULL, reason TEXT, verify_token TEXT,
    requested_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS hub_subscriptions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL, callback TEXT NOT NULL, secret TEXT, alg TEXT NOT NULL,
    lease_secs INTEGER NOT NULL, lease_start INTEGER NOT NULL, expires_at INTEGER NOT NULL,
    verified_at INTEGER NOT NULL, created_at INTEGER NOT NULL,
    cursor INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at INTEGER,
    delivered INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    last_success_at INTEGER, last_success_status INTEGER,
    last_failure_at INTEGER, last_failure_status INTEGER, last_failure_error TEXT,
    UNIQUE (topic, callback)
);
CREATE TABLE IF NOT EXISTS hub_topics (
    topic TEXT PRIMARY KEY, last_message INTEGER, published_at INTEGER, created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS hub_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL, content_type TEXT NOT NULL, body BLOB NOT NULL, published_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS hub_messages_topic ON hub_messages (topic, id);
CREATE TABLE IF NOT EXISTS hub_failures (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    subscription_id INTEGER NOT NULL, message_id INTEGER NOT NULL, attempts INTEGER NOT NULL,
    status INTEGER, error TEXT NOT NULL, at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS hub_failures_sub ON hub_failures (subscription_id, id);
CREATE TABLE IF NOT EXISTS notify_state (
    set_name TEXT PRIMARY KEY,
    watermark INTEGER NOT NULL, parts_seen INTEGER NOT NULL, lists_seen INTEGER NOT NULL,
    announced INTEGER NOT NULL, version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS saved_state (
    key TEXT PRIMARY KEY, json TEXT NOT NULL, version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS aliases (
    alias TEXT PRIMARY KEY, collector TEXT NOT NULL, identifier TEXT NOT NULL
);
"#;

#[derive(Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    /// Batches being applied, by the time they are dated from (see [`SetStore::settle`]).
    applying: Mutex<std::collections::BTreeSet<(i64, u64)>>,
    applied: tokio::sync::Notify,
    batches: std::sync::atomic::AtomicU64,
}

/// A batch being applied: registered while it is dated but not yet committed.
struct Applying<'a> {
    inner: &'a Inner,
    at: (i64, u64),
}

impl Drop for Applying<'_> {
    fn drop(&mut self) {
        self.inner
            .applying
            .lock()
            .expect("applying lock")
            .remove(&self.at);
        self.inner.applied.notify_waiters();
    }
}

impl Inner {
    /// Flushes the write-ahead log to the disk (opened anew each time: a handle kept open
    /// would miss a log that SQLite removed and created again).
    fn sync_log(&self) -> Result<(), StoreError> {
        let wal = self.log_path();
        let file = match std::fs::File::open(&wal) {
            Ok(f) => f,
            // No log: everything is in the database file, synced by its checkpoint.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(sync_failed(&wal, e)),
        };
        file.sync_data().map_err(|e| sync_failed(&wal, e))
    }

    /// SQLite's write-ahead log of the database: its path with `-wal` appended.
    fn log_path(&self) -> PathBuf {
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        PathBuf::from(wal)
    }
}

fn sync_failed(wal: &Path, e: std::io::Error) -> StoreError {
    StoreError::io(format!("cannot sync {} to the disk", wal.display()), e)
}

/// Sets the writer's `synchronous` mode (a statement prepared once per connection: this is on
/// the path of every publish and delivery record).
fn set_synchronous(conn: &Connection, mode: &str) -> Result<(), StoreError> {
    conn.prepare_cached(&format!("PRAGMA synchronous = {mode}"))?
        .execute([])?;
    Ok(())
}

/// When a write reaches the disk.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// `synchronous = FULL`: on the disk before any reader can see it, so whatever is served
    /// or announced (a change, its position) survives a power cut. Every write but these two:
    Full,
    /// The log is synced after the writer is released, so the next writer (a delivery record,
    /// another publish) does not wait for this one's disk flush. On the disk when the write
    /// returns (the log is only reused after a checkpoint has synced it and copied it into the
    /// database file), but readers can see it a moment earlier: only for writes where that
    /// moment costs at most a repeat after a power cut (the hub's published messages), never
    /// for the source's changes.
    AfterRelease,
    /// Not waited for: survives the process being killed (it is in the operating system's
    /// hands) but not a power cut (the hub's delivery records).
    None,
}

/// The open Change List of a set, as the apply loop tracks it.
struct OpenList {
    no: u32,
    from: i64,
    count: u64,
    bytes: u64,
    last_seq: i64,
    max_dt: Option<i64>,
}

impl EmbeddedStore {
    pub fn open(path: &Path) -> Result<EmbeddedStore, StoreError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::io(format!("cannot create {}", dir.display()), e))?;
        }
        let conn = open_conn(path)?;
        conn.execute_batch(SCHEMA)?;
        conn.execute_batch(HUB_SCHEMA)?;
        // Additive columns of later builds: the topic and callback as given (the key columns
        // hold their normal form).
        for (table, column, decl) in [
            ("hub_intents", "topic_given", "TEXT"),
            ("hub_intents", "callback_given", "TEXT"),
            ("hub_subscriptions", "topic_given", "TEXT"),
            ("hub_subscriptions", "callback_given", "TEXT"),
            // The secret before the last one, signing too until `previous_until`.
            ("hub_subscriptions", "previous_secret", "TEXT"),
            ("hub_subscriptions", "previous_until", "INTEGER"),
            // Deliveries held (paused or disabled) since `held_at`; failing since when.
            ("hub_subscriptions", "held_reason", "TEXT"),
            ("hub_subscriptions", "held_at", "INTEGER"),
            ("hub_subscriptions", "failing_since", "INTEGER"),
            // Deliveries a second at most (NULL: the hub's default).
            ("hub_subscriptions", "max_per_sec", "REAL"),
            // How the hub authenticates to the receiver (JSON), set by an admin.
            ("hub_subscriptions", "delivery_auth", "TEXT"),
            // The Resource List part of the change's resource (NULL in rows of earlier
            // builds): a part brought up to date looks up only its own changes' resources.
            ("changes", "part", "INTEGER"),
        ] {
            let has: bool = conn
                .prepare(&format!(
                    "SELECT 1 FROM pragma_table_info('{table}') WHERE name = ?1"
                ))?
                .exists([column])?;
            if !has {
                conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
            }
        }
        let version: Option<String> = conn
            .query_row(
                "SELECT value FROM meta WHERE key='schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()?;
        match version {
            None => {
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)",
                    [SCHEMA_VERSION.to_string()],
                )?;
            }
            Some(v) if v == SCHEMA_VERSION.to_string() => {}
            Some(v) => {
                return Err(StoreError::Corrupt(format!(
                    "{} has schema version {v}; this build knows version {SCHEMA_VERSION}",
                    path.display()
                )))
            }
        }
        Ok(EmbeddedStore {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                writer: Mutex::new(conn),
                readers: Mutex::new(Vec::new()),
                applying: Default::default(),
                applied: tokio::sync::Notify::new(),
                batches: Default::default(),
            }),
        })
    }

    /// Runs `f` on a pooled reader connection on the blocking pool, in one read transaction:
    /// its statements see one state of the database, and SQLite's read lock is taken and let
    /// go once (a statement on its own does both, system calls each: a quarter of an OAI-PMH
    /// page's time went there when its lookups ran one statement per record).
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = inner.readers.lock().expect("reader pool").pop();
            let conn = match pooled {
                Some(c) => c,
                None => open_conn(&inner.path)?,
            };
            let out = in_read_transaction(&conn, f);
            let mut pool = inner.readers.lock().expect("reader pool");
            // A connection left inside a transaction (its COMMIT failed) is not reused.
            if pool.len() < 8 && conn.is_autocommit() {
                pool.push(conn);
            }
            out
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("store task failed: {e}")))?
    }

    /// Runs `f` on the writer connection on the blocking pool ([`Durability::Full`]).
    async fn write<T: Send + 'static, E: From<StoreError> + Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        self.write_with(Durability::Full, f).await
    }

    /// Runs `f` on the writer connection on the blocking pool, reaching the disk as
    /// `durability` says.
    async fn write_with<T: Send + 'static, E: From<StoreError> + Send + 'static>(
        &self,
        durability: Durability,
        f: impl FnOnce(&mut Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let out = {
                let mut conn = inner.writer.lock().expect("writer");
                if durability == Durability::Full {
                    f(&mut conn)?
                } else {
                    set_synchronous(&conn, "NORMAL").map_err(E::from)?;
                    let out = f(&mut conn);
                    set_synchronous(&conn, "FULL").map_err(E::from)?;
                    out?
                }
            };
            if durability == Durability::AfterRelease {
                inner.sync_log().map_err(E::from)?;
            }
            Ok(out)
        })
        .await
        .map_err(|e| E::from(StoreError::Unavailable(format!("store task failed: {e}"))))?
    }
}

/// Runs `f` between `BEGIN` and `COMMIT` statements prepared once per connection (rusqlite's
/// transaction parses both anew each time: 5% of a loaded server's samples).
fn in_read_transaction<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    conn.prepare_cached("BEGIN")?.execute([])?;
    let out = f(conn);
    let end = conn
        .prepare_cached("COMMIT")
        .and_then(|mut c| c.execute([]));
    let out = out?;
    end?;
    Ok(out)
}

fn open_conn(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)
        .map_err(|e| StoreError::sqlite(format!("cannot open {}", path.display()), e))?;
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    // Plans never depend on bound values: otherwise SQLite prepares a statement again each
    // time a different value is bound to its `LIMIT ?` (it plans with the value), and our
    // cached page and lookup statements bind a different limit nearly every time (5% of a
    // loaded server's samples were re-preparing).
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;",
    )?;
    Ok(conn)
}

fn parse_int_cursor(c: Option<Cursor>) -> Result<i64, StoreError> {
    match c {
        None => Ok(0),
        Some(Cursor(s)) => s
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("bad cursor {s:?}"))),
    }
}

/// Registers a set if it is new. Its first Change List (and the notifier's watermark) starts
/// at `start`: the earliest datetime of the batch that creates it, so a backlog keeps its
/// real change dates.
fn ensure_set_tx(
    tx: &rusqlite::Transaction,
    set: &SetName,
    now: Timestamp,
    start: Timestamp,
) -> Result<bool, StoreError> {
    let n = tx.execute(
        "INSERT OR IGNORE INTO sets (name, created_at) VALUES (?1, ?2)",
        params![set.as_str(), now.0],
    )?;
    if n == 1 {
        tx.execute(
            "INSERT INTO changelists (set_name, no, from_ts, until_ts, count, bytes, last_seq, max_dt) \
             VALUES (?1, 1, ?2, NULL, 0, 0, 0, NULL)",
            params![set.as_str(), start.0],
        )?;
        // The notifier announces the new set and notifies its changes from its first one on.
        tx.execute(
            "INSERT OR IGNORE INTO notify_state (set_name, watermark, parts_seen, lists_seen, announced, version) \
             VALUES (?1, ?2, 0, 1, 0, 0)",
            params![set.as_str(), start.0],
        )?;
    }
    Ok(n == 1)
}

fn load_open_list(
    tx: &rusqlite::Transaction,
    set: &SetName,
) -> Result<Option<OpenList>, StoreError> {
    Ok(tx
        .query_row(
            "SELECT no, from_ts, count, bytes, last_seq, max_dt FROM changelists \
             WHERE set_name = ?1 AND until_ts IS NULL",
            [set.as_str()],
            |r| {
                Ok(OpenList {
                    no: r.get(0)?,
                    from: r.get(1)?,
                    count: r.get::<_, i64>(2)? as u64,
                    bytes: r.get::<_, i64>(3)? as u64,
                    last_seq: r.get(4)?,
                    max_dt: r.get(5)?,
                })
            },
        )
        .optional()?)
}

impl OpenList {
    fn totals(&self) -> OpenTotals {
        OpenTotals {
            from: self.from,
            count: self.count,
            bytes: self.bytes,
            max_dt: self.max_dt,
        }
    }
}

/// Closes the open list (see [`OpenTotals::close_time`]) and opens the next one from there.
fn close_list(
    tx: &rusqlite::Transaction,
    set: &SetName,
    open: &mut OpenList,
    now: Timestamp,
) -> Result<(), StoreError> {
    let until = open.totals().close_time(now);
    tx.execute(
        "UPDATE changelists SET until_ts = ?3, count = ?4, bytes = ?5, last_seq = ?6, max_dt = ?7 \
         WHERE set_name = ?1 AND no = ?2",
        params![
            set.as_str(),
            open.no,
            until,
            open.count as i64,
            open.bytes as i64,
            open.last_seq,
            open.max_dt
        ],
    )?;
    *open = OpenList {
        no: open.no + 1,
        from: until,
        count: 0,
        bytes: 0,
        last_seq: open.last_seq,
        max_dt: None,
    };
    tx.execute(
        "INSERT INTO changelists (set_name, no, from_ts, until_ts, count, bytes, last_seq, max_dt) \
         VALUES (?1, ?2, ?3, NULL, 0, 0, ?4, NULL)",
        params![set.as_str(), open.no, open.from, open.last_seq],
    )?;
    Ok(())
}

fn apply_tx(
    tx: &rusqlite::Transaction,
    set: &SetName,
    changes: Vec<NewChange>,
    policy: ListPolicy,
    now: Timestamp,
) -> Result<ApplyOutcome, ApplyError> {
    let start = crate::store::batch_start(&changes, now);
    let mut out = ApplyOutcome {
        set_created: ensure_set_tx(tx, set, now, start)?,
        ..Default::default()
    };
    let mut open = load_open_list(tx, set)?
        .ok_or_else(|| StoreError::Corrupt(format!("set {set} has no open change list")))?;
    let mut last_part: Option<plan::LastPart> = tx
        .query_row(
            "SELECT part, count, bytes FROM rl_parts WHERE set_name = ?1 ORDER BY part DESC LIMIT 1",
            [set.as_str()],
            |r| Ok(plan::LastPart { no: r.get(0)?, count: r.get::<_, i64>(1)? as u64, bytes: r.get::<_, i64>(2)? as u64 }),
        )
        .optional()
        .map_err(StoreError::from)?;
    // Change notifications have been sent for everything dated before this.
    let notified: Option<i64> = tx
        .query_row(
            "SELECT watermark FROM notify_state WHERE set_name = ?1",
            [set.as_str()],
            |r| r.get(0),
        )
        .optional()
        .map_err(StoreError::from)?;
    let sql_err = |e: rusqlite::Error| ApplyError::Store(e.into());

    for (index, mut c) in changes.into_iter().enumerate() {
        let existing: Option<(i64, u32, i64)> = tx
            .prepare_cached(
                "SELECT rid, part, bytes FROM resources WHERE set_name = ?1 AND key = ?2",
            )
            .map_err(sql_err)?
            .query_row(params![set.as_str(), c.key.0], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()
            .map_err(sql_err)?;
        // The resource's newest change (this batch's earlier ones included: same transaction).
        // Only a change that comes with its datetime can be dated before it: one dated on
        // arrival is after everything the set holds.
        let newest: Option<i64> = match c.datetime {
            None => None,
            Some(_) => tx
                .prepare_cached(
                    "SELECT MAX(datetime) FROM changes WHERE set_name = ?1 AND key = ?2",
                )
                .map_err(sql_err)?
                .query_row(params![set.as_str(), c.key.0], |r| r.get(0))
                .map_err(sql_err)?,
        };
        let Some(planned) = plan::plan_into(
            &mut out,
            index,
            &mut c,
            existing.map(|(_, part, bytes)| (part, bytes as u64)),
            newest,
            &open.totals(),
            last_part,
            notified,
            &policy,
            now,
        )?
        else {
            continue;
        };
        if planned.roll {
            out.closed_lists.push(open.no);
            close_list(tx, set, &mut open, now)?;
        }
        let (datetime, eb) = (planned.datetime, planned.entry_bytes);
        let ln = if c.meta.ln.is_empty() {
            None
        } else {
            Some(serde_json::to_string(&c.meta.ln).expect("links serialise"))
        };
        tx.prepare_cached(
            "INSERT INTO changes (set_name, key, loc_type, loc_value, change, datetime, length, md5, mime, lastmod, ln, timestamp, part) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        )
        .map_err(sql_err)?
        .execute(params![
            set.as_str(),
            c.key.0,
            c.location.kind.as_str(),
            c.location.value,
            c.change.as_str(),
            datetime.0,
            c.meta.length.map(|l| l as i64),
            c.meta.md5,
            c.meta.mime,
            c.meta.lastmod.map(|t| t.0),
            ln,
            now.0,
            planned.effect.part()
        ])
        .map_err(sql_err)?;
        let seq = tx.last_insert_rowid();
        open.count += 1;
        open.bytes += eb;
        open.last_seq = seq;
        open.max_dt = Some(open.max_dt.map_or(datetime.0, |m| m.max(datetime.0)));
        out.applied.push((index, seq));
        last_part = plan::LastPart::after(last_part, planned.effect, eb);

        let touch_part = |part: u32, dcount: i64, dbytes: i64| -> Result<(), ApplyError> {
            tx.prepare_cached(
                "UPDATE rl_parts SET count = count + ?3, bytes = bytes + ?4, last_seq = ?5, last_change = ?6 \
                 WHERE set_name = ?1 AND part = ?2",
            )
            .map_err(sql_err)?
            .execute(params![set.as_str(), part, dcount, dbytes, seq, datetime.0])
            .map_err(sql_err)?;
            Ok(())
        };
        let (part, dcount, dbytes) = match planned.effect {
            plan::Effect::Delete { part, bytes } => {
                let rid = existing
                    .map(|(rid, ..)| rid)
                    .expect("a deletion of something held");
                tx.prepare_cached("DELETE FROM resources WHERE rid = ?1")
                    .map_err(sql_err)?
                    .execute([rid])
                    .map_err(sql_err)?;
                touch_part(part, -1, -(bytes as i64))?;
                continue;
            }
            plan::Effect::Update { part, dbytes } => (part, 0, dbytes),
            plan::Effect::Create { part, new_part } => {
                if new_part {
                    tx.prepare_cached(
                        "INSERT INTO rl_parts (set_name, part, count, bytes, last_seq, last_change) VALUES (?1, ?2, 0, 0, 0, 0)",
                    )
                    .map_err(sql_err)?
                    .execute(params![set.as_str(), part])
                    .map_err(sql_err)?;
                }
                (part, 1, eb as i64)
            }
        };
        // One upsert for both: an existing resource keeps its part.
        tx.prepare_cached(
            "INSERT INTO resources (set_name, key, part, loc_type, loc_value, length, md5, mime, lastmod, ln, timestamp, bytes) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) \
             ON CONFLICT (set_name, key) DO UPDATE SET loc_type = excluded.loc_type, loc_value = excluded.loc_value, \
             length = excluded.length, md5 = excluded.md5, mime = excluded.mime, lastmod = excluded.lastmod, \
             ln = excluded.ln, timestamp = excluded.timestamp, bytes = excluded.bytes",
        )
        .map_err(sql_err)?
        .execute(params![
            set.as_str(),
            c.key.0,
            part,
            c.location.kind.as_str(),
            c.location.value,
            c.meta.length.map(|l| l as i64),
            c.meta.md5,
            c.meta.mime,
            c.meta.lastmod.map(|t| t.0),
            ln,
            now.0,
            eb as i64
        ])
        .map_err(sql_err)?;
        touch_part(part, dcount, dbytes)?;
    }
    tx.execute(
        "UPDATE changelists SET count = ?3, bytes = ?4, last_seq = ?5, max_dt = ?6 WHERE set_name = ?1 AND no = ?2",
        params![set.as_str(), open.no, open.count as i64, open.bytes as i64, open.last_seq, open.max_dt],
    )
    .map_err(sql_err)?;
    Ok(out)
}

fn location_from(kind: &str, value: String) -> rusqlite::Result<Location> {
    let kind = LocationType::parse(kind).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Text,
            format!("location type {kind:?}").into(),
        )
    })?;
    Ok(Location { kind, value })
}

fn links_from(ln: Option<String>) -> rusqlite::Result<Vec<Link>> {
    match ln {
        None => Ok(Vec::new()),
        Some(s) => serde_json::from_str(&s).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
        }),
    }
}

/// Up to `limit` resources of a set (one part, or all with `None`) after `rid` `after`, in rid
/// order, each with its rid (its position in its part).
fn resource_rows(
    c: &Connection,
    set: &SetName,
    part: Option<u32>,
    after: i64,
    limit: usize,
) -> Result<Vec<(i64, Resource)>, StoreError> {
    let sql = match part {
        Some(_) => "SELECT rid, key, loc_type, loc_value, length, md5, mime, lastmod, ln, timestamp \
                    FROM resources WHERE set_name = ?1 AND part = ?2 AND rid > ?3 ORDER BY rid LIMIT ?4",
        None => "SELECT rid, key, loc_type, loc_value, length, md5, mime, lastmod, ln, timestamp \
                 FROM resources WHERE set_name = ?1 AND ?2 IS NULL AND rid > ?3 ORDER BY rid LIMIT ?4",
    };
    let mut st = c.prepare_cached(sql)?;
    let mut rows = st.query(params![set.as_str(), part, after, limit as i64])?;
    let mut items = Vec::with_capacity(limit.min(10_000));
    while let Some(r) = rows.next()? {
        items.push((r.get(0)?, resource_from_row(r)?));
    }
    Ok(items)
}

/// Columns: rid, key, loc_type, loc_value, length, md5, mime, lastmod, ln, timestamp.
fn resource_from_row(r: &Row) -> rusqlite::Result<Resource> {
    Ok(Resource {
        key: ResourceKey(r.get(1)?),
        location: location_from(r.get_ref(2)?.as_str()?, r.get(3)?)?,
        meta: ResourceMeta {
            length: r.get::<_, Option<i64>>(4)?.map(|l| l as u64),
            md5: r.get(5)?,
            mime: r.get(6)?,
            lastmod: r.get::<_, Option<i64>>(7)?.map(Timestamp),
            ln: links_from(r.get(8)?)?,
        },
        timestamp: Timestamp(r.get(9)?),
    })
}

/// Columns: seq, key, loc_type, loc_value, change, datetime, length, md5, mime, lastmod, ln, timestamp.
fn change_from_row(r: &Row) -> rusqlite::Result<Change> {
    let change = ChangeType::parse(r.get_ref(4)?.as_str()?).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            4,
            rusqlite::types::Type::Text,
            "change type".into(),
        )
    })?;
    Ok(Change {
        id: r.get(0)?,
        key: ResourceKey(r.get(1)?),
        location: location_from(r.get_ref(2)?.as_str()?, r.get(3)?)?,
        change,
        datetime: Timestamp(r.get(5)?),
        meta: ResourceMeta {
            length: r.get::<_, Option<i64>>(6)?.map(|l| l as u64),
            md5: r.get(7)?,
            mime: r.get(8)?,
            lastmod: r.get::<_, Option<i64>>(9)?.map(Timestamp),
            ln: links_from(r.get(10)?)?,
        },
        timestamp: Timestamp(r.get(11)?),
    })
}

#[async_trait::async_trait]
impl SetStore for EmbeddedStore {
    async fn ensure_set(&self, set: &SetName, now: Timestamp) -> Result<bool, StoreError> {
        let set = set.clone();
        self.write(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let created = ensure_set_tx(&tx, &set, now, now)?;
            tx.commit()?;
            Ok(created)
        })
        .await
    }

    async fn sets(&self) -> Result<Vec<SetInfo>, StoreError> {
        self.read(|c| {
            let mut st = c.prepare_cached("SELECT name, created_at FROM sets ORDER BY name")?;
            let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
            let mut out = Vec::new();
            for row in rows {
                let (name, created) = row?;
                let name = SetName::parse(&name).map_err(StoreError::Corrupt)?;
                out.push(SetInfo {
                    name,
                    created_at: Timestamp(created),
                });
            }
            Ok(out)
        })
        .await
    }

    async fn apply(
        &self,
        set: &SetName,
        changes: Vec<NewChange>,
        policy: ListPolicy,
        now: Timestamp,
    ) -> Result<ApplyOutcome, ApplyError> {
        let set = set.clone();
        // Registered from before it waits for the write lock until it has committed (or
        // failed): readers settling up to a later moment wait for it.
        let dated = changes
            .iter()
            .filter_map(|c| c.datetime)
            .fold(now, |a, b| a.min(b));
        let at = (
            dated.0,
            self.inner
                .batches
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        );
        self.inner
            .applying
            .lock()
            .expect("applying lock")
            .insert(at);
        let _applying = Applying {
            inner: &self.inner,
            at,
        };
        self.write(move |c| {
            let tx = c
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(StoreError::from)?;
            let out = apply_tx(&tx, &set, changes, policy, now)?;
            tx.commit().map_err(StoreError::from)?;
            Ok(out)
        })
        .await
    }

    async fn settle(&self, until: Timestamp) {
        loop {
            let applied = self.inner.applied.notified();
            let oldest = self
                .inner
                .applying
                .lock()
                .expect("applying lock")
                .first()
                .map(|(t, _)| *t);
            if oldest.is_none_or(|t| t >= until.0) {
                return;
            }
            applied.await;
        }
    }

    async fn rollover_if_due(
        &self,
        set: &SetName,
        policy: ListPolicy,
        now: Timestamp,
    ) -> Result<Option<u32>, StoreError> {
        let set = set.clone();
        self.write(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let Some(mut open) = load_open_list(&tx, &set)? else {
                return Ok(None);
            };
            if !policy.period_over(&open.totals(), now) {
                return Ok(None);
            }
            let closed = open.no;
            close_list(&tx, &set, &mut open, now)?;
            tx.commit()?;
            Ok(Some(closed))
        })
        .await
    }

    async fn parts(&self, set: &SetName) -> Result<Vec<PartInfo>, StoreError> {
        let set = set.clone();
        self.read(move |c| {
            let mut st = c.prepare_cached(
                "SELECT part, count, last_seq, last_change FROM rl_parts WHERE set_name = ?1 ORDER BY part",
            )?;
            let rows = st.query_map([set.as_str()], |r| {
                Ok(PartInfo {
                    no: r.get(0)?,
                    count: r.get::<_, i64>(1)? as u64,
                    last_seq: r.get(2)?,
                    last_change: Timestamp(r.get(3)?),
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn resources(
        &self,
        set: &SetName,
        part: Option<u32>,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<Page<Resource>, StoreError> {
        let set = set.clone();
        let after = parse_int_cursor(after)?;
        self.read(move |c| {
            let rows = resource_rows(c, &set, part, after, limit)?;
            let last = rows.last().map_or(after, |(rid, _)| *rid);
            let next = (rows.len() == limit).then(|| Cursor(last.to_string()));
            Ok(Page {
                items: rows.into_iter().map(|(_, r)| r).collect(),
                next,
            })
        })
        .await
    }

    async fn part_resources(
        &self,
        set: &SetName,
        part: u32,
        after: i64,
        limit: usize,
    ) -> Result<Option<Vec<(i64, Resource)>>, StoreError> {
        let set = set.clone();
        self.read(move |c| Ok(Some(resource_rows(c, &set, Some(part), after, limit)?)))
            .await
    }

    async fn part_delta(
        &self,
        set: &SetName,
        part: u32,
        since: i64,
        built: Built,
        limit: usize,
    ) -> Result<Option<PartDelta>, StoreError> {
        let set = set.clone();
        self.read(move |c| {
            let part_now: Option<(i64, i64)> = c
                .prepare_cached(
                    "SELECT last_seq, count FROM rl_parts WHERE set_name = ?1 AND part = ?2",
                )?
                .query_row(params![set.as_str(), part], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            let Some((last_seq, count)) = part_now else {
                return Ok(None);
            };
            // Changes are numbered in commit order across sets: those after `since` are the
            // tail of the log, read by number (`+set_name` keeps the planner off the index
            // that would scan the set's whole log).
            let after: i64 = c
                .prepare_cached(
                    "SELECT count(*) FROM (SELECT 1 FROM changes WHERE seq > ?1 AND +set_name = ?2 LIMIT ?3)",
                )?
                .query_row(params![since, set.as_str(), limit as i64 + 1], |r| r.get(0))?;
            if after as usize > limit {
                return Ok(None);
            }
            let mut changed = Vec::new();
            {
                let mut st = c.prepare_cached(
                    "SELECT DISTINCT r.rid, r.key, r.loc_type, r.loc_value, r.length, r.md5, r.mime, r.lastmod, r.ln, r.timestamp \
                     FROM changes c CROSS JOIN resources r ON r.set_name = c.set_name AND r.key = c.key \
                     WHERE c.seq > ?1 AND +c.set_name = ?2 AND (c.part = ?3 OR c.part IS NULL) AND r.part = ?3 ORDER BY r.rid",
                )?;
                let mut rows = st.query(params![since, set.as_str(), part])?;
                while let Some(r) = rows.next()? {
                    changed.push((r.get(0)?, resource_from_row(r)?));
                }
            }
            // Rids only grow, so a resource made since has a rid past the build's last: when
            // none of those was touched and the count is the build's, no resource came or went,
            // and the part's 50,000 positions need not be read again (most rebuilds: updates).
            let same = count == built.count as i64
                && changed
                    .last()
                    .is_none_or(|(rid, _)| *rid <= built.last_position);
            let positions = if same {
                None
            } else {
                Some(
                    c.prepare_cached(
                        "SELECT rid FROM resources WHERE set_name = ?1 AND part = ?2 ORDER BY rid",
                    )?
                    .query_map(params![set.as_str(), part], |r| r.get(0))?
                    .collect::<Result<Vec<i64>, _>>()?,
                )
            };
            Ok(Some(PartDelta {
                positions,
                changed,
                last_seq,
            }))
        })
        .await
    }

    async fn resource(
        &self,
        set: &SetName,
        key: &ResourceKey,
    ) -> Result<Option<Resource>, StoreError> {
        Ok(self
            .resources_by_key(set, std::slice::from_ref(key))
            .await?
            .pop()
            .flatten())
    }

    async fn resources_by_key(
        &self,
        set: &SetName,
        keys: &[ResourceKey],
    ) -> Result<Vec<Option<Resource>>, StoreError> {
        let (set, keys) = (set.clone(), keys.to_vec());
        self.read(move |c| {
            let mut st = c.prepare_cached(
                "SELECT rid, key, loc_type, loc_value, length, md5, mime, lastmod, ln, timestamp \
                 FROM resources WHERE set_name = ?1 AND key = ?2",
            )?;
            let mut out = Vec::with_capacity(keys.len());
            for key in keys {
                let mut rows = st.query(params![set.as_str(), key.0])?;
                out.push(match rows.next()? {
                    Some(r) => Some(resource_from_row(r)?),
                    None => None,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn changelists(&self, set: &SetName) -> Result<Vec<ChangeListInfo>, StoreError> {
        let set = set.clone();
        self.read(move |c| {
            let mut st = c.prepare_cached(
                "SELECT no, from_ts, until_ts, count, last_seq, max_dt FROM changelists \
                 WHERE set_name = ?1 ORDER BY no",
            )?;
            let rows = st.query_map([set.as_str()], |r| {
                Ok(ChangeListInfo {
                    no: r.get(0)?,
                    from: Timestamp(r.get(1)?),
                    until: r.get::<_, Option<i64>>(2)?.map(Timestamp),
                    count: r.get::<_, i64>(3)? as u64,
                    last_seq: r.get(4)?,
                    last_change: r.get::<_, Option<i64>>(5)?.map(Timestamp),
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn changes(
        &self,
        set: &SetName,
        from: Timestamp,
        until: Option<Timestamp>,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<Page<Change>, StoreError> {
        let set = set.clone();
        let (after_dt, after_seq) = match after {
            None => (from.0, 0),
            Some(Cursor(s)) => {
                let (a, b) = s
                    .split_once(':')
                    .ok_or_else(|| StoreError::Corrupt(format!("bad cursor {s:?}")))?;
                let p = |x: &str| {
                    x.parse::<i64>()
                        .map_err(|_| StoreError::Corrupt(format!("bad cursor {s:?}")))
                };
                (p(a)?, p(b)?)
            }
        };
        let until = until.map_or(i64::MAX, |t| t.0);
        self.read(move |c| {
            let mut st = c.prepare_cached(
                "SELECT seq, key, loc_type, loc_value, change, datetime, length, md5, mime, lastmod, ln, timestamp \
                 FROM changes WHERE set_name = ?1 AND (datetime, seq) > (?2, ?3) AND datetime < ?4 \
                 ORDER BY datetime, seq LIMIT ?5",
            )?;
            let mut rows = st.query(params![set.as_str(), after_dt, after_seq, until, limit as i64])?;
            let mut items = Vec::new();
            while let Some(r) = rows.next()? {
                items.push(change_from_row(r)?);
            }
            let next = match items.last() {
                Some(c) if items.len() == limit => Some(Cursor(format!("{}:{}", c.datetime.0, c.id))),
                _ => None,
            };
            Ok(Page { items, next })
        })
        .await
    }

    /// A batch is registered as being applied the moment after it is dated, and readers
    /// [`SetStore::settle`]: only that moment.
    fn visibility_lag_micros(&self) -> i64 {
        10_000
    }

    fn change_cursor(&self, datetime: Timestamp, id: i64) -> Cursor {
        Cursor(format!("{}:{id}", datetime.0))
    }

    async fn latest_changes(
        &self,
        set: &SetName,
        keys: &[ResourceKey],
        until: Timestamp,
    ) -> Result<std::collections::HashMap<ResourceKey, (Timestamp, i64)>, StoreError> {
        let (set, keys) = (set.clone(), keys.to_vec());
        self.read(move |c| {
            let mut st = c.prepare_cached(
                "SELECT datetime, seq FROM changes WHERE set_name = ?1 AND key = ?2 AND datetime < ?3 \
                 ORDER BY datetime DESC, seq DESC LIMIT 1",
            )?;
            let mut out = std::collections::HashMap::with_capacity(keys.len());
            for key in keys {
                let mut rows = st.query(params![set.as_str(), key.0, until.0])?;
                if let Some(r) = rows.next()? {
                    out.insert(key, (Timestamp(r.get(0)?), r.get(1)?));
                }
            }
            Ok(out)
        })
        .await
    }

    async fn counts(&self, set: &SetName) -> Result<Counts, StoreError> {
        let set = set.clone();
        self.read(move |c| {
            let resources: i64 = c.query_row(
                "SELECT COALESCE(SUM(count), 0) FROM rl_parts WHERE set_name = ?1",
                [set.as_str()],
                |r| r.get(0),
            )?;
            let changes: i64 = c.query_row(
                "SELECT COALESCE(SUM(count), 0) FROM changelists WHERE set_name = ?1",
                [set.as_str()],
                |r| r.get(0),
            )?;
            Ok(Counts {
                resources: resources as u64,
                changes: changes as u64,
            })
        })
        .await
    }

    async fn latest_change(&self, set: &SetName) -> Result<Option<Change>, StoreError> {
        let set = set.clone();
        self.read(move |c| {
            let mut st = c.prepare_cached(
                "SELECT seq, key, loc_type, loc_value, change, datetime, length, md5, mime, lastmod, ln, timestamp \
                 FROM changes WHERE set_name = ?1 ORDER BY datetime DESC, seq DESC LIMIT 1",
            )?;
            let mut rows = st.query([set.as_str()])?;
            match rows.next()? {
                Some(r) => Ok(Some(change_from_row(r)?)),
                None => Ok(None),
            }
        })
        .await
    }

    /// The newest `seq` of the whole log: SQLite commits one writer at a time, so a change
    /// recorded later (in any set) has a larger one.
    async fn recorded_through(&self, _set: &SetName) -> Result<Option<i64>, StoreError> {
        self.read(|c| {
            Ok(Some(c.query_row(
                "SELECT COALESCE(MAX(seq), 0) FROM changes",
                [],
                |r| r.get::<_, i64>(0),
            )?))
        })
        .await
    }

    async fn earliest_recorded_after(
        &self,
        set: &SetName,
        mark: i64,
        until: Timestamp,
    ) -> Result<Option<Timestamp>, StoreError> {
        let set = set.clone();
        self.read(move |c| {
            // The rows past the mark, by the primary key: only what was recorded since. The
            // unary `+` keeps SQLite from the (set_name, datetime) index, which it would
            // otherwise choose and walk the set's whole log for (400 ms on a set of 1,000,000
            // changes, for each kept page sent; the rowid range is 0.03 ms).
            let min: Option<i64> = c.query_row(
                "SELECT MIN(datetime) FROM changes WHERE seq > ?1 AND +set_name = ?2 AND +datetime < ?3",
                params![mark, set.as_str(), until.0],
                |r| r.get(0),
            )?;
            Ok(min.map(Timestamp))
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.read(|c| {
            Ok(c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0))
                .map(|_| ())?)
        })
        .await
    }

    async fn notify_state(&self, set: &SetName) -> Result<Option<NotifyState>, StoreError> {
        let set = set.clone();
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT watermark, parts_seen, lists_seen, announced, version FROM notify_state WHERE set_name = ?1",
                [set.as_str()],
                |r| state_from_row(set.clone(), r),
            )
            .optional()?)
        })
        .await
    }

    /// Creates the state of a set the notifier has never seen (one that predates it).
    async fn notify_init(&self, state: NotifyState) -> Result<(), StoreError> {
        self.write(move |c| {
            c.execute(
                "INSERT OR IGNORE INTO notify_state (set_name, watermark, parts_seen, lists_seen, announced, version) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 0)",
                params![state.set.as_str(), state.watermark.0, state.parts_seen, state.lists_seen, state.announced as i64],
            )?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HubStore;

    /// A publish is answered once `sync_log` has flushed the file SQLite wrote it to: if that
    /// file were not where `sync_log` looks, publishes would silently go unsynced.
    #[tokio::test]
    async fn a_publish_is_flushed_from_the_log_file_sqlite_wrote_it_to() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rshub.sqlite");
        let store = EmbeddedStore::open(&path).unwrap();
        let topic = crate::model::websub::Topic::parse("http://example.org/t").unwrap();
        let body = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
        let wal = store.inner.log_path();
        let before = std::fs::metadata(&wal).map_or(0, |m| m.len());
        store
            .hub_publish(
                vec![(topic, "application/xml".into(), body)],
                None,
                Timestamp::now(),
            )
            .await
            .unwrap();
        let after = std::fs::metadata(&wal)
            .expect("the log sync_log flushes")
            .len();
        assert!(
            after >= before + 64 * 1024,
            "log grew from {before} to {after}"
        );
        store.inner.sync_log().unwrap();
    }

    /// A part brought up to date is given its resources that changed, read through the
    /// changes' parts, and through rows of earlier builds, which have none.
    #[tokio::test]
    async fn a_part_delta_finds_its_changes_with_or_without_their_part() {
        use crate::model::{ChangeType, Location, LocationType, ResourceMeta};
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("rshub.sqlite")).unwrap();
        let set = SetName::parse("s").unwrap();
        let policy = ListPolicy {
            max_items: 10,
            max_bytes: 1_000_000,
            rollover_secs: 0,
            max_future_skew_secs: 60,
        };
        let change = |k: usize, kind: ChangeType| NewChange {
            key: ResourceKey(format!("path:{k}.txt")),
            location: Location {
                kind: LocationType::RelPath,
                value: format!("{k}.txt"),
            },
            change: kind,
            datetime: None,
            meta: ResourceMeta {
                length: Some(k as u64),
                ..ResourceMeta::default()
            },
        };
        let apply = |changes: Vec<NewChange>| {
            let (store, set) = (&store, &set);
            async move {
                store
                    .apply(set, changes, policy, Timestamp::now())
                    .await
                    .unwrap()
                    .applied
                    .last()
                    .unwrap()
                    .1
            }
        };
        // 30 resources: parts 1, 2 and 3 of 10 each.
        let made = apply((0..30).map(|k| change(k, ChangeType::Created)).collect()).await;
        let built = |part: i64| Built {
            count: 10,
            last_position: part * 10,
        };
        let changed_in = |part: u32, since: i64| {
            let store = &store;
            let set = &set;
            async move {
                let d = store
                    .part_delta(set, part, since, built(part as i64), 1_000)
                    .await
                    .unwrap()
                    .unwrap();
                assert!(d.positions.is_none(), "updates only: the same positions");
                d.changed
                    .into_iter()
                    .map(|(_, r)| r.key.0)
                    .collect::<Vec<_>>()
            }
        };
        let updates = [3, 12, 15, 27];
        let updated = apply(
            updates
                .iter()
                .map(|k| change(*k, ChangeType::Updated))
                .collect(),
        )
        .await;
        assert!(updated > made);
        let part2 = vec!["path:12.txt".to_string(), "path:15.txt".to_string()];
        assert_eq!(changed_in(2, made).await, part2);
        assert_eq!(changed_in(1, made).await, vec!["path:3.txt".to_string()]);
        // The same rows as an earlier build left them: no part.
        store
            .inner
            .writer
            .lock()
            .unwrap()
            .execute("UPDATE changes SET part = NULL WHERE seq > ?1", [made])
            .unwrap();
        assert_eq!(changed_in(2, made).await, part2);
        assert_eq!(changed_in(3, made).await, vec!["path:27.txt".to_string()]);
    }
}
