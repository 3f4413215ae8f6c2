//! The destination: `resourcesync-hub harvest`, a ResourceSync client that baselines from a
//! Resource List, stays current by push (WebSub change notifications), fills every gap from
//! the Change Lists, and never moves its position past a change it has not applied and
//! verified. It shares the model and the sitemap reader with the server, never its store.
//!
//! - [`config`], `harvest.toml` and its defaults.
//! - [`scope`]: the trust boundary (which URLs a source may make it reach) and log-safe text.
//! - [`discover`]: Source Description -> Capability Lists -> documents, topic and hub.
//! - [`fetch`]: HTTP, the one way out: scope-checked, bounded bodies, retries; resources
//!   streamed to disk and measured.
//! - [`state`]: the durable position, queue, log, refusals, file claims and subscription
//!   (SQLite).
//! - [`follow`]: the callback server and the subscription.
//! - [`output`]: where resources go: the mirror folder, or the Ingestion 3 archive (Avro
//!   snapshots per provider, on a local folder or S3).
//!
//! The position of a set is a datetime P: every change dated before P has been applied
//! (or, with `fetch.skip_failed`, given up on and listed). Baseline: P = the Resource List's
//! `at`. A notification covering `[from, until)` is applied after the Change Lists have filled
//! `[P, from)` when `from` is past P (a gap), and then P = `until`. A periodic check reads the
//! Change Lists from P (push may be silent). Every change goes through the queue: applied in
//! order per resource, logged once, retried while it fails; P never passes the oldest change
//! still queued.
//!
//! A source is not trusted: what it names outside its scope, URLs over the length limit, list
//! documents listed as resources and URIs that would share a file with another are *refused*:
//! recorded (shown by `harvest status`), logged once, never fetched and never waited for.

pub mod config;
pub mod discover;
pub mod fetch;
pub mod follow;
pub mod output;
pub mod scope;
pub mod state;

use std::collections::{BTreeMap, HashSet};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};

use config::HarvestConfig;
use discover::SetInfo;
use fetch::Fetcher;
use output::{Item, Mirror, Output};
use scope::short;
use state::{Change, Held, Pending, SetRow, State};

use crate::model::Timestamp;
use crate::sitemap::{self, EntryReader, ParsedEntry};

/// The harvester's parts, shared by its tasks.
pub struct Harvester {
    cfg: HarvestConfig,
    state: Arc<State>,
    fetcher: Fetcher,
    output: Arc<dyn Output>,
    /// Base of the callback URLs.
    callback_base: String,
    /// Per set, the newest change the Change Lists brought that no delivery has confirmed yet.
    unconfirmed: std::sync::Mutex<std::collections::HashMap<i64, Timestamp>>,
    /// Set on shutdown: blocking work (unpacking a dump package) stops at its next entry.
    stop: Arc<AtomicBool>,
    /// Files claimed by resources being fetched or unpacked (see [`Worker::claim`]).
    in_flight: InFlight,
}

/// Output files being written, by path, with the URI each is for.
type InFlight = Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>;

/// A followed set: its row and what its Capability List offers.
#[derive(Debug, Clone)]
struct Followed {
    row: SetRow,
    info: SetInfo,
}

/// Why a resource was not applied: a failure (retried, holds the position) or a refusal (the
/// source's error: recorded, not retried, not waited for).
#[derive(Debug, Clone)]
enum NotApplied {
    Failed(String),
    Refused(String),
}

impl std::fmt::Display for NotApplied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotApplied::Failed(m) | NotApplied::Refused(m) => f.write_str(m),
        }
    }
}

impl From<fetch::FetchError> for NotApplied {
    fn from(e: fetch::FetchError) -> Self {
        match e.refused {
            Some(r) => NotApplied::Refused(r.to_string()),
            None => NotApplied::Failed(e.message),
        }
    }
}

/// The longest XML token read from a source's documents: past the longest URL accepted, so
/// that a cut `<loc>` is always refused as too long.
fn max_token(cfg: &HarvestConfig) -> usize {
    (cfg.fetch.max_url_length + 1).max(64 * 1024)
}

/// Records a refusal of `uri` for a set; logged the first time only.
fn refuse(state: &State, set: &str, set_id: i64, uri: &str, reason: &str) -> anyhow::Result<()> {
    if state.refuse(set_id, uri, reason)? {
        tracing::warn!(set, uri = %short(uri), reason, "refused (listed in harvest status; not fetched, not waited for)");
    }
    Ok(())
}

impl Harvester {
    pub fn new(cfg: HarvestConfig, callback_base: String) -> anyhow::Result<Harvester> {
        let state = Arc::new(State::open(&cfg.database_path())?);
        let output: Arc<dyn Output> = match cfg.output.kind {
            config::OutputKind::Mirror => Arc::new(Mirror::new(&cfg.output)?),
            config::OutputKind::Ingestion3 => Arc::new(output::ingestion3::Ingestion3::open(&cfg)?),
        };
        let scope = cfg.scope().map_err(|e| anyhow::anyhow!(e))?;
        let fetcher = Fetcher::new(&cfg.fetch, scope);
        Ok(Harvester {
            cfg,
            state,
            fetcher,
            output,
            callback_base,
            unconfirmed: Default::default(),
            stop: Arc::new(AtomicBool::new(false)),
            in_flight: Default::default(),
        })
    }

    async fn discover(&self) -> anyhow::Result<Vec<Followed>> {
        let (infos, refused) = discover::discover(
            &self.fetcher,
            &self.cfg.source.url,
            &self.cfg.source.sets,
            max_token(&self.cfg),
        )
        .await?;
        for (uri, why) in refused {
            refuse(&self.state, "-", 0, &uri, &why)?;
        }
        infos
            .into_iter()
            .map(|info| {
                let row = self.state.set(&info.capability, &info.name)?;
                for (uri, why) in &info.refused {
                    refuse(&self.state, &info.name, row.id, uri, why)?;
                }
                Ok(Followed { row, info })
            })
            .collect()
    }

    /// A fresh copy of a set's row.
    fn row(&self, id: i64) -> anyhow::Result<SetRow> {
        self.state
            .set_by_id(id)?
            .ok_or_else(|| anyhow::anyhow!("set {id} vanished from the state"))
    }

