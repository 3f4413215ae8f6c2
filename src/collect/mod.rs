//! The collector: OAI-PMH repositories feeding resource sets. Each `[collect.NAME]` keeps the
//! set NAME current: one resource per record ([`map`]), its file under the set's
//! `resource_root_dir` ([`crate::model::origin::record_path`]), changes recorded through the same path as ingest (so
//! notifications, Change Lists and dumps follow), runs that follow the protocol's rules
//! ([`run`], [`client`]) and state kept in the store ([`state`]) so a restart continues where
//! the last page left off. On a shared store one process at a time holds a collector (a
//! lease, renewed while it works); a killed one's collector is taken over once its lease
//! runs out.
//!
//! The protocol's reading ([`oai`]) is pure functions over a response's bytes, each record
//! checked on its own so that a repository's bad input costs one record, never the page.

pub mod client;
pub mod discover;
pub mod hosts;
pub mod into_set;
pub mod kinds;
pub mod listing;
pub mod map;
pub mod oai;
pub mod run;
pub mod state;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use run::{Collector, Poke, Report, RunError};
use state::{Control, Saved};

use crate::config::Config;
use crate::context::Context;
use crate::model::{SetName, Timestamp};
use crate::store::StoreError;

/// How often an idle collector looks at its admins' requests and its lease (more often when
/// the lease is shorter).
const CHECK: Duration = Duration::from_secs(2);

/// What an admin asks of a collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Run,
    Reconcile,
    Pause,
    Resume,
}

/// What this process knows of a collector beyond the store: whether it holds it, what it is
/// doing, when it next runs.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct Live {
    /// Whether this process holds the collector (always, on the embedded store).
    pub held_here: bool,
    /// `run` or `reconcile` while one is under way here.
    pub doing: Option<String>,
    /// When the next incremental run is due (RFC 3339), as this process sees it.
    pub next_run: Option<String>,
}

pub struct Entry {
    pub collector: Collector,
    wake: Notify,
    live: Mutex<Live>,
}

impl Entry {
    pub fn live(&self) -> Live {
        self.live.lock().expect("not poisoned").clone()
    }
    fn set_live(&self, f: impl FnOnce(&mut Live)) {
        f(&mut self.live.lock().expect("not poisoned"))
    }
}

/// Every configured collector of this process.
#[derive(Clone)]
pub struct Collectors {
    entries: Arc<Vec<Arc<Entry>>>,
    ctx: Arc<Context>,
    owner: String,
    /// A collector's lease on a shared store (`hub.partition_lease_secs`: how long a killed
    /// process's work waits before another takes it over).
    lease_secs: u64,
    /// The routes of the harvest engine's callbacks (push from ResourceSync sources), served
    /// at [`CALLBACKS`].
    callbacks: Option<crate::destination::follow::Callbacks>,
    engine: Option<Arc<crate::destination::engine::Engine>>,
    /// On a shared store: the collectors this process is to hold, and when that was reckoned.
    share: Arc<tokio::sync::Mutex<Option<Share>>>,
}

/// The collectors a process is to hold, and when that was reckoned.
type Share = (std::time::Instant, std::collections::HashSet<String>);

/// Where the server serves the callbacks of its ResourceSync collectors' subscriptions.
pub const CALLBACKS: &str = "/collect/push";

impl Collectors {
    /// Takes or renews the lease of `e`'s collector for this process, and keeps its fence in
    /// step: whether it holds it.
    async fn take(&self, e: &Collector) -> Result<bool, StoreError> {
        let lease = format!("collect:{}", e.name);
        let r = self
            .ctx
            .store()
            .lease(&lease, &self.owner, self.lease_secs)
            .await;
        match r {
            Ok(true) => e.fence.renewed(Duration::from_secs(self.lease_secs)),
            _ => e.fence.lost(),
        }
        r
    }

    /// Gives the lease of `e`'s collector up.
    async fn give_up(&self, e: &Collector) {
        e.fence.lost();
        let _ = self
            .ctx
            .store()
            .release(&format!("collect:{}", e.name), &self.owner)
            .await;
    }

