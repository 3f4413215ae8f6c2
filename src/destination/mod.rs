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
//! - `baseline`: a set's first copy, from its Resource List or Resource Dump (a `Walk` per
//!   list); `changes`: the Change Lists, pushed notifications and the queue after it; `push`:
//!   the subscriptions (the `Push` of a source); `documents`: list documents read from disk
//!   entry by entry; `worker`: what a source's fetch tasks share and do (`Work`: claim, fetch,
//!   verify, output, apply in order); `report`: `harvest status`, `audit`, `snapshot`,
//!   `recreate`. This file: the process's shared `Parts`, a source's `Harvester`, discovery,
//!   and [`run`].
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
pub mod engine;
pub mod fetch;
pub mod follow;
pub mod output;
pub mod scope;
pub mod state;

mod baseline;
mod changes;
mod console;
mod documents;
mod push;
mod report;
mod turns;
mod worker;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use config::HarvestConfig;
use discover::SetInfo;
use fetch::Fetcher;
use output::{Mirror, Output};
use scope::short;
use state::{SetRow, State};

pub use report::{audit, audit_of, recreate, snapshot, status, status_of};
use worker::Work;

/// One source's harvester: its configuration and work, on the process's shared `Parts`.
pub struct Harvester {
    /// The source's name (`""`: the single `[source]`).
    name: String,
    cfg: HarvestConfig,
    /// What its fetch tasks share (one `Arc`, cloned into each task).
    work: Arc<Work>,
    /// Its subscriptions.
    push: push::Push,
    /// Its `weight`: its share of the walks when sources contend.
    weight: f64,
}

/// What the harvesters of one process (one per source) share: the state, the outputs, the
/// files being written, the fetch slots and the stop flag.
struct Parts {
    state: state::Handle,
    /// The mirror, one for every source.
    mirror: Option<Arc<dyn Output>>,
    /// Ingestion 3: one archive per provider (one per source), opened when first asked.
    archives: std::sync::Mutex<std::collections::HashMap<String, Arc<dyn Output>>>,
    /// Set on shutdown: blocking work (unpacking a dump package) stops at its next entry.
    stop: AtomicBool,
    /// Files claimed by resources being fetched or unpacked (see [`Work::claim_many`]).
    in_flight: std::sync::Mutex<BTreeMap<String, String>>,
    /// `fetch.concurrency`, over every source of the process.
    slots: Arc<Semaphore>,
    /// At most `fetch.concurrency` sources walk their lists (a temporary file and a reader
    /// each) at once, taking turns fairly: descriptors follow the work, not the number of
    /// sources, and huge sources do not starve small ones.
    turns: turns::Turns,
    /// At most `fetch.concurrency` sources read their Change Lists at once at a periodic
    /// check (5,000 sources started together check together), never behind baselines.
    checks: Arc<Semaphore>,
    /// What each server sees of this harvester (per-authority slots, pauses).
    hosts: fetch::Hosts,
    /// The baselines running now, for the console.
    baselines: Baselines,
    /// Every task of the process: the sources, their housekeeping, the console's audits.
    /// Shutdown cancels `cancel` and waits for them all.
    tasks: tokio_util::task::TaskTracker,
    /// Cancelled at shutdown; each source runs under a child of it, which SIGHUP cancels when
    /// the source leaves the configuration.
    cancel: tokio_util::sync::CancellationToken,
}

/// The baselines running now: (source, set) -> their progress bar (position and length kept
/// even when the bar is not drawn) and when they started.
#[derive(Default)]
pub(crate) struct Baselines(
    std::sync::Mutex<BTreeMap<(String, String), (indicatif::ProgressBar, std::time::Instant)>>,
);

/// A running baseline's progress as the console shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct BaselineProgress {
    pub set: String,
    pub done: u64,
    /// The resources listed (estimated from the parts read so far); `None` before the first.
    pub total: Option<u64>,
    pub elapsed_secs: u64,
    /// Seconds left at the pace so far.
    pub left_secs: Option<u64>,
}