    /// Starts the output's periodic work (snapshots of the Ingestion 3 archive) off the
    /// async threads unless the last one still runs: notifications go on being applied
    /// while a snapshot of millions of records is written. A failure is logged and tried
    /// again at the next check.
    fn housekeeping(&self, sets: &[Followed], running: &mut Option<tokio::task::JoinHandle<()>>) {
        if running.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let mut baselined = true;
        for s in sets {
            baselined &= self.row(s.row.id).is_ok_and(|r| r.baseline_done);
        }
        let output = self.output.clone();
        *running = Some(tokio::spawn(async move {
            match tokio::task::spawn_blocking(move || output.housekeeping(baselined)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %format!("{e:#}"), "output housekeeping failed; tried again at the next check")
                }
                Err(e) => tracing::warn!(error = %e, "output housekeeping panicked"),
            }
        }));
    }

    /// Whether an entry's URL may be fetched for the set: inside the source's scope and not
    /// one of the documents being read (an index or list is never a resource). A refusal is
    /// recorded.
    fn admit(&self, set: &Followed, loc: &str, docs: &HashSet<String>) -> anyhow::Result<bool> {
        let why = match self.fetcher.scope().check(loc) {
            Err(r) => r.to_string(),
            Ok(_) if docs.contains(loc) => {
                "a list document of the source, listed as a resource".to_string()
            }
            Ok(_) => return Ok(true),
        };
        refuse(&self.state, &set.info.name, set.row.id, loc, &why)?;
        Ok(false)
    }

    // ---- baseline ----

    /// The set's baseline: from its Resource Dump when configured and usable, else (or for
    /// what the dump did not hold as the Resource List lists it) from its Resource List.
    async fn baseline(&self, set: &Followed) -> anyhow::Result<()> {
        let mut from_dump = None;
        if self.cfg.source.baseline == config::BaselineFrom::Dump {
            match &set.info.resourcedump {
                Some(rd) => match self.baseline_from_dump(set, rd).await? {
                    Ok((position, 0)) => {
                        self.state.finish_baseline(set.row.id, position)?;
                        return Ok(());
                    }
                    Ok((position, missed)) => {
                        tracing::info!(set = %set.info.name, missed, "bitstreams of the dump did not match its manifest (or could not be placed): fetched on their own, checked against the Resource List");
                        from_dump = Some(position);
                    }
                    Err(e) => {
                        tracing::warn!(set = %set.info.name, error = %format!("{e:#}"), "the Resource Dump cannot be used: baselining from the Resource List");
                    }
                },
                None => {
                    tracing::warn!(set = %set.info.name, "source.baseline = \"dump\", but the set offers no Resource Dump: baselining from its Resource List")
                }
            }
        }
        self.baseline_from_list(set, from_dump).await
    }

    /// Walks the Resource List (through its index, one part at a time, streamed) and fetches
    /// what is not held as listed yet with bounded concurrency. Resumable: what is held as
    /// listed is not fetched again. Failures are queued as changes dated just before the
    /// list's `at`, so they hold the position until they are applied; refusals are recorded.
    /// After a dump baseline the position is the earlier of the dump's and the list's `at`.
    async fn baseline_from_list(
        &self,
        set: &Followed,
        from_dump: Option<Timestamp>,
    ) -> anyhow::Result<()> {
        let Some(rl) = &set.info.resourcelist else {
            anyhow::bail!(
                "set {}: its Capability List has no Resource List (inside the source's scope) to baseline from",
                set.info.name
            );
        };
        let started = Timestamp::now();
        let (header, parts, mut docs) = self.list_parts(set, rl, "Resource List").await?;
        let at = header.md.get("at").and_then(|a| Timestamp::parse(a).ok());
        let bar = progress(&format!("baseline {}", set.info.name));
        let mut total = Total::new(parts.len());
        let sem = Arc::new(Semaphore::new(self.cfg.fetch.concurrency));
        let mut tasks = tokio::task::JoinSet::new();
        let mut failures: Vec<(Change, String)> = Vec::new();
        let (mut held, mut refused) = (Batch::default(), 0u64);
        for part in parts {
            let Some(mut doc) = self
                .open_part(set, part, "Resource List part", &mut docs)
                .await?
            else {
                total.skip(&bar);
                continue;
            };
            total.add(&bar, &doc);
            let r = &mut doc.reader;
            while let Some(e) = r.next_entry()? {
                bar.inc(1);
                if !self.admit(set, &e.loc, &docs)? {
                    refused += 1;
                    continue;
                }
                let c = entry_change(&e, "created", at.unwrap_or(started));
                if self.state.holds_as_listed(set.row.id, &c)? {
                    continue;
                }
                let permit = sem.clone().acquire_owned().await?;
                let (this, name) = (self.clone_parts(), set.info.name.clone());
                // Claimed in list order: of two URIs with one file, the first listed keeps it.
                let claim = this.claim(&c.uri);
                tasks.spawn(async move {
                    let _permit = permit;
                    let r = match claim {
                        Ok(claim) => this.fetch_verify_put(&name, &c, claim).await,
                        Err(e) => Err(e),
                    };
                    (c, r)
                });
                while let Some(done) = tasks.try_join_next() {
                    self.collect(set, done?, &mut failures, &mut held, &mut refused)?;
                }
            }
        }
        while let Some(done) = tasks.join_next().await {
            self.collect(set, done?, &mut failures, &mut held, &mut refused)?;
        }
        held.record(&self.state, set.row.id, 0)?;
        let fetched = held.recorded;
        bar.finish_and_clear();
        // Without `at` (a source that omits it), the time the walk started is the safe start.
        let mut position = at.unwrap_or(started);
        if let Some(d) = from_dump {
            position = position.min(d);
        }
        for (f, _) in &mut failures {
            f.datetime = Timestamp(position.0 - 1);
        }
        let queued: Vec<Change> = failures.iter().map(|(c, _)| c.clone()).collect();
        self.state.enqueue(set.row.id, &queued)?;
        self.state
            .defer(set.row.id, &failures, self.clone_parts().next_try(0))?;
        self.state.finish_baseline(set.row.id, position)?;
        tracing::info!(set = %set.info.name, fetched, failed = failures.len(), refused, position = %position, "baseline done");
        Ok(())
    }

    fn collect(
        &self,
        set: &Followed,
        done: (Change, Result<(Held, Claim), NotApplied>),
        failures: &mut Vec<(Change, String)>,
        held: &mut Batch,
        refused: &mut u64,
    ) -> anyhow::Result<()> {
        match done.1 {
            Ok((h, claim)) => {
                held.holds.push((done.0.uri, h));
                held.claims.push(claim);
                held.record(&self.state, set.row.id, 256)?;
            }
            Err(NotApplied::Refused(why)) => {
                *refused += 1;
                refuse(&self.state, &set.info.name, set.row.id, &done.0.uri, &why)?;
            }
            Err(NotApplied::Failed(e)) => {
                tracing::warn!(uri = %short(&done.0.uri), error = %e, "baseline fetch failed: queued for retry");
                failures.push((done.0, e));
            }
        }
        Ok(())
    }

    /// The baseline from the set's Resource Dump: each package downloaded (resumed after a
    /// dropped connection or a restart: the partial file is kept under `state.dir`), never
    /// past its listed length, unpacked, every bitstream checked against its manifest's md5
    /// and length before the output gets it. Returns `Err` for what may pass (a package
    /// download that keeps failing: tried again at the next check), `Ok(Err)` when the dump
    /// cannot be used (a package longer than listed, refused, not a ZIP…: the Resource List is
    /// used instead), else the dump's `at` and how many bitstreams could not be placed.
    async fn baseline_from_dump(
        &self,
        set: &Followed,
        url: &str,
    ) -> anyhow::Result<anyhow::Result<(Timestamp, u64)>> {
        let started = Timestamp::now();
        let (header, parts, mut docs) = self.list_parts(set, url, "Resource Dump").await?;
        if header.md.get("capability").map(String::as_str) != Some("resourcedump") {
            return Ok(Err(anyhow::anyhow!(
                "{} is not a Resource Dump",
                short(url)
            )));
        }
        let at = header.md.get("at").and_then(|a| Timestamp::parse(a).ok());
        let position = at.unwrap_or(started);
        let downloads = self.cfg.state.dir.join("dump-downloads");
        std::fs::create_dir_all(&downloads)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", downloads.display()))?;
        let bar = progress(&format!(
            "baseline {} from its Resource Dump",
            set.info.name
        ));
        let (mut missed, mut placed) = (0u64, 0u64);
        // A package is unpacked (on every core) while the next one downloads.
        let mut unpacking: Option<tokio::task::JoinHandle<anyhow::Result<Unpacked>>> = None;
        let finish = |r: Result<anyhow::Result<Unpacked>, tokio::task::JoinError>,
                      placed: &mut u64,
                      missed: &mut u64|
         -> anyhow::Result<()> {
            let (n, m) = r??;
            *placed += n;
            *missed += m;
            Ok(())
        };
        for part in parts {
            let Some(mut doc) = self
                .open_part(set, part, "Resource Dump", &mut docs)
                .await?
            else {
                return Ok(Err(anyhow::anyhow!("a part of its index was refused")));
            };
            while let Some(e) = doc.reader.next_entry()? {
                use sha2::Digest;
                let name = crate::digest::hex_digest(sha2::Sha256::digest(e.loc.as_bytes()));
                let local = downloads.join(format!("{}.zip", &name[..32]));
                let expected = e.md.get("length").and_then(|l| l.parse().ok());
                if let Err(err) = self
                    .fetcher
                    .download_resumable(&e.loc, &local, expected)
                    .await
                {
                    if let Some(r) = &err.refused {
                        refuse(
                            &self.state,
                            &set.info.name,
                            set.row.id,
                            &e.loc,
                            &r.to_string(),
                        )?;
                    }
                    let retry = err.retry;
                    let err = anyhow::anyhow!("package {}: {err}", short(&e.loc));
                    return if retry {
                        Err(err)
                    } else {
                        if let Some(u) = unpacking.take() {
                            let _ = u.await;
                        }
                        Ok(Err(err))
                    };
                }
                let (worker, set_name, set_id, file, b) = (
                    self.clone_parts(),
                    set.info.name.clone(),
                    set.row.id,
                    local.clone(),
                    bar.clone(),
                );
                if let Some(previous) = unpacking.take() {
                    if let Err(e) = finish(previous.await, &mut placed, &mut missed) {
                        return Ok(Err(e));
                    }
                }
                unpacking = Some(tokio::task::spawn_blocking(move || {
                    let r = worker.unpack(&set_name, set_id, &file, position, &b);
                    if r.is_ok() {
                        let _ = std::fs::remove_file(&file);
                        let _ = std::fs::remove_file(file.with_extension("etag"));
                    }
                    r
                }));
            }
        }
        if let Some(last) = unpacking {
            if let Err(e) = finish(last.await, &mut placed, &mut missed) {
                return Ok(Err(e));
            }
        }
        bar.finish_and_clear();
        tracing::info!(set = %set.info.name, placed, missed, position = %position, "baseline from the Resource Dump done");
        Ok(Ok((position, missed)))
    }

    /// Runs the set's baseline if it is not done yet: `true` when it is done, `false` when it
    /// was interrupted by an error (logged; resumed at the next check, what was fetched is
    /// kept).
    async fn baselined(&self, set: &Followed) -> anyhow::Result<bool> {
        if self.row(set.row.id)?.baseline_done {
            return Ok(true);
        }
        Ok(match self.baseline(set).await {
            Ok(()) => {
                self.state.set_error(set.row.id, None)?;
                true
            }
            Err(e) => {
                let e = format!("baseline: {e:#}");
                tracing::warn!(set = %set.info.name, error = %e, "baseline interrupted; resumed at the next check");
                self.state.set_error(set.row.id, Some(&e))?;
                false
            }
        })
    }

    /// The parts a fetch task needs (cheap clones).
    fn clone_parts(&self) -> Arc<Worker> {
        Arc::new(Worker {
            state: self.state.clone(),
            fetcher: self.fetcher.clone(),
            output: self.output.clone(),
            exec: self.cfg.output.exec.clone(),
            stop: self.stop.clone(),
            in_flight: self.in_flight.clone(),
            backoff: (
                self.cfg.fetch.backoff_initial_ms,
                self.cfg.fetch.backoff_max_ms,
            ),
        })
    }

    // ---- following ----

    /// Reads the Change Lists from the position on (following the index across closed lists),
    /// queues what is new, applies the queue, and moves the position. Returns how many changes
    /// were new and the newest datetime among them.
    async fn catch_up(&self, set: &Followed) -> anyhow::Result<(usize, Option<Timestamp>)> {
        let r = self.read_changes(set).await;
        let error = r.as_ref().err().map(|e| format!("catching up: {e:#}"));
        self.state.set_error(set.row.id, error.as_deref())?;
        r
    }

    async fn read_changes(&self, set: &Followed) -> anyhow::Result<(usize, Option<Timestamp>)> {
        let Some(cl) = &set.info.changelist else {
            // No Change List: what the baseline could not fetch is still retried.
            self.drain(set).await?;
            return Ok((0, None));
        };
        let row = self.row(set.row.id)?;
        let Some(p) = row.position else {
            return Ok((0, None));
        };
        let (_, parts, mut docs) = self.list_parts(set, cl, "Change List").await?;
        // Closed lists that end at or before P are done; the rest in chronological order.
        let from = |p: &Part| match p {
            Part::There(e) => e.md.get("from").and_then(|f| Timestamp::parse(f).ok()),
            Part::Here(_) => None,
        };
        let mut parts: Vec<Part> = parts
            .into_iter()
            .filter(|part| match part {
                Part::There(e) => {
                    e.md.get("until")
                        .and_then(|u| Timestamp::parse(u).ok())
                        .is_none_or(|u| u > p)
                }
                Part::Here(_) => true,
            })
            .collect();
        parts.sort_by_key(from);
        let mut new = 0;
        let mut newest: Option<Timestamp> = None;
        let mut newest_new: Option<Timestamp> = None;
        for part in parts {
            let Some(mut doc) = self.open_part(set, part, "Change List", &mut docs).await? else {
                continue;
            };
            let r = &mut doc.reader;
            let mut batch = Vec::new();
            loop {
                let entry = r.next_entry()?;
                let end = entry.is_none();
                if let Some(e) = entry {
                    let Some(mut c) = change_of(&e) else { continue };
                    // A refused change is passed too: it never holds the position.
                    newest = newest.max(Some(c.datetime));
                    if !self.admit(set, &c.uri, &docs)? {
                        continue;
                    }
                    if e.md.contains_key("datetime") {
                        if c.datetime >= p {
                            batch.push(c);
                        }
                    } else if self.undated_is_new(set.row.id, &c)? {
                        // A ResourceSync 1.0 style entry has only `lastmod` (a deletion's is the
                        // deleted resource's old one), so its date cannot place it: it is taken
                        // when what we hold does not reflect it yet, dated no earlier than P.
                        c.datetime = c.datetime.max(p);
                        batch.push(c);
                    }
                }
                if batch.len() >= 1000 || (end && !batch.is_empty()) {
                    let b = std::mem::take(&mut batch);
                    let n = self.state.enqueue(set.row.id, &b)?;
                    if n > 0 {
                        newest_new = newest_new.max(b.iter().map(|c| c.datetime).max());
                    }
                    new += n;
                }
                if end {
                    break;
                }
            }
        }
        self.state.checked(set.row.id, newest)?;
        self.drain(set).await?;
        if let Some(n) = newest {
            self.advance(set.row.id, n)?;
        }
        Ok((new, newest_new))
    }

    /// Whether the Change Lists brought changes that push should have brought: the newest
    /// change they brought is more than a few seconds old and no delivery arrived after it.
    /// Then the subscription may be gone at the hub (removed, expired, its store rebuilt) and
    /// is asked for again.
    fn push_missed(&self, set: &Followed, found: (usize, Option<Timestamp>)) -> bool {
        let mut unconfirmed = self.unconfirmed.lock().expect("lock");
        if let (n, Some(newest)) = found {
            if n > 0 {
                let e = unconfirmed.entry(set.row.id).or_insert(newest);
                *e = (*e).max(newest);
            }
        }
        let Some(&newest) = unconfirmed.get(&set.row.id) else {
            return false;
        };
        if newest.0 > Timestamp::now().0 - 3_000_000 {
            return false; // push may still be on its way
        }
        unconfirmed.remove(&set.row.id);
        let last_push = self.row(set.row.id).ok().and_then(|r| r.last_push_at);
        let missed = last_push.is_none_or(|t| t < newest);
        if missed {
            tracing::info!(set = %set.info.name, "the Change Lists had changes push did not bring: subscribing again");
        }
        missed
    }

    /// Whether an entry without a `datetime` still has to be applied: a deletion of something
    /// held, or a creation/update whose length or md5 differ from what is held, or, when md5
    /// cannot tell (the list or the record has none), whose `lastmod` is newer. A URL refused
    /// before is not taken again.
    fn undated_is_new(&self, set_id: i64, c: &Change) -> anyhow::Result<bool> {
        if self.state.is_refused(set_id, &c.uri)? {
            return Ok(false);
        }
        let held = self.state.held(set_id, &c.uri)?;
        Ok(match (c.change.as_str(), held) {
            ("deleted", held) => held.is_some(),
            (_, None) => true,
            (_, Some(h)) => {
                c.length.is_some_and(|l| Some(l) != h.length)
                    || match (&c.md5, &h.md5) {
                        (Some(m), Some(held_md5)) => m != held_md5,
                        _ => c.newer_than(&h),
                    }
            }
        })
    }

    /// Moves the position to `to`, or to the oldest change still queued if that is earlier.
    fn advance(&self, set_id: i64, to: Timestamp) -> anyhow::Result<()> {
        let to = match self.state.oldest_pending(set_id)? {
            Some(p) => p.min(to),
            None => to,
        };
        self.state.advance(set_id, to)?;
        Ok(())
    }

    /// Applies a notification: a gap before it is filled from the Change Lists first. Its
    /// entries outside the source's scope are refused (a signed notification is trusted as
    /// the hub's, not for what it names).
    async fn on_push(&self, set: &Followed, body: &[u8]) -> anyhow::Result<()> {
        let doc = discover::parse(body, max_token(&self.cfg))?;
        if doc.md.get("capability").map(String::as_str) != Some("change-notification") {
            tracing::warn!(set = %set.info.name, "a delivery that is not a change notification: ignored");
            return Ok(());
        }
        let from = doc.md.get("from").and_then(|f| Timestamp::parse(f).ok());
        let until = doc.md.get("until").and_then(|u| Timestamp::parse(u).ok());
        let mut changes: Vec<Change> = Vec::new();
        for c in doc.entries.iter().filter_map(change_of) {
            if self.admit(set, &c.uri, &HashSet::new())? {
                changes.push(c);
            }
        }
        self.state
            .pushed(set.row.id, changes.iter().map(|c| c.datetime).max())?;
        let row = self.row(set.row.id)?;
        let Some(p) = row.position else {
            return Ok(()); // baseline still running: the Change Lists will bring it
        };
        if from.is_none_or(|f| f > p) {
            tracing::info!(set = %set.info.name, position = %p, from = %from.map_or("-".to_string(), |f| f.to_string()), "gap before a notification: filling it from the Change Lists");
            self.catch_up(set).await?;
        }
        let p = self.row(set.row.id)?.position.unwrap_or(p);
        let fresh: Vec<Change> = changes.into_iter().filter(|c| c.datetime >= p).collect();
        self.state.enqueue(set.row.id, &fresh)?;
        self.drain(set).await?;
        if let Some(u) = until.or(fresh.iter().map(|c| c.datetime).max()) {
            self.advance(set.row.id, u)?;
        }
        Ok(())
    }

    /// Applies the queue: per resource in order (a later change of a resource collapses onto
    /// the earlier ones: its content is what is fetched and checked), resources concurrently.
    /// A resource still in its backoff after a failed try waits for a later pass (or for a
    /// newer change of it).
    async fn drain(&self, set: &Followed) -> anyhow::Result<()> {
        let pending = self.state.pending(set.row.id)?;
        if pending.is_empty() {
            return Ok(());
        }
        let now = Timestamp::now();
        let mut by_uri: BTreeMap<String, Vec<Pending>> = BTreeMap::new();
        for p in pending {
            by_uri.entry(p.change.uri.clone()).or_default().push(p);
        }
        let sem = Arc::new(Semaphore::new(self.cfg.fetch.concurrency));
        let mut tasks = tokio::task::JoinSet::new();
        for (_, queue) in by_uri {
            // In its backoff, unless a newer change of it came meanwhile.
            if queue
                .last()
                .is_some_and(|p| p.not_before.is_some_and(|t| t > now))
            {
                continue;
            }
            let permit = sem.clone().acquire_owned().await?;
            let w = self.clone_parts();
            let (name, id) = (set.info.name.clone(), set.row.id);
            let (max_tries, skip) = (self.cfg.fetch.max_tries, self.cfg.fetch.skip_failed);
            // Claimed in queue order (what is fetched: not a deletion).
            let claim = queue
                .last()
                .filter(|p| p.change.change != "deleted")
                .map(|p| w.claim(&p.change.uri));
            tasks.spawn(async move {
                let _permit = permit;
                w.apply_queue(&name, id, queue, claim, max_tries, skip)
                    .await
            });
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
        Ok(())
    }

    /// Keeps the push subscription alive: asks for one when there is none, when the last
    /// request was not verified within a minute, when two thirds of the lease have passed,
    /// when the callback changed, or when `force` (the Change Lists brought changes push did
    /// not).
    async fn keep_subscribed(&self, set: &Followed, force: bool) {
        if !self.cfg.push.enabled {
            return;
        }
        let (Some(topic), Some(hub)) = (&set.info.topic, &set.info.hub) else {
            return;
        };
        let now = Timestamp::now();
        let ours = format!(
            "{}/cb/{}/",
            self.callback_base.trim_end_matches('/'),
            set.row.id
        );
        let current = self.state.subscription(set.row.id).ok().flatten();
        let due = match &current {
            Some(s) if s.topic == *topic && s.callback.starts_with(&ours) => {
                match s.state.as_str() {
                    "active" => {
                        let lease = s.lease_secs.unwrap_or(self.cfg.push.lease_secs);
                        force
                            || now
                                >= s.verified_at
                                    .unwrap_or(s.requested_at)
                                    .plus_secs(lease * 2 / 3)
                    }
                    "requested" => now >= s.requested_at.plus_secs(60),
                    _ => {
                        now >= s
                            .requested_at
                            .plus_secs(self.cfg.follow.check_interval_secs.max(60))
                    }
                }
            }
            _ => true,
        };
        if !due {
            return;
        }
        if let Some(s) = current.as_ref().filter(|s| s.state == "requested") {
            self.subscription_problem(
                set,
                &format!(
                    "the hub accepted the request but has not verified the callback {} within 60 s: the hub must be able to \
                     reach it (push.listen, push.callback_url), and a hub may refuse to call loopback or private addresses \
                     (resourcesync-hub: hub.allow_networks)",
                    short(&s.callback)
                ),
            );
        }
        // The callback keeps its token across renewals; a new one for a new callback.
        let callback = match current.filter(|s| s.callback.starts_with(&ours)) {
            Some(s) => s.callback,
            None => match self
                .state
                .harvester_id()
                .map_err(anyhow::Error::from)
                .and_then(|id| follow::new_token(&id))
            {
                Ok(t) => follow::callback_url(&self.callback_base, set.row.id, &t),
                Err(e) => {
                    tracing::warn!(error = %e, "no callback token");
                    return;
                }
            },
        };
        if let Err(e) = follow::subscribe(
            &self.fetcher,
            &self.state,
            set.row.id,
            hub,
            topic,
            &callback,
            self.cfg.push.lease_secs,
        )
        .await
        {
            self.subscription_problem(set, &format!("{e:#}"));
        }
    }

    /// Records why a set's subscription does not work, logged once per reason; shown by
    /// `harvest status`. Push is then replaced by reading Change Lists, and asked for again.
    fn subscription_problem(&self, set: &Followed, reason: &str) {
        let reason = scope::cut(reason, 800);
        match self.state.subscription_problem(set.row.id, &reason) {
            Ok(true) => {
                tracing::warn!(set = %set.info.name, reason = %reason, "no push: the subscription does not work (Change Lists are read every follow.check_interval_secs; asked again)")
            }
            Ok(false) => {
                tracing::debug!(set = %set.info.name, reason = %reason, "the subscription still does not work")
            }
            Err(e) => tracing::warn!(error = %e, "cannot record the subscription's problem"),
        }
    }
}

