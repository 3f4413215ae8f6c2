//! The Ingestion 3 archive (DPLA's storage layout, seed 004): what the harvester gets, kept as
//! `dpla.avro.v1.OriginalRecord` Avro snapshots in a folder tree per provider, so that the
//! provider's record set at any past time can be recreated.
//!
//! ```text
//! <provider>/harvest/<yyyymmdd>/<ts>-<provider>-OriginalRecord.v1.avro/
//!     part-00000.avro …  _MANIFEST  _LOGS/ops/<ts>.csv  _LOGS/skipped.csv  _SUCCESS
//! <provider>/harvest/<yyyymmdd>/<ts>-<provider>-OriginalRecord.v1-prov.json
//! <provider>/plan/<ts>/<ts>-OriginalRecord.v1.json
//! <provider>/journal/<first seq>-<last seq>.avro
//! ```
//!
//! - **Every harvest activity is a complete snapshot** (DPLA's pipeline reads the newest folder
//!   under `harvest/` as the provider's whole record set). Snapshot = previous snapshot +
//!   the changes journaled since, written as a new activity with `_LOGS/ops/<ts>.csv`
//!   (`id,operation`: insert, update, delete) and a provenance file naming the previous one.
//! - **The journal.** Each applied change is first committed to a local SQLite journal in the
//!   harvester's state folder (before the harvester records the change as applied, with the
//!   same durability as that record: WAL, survives a killed process), and exported to `<provider>/journal/` as Avro segments (`rshub.JournalEntry`:
//!   seq, at, op, id, mimetype, document) at least every `JOURNAL_EXPORT_SECS` and before
//!   every snapshot. `journal/` is outside `harvest/`, so DPLA's tools never take it for a
//!   harvest.
//! - **Crash safety.** `_SUCCESS` is written last; a snapshot interrupted by a crash is
//!   recorded as unfinished in the local journal and redone (same timestamp, same paths,
//!   partial objects removed first) when the harvester or `harvest snapshot` starts again.
//! - Resources the `MimeType` enum cannot hold (anything but JSON, XML, Turtle) are not
//!   archived: they are listed with their media type in `_LOGS/skipped.csv`.

pub mod record;
mod store;
mod text;

use anyhow::Context as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

use super::{Auditor, Holding, Item, Output};
use crate::destination::config::{HarvestConfig, Layout};
use crate::model::Timestamp;
use record::{mime_symbol, OriginalRecord, PartWriter, SCHEMA_NAME};
pub use store::Archive;

/// The journal is exported to storage at least this often (checked at each change).
const JOURNAL_EXPORT_SECS: i64 = 10;

pub struct Ingestion3 {
    archive: Archive,
    provider: String,
    layout: Layout,
    /// The source harvested (named in every activity's `_MANIFEST`).
    source: String,
    /// The connection that appends to the journal (short statements only: a snapshot reads
    /// on a connection of its own, so puts never wait for one).
    journal: Mutex<Connection>,
    db_path: PathBuf,
    /// One export at a time (two would write overlapping segments).
    exporting: Mutex<()>,
    /// Set on shutdown: a snapshot in progress stops at its next record and is redone at the
    /// next start.
    stop: std::sync::atomic::AtomicBool,
    tmp: PathBuf,
    _scratch: super::Scratch,
    part_max_bytes: u64,
    interval_secs: u64,
    last_export: Mutex<i64>,
}

/// What a snapshot wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SnapshotReport {
    /// The activity folder, relative to the provider folder.
    pub activity: String,
    pub records: u64,
    pub inserted: u64,
    pub updated: u64,
    pub deleted: u64,
    pub skipped: u64,
}

/// `yyyymmdd_hhmmss` (UTC).
pub fn ts_string(t: Timestamp) -> String {
    chrono::DateTime::from_timestamp_micros(t.0)
        .unwrap_or_default()
        .format("%Y%m%d_%H%M%S")
        .to_string()
}