/// Takes a baseline off [`Baselines`] when it ends, however it ends.
pub(crate) struct Shown<'a> {
    of: &'a Baselines,
    key: (String, String),
}

impl Drop for Shown<'_> {
    fn drop(&mut self) {
        self.of.0.lock().expect("baselines").remove(&self.key);
    }
}

impl Baselines {
    pub(crate) fn show(&self, source: &str, set: &str, bar: &indicatif::ProgressBar) -> Shown<'_> {
        let key = (source.to_string(), set.to_string());
        self.0
            .lock()
            .expect("baselines")
            .insert(key.clone(), (bar.clone(), std::time::Instant::now()));
        Shown { of: self, key }
    }

    /// The baselines of `source` running now.
    pub(crate) fn of(&self, source: &str) -> Vec<BaselineProgress> {
        self.0
            .lock()
            .expect("baselines")
            .iter()
            .filter(|((s, _), _)| s == source)
            .map(|((_, set), (bar, started))| {
                let done = bar.position();
                let total = bar.length();
                let elapsed = started.elapsed().as_secs_f64();
                let left = total
                    .filter(|_| done > 0)
                    .map(|t| (elapsed * t.saturating_sub(done) as f64 / done as f64) as u64);
                BaselineProgress {
                    set: set.clone(),
                    done,
                    total,
                    elapsed_secs: elapsed as u64,
                    left_secs: left,
                }
            })
            .collect()
    }
}

impl Parts {
    /// The parts of a process configured by `cfg`; `given`: each source's output is given
    /// when it starts (the engine embedded, see [`Engine`]), none is opened here.
    fn open(cfg: &HarvestConfig, given: bool, hosts: fetch::Hosts) -> anyhow::Result<Arc<Parts>> {
        let mirror: Option<Arc<dyn Output>> = match cfg.output.kind {
            _ if given => None,
            config::OutputKind::Mirror => Some(Arc::new(Mirror::new(&cfg.output)?)),
            config::OutputKind::Ingestion3 => None,
        };
        Ok(Arc::new(Parts {
            state: state::Handle::open(&cfg.database_path())?,
            mirror,
            archives: Default::default(),
            stop: AtomicBool::new(false),
            in_flight: Default::default(),
            slots: Arc::new(Semaphore::new(cfg.fetch.concurrency)),
            turns: turns::Turns::new(cfg.fetch.concurrency),
            checks: Arc::new(Semaphore::new(cfg.fetch.concurrency)),
            hosts,
            baselines: Baselines::default(),
            tasks: tokio_util::task::TaskTracker::new(),
            cancel: tokio_util::sync::CancellationToken::new(),
        }))
    }

    /// The output of one source (`cfg`: its configuration, from `for_source`).
    fn output_for(&self, cfg: &HarvestConfig) -> anyhow::Result<Arc<dyn Output>> {
        if let Some(m) = &self.mirror {
            return Ok(m.clone());
        }
        let mut archives = self.archives.lock().expect("archives lock");
        if let Some(a) = archives.get(&cfg.output.provider) {
            return Ok(a.clone());
        }
        let a: Arc<dyn Output> = Arc::new(output::ingestion3::Ingestion3::open(cfg)?);
        archives.insert(cfg.output.provider.clone(), a.clone());
        Ok(a)
    }

    /// Shutdown: every output's long work stops soon.
    fn interrupt(&self) {
        if let Some(m) = &self.mirror {
            m.interrupt();
        }
        for a in self.archives.lock().expect("archives lock").values() {
            a.interrupt();
        }
    }
}

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
            None => NotApplied::Failed(crate::cause::chain(&e)),
        }
    }
}