/// A document fetched to a temporary file, read entry by entry (the file lives as long as this).
struct OnDisk {
    reader: EntryReader<std::io::BufReader<sitemap::Bounded<std::fs::File>>>,
    _file: tempfile::NamedTempFile,
}

/// One document of a list: the list itself (already open), or an entry of its index.
enum Part {
    Here(Box<OnDisk>),
    There(ParsedEntry),
}

impl Harvester {
    async fn open_doc(&self, url: &str, what: &str) -> Result<OnDisk, fetch::FetchError> {
        let file = self
            .fetcher
            .document_to_file(url, self.output.temp_dir())
            .await
            .map_err(|e| fetch::FetchError {
                message: format!("{what} {e}"),
                ..e
            })?;
        let bad = |e: String| fetch::FetchError {
            message: format!("{what} {}: {e}", short(url)),
            retry: false,
            retry_after: None,
            refused: None,
            status: None,
        };
        let f = std::fs::File::open(file.path()).map_err(|e| bad(e.to_string()))?;
        let reader = EntryReader::new(std::io::BufReader::new(sitemap::Bounded::new(
            f,
            max_token(&self.cfg),
        )))
        .map_err(|e| bad(short(&e.to_string()).into_owned()))?;
        Ok(OnDisk {
            reader,
            _file: file,
        })
    }