    /// How often the lease is renewed and requests looked at.
    fn check(&self) -> Duration {
        CHECK.min(Duration::from_millis(self.lease_secs * 1000 / 3))
    }

    /// While a collector works: renews its lease, and cancels `stop` when the lease is lost
    /// or an admin pauses it (the work then ends at its next step, saving where it stands).
    /// Never resolves.
    async fn hold(&self, c: &Collector, stop: &CancellationToken) {
        let store = self.ctx.store();
        let name = c.name.as_str();
        loop {
            tokio::time::sleep(self.check()).await;
            let held = self.take(c).await.unwrap_or(false);
            let paused = state::load::<Control>(store, &state::control_key(name))
                .await
                .map(|(c, _)| c.paused)
                .unwrap_or(false);
            if !held || paused {
                tracing::info!(collector = %name, held, paused, "stopping the collector's work");
                stop.cancel();
                return std::future::pending::<()>().await;
            }
        }
    }
}

/// The harvest engine's configuration for the server's collectors: its state under the data
/// folder, push on (callbacks on the server's own port), a periodic check every interval of
/// the quickest ResourceSync collector, and each host's requests limited as the OAI-PMH
/// collectors' are.
fn engine_config(config: &Config) -> crate::destination::config::HarvestConfig {
    let mut h = crate::destination::config::HarvestConfig::defaults();
    h.state.dir = config.server.data_dir.join("collect-engine");
    h.push.enabled = true;
    h.push.callback_url = format!("{}{CALLBACKS}", config.base_url().trim_end_matches('/'));
    let rs = config.collect.values().filter(|c| {
        c.kind
            .is_none_or(|k| k == crate::config::CollectKind::Resourcesync)
    });
    if let Some(i) = rs.clone().map(|c| c.interval_secs).min() {
        h.follow.check_interval_secs = i.max(1);
    }
    if let Some(t) = rs.map(|c| c.request_timeout_secs).min() {
        h.fetch.timeout_secs = t;
    }
    h.fetch.per_host_concurrency = client::IN_FLIGHT;
    h.fetch.user_agent = format!("collector; +{}", config.base_url());
    h
}

fn parse_time(s: &Option<String>) -> Option<Timestamp> {
    s.as_deref().and_then(|t| Timestamp::parse(t).ok())
}

impl Collectors {
    /// The collectors `[collect.NAME]` configures; `owner` names this process in leases.
    /// The harvest engine is opened when a collector may read a ResourceSync source (its
    /// `kind` says so, or is left to discovery).
    pub async fn new(
        config: &Config,
        ctx: Arc<Context>,
        poke: Poke,
        owner: String,
    ) -> anyhow::Result<Collectors> {
        let mut entries = Vec::new();
        let hosts = hosts::hosts(config, ctx.store(), &owner);
        let (engine, callbacks) = if config.collect.values().any(|c| {
            c.kind
                .is_none_or(|k| k == crate::config::CollectKind::Resourcesync)
        }) {
            let (e, r) = crate::destination::engine::Engine::open(
                engine_config(config),
                format!("{}{CALLBACKS}", config.base_url().trim_end_matches('/')),
                hosts.clone(),
            )
            .await?;
            (Some(Arc::new(e)), Some(r))
        } else {
            (None, None)
        };
        for (name, cfg) in &config.collect {
            let set = SetName::parse(name).map_err(anyhow::Error::msg)?;
            let collector = Collector::new(
                set,
                cfg.clone(),
                ctx.clone(),
                poke.clone(),
                engine.clone(),
                hosts.clone(),
            )
            // The client's refusal of its configuration is words (a String).
            .map_err(|e| anyhow::Error::msg(e).context(format!("[collect.{name}]")))?;
            entries.push(Arc::new(Entry {
                collector,
                wake: Notify::new(),
                live: Mutex::new(Live::default()),
            }));
        }
        Ok(Collectors {
            entries: Arc::new(entries),
            ctx,
            owner,
            lease_secs: config.hub.partition_lease_secs,
            callbacks,
            engine,
            share: Default::default(),
        })
    }