/// The longest XML token read from a source's documents: past the longest URL accepted, so
/// that a cut `<loc>` is always refused as too long.
fn max_token(cfg: &HarvestConfig) -> usize {
    (cfg.fetch.max_url_length + 1).max(64 * 1024)
}

/// The state's row of a set found by discovery, with its refusals recorded.
fn followed(state: &State, source: &str, info: SetInfo) -> anyhow::Result<Followed> {
    let row = state.set(source, &info.capability, &info.name)?;
    if row.source != source {
        // Two sources lead to one Capability List (one through its Source Description, one
        // directly, say): sharing its state would mix their positions and holdings, so the
        // second stops and says why.
        return Err(discover::ConfigMismatch(format!(
            "its set {} ({}) is followed by source {} already: two [[sources]] lead to one set",
            info.name,
            short(&info.capability),
            row.source
        ))
        .into());
    }
    for (uri, why) in &info.refused {
        refuse(state, &info.name, row.id, uri, why)?;
    }
    Ok(Followed { row, info })
}

/// Records a refusal of `uri` for a set; logged the first time only.
fn refuse(state: &State, set: &str, set_id: i64, uri: &str, reason: &str) -> anyhow::Result<()> {
    if state.refuse(set_id, uri, reason)? {
        tracing::warn!(set, uri = %short(uri), reason, "refused (listed in harvest status; not fetched, not waited for)");
    }
    Ok(())
}

impl Harvester {
    /// The harvester of `source` (of the process configured by `cfg`), on the shared parts;
    /// its output is `output` when given, else the process's for it.
    fn new(
        cfg: &HarvestConfig,
        source: &config::NamedSource,
        callback_base: String,
        parts: &Arc<Parts>,
        output: Option<Arc<dyn Output>>,
    ) -> anyhow::Result<Harvester> {
        let cfg = cfg.for_source(source);
        let output = match output {
            Some(o) => o,
            None => parts.output_for(&cfg)?,
        };
        let scope = cfg.scope().map_err(anyhow::Error::msg)?;
        let mut fetcher = Fetcher::new(&cfg.fetch, scope, parts.hosts.clone());
        if !source.token_env.is_empty() {
            let token = std::env::var(&source.token_env).map_err(|_| {
                anyhow::anyhow!(
                    "source {}: token_env names {}, which is not set",
                    source.name,
                    source.token_env
                )
            })?;
            fetcher = fetcher.with_bearer(token);
        }
        let work = Arc::new(Work {
            parts: parts.clone(),
            fetcher,
            output,
            exec: cfg.output.exec.clone(),
            backoff: (cfg.fetch.backoff_initial_ms, cfg.fetch.backoff_max_ms),
        });
        let push = push::Push::new(
            cfg.push.clone(),
            cfg.follow.check_interval_secs,
            work.fetcher.clone(),
            parts.state.clone(),
            callback_base,
        );
        Ok(Harvester {
            name: source.name.clone(),
            cfg,
            work,
            push,
            weight: f64::from(source.weight),
        })
    }

    /// The state of the process.
    fn state(&self) -> &state::Handle {
        &self.work.parts.state
    }

    fn fetcher(&self) -> &Fetcher {
        &self.work.fetcher
    }

    fn output(&self) -> &Arc<dyn Output> {
        &self.work.output
    }

    fn parts(&self) -> &Parts {
        &self.work.parts
    }

    /// The source's name for logs and messages.
    fn label(&self) -> &str {
        if self.name.is_empty() {
            &self.cfg.source.url
        } else {
            &self.name
        }
    }

    async fn discover(&self) -> anyhow::Result<Vec<Followed>> {
        let (infos, refused) = discover::discover(
            self.fetcher(),
            &self.cfg.source.url,
            &self.cfg.source.sets,
            max_token(&self.cfg),
        )
        .await?;
        let name = self.name.clone();
        // One trip to the state for every set found and every refusal.
        self.state()
            .run_any(move |s| {
                for (uri, why) in refused {
                    refuse(s, "-", 0, &uri, &why)?;
                }
                infos
                    .into_iter()
                    .map(|info| followed(s, &name, info))
                    .collect()
            })
            .await
    }