    /// A list's header and its documents: itself when it is not an index, else the entries
    /// of its index (each opened with [`Harvester::open_part`] when its turn comes, so only
    /// one part is on disk at a time); and the URLs of the documents read so far (never
    /// resources).
    async fn list_parts(
        &self,
        set: &Followed,
        url: &str,
        what: &str,
    ) -> anyhow::Result<(sitemap::Document, Vec<Part>, HashSet<String>)> {
        let mut d = self.open_doc(url, what).await?;
        let header = d.reader.header().clone();
        let mut docs = HashSet::from([url.to_string()]);
        if !header.is_index {
            return Ok((header, vec![Part::Here(Box::new(d))], docs));
        }
        let mut parts = Vec::new();
        while let Some(e) = d.reader.next_entry()? {
            if !self.admit(set, &e.loc, &HashSet::new())? {
                continue;
            }
            if !docs.insert(e.loc.clone()) {
                let why = "a list document listed again in its own index";
                refuse(&self.state, &set.info.name, set.row.id, &e.loc, why)?;
                continue;
            }
            parts.push(Part::There(e));
        }
        Ok((header, parts, docs))
    }

    /// Opens a part of a list; `None` when it is refused (recorded): outside the scope, or an
    /// index itself (the spec allows one level of index).
    async fn open_part(
        &self,
        set: &Followed,
        part: Part,
        what: &str,
        docs: &mut HashSet<String>,
    ) -> anyhow::Result<Option<OnDisk>> {
        let e = match part {
            Part::Here(d) => return Ok(Some(*d)),
            Part::There(e) => e,
        };
        docs.insert(e.loc.clone());
        let why = match self.open_doc(&e.loc, what).await {
            Ok(d) if !d.reader.header().is_index => return Ok(Some(d)),
            Ok(_) => "a sitemap index inside an index (one level is allowed)".to_string(),
            Err(err) => match err.refused {
                Some(r) => r.to_string(),
                None => return Err(err.into()),
            },
        };
        refuse(&self.state, &set.info.name, set.row.id, &e.loc, &why)?;
        Ok(None)
    }
}

/// A file of the output claimed for a URI being written (see [`Worker::claim`]); let go when
/// dropped.
struct Claim(Option<(InFlight, String)>);

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some((writing, path)) = &self.0 {
            writing.lock().expect("in-flight lock").remove(path);
        }
    }
}

/// Resources fetched by a baseline, recorded as held a batch at a time (one transaction for
/// many: a crash before a batch is recorded only means those are fetched again), their files'
/// claims kept until then.
#[derive(Default)]
struct Batch {
    holds: Vec<(String, Held)>,
    claims: Vec<Claim>,
    recorded: u64,
}

impl Batch {
    /// Records the batch once it has more than `over` resources.
    fn record(&mut self, state: &State, set_id: i64, over: usize) -> anyhow::Result<()> {
        if self.holds.len() > over {
            state.hold_many(set_id, &self.holds)?;
            self.recorded += self.holds.len() as u64;
            self.holds.clear();
            self.claims.clear();
        }
        Ok(())
    }
}

