//! The baseline: a set's Resource List walked part by part (or its Resource Dump unpacked),
//! every resource fetched, checked and recorded a batch at a time, with a progress bar.

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use super::documents::{entry_change, OnDisk};
use super::output::Item;
use super::scope::short;
use super::state::{Change, ChangeType, Held, State};
use super::turns::Turn;
use super::worker::{Claim, Work};
use super::{config, refuse, Followed, Harvester, NotApplied};
use crate::model::Timestamp;
use crate::sitemap::{self, EntryReader, ParsedEntry};
use anyhow::Context as _;

/// Entries of a Resource List checked against the state at once by a walk.
const WALK_BATCH: usize = 256;
/// Resources fetched by a baseline are recorded this many at a time, one transaction each,
/// committed in the background while the walk goes on (at most one in flight). 4,096 at a
/// time measured no faster than 256 (bench_harvest --source nginx), so a crash refetches
/// little. A crash loses none of them: the ones not yet recorded are fetched again.
const RECORD_BATCH: usize = 256;

impl Harvester {
    /// The set's baseline: from its Resource Dump when configured and usable, else (or for
    /// what the dump did not hold as the Resource List lists it) from its Resource List.
    /// The caller holds a turn (a place among `fetch.concurrency` lists walked at once),
    /// passed at each batch of the Resource List.
    pub(super) async fn baseline(&self, set: &Followed, turn: &mut Turn) -> anyhow::Result<()> {
        let mut from_dump = None;
        if self.cfg.source.baseline == config::BaselineFrom::Dump {
            match &set.info.resourcedump {
                Some(rd) => match self.baseline_from_dump(set, rd).await? {
                    Ok((position, 0)) => {
                        let id = set.row.id;
                        self.state()
                            .run(move |s| s.finish_baseline(id, position))
                            .await?;
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
        self.baseline_from_list(set, from_dump, turn).await
    }

    /// Walks the Resource List (through its index, one part at a time, streamed) and fetches
    /// what is not held as listed yet with bounded concurrency. Resumable: what is held as
    /// listed is not fetched again. Failures are queued as changes dated just before the
    /// list's `at`, so they hold the position until they are applied; refusals are recorded.
    /// After a dump baseline the position is the earlier of the dump's and the list's `at`.
    pub(super) async fn baseline_from_list(
        &self,
        set: &Followed,
        from_dump: Option<Timestamp>,
        turn: &mut Turn,
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
        let _shown = self
            .parts()
            .baselines
            .show(&self.name, &set.info.name, &bar);
        let mut total = Total::new(parts.len());
        let sem = self.parts().slots.clone();
        let mut tasks = tokio::task::JoinSet::new();
        let mut walk = Walk {
            h: self,
            set,
            failures: Vec::new(),
            held: Batch::default(),
            refused: 0,
            writing: None,
        };
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
            // A batch of entries at a time: what is held as listed, and the files' claims,
            // each read from the state once for the whole batch, the next batch's read under
            // way while this one's fetches start.
            let mut reading = None;
            loop {
                let mut batch = Vec::with_capacity(WALK_BATCH);
                while batch.len() < WALK_BATCH {
                    let Some(e) = r.next_entry()? else { break };
                    // The bar counts entries settled: refused, held as listed, or fetched
                    // (or failed) — not merely read.
                    if !self.admit(set, &e.loc, &docs).await? {
                        walk.refused += 1;
                        bar.inc(1);
                        continue;
                    }
                    batch.push(entry_change(&e, ChangeType::Created, at.unwrap_or(started)));
                }
                let next = (!batch.is_empty()).then(|| self.read_batch(set.row.id, batch));
                let (todo, claims, listed) = match std::mem::replace(&mut reading, next) {
                    Some(h) => h.await??,
                    // The part's first batch: its read is under way; gather the next.
                    None if reading.is_some() => continue,
                    None => break,
                };
                bar.inc(listed);
                let batch_len = listed + todo.len() as u64;
                for (c, claim) in todo.into_iter().zip(claims) {
                    let permit = sem.clone().acquire_owned().await?;
                    let (this, name) = (self.work.clone(), set.info.name.clone());
                    tasks.spawn(async move {
                        let _permit = permit;
                        let r = match claim {
                            Ok(claim) => this.fetch_verify_put(&name, &c, claim).await,
                            Err(e) => Err(e),
                        };
                        (c, r)
                    });
                    while let Some(done) = tasks.try_join_next() {
                        walk.collect(done?).await?;
                        bar.inc(1);
                        walk.record(RECORD_BATCH).await?;
                    }
                }
                // A batch boundary with more of the part to come: a source that has had less
                // takes the turn, if one waits (its fetches under way go on meanwhile). Never
                // at the end: a walk waiting only to finish would hold its list and
                // connections (500 small sources did so at once: 2,700 descriptors).
                if reading.is_some() {
                    turn.pass(batch_len).await;
                }
            }
        }
        while let Some(done) = tasks.join_next().await {
            walk.collect(done?).await?;
            bar.inc(1);
            walk.record(RECORD_BATCH).await?;
        }
        walk.record_all().await?;
        let Walk {
            mut failures,
            held,
            refused,
            ..
        } = walk;
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
        let failed = failures.len();
        let (id, not_before) = (set.row.id, self.work.clone().next_try(0));
        self.state()
            .run(move |s| {
                let queued: Vec<Change> = failures.iter().map(|(c, _)| c.clone()).collect();
                s.enqueue(id, &queued)?;
                s.defer(id, &failures, not_before)?;
                s.finish_baseline(id, position)
            })
            .await?;
        tracing::info!(set = %set.info.name, fetched, failed, refused, position = %position, "baseline done");
        Ok(())
    }

    /// Starts reading, off the async threads, which of `entries` are held as listed (they
    /// are left out) and claiming the files of the others, in list order: of two URIs with
    /// one file, the first listed keeps it.
    fn read_batch(&self, set_id: i64, entries: Vec<Change>) -> tokio::task::JoinHandle<BatchRead> {
        let w = self.work.clone();
        tokio::spawn(async move {
            let n = entries.len() as u64;
            let todo = w
                .parts
                .state
                .run(move |s| {
                    let listed = s.hold_as_listed(set_id, &entries)?;
                    Ok(entries
                        .into_iter()
                        .zip(listed)
                        .filter(|(_, listed)| !listed)
                        .map(|(c, _)| c)
                        .collect::<Vec<Change>>())
                })
                .await?;
            let uris: Vec<&str> = todo.iter().map(|c| c.uri.as_str()).collect();
            let claims = w.claim_many(&uris).await;
            let listed = n - todo.len() as u64;
            anyhow::Ok((todo, claims, listed))
        })
    }

    /// The baseline from the set's Resource Dump: each package downloaded (resumed after a
    /// dropped connection or a restart: the partial file is kept under `state.dir`), never
    /// past its listed length, unpacked, every bitstream checked against its manifest's md5
    /// and length before the output gets it. Returns `Err` for what may pass (a package
    /// download that keeps failing: tried again at the next check), `Ok(Err)` when the dump
    /// cannot be used (a package longer than listed, refused, not a ZIP…: the Resource List is
    /// used instead), else the dump's `at` and how many bitstreams could not be placed.
    pub(super) async fn baseline_from_dump(
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
            .with_context(|| format!("cannot create {}", downloads.display()))?;
        let bar = progress(&format!(
            "baseline {} from its Resource Dump",
            set.info.name
        ));
        let _shown = self
            .parts()
            .baselines
            .show(&self.name, &set.info.name, &bar);
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
                    .fetcher()
                    .download_resumable(&e.loc, &local, expected)
                    .await
                {
                    if let Some(r) = &err.refused {
                        self.refuse(&set.info.name, set.row.id, &e.loc, &r.to_string())
                            .await?;
                    }
                    let retry = err.retry;
                    let err = anyhow::Error::new(err).context(format!("package {}", short(&e.loc)));
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
                    self.work.clone(),
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
    /// `turn`: the caller's turn at walking (else one is waited for here).
    pub(super) async fn baselined(
        &self,
        set: &Followed,
        turn: Option<&mut Turn>,
    ) -> anyhow::Result<bool> {
        if self.row(set.row.id).await?.baseline_done {
            return Ok(true);
        }
        let mut own;
        let turn = match turn {
            Some(t) => t,
            None => {
                own = self.parts().turns.take(&self.name, self.weight).await;
                &mut own
            }
        };
        let (done, error) = match self.baseline(set, turn).await {
            Ok(()) => (true, None),
            Err(e) => {
                let e = format!("baseline: {e:#}");
                tracing::warn!(set = %set.info.name, error = %e, "baseline interrupted; resumed at the next check");
                (false, Some(e))
            }
        };
        let id = set.row.id;
        self.state()
            .run(move |s| s.set_error(id, error.as_deref()))
            .await?;
        Ok(done)
    }
}

/// A baseline's walk of a Resource List: what it has fetched (recorded a batch at a time, the
/// batch before this one possibly still being written), what failed (queued at the end) and
/// how many URLs it refused.
struct Walk<'a> {
    h: &'a Harvester,
    set: &'a Followed,
    failures: Vec<(Change, String)>,
    held: Batch,
    refused: u64,
    writing: Option<tokio::task::JoinHandle<anyhow::Result<u64>>>,
}

impl Walk<'_> {
    /// Takes in a finished fetch: held (to record), refused (recorded now) or failed (queued
    /// for retry at the end of the walk).
    async fn collect(
        &mut self,
        done: (Change, Result<(Held, Claim), NotApplied>),
    ) -> anyhow::Result<()> {
        match done.1 {
            Ok((h, claim)) => {
                self.held.holds.push((done.0.uri, h));
                self.held.claims.push(claim);
            }
            Err(NotApplied::Refused(why)) => {
                self.refused += 1;
                self.h
                    .refuse(&self.set.info.name, self.set.row.id, &done.0.uri, &why)
                    .await?;
            }
            Err(NotApplied::Failed(e)) => {
                tracing::warn!(uri = %short(&done.0.uri), error = %e, "baseline fetch failed: queued for retry");
                self.failures.push((done.0, e));
            }
        }
        Ok(())
    }

    /// Once more than `over` resources are held, records them in the background (one
    /// transaction, on the blocking pool) after the batch before them is recorded: the walk
    /// goes on fetching while a batch commits (it used to wait, its fetches draining
    /// meanwhile). The claims go with the batch and are released once it is recorded.
    async fn record(&mut self, over: usize) -> anyhow::Result<()> {
        if self.held.holds.len() <= over {
            return Ok(());
        }
        let mut batch = Batch {
            holds: std::mem::take(&mut self.held.holds),
            claims: std::mem::take(&mut self.held.claims),
            recorded: 0,
        };
        if let Some(w) = self.writing.take() {
            self.held.recorded += w.await??;
        }
        let (state, set_id) = (self.h.state().clone(), self.set.row.id);
        self.writing = Some(tokio::spawn(async move {
            state
                .run_any(move |s| {
                    batch.record(s, set_id, 0)?;
                    Ok(batch.recorded)
                })
                .await
        }));
        Ok(())
    }

    /// Records what is left and waits for every batch to be recorded.
    async fn record_all(&mut self) -> anyhow::Result<()> {
        self.record(0).await?;
        if let Some(w) = self.writing.take() {
            self.held.recorded += w.await??;
        }
        Ok(())
    }
}

/// A batch's entries not held as listed, with their files' claims.
/// A batch's entries to fetch, their files' claims, and how many were held as listed already.
type BatchRead = anyhow::Result<(Vec<Change>, Vec<Result<Claim, NotApplied>>, u64)>;

/// Resources fetched by a baseline, recorded as held a batch at a time (one transaction for
/// many: a crash before a batch is recorded only means those are fetched again), their files'
/// claims kept until then.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) holds: Vec<(String, Held)>,
    pub(super) claims: Vec<Claim>,
    pub(super) recorded: u64,
}

impl Batch {
    /// Records the batch once it has more than `over` resources.
    pub(super) fn record(&mut self, state: &State, set_id: i64, over: usize) -> anyhow::Result<()> {
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
pub(super) type Unpacked = (u64, u64);

impl Work {
    /// Unpacks one Resource Dump package (blocking): every manifest entry's bitstream,
    /// checked against the manifest, handed to the output and recorded as held. Returns how
    /// many were placed and how many could not be. Stops at the next entry on shutdown.
    pub(super) fn unpack(
        &self,
        set: &str,
        set_id: i64,
        zip_path: &std::path::Path,
        at: Timestamp,
        bar: &ProgressBar,
    ) -> anyhow::Result<Unpacked> {
        let mut z = zip::ZipArchive::new(std::fs::File::open(zip_path)?)
            .with_context(|| format!("{}: not a ZIP package", zip_path.display()))?;
        let manifest = crate::package::read_manifest(&mut z, self.fetcher.max_document_bytes())
            .with_context(|| format!("{}", zip_path.display()))?;
        let max_token = (self.fetcher.scope().max_url_length() + 1).max(64 * 1024);
        let mut reader = EntryReader::new(std::io::BufReader::new(sitemap::Bounded::new(
            &manifest[..],
            max_token,
        )))
        .context("the package's manifest.xml")?;
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

    /// Unpacks some entries of a package (see [`Work::unpack`]). An entry outside the
    /// source's scope is refused: its bytes never reach the output.
    pub(super) fn unpack_entries(
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
        let state = self.parts.state.in_blocking_task();
        let (mut placed, mut missed) = (0u64, 0u64);
        // Recorded a thousand at a time.
        let mut held = Batch::default();
        let mut buf = vec![0u8; 64 * 1024];
        // A chunk's entries are looked up in the state and claimed together (one read
        // transaction each), then unpacked one by one.
        for chunk in entries.chunks(256) {
            let mut todo = Vec::with_capacity(chunk.len());
            for e in chunk {
                match self.fetcher.scope().check(&e.loc) {
                    Err(r) => {
                        bar.inc(1);
                        refuse(state, set, set_id, &e.loc, &r.to_string())?;
                    }
                    Ok(_) => todo.push((e, entry_change(e, ChangeType::Created, at))),
                }
            }
            let holds = state.hold_as_listed(set_id, todo.iter().map(|(_, c)| c))?;
            let mut wanted = Vec::with_capacity(todo.len());
            for ((e, c), holds) in todo.into_iter().zip(holds) {
                if holds {
                    bar.inc(1);
                    continue;
                }
                match e
                    .md
                    .get("path")
                    .and_then(|p| crate::package::member_name(p))
                {
                    Some(inner) => wanted.push((e, c, inner)),
                    None => {
                        bar.inc(1);
                        missed += 1;
                    }
                }
            }
            let uris: Vec<&str> = wanted.iter().map(|(_, c, _)| c.uri.as_str()).collect();
            let claims = self.claim_many_blocking(&uris);
            drop(uris);
            for ((e, c, inner), claim) in wanted.into_iter().zip(claims) {
                if self.parts.stop.load(Ordering::Relaxed) {
                    held.record(state, set_id, 0)?;
                    anyhow::bail!("stopping");
                }
                bar.inc(1);
                let claim = match claim {
                    Ok(claim) => claim,
                    Err(NotApplied::Refused(r)) => {
                        refuse(state, set, set_id, &c.uri, &r)?;
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
                        refuse(state, set, set_id, &c.uri, &format!("{err:#}"))?;
                        continue;
                    }
                };
                let measured = (|| -> anyhow::Result<(u64, String)> {
                    let mut f = z.by_name(inner)?;
                    // Never more than the manifest promises (a package is not trusted further).
                    let limit = c.length.unwrap_or(f.size()).saturating_add(1);
                    let mut out = std::io::BufWriter::new(super::output::create_download(&dest)?);
                    let (mut h, mut n) = (md5::Md5::new(), 0u64);
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
                    lastmod: c.lastmod.or(Some(at)),
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
                        held.record(state, set_id, 1000)?;
                        placed += 1;
                    }
                    Err(err) => {
                        let _ = std::fs::remove_file(&dest);
                        tracing::warn!(uri = %short(&c.uri), error = %format!("{err:#}"), "the output refused a bitstream");
                        missed += 1;
                    }
                }
            }
        }
        held.record(state, set_id, 0)?;
        Ok((placed, missed))
    }
}

pub(super) fn progress(what: &str) -> ProgressBar {
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
pub(super) struct Total {
    pub(super) parts: usize,
    pub(super) opened: usize,
    pub(super) entries: u64,
}

impl Total {
    pub(super) fn new(parts: usize) -> Total {
        Total {
            parts,
            opened: 0,
            entries: 0,
        }
    }

    /// A part opened: its entries counted (a quick scan of the file on disk).
    pub(super) fn add(&mut self, bar: &ProgressBar, doc: &OnDisk) {
        self.opened += 1;
        self.entries += count_entries(doc._file.path()).unwrap_or(0);
        self.show(bar);
    }

    /// A part refused: one fewer to come.
    pub(super) fn skip(&mut self, bar: &ProgressBar) {
        self.parts = self.parts.saturating_sub(1);
        self.show(bar);
    }

    pub(super) fn show(&self, bar: &ProgressBar) {
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
pub(super) fn count_entries(path: &std::path::Path) -> std::io::Result<u64> {
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