    /// Whether this process is to hold the collector `name`: always on the embedded store; on
    /// a shared one, when it wins it among the live processes (rendezvous hashing with
    /// bounded loads over the collectors, as delivery's partitions are shared: each process
    /// holds an even share, and a process joining or leaving moves few). Reckoned again at
    /// most every check.
    async fn is_mine(&self, name: &str) -> bool {
        let store = self.ctx.store();
        if !store.is_shared() {
            return true;
        }
        let mut share = self.share.lock().await;
        let fresh = share
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < self.check());
        if !fresh {
            match store.heartbeat(&self.owner, self.lease_secs).await {
                Ok(mut nodes) => {
                    nodes.sort();
                    let mut names: Vec<&str> = self
                        .entries
                        .iter()
                        .map(|e| e.collector.name.as_str())
                        .collect();
                    names.sort();
                    let won = crate::hub::assign(&nodes, names.len() as u32);
                    let mine = names
                        .into_iter()
                        .zip(won)
                        .filter(|(_, w)| *w == Some(self.owner.as_str()))
                        .map(|(n, _)| n.to_string())
                        .collect();
                    *share = Some((std::time::Instant::now(), mine));
                }
                Err(e) => {
                    tracing::warn!(error = %crate::cause::chain(&e), "cannot reach the store for the live processes; collectors held are kept");
                }
            }
        }
        share.as_ref().is_none_or(|(_, m)| m.contains(name))
    }

    /// The routes of the harvest engine's callbacks, when it is open (served at [`CALLBACKS`]).
    pub fn callbacks(&self) -> Option<crate::destination::follow::Callbacks> {
        self.callbacks.clone()
    }

    /// Stops the harvest engine's work (at shutdown).
    pub async fn shutdown(&self) {
        if let Some(e) = &self.engine {
            e.shutdown().await;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[Arc<Entry>] {
        &self.entries
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Entry>> {
        self.entries
            .iter()
            .find(|e| e.collector.name.as_str() == name)
    }

    /// Records an admin's request in the store (where the process holding the collector
    /// sees it) and wakes the collector if it is held here.
    pub async fn ask(&self, name: &str, action: Action) -> Result<Control, StoreError> {
        let c = state::control(self.ctx.store(), name, |c| match action {
            Action::Run => c.run_requests += 1,
            Action::Reconcile => c.reconcile_requests += 1,
            Action::Pause => c.paused = true,
            Action::Resume => {
                c.paused = false;
                c.resumes += 1;
            }
        })
        .await?;
        if let Some(e) = self.get(name) {
            e.wake.notify_one();
        }
        Ok(c)
    }

    /// Collects the one record `identifier` at collector `name` at once (an announcement
    /// named it): its change recorded and notified when the set did not hold these bytes.
    /// Refused in words when there is no such collector or another process holds it (its next
    /// run brings the record).
    pub async fn collect_one(
        &self,
        name: &str,
        identifier: &str,
        cancel: &CancellationToken,
    ) -> Result<state::Counts, String> {
        let e = self
            .get(name)
            .ok_or_else(|| format!("no collector named {name:?}"))?;
        let held = self
            .take(&e.collector)
            .await
            .map_err(|e| crate::cause::chain(&e))?;
        if !held {
            return Err(format!(
                "another process holds collector {name}: its next run brings the record"
            ));
        }
        e.collector
            .collect_one(identifier, cancel)
            .await
            .map_err(|e| crate::cause::chain(&e))
    }

    /// Starts one loop per collector on `tasks`, each under a supervisor (`restarted` counts
    /// the loops that ended unexpectedly and were started again).
    pub fn spawn(
        &self,
        tasks: &TaskTracker,
        cancel: CancellationToken,
        restarted: prometheus_client::metrics::counter::Counter,
    ) {
        for e in self.entries.iter() {
            let (e, all, c) = (e.clone(), self.clone(), cancel.clone());
            tasks.spawn(crate::workers::supervise(
                "collector",
                restarted.clone(),
                cancel.clone(),
                move || drive(e.clone(), all.clone(), c.clone()),
            ));
        }
    }

    /// `collect --once`: one run of each collector (or of `only`), then a reconcile pass
    /// where the repository forgets deletions and one is due. A collector another process
    /// holds, paused or stopped is skipped with the reason.
    pub async fn once(
        &self,
        only: Option<&str>,
        cancel: &CancellationToken,
    ) -> Vec<(String, Result<String, String>)> {
        let mut out = Vec::new();
        for e in self.entries.iter() {
            let name = e.collector.name.to_string();
            if only.is_some_and(|o| o != name) {
                continue;
            }
            let r = self.once_one(e, cancel).await;
            out.push((name, r));
        }
        out
    }

    async fn once_one(&self, e: &Entry, cancel: &CancellationToken) -> Result<String, String> {
        let store = self.ctx.store();
        if !self.take(&e.collector).await.map_err(|e| e.to_string())? {
            return Err("another process holds this collector".into());
        }
        let (control, _) =
            state::load::<Control>(store, &state::control_key(e.collector.name.as_str()))
                .await
                .map_err(|e| e.to_string())?;
        let mut saved = e.collector.adopt().await.map_err(|e| e.to_string())?;
        if e.collector.kind_known(&saved) == Some(crate::config::CollectKind::Resourcesync) {
            return Err("a ResourceSync source is followed by the running server (baseline, Change Lists and push), not by --once".into());
        }
        if control.paused {
            return Err("paused (resume it with `admin collect resume`)".into());
        }
        if let Some((why, _)) = saved
            .stopped
            .as_ref()
            .filter(|(_, r)| control.resumes <= *r)
        {
            return Err(format!("stopped: {why}"));
        }
        saved.stopped = None;
        saved.runs_answered = control.run_requests;
        let stop = cancel.child_token();
        let both = async {
            let words = work(e, &mut saved, Work::Run, &stop).await?;
            if reconcile_due(e, &saved, &control) {
                saved.reconciles_answered = control.reconcile_requests;
                let r = work(e, &mut saved, Work::Reconcile, &stop).await?;
                return Ok(format!("{words}; {r}"));
            }
            Ok(words)
        };
        let result = tokio::select! {
            r = both => r,
            _ = self.hold(&e.collector, &stop) => unreachable!("hold never resolves"),
        };
        self.give_up(&e.collector).await;
        result
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    Run,
    Reconcile,
}

/// Whether a reconcile pass is due: asked for, or on schedule for a repository that forgets
/// deletions (after a first complete run).
fn reconcile_due(e: &Entry, saved: &Saved, control: &Control) -> bool {
    if control.reconcile_requests > saved.reconciles_answered
        || (saved.reconcile_owed && saved.from.is_some())
    {
        return true;
    }
    let cfg = e.collector.config();
    let forgets = saved
        .identify
        .as_ref()
        .is_some_and(|i| i.deleted_record != "persistent");
    cfg.reconcile_secs > 0
        && forgets
        && saved.from.is_some()
        && parse_time(&saved.last_reconcile)
            .is_none_or(|t| t.plus_secs(cfg.reconcile_secs) <= Timestamp::now())
}

/// Does one run or pass, saving its outcome in words; `Ok` with a summary, `Err` with the
/// reason.
async fn work(
    e: &Entry,
    saved: &mut Saved,
    what: Work,
    cancel: &CancellationToken,
) -> Result<String, String> {
    let c = &e.collector;
    e.set_live(|l| {
        l.doing = Some(match what {
            Work::Run => "run".into(),
            Work::Reconcile => "reconcile".into(),
        })
    });
    let result = match what {
        Work::Run => c.run(saved, cancel).await.map(|r| {
            if let Some(w) = r.words {
                return w;
            }
            let k = r.counts;
            let mut words = format!(
                "{} records read: {} created, {} updated, {} deleted, {} unchanged, {} quarantined",
                k.seen, k.created, k.updated, k.deleted, k.unchanged, k.quarantined
            );
            if let Some(why) = r.ended_early {
                words.push_str(&format!(" (ended early: {why})"));
            }
            words
        }),
        Work::Reconcile => c.reconcile(saved, cancel).await.map(|n| {
            saved.reconcile_owed = false;
            format!("reconcile: {n} records the repository no longer lists marked deleted")
        }),
    };
    e.set_live(|l| l.doing = None);
    let now = Timestamp::now().to_string();
    match &result {
        Ok(words) => {
            tracing::info!(collector = %c.name, "{words}");
            if what == Work::Run {
                saved.last_ended = Some(now);
                saved.last_outcome = Some(words.clone());
                saved.last_error = None;
            }
        }
        Err(RunError::Lost) => {
            tracing::warn!(collector = %c.name, "another process took this collector over");
        }
        Err(RunError::Fetch(client::Failure::Cancelled)) => {}
        Err(RunError::Fetch(client::Failure::Refused(why))) => {
            let why = &crate::cause::outsider(why);
            tracing::warn!(collector = %c.name, reason = %why, "the repository refused access: the collector is stopped until an admin resumes it");
            match state::load::<Control>(c.store(), &state::control_key(c.name.as_str())).await {
                Ok((control, _)) => saved.stopped = Some((why.clone(), control.resumes)),
                Err(err) => {
                    tracing::warn!(collector = %c.name, error = %crate::cause::chain(&err), "cannot read the collector's control")
                }
            }
            saved.last_ended = Some(now.clone());
            let words = format!("the repository refused access ({why}); the collector is stopped until an admin resumes it");
            saved.last_outcome = Some(format!("failed: {words}"));
            saved.last_error = Some(words);
        }
        Err(err) => {
            // Errors quote the repository: kept and logged at a bounded length.
            let words =
                crate::cause::cut(&crate::cause::chain(err), 4 * crate::cause::OUTSIDER_TEXT);
            tracing::warn!(collector = %c.name, error = %words, "collector run failed");
            if what == Work::Run {
                saved.last_ended = Some(now);
                saved.last_outcome = Some(format!("failed: {words}"));
            }
            saved.last_error = Some(words);
        }
    }
    if !matches!(result, Err(RunError::Lost)) {
        if let Err(err) = c.save(saved).await {
            tracing::warn!(collector = %c.name, error = %crate::cause::chain(&err), "the collector's outcome was not saved");
        }
    }
    result.map_err(|e| crate::cause::chain(&e))
}

/// One collector's loop: hold it (a lease on a shared store), answer admins' requests, run
/// when due, reconcile when due.
async fn drive(e: Arc<Entry>, all: Collectors, cancel: CancellationToken) {
    let store = all.ctx.store().clone();
    let name = e.collector.name.to_string();
    let mut was_held = false;
    while !cancel.is_cancelled() {
        // Another live process wins it now: given up between runs, for that one to take.
        let mine = all.is_mine(&name).await;
        if !mine && was_held {
            tracing::info!(collector = %name, "another live process is to hold this collector: given up between runs");
            e.collector.let_go();
            all.give_up(&e.collector).await;
        }
        let mut held = match mine {
            false => false,
            true => match all.take(&e.collector).await {
                Ok(h) => h,
                Err(err) => {
                    tracing::warn!(collector = %name, error = %crate::cause::chain(&err), "cannot reach the store for the collector's lease");
                    false
                }
            },
        };
        e.set_live(|l| l.held_here = held);
        if !held {
            e.collector.let_go();
        }
        if held && !was_held && store.is_shared() {
            tracing::info!(collector = %name, owner = %all.owner, "this process now holds the collector");
            // What a killed holder left half-written is finished before the set is read (its
            // claim on the set may outlast its lease on the collector: the lease is renewed
            // meanwhile).
            let stop = cancel.child_token();
            let recovered = tokio::select! {
                r = store.recover_writes(&e.collector.name) => r,
                _ = all.hold(&e.collector, &stop) => unreachable!("hold never resolves"),
            };
            if let Err(err) = recovered {
                tracing::warn!(collector = %name, error = %crate::cause::chain(&err), "cannot finish what the last holder left of the set; trying again");
                all.give_up(&e.collector).await;
                held = false;
            }
        }
        was_held = held;
        let mut wait = all.check();
        if held {
            match step(&e, &all, &cancel).await {
                Ok(Some(next)) => wait = next.min(all.check()),
                Ok(None) => wait = Duration::ZERO,
                Err(err) => {
                    tracing::warn!(collector = %name, error = %crate::cause::chain(&err), "the collector's state could not be read");
                }
            }
        }
        if wait.is_zero() {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = e.wake.notified() => {}
            _ = cancel.cancelled() => break,
        }
    }
    e.collector.let_go();
    all.give_up(&e.collector).await;
}

/// Does what is due now, if anything: `Some(wait)` until the next thing is due, `None` to
/// look again at once.
async fn step(
    e: &Entry,
    all: &Collectors,
    cancel: &CancellationToken,
) -> Result<Option<Duration>, StoreError> {
    let store = all.ctx.store();
    let c = &e.collector;
    let (control, _) = state::load::<Control>(store, &state::control_key(c.name.as_str())).await?;
    let mut saved = c.adopt().await?;
    let interval = c.config().interval_secs;
    let failed = saved
        .last_outcome
        .as_deref()
        .is_some_and(|o| o.starts_with("failed"));
    // After a failure the next run comes sooner (at most 5 minutes later).
    let next = match failed {
        true => parse_time(&saved.last_ended).map(|t| t.plus_secs(interval.min(300))),
        false => parse_time(&saved.last_started).map(|t| t.plus_secs(interval)),
    };
    // A run that started and never ended here (a killed process, a pause) goes on at once.
    let interrupted =
        saved.run.is_some() && parse_time(&saved.last_ended) < parse_time(&saved.last_started);
    e.set_live(|l| l.next_run = next.map(|t| t.to_string()));
    if control.paused {
        c.let_go();
        return Ok(Some(all.check()));
    }
    // Resumed after it stopped itself: it runs at once.
    let mut resumed = false;
    if let Some((_, at)) = &saved.stopped {
        if control.resumes <= *at {
            return Ok(Some(all.check()));
        }
        saved.stopped = None;
        resumed = true;
    }
    let asked = control.run_requests > saved.runs_answered;
    // A set of OAI-PMH records collected under an older layout of paths is collected again at
    // once (once: a failed run waits as any other). Other kinds have their own paths.
    let oai = c
        .kind_known(&saved)
        .is_none_or(|k| k == crate::config::CollectKind::OaiPmh);
    let relayout = oai && saved.layout < run::PATH_LAYOUT && !failed;
    let due =
        interrupted || resumed || relayout || next.is_none_or(|t| t <= Timestamp::now()) || asked;
    let what = if due {
        saved.runs_answered = control.run_requests;
        Work::Run
    } else if reconcile_due(e, &saved, &control) {
        saved.reconciles_answered = control.reconcile_requests;
        Work::Reconcile
    } else {
        let left = next.map_or(0, |t| (t.0 - Timestamp::now().0).max(0) as u64);
        return Ok(Some(Duration::from_micros(left)));
    };
    // While it works: the lease renewed, and a pause (or a lost lease) stops it at once.
    let stop = cancel.child_token();
    let guard = all.hold(c, &stop);
    tokio::select! {
        _ = work(e, &mut saved, what, &stop) => {}
        _ = guard => {}
    }
    Ok(if cancel.is_cancelled() {
        Some(all.check())
    } else {
        None
    })
}