/// What unpacking a dump package did: bitstreams placed, and how many could not be (fetched
/// on their own from the Resource List).
type Unpacked = (u64, u64);

/// What a fetch task needs.
struct Worker {
    state: Arc<State>,
    fetcher: Fetcher,
    output: Arc<dyn Output>,
    exec: String,
    stop: Arc<AtomicBool>,
    in_flight: InFlight,
    /// `fetch.backoff_initial_ms`, `fetch.backoff_max_ms`: the pause before a failed resource
    /// is tried again grows from the first by 4× per try, up to ten times the second.
    backoff: (u64, u64),
}

impl Worker {
    /// When a resource that failed its try number `tries` + 1 is tried again: the pause grows
    /// from `fetch.backoff_initial_ms` by 4× per try, up to ten times `fetch.backoff_max_ms`.
    fn next_try(&self, tries: u32) -> Timestamp {
        let (first, max) = self.backoff;
        let pause_ms = first
            .saturating_mul(4u64.saturating_pow(tries + 1))
            .min(max.saturating_mul(10));
        Timestamp(
            Timestamp::now()
                .0
                .saturating_add((pause_ms as i64).saturating_mul(1000)),
        )
    }

    /// Claims the file `uri` gets in the output (outputs that name files after URIs): a URI
    /// whose file would be the file of another resource (held, or being written now), or
    /// would need a folder where another's file is (or the other way round), is refused,
    /// never written over it. The claim holds while the returned guard lives; it becomes
    /// durable when the resource is recorded as held.
    fn claim(&self, uri: &str) -> Result<Claim, NotApplied> {
        let target = self
            .output
            .target(uri)
            .map_err(|e| NotApplied::Refused(format!("{e:#}")))?;
        let Some((root, t)) = target else {
            return Ok(Claim(None));
        };
        let path = t.display().to_string();
        let mut writing = self.in_flight.lock().expect("in-flight lock");
        let crosses =
            |a: &str, b: &str| a == b || b.strip_prefix(a).is_some_and(|r| r.starts_with('/'));
        let mut other = writing
            .iter()
            .find(|(p, u)| *u != uri && (crosses(p, &path) || crosses(&path, p)))
            .map(|(_, u)| u.clone());
        if other.is_none() {
            other = self
                .state
                .claim_conflict(&root.display().to_string(), &path, uri)
                .map_err(|e| NotApplied::Failed(e.to_string()))?;
        }
        if let Some(other) = other {
            return Err(NotApplied::Refused(format!(
                "its file in the output would be the file (or a folder) of {}",
                short(&other)
            )));
        }
        writing.insert(path.clone(), uri.to_string());
        Ok(Claim(Some((self.in_flight.clone(), path))))
    }

    /// Fetches, checks length and md5 against `c`, and hands the file to the output.
    async fn fetch_verify_put(
        &self,
        set: &str,
        c: &Change,
        claim: Claim,
    ) -> Result<(Held, Claim), NotApplied> {
        let path = self
            .output
            .download_path(&c.uri)
            .map_err(|e| NotApplied::Refused(format!("{e:#}")))?;
        let d = self.fetcher.download(&c.uri, &path, c.length).await?;
        if let Err(e) = c.check(d.length, &d.md5) {
            let _ = std::fs::remove_file(&d.path);
            return Err(NotApplied::Failed(format!("{}: {e}", short(&c.uri))));
        }
        let output = self.output.clone();
        let (set, uri, md5, path, mime) = (
            set.to_string(),
            c.uri.clone(),
            d.md5.clone(),
            d.path.clone(),
            d.mime.clone(),
        );
        let length = d.length;
        let placed = tokio::task::spawn_blocking(move || {
            let r = output.put(
                &Item {
                    set: &set,
                    uri: &uri,
                    md5: &md5,
                    length,
                    mime: mime.as_deref(),
                },
                &path,
            );
            if r.is_err() {
                let _ = std::fs::remove_file(&path);
            }
            r
        })
        .await
        .map_err(|e| NotApplied::Failed(e.to_string()))?
        .map_err(|e| NotApplied::Failed(format!("{e:#}")))?;
        Ok((
            Held {
                md5: Some(d.md5),
                length: Some(d.length),
                path: placed,
                lastmod: c.lastmod.or(Some(c.datetime)),
            },
            claim,
        ))
    }