    /// For a source followed with `sets = []` (every set it lists), at each check: reads its
    /// Source Description again; a set it lists now and did not before is followed from here
    /// on (subscribed now; its baseline and catch-up follow in this check), and a set it no
    /// longer lists stops being followed, its row saying so (`harvest status`, the console)
    /// until it comes back. A source that cannot be read now changes nothing. Whether the
    /// sets followed changed.
    async fn refresh_sets(&self, sets: &mut Vec<Followed>) -> anyhow::Result<bool> {
        let found = match self.discover().await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(source = %self.label(), error = %format!("{e:#}"), "cannot read the source's sets now; following the ones known");
                return Ok(false);
            }
        };
        let mut changed = false;
        let listed: std::collections::HashSet<i64> = found.iter().map(|f| f.row.id).collect();
        let now = crate::model::Timestamp::now();
        for s in sets.iter().filter(|s| !listed.contains(&s.row.id)) {
            tracing::warn!(source = %self.label(), set = %s.info.name, "the source no longer lists this set: not followed until it does again");
            let (id, why) = (
                s.row.id,
                format!("the source no longer lists this set (checked {}); it is not followed until it does again", now.floor_secs()),
            );
            self.state()
                .run(move |st| st.set_error(id, Some(&why)))
                .await?;
            changed = true;
        }
        sets.retain(|s| listed.contains(&s.row.id));
        for f in found {
            if sets.iter().any(|s| s.row.id == f.row.id) {
                continue;
            }
            tracing::info!(source = %self.label(), set = %f.info.name, "the source lists a new set: following it");
            let id = f.row.id;
            // A set that came back: what was said of its absence no longer holds.
            self.state().run(move |st| st.set_error(id, None)).await?;
            self.push.keep_subscribed(&f, false).await;
            sets.push(f);
            changed = true;
        }
        Ok(changed)
    }

    /// Records a refusal of `uri` for a set; logged the first time only.
    async fn refuse(&self, set: &str, set_id: i64, uri: &str, reason: &str) -> anyhow::Result<()> {
        let (set, uri, reason) = (set.to_string(), uri.to_string(), reason.to_string());
        self.state()
            .run_any(move |s| refuse(s, &set, set_id, &uri, &reason))
            .await
    }

    /// Records the source's error (`None`: it answers again).
    async fn source_error(&self, error: Option<String>) -> anyhow::Result<()> {
        let name = self.name.clone();
        Ok(self
            .state()
            .run(move |s| s.source_error(&name, error.as_deref()))
            .await?)
    }

    /// A fresh copy of a set's row.
    async fn row(&self, id: i64) -> anyhow::Result<SetRow> {
        self.state()
            .run(move |s| s.set_by_id(id))
            .await?
            .ok_or_else(|| anyhow::anyhow!("set {id} vanished from the state"))
    }

    /// Starts the output's periodic work (snapshots of the Ingestion 3 archive) on the
    /// blocking pool, owned by `tasks`, unless the last one still runs: notifications go on
    /// being applied while a snapshot of millions of records is written. A failure is logged
    /// and tried again at the next check.
    fn housekeeping(&self, sets: &[Followed], tasks: &Housekeeping) {
        if tasks.busy.swap(true, Ordering::AcqRel) {
            return;
        }
        let ids: Vec<i64> = sets.iter().map(|s| s.row.id).collect();
        let (output, state, busy) = (
            self.output().clone(),
            self.state().clone(),
            tasks.busy.clone(),
        );
        tasks.tracker.spawn(async move {
            let done = state
                .run_any(move |s| {
                    let mut baselined = true;
                    for id in ids {
                        baselined &= s.set_by_id(id)?.is_some_and(|r| r.baseline_done);
                    }
                    output.housekeeping(baselined)
                })
                .await;
            if let Err(e) = done {
                tracing::warn!(error = %format!("{e:#}"), "output housekeeping failed; tried again at the next check");
            }
            busy.store(false, Ordering::Release);
        });
    }

    /// Whether an entry's URL may be fetched for the set: inside the source's scope and not
    /// one of the documents being read (an index or list is never a resource). A refusal is
    /// recorded.
    async fn admit(
        &self,
        set: &Followed,
        loc: &str,
        docs: &HashSet<String>,
    ) -> anyhow::Result<bool> {
        let why = match self.fetcher().scope().check(loc) {
            Err(r) => r.to_string(),
            Ok(_) if docs.contains(loc) => {
                "a list document of the source, listed as a resource".to_string()
            }
            Ok(_) => return Ok(true),
        };
        self.refuse(&set.info.name, set.row.id, loc, &why).await?;
        Ok(false)
    }
}