/// What `harvest status` says of the archive: how many resources are not archived, and
/// the first few with why (read from the journal in `state_dir`, without opening the archive).
pub fn not_archived(
    harvest: &HarvestConfig,
    first: usize,
) -> anyhow::Result<(u64, Vec<(String, String)>)> {
    let db = harvest.ingestion3_journal();
    if !db.exists() {
        return Ok((0, Vec::new()));
    }
    let c = Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let n: i64 = c.query_row("SELECT COUNT(*) FROM skipped", [], |r| r.get(0))?;
    let has_reason: bool = c.query_row(
        "SELECT COUNT(*) > 0 FROM pragma_table_info('skipped') WHERE name = 'reason'",
        [],
        |r| r.get(0),
    )?;
    let sql = if has_reason {
        "SELECT id, coalesce(reason, 'media type ' || coalesce(mime, '')) FROM skipped ORDER BY at DESC LIMIT ?1"
    } else {
        "SELECT id, 'media type ' || coalesce(mime, '') FROM skipped ORDER BY at DESC LIMIT ?1"
    };
    let mut st = c.prepare(sql)?;
    let rows = st
        .query_map([first as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<Vec<(String, String)>, _>>()?;
    Ok((n as u64, rows))
}

impl Ingestion3 {
    pub fn open(harvest: &HarvestConfig) -> anyhow::Result<Ingestion3> {
        let (cfg, state_dir) = (&harvest.output, harvest.state.dir.as_path());
        let parent = state_dir.join("ingestion3-tmp");
        std::fs::create_dir_all(&parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let scratch = super::Scratch::open(&parent)?;
        let tmp = scratch.path().to_path_buf();
        let db_path = harvest.ingestion3_journal();
        let conn = Connection::open(&db_path)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
             CREATE TABLE IF NOT EXISTS journal (
               seq INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL, op TEXT NOT NULL,
               id TEXT NOT NULL, mimetype TEXT, document TEXT);
             CREATE INDEX IF NOT EXISTS journal_id ON journal (id, seq);
             CREATE TABLE IF NOT EXISTS skipped (id TEXT PRIMARY KEY, mime TEXT, at INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS exported (one INTEGER PRIMARY KEY CHECK (one = 1), through INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS snapshots (
               ts TEXT PRIMARY KEY, activity TEXT NOT NULL, through INTEGER NOT NULL,
               records INTEGER, done INTEGER NOT NULL DEFAULT 0);",
        )?;
        let has_reason: bool = conn.query_row(
            "SELECT COUNT(*) > 0 FROM pragma_table_info('skipped') WHERE name = 'reason'",
            [],
            |r| r.get(0),
        )?;
        if !has_reason {
            conn.execute_batch("ALTER TABLE skipped ADD COLUMN reason TEXT;")?;
        }
        Ok(Ingestion3 {
            archive: Archive::open(cfg)?,
            provider: cfg.provider.clone(),
            layout: cfg.layout,
            source: harvest.source.url.clone(),
            journal: Mutex::new(conn),
            db_path,
            exporting: Mutex::new(()),
            stop: Default::default(),
            tmp,
            _scratch: scratch,
            part_max_bytes: cfg.part_max_bytes,
            interval_secs: cfg.snapshot_interval_secs,
            // The first export comes with housekeeping or JOURNAL_EXPORT_SECS from now.
            last_export: Mutex::new(Timestamp::now().0),
        })
    }

    pub fn archive(&self) -> &Archive {
        &self.archive
    }

    fn journal(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.journal.lock().expect("journal lock")
    }

    /// A connection of its own, for long reads (WAL: they see a consistent state and never
    /// block the appends); its temporary tables spill to disk, not memory.
    fn reader(&self) -> anyhow::Result<Connection> {
        let c = Connection::open(&self.db_path)?;
        c.busy_timeout(std::time::Duration::from_secs(10))?;
        c.execute_batch("PRAGMA temp_store = FILE; PRAGMA cache_size = -8000;")?;
        Ok(c)
    }

    fn check_stop(&self) -> anyhow::Result<()> {
        if self.stop.load(std::sync::atomic::Ordering::Relaxed) {
            anyhow::bail!("interrupted by shutdown; the snapshot is finished at the next start");
        }
        Ok(())
    }

    /// The part files of a stored activity (`<provider>/…`), streamed record by record
    /// through `f`, one part downloaded at a time.
    fn for_each_record(
        &self,
        activity: &str,
        mut f: impl FnMut(OriginalRecord) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        for part in self
            .archive
            .list(activity)?
            .into_iter()
            .filter(|p| p.rsplit('/').next().is_some_and(|n| n.starts_with("part-")))
        {
            let local = self.archive.fetch_to(&part, &self.tmp)?;
            let file = std::io::BufReader::new(std::fs::File::open(&local)?);
            let r = record::for_each(file, &mut f);
            let _ = std::fs::remove_file(local);
            r?;
        }
        Ok(())
    }

    fn record(
        &self,
        op: &str,
        id: &str,
        mimetype: Option<&str>,
        doc: Option<&str>,
    ) -> anyhow::Result<()> {
        let now = Timestamp::now().0;
        self.journal().execute(
            "INSERT INTO journal (at, op, id, mimetype, document) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![now, op, id, mimetype, doc],
        )?;
        let due = {
            let last = self.last_export.lock().expect("export lock");
            now - *last > JOURNAL_EXPORT_SECS * 1_000_000
        };
        // Another put (or a snapshot) exporting already covers this one soon enough.
        if due && self.exporting.try_lock().is_ok() {
            self.export_journal()?;
        }
        Ok(())
    }

    /// Writes the journal entries not yet in storage there, as segments of at most
    /// `SEGMENT_ROWS` entries (memory stays bounded however far behind the export is).
    pub fn export_journal(&self) -> anyhow::Result<()> {
        const SEGMENT_ROWS: i64 = 2000;
        let _one = self.exporting.lock().expect("export lock");
        *self.last_export.lock().expect("export lock") = Timestamp::now().0;
        loop {
            let (from, rows) = {
                let c = self.journal();
                let from: i64 = c
                    .query_row("SELECT through FROM exported", [], |r| r.get(0))
                    .optional()?
                    .unwrap_or(0);
                let mut st = c.prepare_cached(
                    "SELECT seq, at, op, id, mimetype, document FROM journal WHERE seq > ?1
                     ORDER BY seq LIMIT ?2",
                )?;
                let rows = st
                    .query_map([from, SEGMENT_ROWS], |r| {
                        Ok(store::JournalEntry {
                            seq: r.get(0)?,
                            at: r.get(1)?,
                            op: r.get(2)?,
                            id: r.get(3)?,
                            mimetype: r.get(4)?,
                            document: r.get(5)?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                (from, rows)
            };
            let Some(last) = rows.last().map(|r| r.seq) else {
                return Ok(());
            };
            let path = format!(
                "{}/journal/{:020}-{:020}.avro",
                self.provider,
                from + 1,
                last
            );
            self.archive
                .put_bytes(&path, store::journal_segment(&rows)?)?;
            self.journal().execute(
                "INSERT INTO exported (one, through) VALUES (1, ?1)
                 ON CONFLICT (one) DO UPDATE SET through = excluded.through",
                [last],
            )?;
            if (rows.len() as i64) < SEGMENT_ROWS {
                return Ok(());
            }
        }
    }

    /// The lock that one process at a time holds while it writes activities (the harvester's
    /// housekeeping, `harvest snapshot`, `harvest recreate`): `None` while another holds it.
    fn try_activity_lock(&self) -> anyhow::Result<Option<std::fs::File>> {
        // One per journal (per provider): `ingestion3.lock` beside `ingestion3.sqlite`.
        let path = self.db_path.with_extension("lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        match f.try_lock() {
            Ok(()) => Ok(Some(f)),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => {
                Err(e).with_context(|| format!("cannot lock {}", path.display()))
            }
        }
    }

    fn activity_lock(&self) -> anyhow::Result<std::fs::File> {
        self.try_activity_lock()?.ok_or_else(|| {
            anyhow::anyhow!(
                "another process (the running harvester, or another `harvest snapshot` or \
                 `recreate`) is writing an activity of this archive now; try again when it is done"
            )
        })
    }

    /// Finishes a snapshot a crash interrupted, if any.
    pub fn finish_interrupted(&self) -> anyhow::Result<Option<SnapshotReport>> {
        let _lock = self.activity_lock()?;
        self.finish_interrupted_locked()
    }

    fn finish_interrupted_locked(&self) -> anyhow::Result<Option<SnapshotReport>> {
        let open: Option<String> = self
            .journal()
            .query_row(
                "SELECT ts FROM snapshots WHERE done = 0 ORDER BY ts LIMIT 1",
                [],
                |r| r.get(0),
            )
            .optional()?;
        match open {
            Some(ts) => {
                tracing::warn!(ts = %ts, "finishing the snapshot an earlier run left unfinished");
                self.snapshot_at(&ts).map(Some)
            }
            None => Ok(None),
        }
    }

    /// A new complete snapshot: the previous one plus the changes journaled since.
    pub fn snapshot(&self) -> anyhow::Result<SnapshotReport> {
        let _lock = self.activity_lock()?;
        self.snapshot_locked()
    }

    fn snapshot_locked(&self) -> anyhow::Result<SnapshotReport> {
        if let Some(r) = self.finish_interrupted_locked()? {
            return Ok(r);
        }
        let ts = self.free_ts()?;
        self.snapshot_at(&ts)
    }

    /// The current second as an activity timestamp, waiting for the next second while an
    /// activity (a snapshot or a recreation) already has it: two would share a folder.
    fn free_ts(&self) -> anyhow::Result<String> {
        loop {
            let ts = ts_string(Timestamp::now());
            let taken = self
                .journal()
                .query_row("SELECT 1 FROM snapshots WHERE ts = ?1", [&ts], |_| Ok(()))
                .optional()?
                .is_some()
                || !self
                    .archive
                    .list(&format!("{}/{}", self.provider, self.activity_name(&ts)))?
                    .is_empty();
            if !taken {
                return Ok(ts);
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// The schema name in file names: the specification's `OriginalRecord.v1`, or the
    /// `OriginalRecord` DPLA's code looks for.
    fn schema_name(&self) -> &'static str {
        match self.layout {
            Layout::Spec => SCHEMA_NAME,
            Layout::Ingestion3Code => "OriginalRecord",
        }
    }

    /// The plan file of the activity started at `ts` (relative to the provider's folder).
    fn plan_name(&self, ts: &str) -> String {
        format!("plan/{ts}/{ts}-{}.json", self.schema_name())
    }

    /// A harvest activity's folder (relative to the provider's).
    fn activity_name(&self, ts: &str) -> String {
        let schema = self.schema_name();
        match self.layout {
            Layout::Spec => format!("harvest/{}/{ts}-{}-{schema}.avro", &ts[..8], self.provider),
            Layout::Ingestion3Code => format!("harvest/{ts}-{}-{schema}.avro", self.provider),
        }
    }

    /// The folders holding harvest activities whose date is `date` (yyyymmdd) or earlier,
    /// newest first.
    fn activity_folders(&self, date: &str) -> anyhow::Result<Vec<String>> {
        let harvest = format!("{}/harvest", self.provider);
        Ok(match self.layout {
            Layout::Ingestion3Code => vec![harvest],
            Layout::Spec => {
                let mut dates: Vec<String> = self
                    .archive
                    .list(&harvest)?
                    .into_iter()
                    .filter_map(|p| p.split('/').nth(2).map(str::to_string))
                    .filter(|d| d.as_str() <= date)
                    .collect();
                dates.sort();
                dates.dedup();
                dates
                    .iter()
                    .rev()
                    .map(|d| format!("{harvest}/{d}"))
                    .collect()
            }
        })
    }

    fn snapshot_at(&self, ts: &str) -> anyhow::Result<SnapshotReport> {
        self.export_journal()?;
        let activity = self.activity_name(ts);
        let (prev, prev_through, through) = {
            let c = self.journal();
            let prev: Option<(String, i64)> = c
                .query_row(
                    "SELECT activity, through FROM snapshots WHERE done = 1 ORDER BY ts DESC LIMIT 1",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let through: i64 = match c
                .query_row("SELECT through FROM snapshots WHERE ts = ?1", [ts], |r| {
                    r.get(0)
                })
                .optional()?
            {
                Some(t) => t,
                None => {
                    let t: i64 =
                        c.query_row("SELECT coalesce(max(seq), 0) FROM journal", [], |r| {
                            r.get(0)
                        })?;
                    c.execute(
                        "INSERT INTO snapshots (ts, activity, through) VALUES (?1, ?2, ?3)",
                        params![ts, activity, t],
                    )?;
                    t
                }
            };
            let prev_through = prev.as_ref().map_or(0, |p| p.1);
            (prev.map(|p| p.0), prev_through, through)
        };
        // When the newest change folded in was applied: the snapshot is the state as of then.
        let through_at: i64 = self
            .journal()
            .query_row("SELECT at FROM journal WHERE seq = ?1", [through], |r| {
                r.get(0)
            })
            .optional()?
            .unwrap_or(0);
        let base = format!("{}/{activity}", self.provider);
        // A folder left by an interrupted try of this snapshot: start it over.
        self.archive.delete_prefix(&base)?;

        let started = chrono::NaiveDateTime::parse_from_str(ts, "%Y%m%d_%H%M%S")?
            .and_utc()
            .timestamp();
        // The newest change per resource since the previous snapshot, on a connection of
        // the snapshot's own: changes applied meanwhile go on being journaled.
        let r = self.reader()?;
        r.execute(
            "CREATE TEMP TABLE latest AS SELECT id, max(seq) AS seq, 0 AS in_prev FROM journal
             WHERE seq > ?1 AND seq <= ?2 GROUP BY id",
            [prev_through, through],
        )?;
        r.execute_batch("CREATE UNIQUE INDEX temp.latest_id ON latest (id)")?;
        let schema = record::schema();
        let mut parts = Parts::new(self, &base, &schema)?;
        if let Some(prev) = &prev {
            let mut mark = r.prepare("UPDATE latest SET in_prev = 1 WHERE id = ?1")?;
            self.for_each_record(&format!("{}/{prev}", self.provider), |mut rec| {
                if mark.execute([&rec.id])? == 0 {
                    rec.ingest_date = started;
                    parts.append(&rec)?;
                }
                Ok(())
            })?;
        }
        // The changes: the newest upsert of each resource, and the operations log (on disk
        // while it grows: a baseline logs every record).
        let ops_path = self.tmp.join(format!("ops-{ts}.csv"));
        let mut ops = std::io::BufWriter::new(std::fs::File::create(&ops_path)?);
        std::io::Write::write_all(&mut ops, b"id,operation\n")?;
        let (mut inserted, mut updated, mut deleted) = (0u64, 0u64, 0u64);
        {
            let mut st = r.prepare(
                "SELECT j.id, j.op, j.mimetype, j.document, l.in_prev FROM latest l
                 JOIN journal j ON j.seq = l.seq ORDER BY j.seq",
            )?;
            let mut rows = st.query([])?;
            while let Some(row) = rows.next()? {
                let (id, op, mimetype, doc, in_prev): (
                    String,
                    String,
                    Option<String>,
                    Option<String>,
                    bool,
                ) = (
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                );
                let operation = match (op.as_str(), in_prev) {
                    ("upsert", false) => "insert",
                    ("upsert", true) => "update",
                    (_, true) => "delete",
                    // Created and deleted between two snapshots: never in one.
                    (_, false) => continue,
                };
                match operation {
                    "insert" => inserted += 1,
                    "update" => updated += 1,
                    _ => deleted += 1,
                }
                writeln!(ops, "{},{operation}", csv_field(&id))?;
                if op == "upsert" {
                    parts.append(&OriginalRecord {
                        mimetype: stored_symbol(&id, mimetype.as_deref())?,
                        id,
                        ingest_date: started,
                        provider: self.provider.clone(),
                        document: doc.unwrap_or_default(),
                    })?;
                }
            }
        }
        let records = parts.finish()?;
        std::io::Write::flush(&mut ops)?;
        drop(ops);
        self.archive
            .put_file(&format!("{base}/_LOGS/ops/{ts}.csv"), &ops_path)?;
        let _ = std::fs::remove_file(&ops_path);
        // The resources not archived, also on disk while listed (there may be millions).
        let skipped_path = self.tmp.join(format!("skipped-{ts}.csv"));
        let mut skipped_csv = std::io::BufWriter::new(std::fs::File::create(&skipped_path)?);
        std::io::Write::write_all(&mut skipped_csv, b"id,mimetype,reason\n")?;
        let mut skipped = 0u64;
        {
            let mut st = r.prepare("SELECT id, mime, reason FROM skipped ORDER BY id")?;
            let mut rows = st.query([])?;
            while let Some(row) = rows.next()? {
                let (id, mime, reason): (String, Option<String>, Option<String>) =
                    (row.get(0)?, row.get(1)?, row.get(2)?);
                writeln!(
                    skipped_csv,
                    "{},{},{}",
                    csv_field(&id),
                    csv_field(mime.as_deref().unwrap_or("")),
                    csv_field(reason.as_deref().unwrap_or(""))
                )?;
                skipped += 1;
            }
        }
        std::io::Write::flush(&mut skipped_csv)?;
        drop(skipped_csv);
        self.archive
            .put_file(&format!("{base}/_LOGS/skipped.csv"), &skipped_path)?;
        let _ = std::fs::remove_file(&skipped_path);
        self.finish_activity(
            ts,
            &activity,
            records,
            // The first snapshot derives from no activity: it belongs to its plan.
            &prev.unwrap_or_else(|| self.plan_name(ts)),
            // What this snapshot folds in: `recreate` applies journal entries after it.
            vec![(
                "journal.json".into(),
                serde_json::to_vec(&serde_json::json!({
                    "through_seq": through,
                    "through_at_us": through_at,
                }))?,
            )],
        )?;
        {
            let c = self.journal();
            c.execute(
                "UPDATE snapshots SET done = 1, records = ?2 WHERE ts = ?1",
                params![ts, records as i64],
            )?;
            // Exported, and folded into this snapshot: the local copy is no longer needed.
            c.execute("DELETE FROM journal WHERE seq <= ?1", [through])?;
        }
        Ok(SnapshotReport {
            activity,
            records,
            inserted,
            updated,
            deleted,
            skipped,
        })
    }
    /// Writes what completes an activity whose parts are stored: its `_LOGS` files, the
    /// `_MANIFEST`, the provenance file beside it, the plan file, and `_SUCCESS` last.
    fn finish_activity(
        &self,
        ts: &str,
        activity: &str,
        records: u64,
        generator: &str,
        logs: Vec<(String, Vec<u8>)>,
    ) -> anyhow::Result<()> {
        let base = format!("{}/{activity}", self.provider);
        let version = format!("resourcesync-hub {}", env!("CARGO_PKG_VERSION"));
        for (name, bytes) in logs {
            self.archive
                .put_bytes(&format!("{base}/_LOGS/{name}"), bytes)?;
        }
        let start = chrono::NaiveDateTime::parse_from_str(ts, "%Y%m%d_%H%M%S")?;
        self.archive.put_bytes(
            &format!("{base}/_MANIFEST"),
            format!(
                "Activity: Harvest\nProvider: {}\nRecord count: {records}\nStart date/time: {}\nInput: {} (ResourceSync, by resourcesync-hub harvest)\n",
                self.provider,
                start.format("%Y-%m-%d %H:%M:%S"),
                self.source
            )
            .into_bytes(),
        )?;
        self.archive.put_bytes(
            &format!(
                "{}/{}-prov.json",
                self.provider,
                activity.trim_end_matches(".avro")
            ),
            serde_json::to_vec_pretty(&serde_json::json!({
                "generator": generator,
                "version": version,
            }))?,
        )?;
        self.archive.put_bytes(
            &format!("{}/{}", self.provider, self.plan_name(ts)),
            serde_json::to_vec_pretty(&serde_json::json!({
                "harvest": activity,
                "version": version,
            }))?,
        )?;
        // Last: the folder is complete.
        self.archive
            .put_bytes(&format!("{base}/_SUCCESS"), Vec::new())?;
        Ok(())
    }

    /// The provider's record set as of `at`, written as a new harvest activity: the newest
    /// snapshot started at or before `at` (found by walking back through the date folders)
    /// plus the journal entries after it up to `at`; its provenance names that snapshot.
    pub fn recreate(&self, at: Timestamp) -> anyhow::Result<SnapshotReport> {
        let _lock = self.activity_lock()?;
        self.export_journal()?;
        let want = ts_string(at);
        let mut base: Option<(String, i64)> = None;
        'walk: for folder in self.activity_folders(&want[..8])? {
            let objects = self.archive.list(&folder)?;
            let mut done: Vec<String> = objects
                .iter()
                .filter_map(|p| p.strip_suffix("/_SUCCESS"))
                .filter(|a| {
                    !objects
                        .iter()
                        .any(|o| o == &format!("{a}/_LOGS/recreated.json"))
                })
                .map(str::to_string)
                .collect();
            done.sort();
            for a in done.iter().rev() {
                let name = a.rsplit('/').next().unwrap_or_default();
                if name.len() < 15 || name[..15] > *want {
                    continue;
                }
                // Within the same second as `at`: only if what it folds in is not newer.
                let local = self
                    .archive
                    .fetch_to(&format!("{a}/_LOGS/journal.json"), &self.tmp)?;
                let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&local)?)?;
                let _ = std::fs::remove_file(local);
                if v["through_at_us"].as_i64().unwrap_or(0) <= at.0 {
                    base = Some((a.clone(), v["through_seq"].as_i64().unwrap_or(0)));
                    break 'walk;
                }
            }
        }
        let (base_activity, through) = base.ok_or_else(|| {
            anyhow::anyhow!(
                "no snapshot of {} started at or before {want}",
                self.provider
            )
        })?;
        // The newest entry per resource after the snapshot, up to `at`: a temporary table
        // (on disk when large), not memory, whatever the number of changes.
        let r = self.reader()?;
        r.execute_batch(
            "CREATE TEMP TABLE upto (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, op TEXT NOT NULL,
               mimetype TEXT, document TEXT)",
        )?;
        {
            let mut put = r.prepare(
                "INSERT INTO upto (id, seq, op, mimetype, document) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, op = excluded.op,
                   mimetype = excluded.mimetype, document = excluded.document
                 WHERE excluded.seq > upto.seq",
            )?;
            for seg in self.archive.list(&format!("{}/journal", self.provider))? {
                let last: i64 = seg
                    .rsplit('/')
                    .next()
                    .and_then(|n| n.trim_end_matches(".avro").split('-').nth(1))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(i64::MAX);
                if last <= through {
                    continue;
                }
                let local = self.archive.fetch_to(&seg, &self.tmp)?;
                let entries =
                    store::read_journal(std::io::BufReader::new(std::fs::File::open(&local)?));
                let _ = std::fs::remove_file(local);
                r.execute_batch("BEGIN")?;
                for e in entries? {
                    if e.seq > through && e.at <= at.0 {
                        put.execute(params![e.id, e.seq, e.op, e.mimetype, e.document])?;
                    }
                }
                r.execute_batch("COMMIT")?;
            }
        }
        let ts = self.free_ts()?;
        let activity = self.activity_name(&ts);
        let base = format!("{}/{activity}", self.provider);
        let started = Timestamp::now().0 / 1_000_000;
        let schema = record::schema();
        let mut parts = Parts::new(self, &base, &schema)?;
        {
            let mut changed = r.prepare("SELECT 1 FROM upto WHERE id = ?1")?;
            self.for_each_record(&base_activity, |mut rec| {
                if !changed.exists([&rec.id])? {
                    rec.ingest_date = started;
                    parts.append(&rec)?;
                }
                Ok(())
            })?;
        }
        let (mut inserted, mut deleted) = (0, 0);
        {
            let mut st = r.prepare("SELECT id, op, mimetype, document FROM upto ORDER BY id")?;
            let mut rows = st.query([])?;
            while let Some(row) = rows.next()? {
                let (id, op, mimetype, document): (String, String, Option<String>, Option<String>) =
                    (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?);
                if op == "upsert" {
                    inserted += 1;
                    parts.append(&OriginalRecord {
                        mimetype: stored_symbol(&id, mimetype.as_deref())?,
                        id,
                        ingest_date: started,
                        provider: self.provider.clone(),
                        document: document.unwrap_or_default(),
                    })?;
                } else {
                    deleted += 1;
                }
            }
        }
        let records = parts.finish()?;
        let generator = base_activity
            .strip_prefix(&format!("{}/", self.provider))
            .unwrap_or(&base_activity)
            .to_string();
        self.finish_activity(
            &ts,
            &activity,
            records,
            &generator,
            vec![(
                "recreated.json".into(),
                serde_json::to_vec_pretty(&serde_json::json!({
                    "at": at.to_string(),
                    "from": generator,
                    "journal_after_seq": through,
                }))?,
            )],
        )?;
        Ok(SnapshotReport {
            activity,
            records,
            inserted,
            updated: 0,
            deleted,
            skipped: 0,
        })
    }
}

/// The archive's current record set (the newest snapshot + the journal since, and the
/// resources not archived) indexed by id in a temporary table, for `harvest audit`.
struct Audit {
    c: Connection,
}

impl Ingestion3 {
    fn audit_index(&self) -> anyhow::Result<Audit> {
        use md5::Digest;
        let c = self.reader()?;
        c.execute_batch(
            "CREATE TEMP TABLE held (id TEXT PRIMARY KEY, len INTEGER, md5 TEXT, skipped TEXT,
               seen INTEGER NOT NULL DEFAULT 0);
             BEGIN;",
        )?;
        let base: Option<(String, i64)> = c
            .query_row(
                "SELECT activity, through FROM snapshots WHERE done = 1 ORDER BY ts DESC LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let facts = |doc: &[u8]| {
            (
                doc.len() as i64,
                crate::digest::hex_digest(md5::Md5::digest(doc)),
            )
        };
        {
            let mut put =
                c.prepare("INSERT OR REPLACE INTO held (id, len, md5) VALUES (?1, ?2, ?3)")?;
            if let Some((activity, _)) = &base {
                self.for_each_record(&format!("{}/{activity}", self.provider), |r| {
                    let (len, md5) = facts(r.document.as_bytes());
                    put.execute(params![r.id, len, md5])?;
                    Ok(())
                })?;
            }
            let mut del = c.prepare("DELETE FROM held WHERE id = ?1")?;
            let mut st =
                c.prepare("SELECT op, id, document FROM journal WHERE seq > ?1 ORDER BY seq")?;
            let mut rows = st.query([base.as_ref().map_or(0, |b| b.1)])?;
            while let Some(row) = rows.next()? {
                let (op, id, doc): (String, String, Option<String>) =
                    (row.get(0)?, row.get(1)?, row.get(2)?);
                if op == "upsert" {
                    let (len, md5) = facts(doc.unwrap_or_default().as_bytes());
                    put.execute(params![id, len, md5])?;
                } else {
                    del.execute([id])?;
                }
            }
        }
        c.execute_batch(
            "INSERT OR REPLACE INTO held (id, skipped) SELECT id, coalesce(mime, '') FROM skipped;
             COMMIT;",
        )?;
        Ok(Audit { c })
    }
}

impl Auditor for Audit {
    fn holding(&mut self, uri: &str) -> anyhow::Result<Holding> {
        let found: Option<(Option<i64>, Option<String>, Option<String>)> = self
            .c
            .query_row(
                "UPDATE held SET seen = 1 WHERE id = ?1 RETURNING len, md5, skipped",
                [uri],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        Ok(match found {
            None => Holding::Missing,
            Some((_, _, Some(mime))) => Holding::NotArchived(format!(
                "{mime:?} is not JSON, XML or Turtle (listed in _LOGS/skipped.csv)"
            )),
            Some((len, md5, None)) => Holding::Held {
                length: len.unwrap_or(0) as u64,
                md5: md5.unwrap_or_default(),
            },
        })
    }

    fn unlisted(&mut self) -> anyhow::Result<Option<Vec<String>>> {
        let mut st = self
            .c
            .prepare("SELECT id FROM held WHERE seen = 0 ORDER BY id")?;
        let ids = st
            .query_map([], |r| r.get(0))?
            .collect::<Result<Vec<String>, _>>()?;
        Ok(Some(ids))
    }
}

/// A journaled mimetype as the enum symbol it was stored as.
fn stored_symbol(id: &str, mimetype: Option<&str>) -> anyhow::Result<&'static str> {
    mimetype
        .and_then(|m| record::SYMBOLS.iter().copied().find(|s| *s == m))
        .ok_or_else(|| anyhow::anyhow!("journal entry for {id} without a mimetype"))
}

/// A CSV field (RFC 4180 quoting when needed).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The part files of one snapshot: written locally, cut at `part_max_bytes`, then stored.
struct Parts<'a> {
    out: &'a Ingestion3,
    base: String,
    schema: &'a apache_avro::Schema,
    current: Option<(
        PartWriter<'a, std::io::BufWriter<std::fs::File>>,
        PathBuf,
        u64,
    )>,
    next: u32,
    records: u64,
}

impl<'a> Parts<'a> {
    fn new(
        out: &'a Ingestion3,
        base: &str,
        schema: &'a apache_avro::Schema,
    ) -> anyhow::Result<Parts<'a>> {
        Ok(Parts {
            out,
            base: base.to_string(),
            schema,
            current: None,
            next: 0,
            records: 0,
        })
    }

    fn append(&mut self, r: &OriginalRecord) -> anyhow::Result<()> {
        self.out.check_stop()?;
        if self.current.is_none() {
            let path = self.out.tmp.join(format!("part-{:05}.avro", self.next));
            let file = std::io::BufWriter::new(std::fs::File::create(&path)?);
            self.current = Some((PartWriter::new(self.schema, file)?, path, 0));
        }
        let (w, _, bytes) = self.current.as_mut().expect("a part");
        w.append(r)?;
        *bytes += (r.document.len() + r.id.len() + 32) as u64;
        self.records += 1;
        if *bytes >= self.out.part_max_bytes {
            self.close()?;
        }
        Ok(())
    }

    fn close(&mut self) -> anyhow::Result<()> {
        if let Some((w, path, _)) = self.current.take() {
            let mut file = w.finish()?;
            std::io::Write::flush(&mut file)?;
            drop(file);
            let name = format!("{}/part-{:05}.avro", self.base, self.next);
            self.out.archive.put_file(&name, &path)?;
            let _ = std::fs::remove_file(&path);
            self.next += 1;
        }
        Ok(())
    }

    /// Closes the last part (an empty snapshot still gets one, empty, part) and returns the
    /// record count.
    fn finish(mut self) -> anyhow::Result<u64> {
        if self.next == 0 && self.current.is_none() {
            let path = self.out.tmp.join("part-00000.avro");
            let file = std::io::BufWriter::new(std::fs::File::create(&path)?);
            self.current = Some((PartWriter::new(self.schema, file)?, path, 0));
        }
        self.close()?;
        Ok(self.records)
    }
}

impl Output for Ingestion3 {
    fn put(&self, item: &Item, file: &Path) -> anyhow::Result<String> {
        let mime = item.mime.unwrap_or("");
        let document = match mime_symbol(mime) {
            Some(sym) => {
                let bytes = std::fs::read(file)?;
                text::document_text(&bytes, mime, sym == "application_xml").map(|d| (sym, d))
            }
            None if mime.is_empty() => {
                Err("no media type (only JSON, XML and Turtle are archived)".into())
            }
            None => Err(format!("media type {mime} is not JSON, XML or Turtle")),
        };
        let _ = std::fs::remove_file(file);
        match document {
            Ok((sym, doc)) => {
                self.journal()
                    .execute("DELETE FROM skipped WHERE id = ?1", [item.uri])?;
                self.record("upsert", item.uri, Some(sym), Some(&doc))?;
                Ok(format!("ingestion3 journal ({sym})"))
            }
            Err(why) => {
                // Not archived (listed in the next snapshot's _LOGS/skipped.csv and in
                // `harvest status`); a record it replaces is removed from the next snapshot.
                self.journal().execute(
                    "INSERT INTO skipped (id, mime, at, reason) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (id) DO UPDATE SET mime = excluded.mime, at = excluded.at, reason = excluded.reason",
                    params![item.uri, mime, Timestamp::now().0, why],
                )?;
                self.record("delete", item.uri, None, None)?;
                Ok(format!("not archived: {why}"))
            }
        }
    }

    fn delete(&self, _set: &str, uri: &str) -> anyhow::Result<()> {
        self.journal()
            .execute("DELETE FROM skipped WHERE id = ?1", [uri])?;
        self.record("delete", uri, None, None)
    }

    fn temp_dir(&self) -> &Path {
        &self.tmp
    }

    fn download_path(&self, uri: &str) -> anyhow::Result<PathBuf> {
        use sha2::Digest;
        let h = crate::digest::hex_digest(sha2::Sha256::digest(uri.as_bytes()));
        Ok(self.tmp.join(format!("{h}.part")))
    }

    fn interrupt(&self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn auditor(&self) -> anyhow::Result<Box<dyn Auditor + Send>> {
        Ok(Box::new(self.audit_index()?))
    }

    /// Finishes an interrupted snapshot, exports the journal, and writes a snapshot when the
    /// baseline has none yet or `snapshot_interval_secs` passed since the last one.
    fn housekeeping(&self, baselined: bool) -> anyhow::Result<()> {
        let Some(_lock) = self.try_activity_lock()? else {
            tracing::debug!(
                "another process writes an activity; housekeeping waits for the next check"
            );
            return self.export_journal();
        };
        self.finish_interrupted_locked()?;
        self.export_journal()?;
        if !baselined {
            return Ok(());
        }
        let last: Option<String> = self
            .journal()
            .query_row(
                "SELECT ts FROM snapshots WHERE done = 1 ORDER BY ts DESC LIMIT 1",
                [],
                |r| r.get(0),
            )
            .optional()?;
        let due = match &last {
            None => true,
            Some(ts) => {
                let at = chrono::NaiveDateTime::parse_from_str(ts, "%Y%m%d_%H%M%S")?
                    .and_utc()
                    .timestamp();
                self.interval_secs > 0
                    && chrono::Utc::now().timestamp() - at >= self.interval_secs as i64
                    && self
                        .journal()
                        .query_row("SELECT count(*) FROM journal", [], |r| r.get::<_, i64>(0))?
                        > 0
            }
        };
        if due {
            let r = self.snapshot_locked()?;
            tracing::info!(activity = %r.activity, records = r.records, inserted = r.inserted, updated = r.updated, deleted = r.deleted, skipped = r.skipped, "Ingestion 3 snapshot written");
        }
        Ok(())
    }
}