    /// Unpacks one Resource Dump package (blocking): every manifest entry's bitstream,
    /// checked against the manifest, handed to the output and recorded as held. Returns how
    /// many were placed and how many could not be. Stops at the next entry on shutdown.
    fn unpack(
        &self,
        set: &str,
        set_id: i64,
        zip_path: &std::path::Path,
        at: Timestamp,
        bar: &ProgressBar,
    ) -> anyhow::Result<Unpacked> {
        use std::io::Read;
        let mut z = zip::ZipArchive::new(std::fs::File::open(zip_path)?)
            .map_err(|e| anyhow::anyhow!("{}: not a ZIP package: {e}", zip_path.display()))?;
        let mut manifest = Vec::new();
        let max_doc = self.fetcher.max_document_bytes();
        z.by_name("manifest.xml")
            .map_err(|e| anyhow::anyhow!("a package without manifest.xml: {e}"))?
            .take(max_doc + 1)
            .read_to_end(&mut manifest)?;
        if manifest.len() as u64 > max_doc {
            anyhow::bail!("the package's manifest.xml is larger than fetch.max_document_bytes");
        }
        let max_token = (self.fetcher.scope().max_url_length() + 1).max(64 * 1024);
        let mut reader = EntryReader::new(std::io::BufReader::new(sitemap::Bounded::new(
            &manifest[..],
            max_token,
        )))
        .map_err(|e| anyhow::anyhow!("the package's manifest.xml: {e}"))?;
        if reader.header().md.get("capability").map(String::as_str) != Some("resourcedump-manifest")
        {
            anyhow::bail!("the package's manifest.xml is not a Resource Dump Manifest");
        }
        let mut entries = Vec::new();
        while let Some(e) = reader.next_entry()? {
            entries.push(e);
        }
        drop((z, manifest));
        // The entries split over the cores, each part read through its own handle.
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(1, 4));
        let chunk = entries.len().div_ceil(cores).max(1);
        let results: Vec<anyhow::Result<Unpacked>> = std::thread::scope(|scope| {
            let handles: Vec<_> = entries
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || self.unpack_entries(set, set_id, zip_path, part, at, bar))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("an unpacking thread panicked")))
                })
                .collect()
        });
        let (mut placed, mut missed) = (0u64, 0u64);
        for r in results {
            let (n, m) = r?;
            placed += n;
            missed += m;
        }
        Ok((placed, missed))
    }

    /// Unpacks some entries of a package (see [`Worker::unpack`]). An entry outside the
    /// source's scope is refused: its bytes never reach the output.
    fn unpack_entries(
        &self,
        set: &str,
        set_id: i64,
        zip_path: &std::path::Path,
        entries: &[ParsedEntry],
        at: Timestamp,
        bar: &ProgressBar,
    ) -> anyhow::Result<Unpacked> {
        use md5::Digest;
        use std::io::Read;
        let mut z = zip::ZipArchive::new(std::fs::File::open(zip_path)?)?;
        let (mut placed, mut missed) = (0u64, 0u64);
        // Recorded a thousand at a time.
        let mut held = Batch::default();
        for e in entries {
            if self.stop.load(Ordering::Relaxed) {
                held.record(&self.state, set_id, 0)?;
                anyhow::bail!("stopping");
            }
            bar.inc(1);
            if let Err(r) = self.fetcher.scope().check(&e.loc) {
                refuse(&self.state, set, set_id, &e.loc, &r.to_string())?;
                continue;
            }
            let c = entry_change(e, "created", at);
            if self.state.holds_as_listed(set_id, &c)? {
                continue;
            }
            let Some(inner) =
                e.md.get("path")
                    .map(|p| p.trim_start_matches('/').to_string())
            else {
                missed += 1;
                continue;
            };
            let claim = match self.claim(&c.uri) {
                Ok(claim) => claim,
                Err(NotApplied::Refused(r)) => {
                    refuse(&self.state, set, set_id, &c.uri, &r)?;
                    continue;
                }
                Err(NotApplied::Failed(_)) => {
                    missed += 1;
                    continue;
                }
            };
            let dest = match self.output.download_path(&c.uri) {
                Ok(d) => d,
                Err(err) => {
                    refuse(&self.state, set, set_id, &c.uri, &format!("{err:#}"))?;
                    continue;
                }
            };
            let measured = (|| -> anyhow::Result<(u64, String)> {
                let mut f = z.by_name(&inner)?;
                // Never more than the manifest promises (a package is not trusted further).
                let limit = c.length.unwrap_or(f.size()).saturating_add(1);
                let mut out = std::io::BufWriter::new(std::fs::File::create(&dest)?);
                let (mut h, mut n, mut buf) = (md5::Md5::new(), 0u64, vec![0u8; 64 * 1024]);
                let mut r = (&mut f).take(limit);
                loop {
                    let k = r.read(&mut buf)?;
                    if k == 0 {
                        break;
                    }
                    h.update(&buf[..k]);
                    std::io::Write::write_all(&mut out, &buf[..k])?;
                    n += k as u64;
                }
                std::io::Write::flush(&mut out)?;
                Ok((n, crate::digest::hex_digest(h.finalize())))
            })();
            let checked = measured
                .map_err(|err| format!("cannot unpack it: {err:#}"))
                .and_then(|(length, md5)| c.check(length, &md5).map(|_| (length, md5)));
            let (length, md5) = match checked {
                Ok(m) => m,
                Err(why) => {
                    tracing::warn!(uri = %short(&c.uri), error = %why, "a bitstream of the dump does not match its manifest entry: fetched on its own");
                    let _ = std::fs::remove_file(&dest);
                    missed += 1;
                    continue;
                }
            };
            let item = Item {
                set,
                uri: &c.uri,
                md5: &md5,
                length,
                mime: e.md.get("type").map(String::as_str),
            };
            match self.output.put(&item, &dest) {
                Ok(path) => {
                    held.holds.push((
                        c.uri,
                        Held {
                            md5: Some(md5),
                            length: Some(length),
                            path,
                            lastmod: c.lastmod.or(Some(at)),
                        },
                    ));
                    held.claims.push(claim);
                    held.record(&self.state, set_id, 1000)?;
                    placed += 1;
                }
                Err(err) => {
                    let _ = std::fs::remove_file(&dest);
                    tracing::warn!(uri = %short(&c.uri), error = %format!("{err:#}"), "the output refused a bitstream");
                    missed += 1;
                }
            }
        }
        held.record(&self.state, set_id, 0)?;
        Ok((placed, missed))
    }

    /// One resource's queued changes, in order. The last change decides the content: the
    /// earlier ones are applied with it (each logged once, the hook run for each). A refusal
    /// (outside the scope, a file another resource has) takes them out of the queue.
    async fn apply_queue(
        &self,
        set: &str,
        set_id: i64,
        queue: Vec<Pending>,
        claim: Option<Result<Claim, NotApplied>>,
        max_tries: u32,
        skip: bool,
    ) -> anyhow::Result<()> {
        let last = queue.last().expect("a non-empty queue").clone();
        // The file's claim lives until the change is recorded as applied.
        let mut kept = None;
        let result: Result<Option<Held>, NotApplied> = if last.change.change == "deleted" {
            let (output, set_s, uri) = (
                self.output.clone(),
                set.to_string(),
                last.change.uri.clone(),
            );
            tokio::task::spawn_blocking(move || output.delete(&set_s, &uri))
                .await?
                .map(|_| None)
                .map_err(|e| NotApplied::Failed(format!("{e:#}")))
        } else {
            match claim {
                Some(Ok(claim)) => {
                    self.fetch_verify_put(set, &last.change, claim)
                        .await
                        .map(|(held, c)| {
                            kept = Some(c);
                            Some(held)
                        })
                }
                Some(Err(e)) => Err(e),
                None => Err(NotApplied::Failed(
                    "no claim for a resource to fetch".into(),
                )),
            }
        };
        let result = match result {
            Ok(held) => {
                let mut hook = Ok(());
                for p in &queue {
                    hook = self.run_hook(set, &p.change, held.as_ref()).await;
                    if hook.is_err() {
                        break;
                    }
                }
                hook.map(|_| held).map_err(NotApplied::Failed)
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(held) => {
                for p in &queue {
                    self.state.applied(set_id, p, held.as_ref())?;
                }
                drop(kept);
            }
            Err(NotApplied::Refused(why)) => {
                for p in &queue {
                    self.state.refuse_change(set_id, p, &why)?;
                }
                tracing::warn!(set, uri = %short(&last.change.uri), reason = %why, "refused (listed in harvest status; not fetched, not waited for)");
            }
            Err(NotApplied::Failed(e)) => {
                let not_before = self.next_try(last.tries);
                let p = self
                    .state
                    .attempt_failed(&last, &e, max_tries, skip, not_before)?;
                // Earlier changes of the resource share the outcome of the last one.
                for earlier in &queue[..queue.len() - 1] {
                    self.state
                        .attempt_failed(earlier, &e, max_tries, skip, not_before)?;
                }
                let uri = short(&last.change.uri);
                if p.skipped {
                    tracing::warn!(set, uri = %uri, tries = p.tries, error = %e, "giving up on a change (fetch.skip_failed): the position moves past it");
                } else if p.failed {
                    tracing::warn!(set, uri = %uri, tries = p.tries, error = %e, "change failed; it holds the position and is retried at every check");
                } else {
                    tracing::info!(set, uri = %uri, tries = p.tries, error = %e, "change not applied yet; retried");
                }
            }
        }
        Ok(())
    }

    /// The `output.exec` hook for one applied change, its JSON on standard input.
    async fn run_hook(&self, set: &str, c: &Change, held: Option<&Held>) -> Result<(), String> {
        if self.exec.is_empty() {
            return Ok(());
        }
        let json = serde_json::json!({
            "set": set, "uri": c.uri, "change": c.change, "datetime": c.datetime.to_string(),
            "md5": held.and_then(|h| h.md5.clone()), "length": held.and_then(|h| h.length),
            "path": held.map(|h| h.path.clone()),
        })
        .to_string();
        let cmd = self.exec.clone();
        let out = tokio::time::timeout(Duration::from_secs(600), async move {
            use tokio::io::AsyncWriteExt;
            let mut child = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(&cmd)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::inherit())
                .stderr(std::process::Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("exec {cmd:?}: {e}"))?;
            let mut stdin = child.stdin.take().expect("piped");
            // One write: a line under PIPE_BUF reaches a hook that appends it to a file whole.
            let _ = stdin.write_all(format!("{json}\n").as_bytes()).await;
            drop(stdin);
            let status = child
                .wait()
                .await
                .map_err(|e| format!("exec {cmd:?}: {e}"))?;
            if status.success() {
                Ok(())
            } else {
                Err(format!("exec {cmd:?} exited with {status}"))
            }
        })
        .await;
        out.unwrap_or_else(|_| Err("exec hook timed out after 600 s".into()))
    }
}

fn progress(what: &str) -> ProgressBar {
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::new_spinner()
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}: {pos} resources ({per_sec}) {elapsed}")
            .expect("template"),
    );
    bar.set_message(what.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// The baseline's total for its progress bar: the entries of the parts read so far, and for
/// the parts still to come, as many as the parts read had on average (parts are filled in
/// order, so this is close).
struct Total {
    parts: usize,
    opened: usize,
    entries: u64,
}

impl Total {
    fn new(parts: usize) -> Total {
        Total {
            parts,
            opened: 0,
            entries: 0,
        }
    }

    /// A part opened: its entries counted (a quick scan of the file on disk).
    fn add(&mut self, bar: &ProgressBar, doc: &OnDisk) {
        self.opened += 1;
        self.entries += count_entries(doc._file.path()).unwrap_or(0);
        self.show(bar);
    }

    /// A part refused: one fewer to come.
    fn skip(&mut self, bar: &ProgressBar) {
        self.parts = self.parts.saturating_sub(1);
        self.show(bar);
    }

    fn show(&self, bar: &ProgressBar) {
        if self.opened == 0 {
            return;
        }
        let rest = (self.parts.saturating_sub(self.opened)) as u64;
        let len = self.entries + self.entries / self.opened as u64 * rest;
        if bar.length().is_none() {
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} {msg}: {pos}/{len} resources ({per_sec}, {eta} left) {elapsed}",
                )
                .expect("template"),
            );
        }
        bar.set_length(len.max(bar.position()));
    }
}

/// How many `<url>` entries a sitemap file holds (counted by their closing tags).
fn count_entries(path: &std::path::Path) -> std::io::Result<u64> {
    use std::io::Read;
    const TAG: &[u8] = b"</url>";
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut n, mut kept) = (0u64, 0usize);
    loop {
        let read = f.read(&mut buf[kept..])?;
        if read == 0 {
            return Ok(n);
        }
        let end = kept + read;
        n += memchr::memmem::find_iter(&buf[..end], TAG).count() as u64;
        // Keep a tail shorter than the tag: a tag cut by the chunk's end is counted next time.
        kept = (TAG.len() - 1).min(end);
        buf.copy_within(end - kept..end, 0);
    }
}

/// A Resource List entry as a change of kind `kind` at `datetime`.
fn entry_change(e: &ParsedEntry, kind: &str, datetime: Timestamp) -> Change {
    Change {
        uri: e.loc.clone(),
        change: kind.into(),
        datetime,
        md5: md5_of(e),
        length: e.md.get("length").and_then(|l| l.parse().ok()),
        lastmod: e.lastmod.as_deref().and_then(|l| Timestamp::parse(l).ok()),
    }
}