/// Descriptors a harvester keeps for itself: the state's database and its journal, the
/// listeners, the log, the runtime, deliveries being read.
const FD_RESERVE: u64 = 64;
/// Descriptors per unit of `fetch.concurrency`: a fetch (its connection, the file being
/// written), a walk (its connection, its list on disk and that list's reader) and a check
/// (the same).
const FD_PER_SLOT: u64 = 8;

/// The most descriptors `sources` sources at `fetch.concurrency` may hold at once: the
/// reserve, the work in flight, and a connection per source (kept up to a second after its
/// last request: pushes to every source within one second). Measured: 190 at 5,000 sources
/// at concurrency 32 (bench_aggregator), since sources at rest hold none.
pub fn descriptors_needed(sources: usize, concurrency: usize) -> u64 {
    descriptors_besides_sources(concurrency) + sources as u64
}

/// How many sources a limit of `limit` open files allows at `fetch.concurrency`.
pub fn sources_allowed(limit: u64, concurrency: usize) -> u64 {
    limit.saturating_sub(descriptors_besides_sources(concurrency))
}

/// The reserve and the work in flight at `fetch.concurrency`.
fn descriptors_besides_sources(concurrency: usize) -> u64 {
    FD_RESERVE + FD_PER_SLOT * concurrency as u64
}

/// Why `sources` sources do not fit a limit of `limit` open files, or `None` when they do.
fn too_many_sources(sources: usize, concurrency: usize, limit: u64) -> Option<String> {
    let need = descriptors_needed(sources, concurrency);
    (need > limit).then(|| {
        format!(
            "{sources} sources at fetch.concurrency {concurrency} may need up to {need} open files, and the limit of open files is {limit} (the hard limit, `ulimit -Hn`): it allows {} sources. Raise the hard limit (ulimit -Hn; LimitNOFILE= in a systemd unit; --ulimit nofile= for docker), lower fetch.concurrency, or split the sources over harvesters",
            sources_allowed(limit, concurrency)
        )
    })
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
    run_reloading(cfg, None, listener, shutdown).await
}