/// A Change List / notification entry as a change (its `datetime`, or its `lastmod` for
/// ResourceSync 1.0 lists without one); `None` for an entry without a change or a date.
fn change_of(e: &ParsedEntry) -> Option<Change> {
    let kind = e.md.get("change")?;
    if !matches!(kind.as_str(), "created" | "updated" | "deleted") {
        return None;
    }
    let dt =
        e.md.get("datetime")
            .or(e.lastmod.as_ref())
            .and_then(|d| Timestamp::parse(d).ok())?;
    Some(entry_change(e, kind, dt))
}

/// The md5 of an entry's `hash` (`md5:<hex> sha-256:<hex>`).
fn md5_of(e: &ParsedEntry) -> Option<String> {
    e.md.get("hash")?
        .split_whitespace()
        .find_map(|h| h.strip_prefix("md5:"))
        .filter(|h| h.len() == 32)
        .map(|h| h.to_ascii_lowercase())
}

/// Runs the harvester until `shutdown`: discovery, baselines, the callback server (on
/// `listener`, or `push.listen`), then notifications as they come and a catch-up every
/// `follow.check_interval_secs`. Shutdown stops it in every phase: the work under way is
/// dropped (what it had applied is recorded; the rest is redone at the next start), blocking
/// work stops at its next step, and the callback server is given a second to close.
pub async fn run(
    cfg: HarvestConfig,
    listener: Option<TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::channel::<follow::Push>(64);
    let cancel = tokio_util::sync::CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        shutdown.await;
        stop.cancel();
    });
    let mut callback_base = cfg.push.callback_url.clone();
    let mut server = None;
    let harvester = if cfg.push.enabled {
        let listener = match listener {
            Some(l) => l,
            None => TcpListener::bind(&cfg.push.listen).await.map_err(|e| {
                if e.kind() == std::io::ErrorKind::AddrInUse {
                    anyhow::anyhow!(
                        "cannot listen on push.listen {}: another program (another harvester?) listens there; give each harvester its own push.listen port (and push.callback_url)",
                        cfg.push.listen
                    )
                } else {
                    anyhow::anyhow!("cannot listen on push.listen {}: {e}", cfg.push.listen)
                }
            })?,
        };
        if callback_base.is_empty() {
            callback_base = format!("http://{}", listener.local_addr()?);
        }
        let h = Harvester::new(cfg.clone(), callback_base.clone())?;
        let app = follow::router(h.state.clone(), tx.clone(), &cfg.push);
        let c = cancel.clone();
        tracing::info!(addr = %listener.local_addr()?, callback_base = %callback_base, "callback server listening");
        use axum::serve::ListenerExt;
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        server = Some(tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { c.cancelled().await })
                .await
        }));
        h
    } else {
        Harvester::new(cfg.clone(), callback_base)?
    };
    drop(tx);
    let h = harvester;
    let mut housekeeping = None;
    let work = async {
        // A source that cannot be read yet (down, restarting, overloaded) is tried again with
        // growing pauses: a long-lived harvester does not give up at start.
        let mut pause = Duration::from_secs(1);
        let sets = loop {
            match h.discover().await {
                Ok(s) => {
                    h.state.source_error("", None)?;
                    break s;
                }
                Err(e) if e.downcast_ref::<discover::ConfigMismatch>().is_some() => return Err(e),
                Err(e) => {
                    let e = format!("{e:#}");
                    h.state.source_error("", Some(&e))?;
                    tracing::warn!(error = %e, retry_in_secs = pause.as_secs(), "cannot read the source yet (harvest status shows it)");
                    tokio::time::sleep(pause).await;
                    pause =
                        (pause * 2).min(Duration::from_secs(cfg.follow.check_interval_secs.max(1)));
                }
            }
        };
        tracing::info!(sets = %sets.iter().map(|s| s.info.name.as_str()).collect::<Vec<_>>().join(", "), "following");
        for s in &sets {
            // Subscribe first, so that nothing published during the baseline is lost to push
            // (the Change Lists would bring it anyway).
            h.keep_subscribed(s, false).await;
            if !h.baselined(s).await? {
                continue;
            }
            match h.catch_up(s).await {
                Ok(found) => {
                    if h.push_missed(s, found) {
                        h.keep_subscribed(s, true).await;
                    }
                }
                Err(e) => {
                    tracing::warn!(set = %s.info.name, error = %format!("{e:#}"), "catching up from the Change Lists failed; retried at the next check")
                }
            }
        }
        h.housekeeping(&sets, &mut housekeeping);
        let mut tick = tokio::time::interval(Duration::from_secs(cfg.follow.check_interval_secs));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                Some(push) = rx.recv() => {
                    let Some(set) = sets.iter().find(|s| s.row.id == push.set_id) else { continue };
                    if let Err(e) = h.on_push(set, &push.body).await {
                        tracing::warn!(set = %set.info.name, error = %format!("{e:#}"), "applying a notification failed; the next check catches up");
                    }
                }
                _ = tick.tick() => {
                    for s in &sets {
                        if !h.baselined(s).await? {
                            continue;
                        }
                        match h.catch_up(s).await {
                            Ok(found) => {
                                let missed = h.push_missed(s, found);
                                h.keep_subscribed(s, missed).await;
                            }
                            Err(e) => tracing::warn!(set = %s.info.name, error = %format!("{e:#}"), "periodic catch-up failed"),
                        }
                    }
                    h.housekeeping(&sets, &mut housekeeping);
                }
            }
        }
        #[allow(unreachable_code)]
        Ok::<(), anyhow::Error>(())
    };
    tokio::select! {
        r = work => r?,
        _ = cancel.cancelled() => {}
    }
    // Blocking work stops at its next step: a package being unpacked at its next entry, a
    // snapshot being written at its next record (redone at the next start).
    h.stop.store(true, Ordering::Relaxed);
    h.output.interrupt();
    if let Some(t) = housekeeping {
        let _ = t.await;
    }
    if let Some(mut s) = server {
        // A delivery still being read (a hub trickling its body) does not hold the exit.
        if tokio::time::timeout(Duration::from_secs(1), &mut s)
            .await
            .is_err()
        {
            s.abort();
        }
    }
    Ok(())
}

fn ingestion3(cfg: &HarvestConfig) -> anyhow::Result<Arc<output::ingestion3::Ingestion3>> {
    if cfg.output.kind != config::OutputKind::Ingestion3 {
        anyhow::bail!("this works on the Ingestion 3 archive: set output.kind = \"ingestion3\"");
    }
    Ok(Arc::new(output::ingestion3::Ingestion3::open(cfg)?))
}

/// `harvest snapshot`: a new complete snapshot of the Ingestion 3 archive now (JSON report).
pub async fn snapshot(cfg: &HarvestConfig) -> anyhow::Result<String> {
    let out = ingestion3(cfg)?;
    let r = tokio::task::spawn_blocking(move || out.snapshot()).await??;
    Ok(serde_json::to_string(&r)?)
}

/// `harvest recreate --at T`: the provider's record set as of `at`, as a new activity.
pub async fn recreate(cfg: &HarvestConfig, at: Timestamp) -> anyhow::Result<String> {
    let out = ingestion3(cfg)?;
    let r = tokio::task::spawn_blocking(move || out.recreate(at)).await??;
    Ok(serde_json::to_string(&r)?)
}

/// `harvest status`: position, lag, subscription, queue, failures and refusals, as text.
pub fn status(cfg: &HarvestConfig) -> anyhow::Result<String> {
    let db = cfg.database_path();
    if !db.exists() {
        anyhow::bail!(
            "no harvest state at {} (state.dir): nothing harvested yet",
            db.display()
        );
    }
    let state = State::open(&db)?;
    let mut out = format!("source {}\n", cfg.source.url);
    match state.source_failing("")? {
        Some((e, since)) => out.push_str(&format!(
            "  reachable:        NO, failing since {since}: {e}\n"
        )),
        None => out.push_str("  reachable:        yes\n"),
    }
    let sets = state.sets()?;
    for s in &sets {
        let lag = match (s.source_latest, s.position) {
            (Some(l), Some(p)) if l >= p => format!("{:.1} s", (l.0 - p.0) as f64 / 1e6),
            (Some(_), Some(_)) => "0 s (up to date)".into(),
            _ => "unknown".into(),
        };
        out.push_str(&format!(
            "set {}\n  capability list:  {}\n  baseline:         {}\n  position:         {}\n  newest at source: {}\n  lag:              {lag}\n  resources held:   {}\n  changes applied:  {}\n  pending:          {}\n  last check:       {}\n  last push:        {}\n",
            s.name,
            s.capability,
            if s.baseline_done { "done" } else { "not finished" },
            s.position.map_or("-".into(), |p| p.to_string()),
            s.source_latest.map_or("-".into(), |p| p.to_string()),
            state.count_held(s.id)?,
            state.applied_count(s.id)?,
            state.count_pending(s.id)?,
            s.checked_at.map_or("-".into(), |p| p.to_string()),
            s.last_push_at.map_or("-".into(), |p| p.to_string()),
        ));
        if let Some(e) = &s.last_error {
            out.push_str(&format!("  last error:       {}\n", short(e)));
        }
        match state.subscription(s.id)? {
            Some(sub) => {
                let expires = sub
                    .verified_at
                    .zip(sub.lease_secs)
                    .map(|(v, l)| v.plus_secs(l).to_string())
                    .unwrap_or("-".into());
                out.push_str(&format!(
                    "  subscription:     {} at {} (topic {}, callback {}, lease until {expires})\n",
                    sub.state, sub.hub, sub.topic, sub.callback,
                ));
                if let Some(r) = sub.reason {
                    out.push_str(&format!("  no push because:  {}\n", scope::cut(&r, 800)));
                }
            }
            None => out.push_str("  subscription:     none\n"),
        }
    }
    let problems = state.problems()?;
    if !problems.is_empty() {
        out.push_str("\nnot applied yet:\n");
        for (_, p) in problems {
            let what = if p.skipped {
                "SKIPPED"
            } else if p.failed {
                "FAILED"
            } else {
                "retrying"
            };
            out.push_str(&format!(
                "  {what:8} {} {} {} (tries {}): {}\n",
                p.change.change,
                short(&p.change.uri),
                p.change.datetime,
                p.tries,
                short(&p.last_error.unwrap_or_default())
            ));
        }
    }
    if cfg.output.kind == config::OutputKind::Ingestion3 {
        let (n, first) = output::ingestion3::not_archived(&cfg.state.dir, 10)?;
        if n > 0 {
            out.push_str(&format!(
                "\nnot archived ({n}; listed in the next snapshot's _LOGS/skipped.csv):\n"
            ));
            for (uri, why) in first {
                out.push_str(&format!("  {}: {}\n", short(&uri), short(&why)));
            }
        }
    }
    let (refused, counts) = state.refusals(20)?;
    if !counts.is_empty() {
        let name = |id: i64| {
            sets.iter()
                .find(|s| s.id == id)
                .map_or("the source".to_string(), |s| format!("set {}", s.name))
        };
        out.push_str("\nrefused (the source's errors: not fetched, not waited for):\n");
        for (set, n) in &counts {
            out.push_str(&format!("  {}: {n} URL(s)\n", name(*set)));
            for r in refused.iter().filter(|r| r.set_id == *set) {
                out.push_str(&format!(
                    "    {} ({}x, last {}): {}\n",
                    short(&r.uri),
                    r.count,
                    r.last_at,
                    r.reason
                ));
            }
        }
    }
    out.push_str(&format!(
        "\ndeliveries ignored: {} unsigned, {} with a wrong signature\n",
        state.counter("unsigned")?,
        state.counter("bad_signature")?
    ));
    let foreign = state.counter("foreign")?;
    if foreign > 0 {
        out.push_str(&format!(
            "callback requests for another harvester: {foreign} (two harvesters share one callback URL: give each its own push.listen and push.callback_url)\n"
        ));
    }
    Ok(out)
}

/// A count and the first few of what it counts, for a report.
#[derive(Default)]
struct Sample {
    n: u64,
    first: Vec<String>,
}

impl Sample {
    fn add(&mut self, what: String) {
        self.n += 1;
        if self.first.len() < 20 {
            self.first.push(what);
        }
    }

    fn list(&self, out: &mut String, what: &str) {
        for u in &self.first {
            out.push_str(&format!("  {what}: {u}\n"));
        }
        if self.n > self.first.len() as u64 {
            out.push_str(&format!(
                "  … and {} more {what}\n",
                self.n - self.first.len() as u64
            ));
        }
    }
}

/// `harvest audit`: compares what the destination holds with the source's current Resource
/// List. Returns the report and whether it is in sync. Entries the harvester refuses (outside
/// the scope, too long, names that cannot be files, a file another URI has) are reported as
/// such and do not count against the sync; the rest are compared.
pub async fn audit(cfg: &HarvestConfig) -> anyhow::Result<(String, bool)> {
    let h = Harvester::new(cfg.clone(), String::new())?;
    let sets = h.discover().await?;
    let output = h.output.clone();
    let mut auditor = tokio::task::spawn_blocking(move || output.auditor()).await??;
    let mut out = String::new();
    let mut in_sync = true;
    for s in &sets {
        let Some(rl) = &s.info.resourcelist else {
            continue;
        };
        let mut listed: HashSet<String> = HashSet::new();
        let (mut missing, mut differ, mut refused) =
            (Sample::default(), Sample::default(), Sample::default());
        let mut not_archived = 0u64;
        let (_, parts, mut docs) = h.list_parts(s, rl, "Resource List").await?;
        for part in parts {
            let Some(mut doc) = h
                .open_part(s, part, "Resource List part", &mut docs)
                .await?
            else {
                continue;
            };
            let r = &mut doc.reader;
            while let Some(e) = r.next_entry()? {
                let c = entry_change(&e, "created", Timestamp(0));
                let uri = short(&c.uri).into_owned();
                if let Err(why) = h.fetcher.scope().check(&c.uri) {
                    refused.add(format!("{uri}: {why}"));
                    continue;
                }
                if docs.contains(&c.uri) {
                    refused.add(format!("{uri}: a list document, listed as a resource"));
                    continue;
                }
                let other = match h.output.target(&c.uri) {
                    Ok(Some((root, t))) => h.state.claim_conflict(
                        &root.display().to_string(),
                        &t.display().to_string(),
                        &c.uri,
                    )?,
                    _ => None,
                };
                if let Some(o) = other {
                    refused.add(format!("{uri}: its file is the file of {}", short(&o)));
                    listed.insert(c.uri);
                    continue;
                }
                match auditor.holding(&c.uri) {
                    Err(e) => refused.add(format!("{uri}: {}", short(&format!("{e:#}")))),
                    Ok(output::Holding::Missing) => missing.add(uri),
                    Ok(output::Holding::NotArchived(_)) => not_archived += 1,
                    Ok(output::Holding::Held { length, md5 }) => {
                        if let Err(why) = c.check(length, &md5) {
                            differ.add(format!("{uri} ({why})"));
                        } else if c.md5.is_none()
                            && h.state
                                .held(s.row.id, &c.uri)?
                                .is_some_and(|held| c.newer_than(&held))
                        {
                            differ.add(format!("{uri} (the list's lastmod is newer than the copy's; it has no md5 to compare)"));
                        }
                    }
                }
                listed.insert(c.uri);
            }
        }
        // The mirror: what the harvester's record holds for this set. (The archive tells
        // what it holds itself, over all sets, below.)
        let mut extra = Sample::default();
        if cfg.output.kind == config::OutputKind::Mirror {
            for u in h.state.held_uris(s.row.id)? {
                if !listed.contains(&u) {
                    extra.add(short(&u).into_owned());
                }
            }
        }
        let ok = missing.n == 0 && differ.n == 0 && extra.n == 0;
        in_sync &= ok;
        out.push_str(&format!(
            "set {}: {} listed, {} missing, {} different, {} held but no longer listed{}{}\n",
            s.info.name,
            listed.len() as u64 + refused.n,
            missing.n,
            differ.n,
            extra.n,
            if not_archived > 0 {
                format!(", {not_archived} not archived (not JSON, XML or Turtle)")
            } else {
                String::new()
            },
            if refused.n > 0 {
                format!(
                    ", {} refused (the source's errors, not harvested: below)",
                    refused.n
                )
            } else {
                String::new()
            }
        ));
        missing.list(&mut out, "missing");
        differ.list(&mut out, "different");
        extra.list(&mut out, "extra");
        refused.list(&mut out, "refused");
    }
    if let Some(extra) = auditor.unlisted()? {
        in_sync &= extra.is_empty();
        out.push_str(&format!(
            "archive: {} records no set lists any more\n",
            extra.len()
        ));
        let mut sample = Sample::default();
        for u in &extra {
            sample.add(short(u).into_owned());
        }
        sample.list(&mut out, "extra");
    }
    out.push_str(if in_sync {
        "IN SYNC\n"
    } else {
        "NOT IN SYNC\n"
    });
    Ok((out, in_sync))
}

#[cfg(test)]
mod tests {
    /// Entries are counted across the scan's 1 MiB chunks, a tag cut by a chunk's end too.
    #[test]
    fn entries_are_counted_across_chunks() {
        let mut text = Vec::new();
        text.extend_from_slice(b"<urlset><url><loc>a</loc></url>");
        text.resize((1 << 20) - 3, b' ');
        text.extend_from_slice(b"</url><url><loc>b</loc></url></urlset>");
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), &text).unwrap();
        assert_eq!(super::count_entries(f.path()).unwrap(), 3);
    }
}