/// [`run`], and on SIGHUP the configuration file `reload` is read again: sources added to
/// `[[sources]]` start, removed ones stop, changed ones restart; the others go on untouched
/// (their state and work in flight). Other keys take effect at a restart.
pub async fn run_reloading(
    cfg: HarvestConfig,
    reload: Option<std::path::PathBuf>,
    listener: Option<TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Thousands of sources may hold more descriptors than the common soft limit of 1,024.
    let n_sources = cfg.source_list().len();
    let limit = match crate::conn::raise_open_files() {
        Ok((before, after)) => {
            tracing::info!(
                before,
                limit = after,
                sources_allowed = sources_allowed(after, cfg.fetch.concurrency),
                sources = n_sources,
                concurrency = cfg.fetch.concurrency,
                "open files: soft limit raised to the hard limit; it allows this many sources at fetch.concurrency"
            );
            Some(after)
        }
        Err(e) => {
            tracing::warn!(error = %e, "open files: the soft limit could not be raised");
            None
        }
    };
    if let Some(why) = limit.and_then(|l| too_many_sources(n_sources, cfg.fetch.concurrency, l)) {
        anyhow::bail!(why);
    }
    let inbox = follow::Wakes::default();
    let parts = Parts::open(&cfg, false, Default::default())?;
    let cancel = parts.cancel.clone();
    let stop = cancel.clone();
    tokio::spawn(async move {
        shutdown.await;
        stop.cancel();
    });
    let (console_at, console_token) = cfg.console_at()?;
    let console = || console::router(cfg.clone(), parts.clone(), console_token.clone());
    let mut callback_base = cfg.push.callback_url.clone();
    let mut server = None;
    let mut console_server = None;
    if cfg.push.enabled {
        let listener = match listener {
            Some(l) => l,
            None => TcpListener::bind(&cfg.push.listen).await.map_err(|e| {
                if e.kind() == std::io::ErrorKind::AddrInUse {
                    anyhow::anyhow!(
                        "cannot listen on push.listen {}: another program (another harvester?) listens there; give each harvester its own push.listen port (and push.callback_url)",
                        cfg.push.listen
                    )
                } else {
                    anyhow::Error::new(e)
                        .context(format!("cannot listen on push.listen {}", cfg.push.listen))
                }
            })?,
        };
        if callback_base.is_empty() {
            callback_base = format!("http://{}", listener.local_addr()?);
        }
        // One callback server for every source: each subscription has a path of its own.
        let mut app = follow::router(parts.state.clone(), inbox.clone(), &cfg.push).await?;
        tracing::info!(addr = %listener.local_addr()?, callback_base = %callback_base, "callback server listening");
        if console_at == config::ConsoleAt::Callback {
            app = app.merge(console()?);
            tracing::info!(url = %format!("http://{}/console/", listener.local_addr()?), "console");
        }
        server = Some(follow::serve(listener, app, cancel.clone()));
    }
    if let config::ConsoleAt::Own(addr) = console_at {
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            anyhow::Error::new(e).context(format!("cannot listen on console.listen {addr}"))
        })?;
        tracing::info!(url = %format!("http://{}/console/", listener.local_addr()?), "console");
        console_server = Some(follow::serve(listener, console()?, cancel.clone()));
    }
    if console_at == config::ConsoleAt::Off {
        tracing::info!("no console (console.listen = \"off\", or push.listen is not a loopback address: give console.listen one)");
    }
    // A source's task ends with an error only for what stops the harvester: its
    // configuration asks for what the source does not offer (at start), or the state failed.
    let (failed, mut failures) = tokio::sync::mpsc::unbounded_channel::<anyhow::Error>();
    // By source name: what it was started with and the token that stops it.
    let mut running: std::collections::HashMap<String, Running> = Default::default();
    // `fatal`: a configuration error of the source (a set it does not offer) stops the
    // harvester (at start); a source added by SIGHUP only stops itself, and says why.
    let start = |source: &config::NamedSource, fatal: bool| -> anyhow::Result<Running> {
        let h = Arc::new(Harvester::new(
            &cfg,
            source,
            callback_base.clone(),
            &parts,
            None,
        )?);
        let keeping = Housekeeping {
            tracker: parts.tasks.clone(),
            busy: Default::default(),
        };
        let stop = parts.cancel.child_token();
        let (until, failed, wakes) = (stop.clone(), failed.clone(), inbox.clone());
        parts.tasks.spawn(async move {
            let label = h.label().to_string();
            // Cancelled (SIGHUP, shutdown): the source's work ends at the step it waits on;
            // what it applied is in the state, and its next start goes on from there.
            let r = tokio::select! {
                r = follow_source(h, wakes, keeping, fatal, Default::default()) => r,
                _ = until.cancelled() => Ok(()),
            };
            match r {
                Ok(()) => tracing::debug!(source = %label, "source stopped"),
                Err(e) => {
                    let _ = failed.send(e);
                }
            }
        });
        Ok(Running {
            source: source.clone(),
            stop,
        })
    };
    for source in cfg.source_list() {
        running.insert(source.name.clone(), start(&source, true)?);
    }
    #[cfg(unix)]
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let work = async {
        loop {
            #[cfg(unix)]
            let hup = hangup.recv();
            #[cfg(not(unix))]
            let hup = std::future::pending::<Option<()>>();
            tokio::select! {
                // A source's loop ends with an error only for what stops the harvester.
                Some(e) = failures.recv() => return Err(e),
                _ = hup => {
                    let Some(path) = &reload else {
                        tracing::info!("SIGHUP: no configuration file to read again");
                        continue;
                    };
                    match HarvestConfig::load(Some(path)) {
                        Err(e) => tracing::warn!(error = %e, "SIGHUP: the configuration does not load; the running one is kept"),
                        Ok(new) => {
                            let wanted = new.source_list();
                            if let Some(why) = limit.and_then(|l| too_many_sources(wanted.len(), cfg.fetch.concurrency, l)) {
                                tracing::warn!(error = %why, "SIGHUP: the configuration is not applied; the running one is kept");
                                continue;
                            }
                            let mut stopped = 0;
                            running.retain(|name, r| {
                                let keep = wanted.iter().any(|w| w == &r.source);
                                if !keep {
                                    tracing::info!(source = %name, "SIGHUP: source stopped");
                                    r.stop.cancel();
                                    stopped += 1;
                                }
                                keep
                            });
                            let mut started = 0;
                            for w in wanted {
                                if !running.contains_key(&w.name) {
                                    match start(&w, false) {
                                        Ok(r) => {
                                            tracing::info!(source = %w.name, "SIGHUP: source started");
                                            running.insert(w.name.clone(), r);
                                            started += 1;
                                        }
                                        Err(e) => tracing::warn!(source = %w.name, error = %format!("{e:#}"), "SIGHUP: the source cannot start"),
                                    }
                                }
                            }
                            tracing::info!(stopped, started, kept = running.len() - started, "SIGHUP: sources reloaded (other keys take effect at a restart)");
                        }
                    }
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
    // Every source, housekeeping task and audit is told to stop, and waited for. Blocking
    // work stops at its next step: a package being unpacked at its next entry, a snapshot
    // being written at its next record (redone at the next start).
    cancel.cancel();
    parts.stop.store(true, Ordering::Relaxed);
    parts.interrupt();
    parts.tasks.close();
    parts.tasks.wait().await;
    for mut s in [server, console_server].into_iter().flatten() {
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

/// A source being followed: what it was started with, and the token that stops it.
struct Running {
    source: config::NamedSource,
    stop: tokio_util::sync::CancellationToken,
}

/// A source's housekeeping (Ingestion 3 exports and snapshots): its tasks are owned by the
/// process's tracker, so that shutdown waits for them; one runs at a time per source.
#[derive(Clone)]
struct Housekeeping {
    tracker: tokio_util::task::TaskTracker,
    busy: Arc<AtomicBool>,
}

/// One source, for as long as the harvester runs: discovery (retried with growing pauses
/// while the source cannot be read), each set's subscription and baseline, then the
/// deliveries in the inbox and the periodic catch-up. Its housekeeping tasks (Ingestion 3
/// exports and snapshots) go to `keeping`'s tracker, so that shutdown can wait for them.
async fn follow_source(
    h: Arc<Harvester>,
    wakes: follow::Wakes,
    keeping: Housekeeping,
    fatal: bool,
    asked: Arc<tokio::sync::Notify>,
) -> anyhow::Result<()> {
    let cfg = &h.cfg;
    // A source that cannot be read yet (down, restarting, overloaded) is tried again with
    // growing pauses: a long-lived harvester does not give up at start.
    let mut pauses = crate::backoff::Backoff::new(
        Duration::from_secs(1),
        Duration::from_secs(cfg.follow.check_interval_secs.max(1)),
    );
    let (sets, mut turn) = loop {
        // Discovery too takes a walk's place: hundreds of sources starting at once open
        // their connections a few dozen at a time.
        // The walk is kept for the baselines that follow (when they are due): the
        // connection that read the Capability List reads the Resource List next, instead of
        // lying idle while the source waits for another walk (500 sources discovered at
        // once left ~1,000 descriptors open).
        let turn = h.parts().turns.take(&h.name, h.weight).await;
        match h.discover().await {
            Ok(s) => {
                h.source_error(None).await?;
                break (s, turn);
            }
            Err(e) if e.downcast_ref::<discover::ConfigMismatch>().is_some() => {
                let e = e.context(format!("source {}", h.label()));
                if fatal {
                    return Err(e);
                }
                let e = format!("{e:#}");
                h.source_error(Some(e.clone())).await?;
                tracing::error!(error = %e, "the source stops: its configuration asks for what it does not offer");
                return Ok(());
            }
            Err(e) => {
                drop(turn);
                let e = format!("{e:#}");
                h.source_error(Some(e.clone())).await?;
                let pause = pauses.pause();
                tracing::warn!(source = %h.label(), error = %e, retry_in_secs = pause.as_secs(), "cannot read the source yet (harvest status shows it)");
                tokio::time::sleep(pause).await;
            }
        }
    };
    tracing::info!(source = %h.label(), sets = %sets.iter().map(|s| s.info.name.as_str()).collect::<Vec<_>>().join(", "), "following");
    for s in &sets {
        // Subscribe first, so that nothing published during the baseline is lost to push
        // (the Change Lists would bring it anyway).
        h.push.keep_subscribed(s, false).await;
        if !h.baselined(s, Some(&mut turn)).await? {
            continue;
        }
        match h.catch_up(s).await {
            Ok(found) => {
                if h.push.missed(s, found).await {
                    h.push.keep_subscribed(s, true).await;
                }
            }
            Err(e) => {
                tracing::warn!(set = %s.info.name, error = %format!("{e:#}"), "catching up from the Change Lists failed; retried at the next check")
            }
        }
    }
    drop(turn);
    // Its walks are over: its idle connections are closed now, not a second later (5,000
    // sources finishing baselines left thousands open at once).
    h.fetcher().rest();
    h.housekeeping(&sets, &keeping);
    let mut sets = sets;
    let mut bell = wakes.listen(sets.iter().map(|s| s.row.id));
    let mut tick = tokio::time::interval(Duration::from_secs(cfg.follow.check_interval_secs));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        // Deliveries kept while the harvester was busy (or before a restart), in order.
        h.apply_inbox(&sets).await?;
        let check = tokio::select! {
            _ = bell.notified() => false,
            _ = tick.tick() => true,
            // Its owner asks for a check now (an admin's "run now" of a collector).
            _ = asked.notified() => true,
        };
        if check {
            if cfg.source.sets.is_empty() && h.refresh_sets(&mut sets).await? {
                bell = wakes.listen(sets.iter().map(|s| s.row.id));
            }
            for s in &sets {
                if !h.baselined(s, None).await? {
                    continue;
                }
                let _check = h.parts().checks.acquire().await?;
                match h.catch_up(s).await {
                    Ok(found) => {
                        let missed = h.push.missed(s, found).await;
                        h.push.keep_subscribed(s, missed).await;
                    }
                    Err(e) => {
                        tracing::warn!(set = %s.info.name, error = %format!("{e:#}"), "periodic catch-up failed")
                    }
                }
            }
            h.fetcher().rest();
            h.housekeeping(&sets, &keeping);
        }
    }
}
