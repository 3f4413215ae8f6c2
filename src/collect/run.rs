//! One collector's work: an incremental run (`Identify`, then `ListRecords` from the window's
//! start, page by page, each page applied through the same path as ingest and then
//! checkpointed with its resumption token), and the reconcile pass for repositories that
//! forget deletions.
//!
//! The rules (see FACTS.md "OAI-PMH"): `from` is the `responseDate` of the last run that
//! completed, taken at that run's start (its `Identify`), saved only when it completes, minus
//! one granularity step; no `until`. A restart continues the list from the checkpointed
//! token; a refused token (`badResumptionToken`) starts the window again from the saved
//! `from`; `noRecordsMatch` is an empty run. A token that repeats, a page that repeats an
//! earlier page's records under a new token, more than [`MAX_EMPTY_PAGES`] pages in a row
//! without a record, a token longer than [`MAX_TOKEN_BYTES`] or more than [`MAX_RUN_PAGES`]
//! pages end the run with the reason. Tokens and pages are remembered by a 64-bit digest (a
//! run over a million pages keeps a few megabytes), and a peer's text (tokens, messages,
//! identifiers) is cut to a few hundred bytes wherever it is kept or logged.
//!
//! A page's records are applied before its token is saved: a process killed in between reads
//! the page again and records nothing twice, because a record whose bytes the set already
//! holds records nothing.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher as _;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::client::{Client, Failure, Trace};
use super::map::{change_for, Origin};
use super::oai::{self, DeletedRecord, Granularity, Record};
use super::state::{self, Control, Counts, Identified, RunPoint, Saved};
use crate::config::{CollectConfig, CollectKind};
use crate::context::Context;
use crate::ingest::{self, IngestError};
use crate::model::{ChangeEvent, ChangeType, Location, LocationType, SetName, Timestamp};
use crate::store::StoreError;

/// Pages in a row without a record before a run ends (a repository that pages forever).
pub const MAX_EMPTY_PAGES: u32 = 10;
/// Restarts of the list after refused tokens before a run ends.
const MAX_RESTARTS: u32 = 3;
/// The longest resumption token taken: real ones are a few hundred bytes; one past this ends
/// the run (it would be sent back in every request's URL, and kept in the checkpoint).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// Pages a run reads at most (a repository that pages for ever ends here, with the reason).
pub const MAX_RUN_PAGES: u64 = 1_000_000;
/// The layout of collected records' paths (`crate::model::origin::record_path`): 2 reads
/// like the identifier (`~XX` escapes); before it, `%XX` escapes and hashed long names.
pub const PATH_LAYOUT: u32 = 2;
/// Held by a collector from its check of what other collectors hold to its recording.
static CLAIM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// The repository's sets kept at most (what `ListSets` sends is a peer's: bounded).
const MAX_SETS: usize = 10_000;
/// `ListSets` pages read at most (a repository listing sets for ever ends there).
const MAX_SET_PAGES: u32 = 100;
/// Stored resources read per store call by the reconcile pass.
const RECONCILE_PAGE: usize = 1000;

/// Why a run did not complete.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Fetch(#[from] super::client::Failure),
    #[error("{0}")]
    Protocol(String),
    #[error("the store: {0}")]
    Store(#[from] StoreError),
    #[error("writing a record's file: {0}")]
    Io(#[from] std::io::Error),
    /// Another process took the collector over (a shared store).
    #[error("another process took this collector over")]
    Lost,
}

/// A completed run's or pass's figures.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub counts: Counts,
    pub pages: u64,
    pub requests: u64,
    /// Set when the run ended early on its own terms (a repeated token, endless empty pages).
    pub ended_early: Option<String>,
    /// The outcome in words, for a kind whose counts do not tell it.
    pub words: Option<String>,
}

pub use super::into_set::Poke;

pub struct Collector {
    pub name: SetName,
    cfg: CollectConfig,
    client: Client,
    origin: Origin,
    ctx: Arc<Context>,
    poke: Poke,
    /// The saved document's version as this process last wrote or read it.
    version: tokio::sync::Mutex<Option<i64>>,
    /// Held while records are applied: a run's page and an announced record (see
    /// [`Collector::collect_one`]) are applied one after the other, never interleaved.
    applying: tokio::sync::Mutex<()>,
    /// The harvest engine that follows ResourceSync sources (shared by the process's
    /// collectors; none when every collector is an OAI-PMH one).
    engine: Option<Arc<crate::destination::engine::Engine>>,
    /// What this process's collectors have in flight at each host (see [`Collector::fetcher`]).
    hosts: crate::destination::fetch::Hosts,
    /// The set as the output of resources (made at first use).
    into: std::sync::Mutex<Option<super::into_set::IntoSet>>,
    /// Whether this process holds the collector now (see [`super::into_set::Fence`]).
    pub fence: Arc<super::into_set::Fence>,
}

fn now_text() -> String {
    Timestamp::now().to_string()
}

/// `t` in the form a repository of `g` takes as `from`.
pub fn oai_date(t: Timestamp, g: Granularity) -> String {
    let d = chrono::DateTime::from_timestamp_micros(t.0).unwrap_or_default();
    match g {
        Granularity::Day => d.format("%Y-%m-%d").to_string(),
        Granularity::Seconds => d.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    }
}

/// The next run's `from`: the saved `responseDate` less one granularity step.
pub fn window_start(saved: &str, g: Granularity) -> Option<String> {
    let t = super::map::datestamp(saved).ok()?;
    let step = match g {
        Granularity::Day => 86_400_000_000,
        Granularity::Seconds => 1_000_000,
    };
    Some(oai_date(Timestamp(t.0 - step), g))
}

/// Adds a `ListSets` page's sets to `sets`, up to [`MAX_SETS`]; `false` when some did not fit.
fn keep_sets(sets: &mut Vec<(String, String)>, page: Vec<(String, String)>) -> bool {
    let room = MAX_SETS.saturating_sub(sets.len());
    let all = page.len() <= room;
    sets.extend(page.into_iter().take(room));
    all
}

/// What the repository said of itself, as the collector keeps it.
fn identified(id: &oai::Identify) -> Identified {
    Identified {
        repository_name: id.repository_name.clone(),
        granularity: match id.granularity {
            Granularity::Day => "YYYY-MM-DD".into(),
            Granularity::Seconds => "YYYY-MM-DDThh:mm:ssZ".into(),
        },
        earliest_datestamp: id.earliest_datestamp.clone(),
        deleted_record: match id.deleted_record {
            DeletedRecord::No => "no",
            DeletedRecord::Transient => "transient",
            DeletedRecord::Persistent => "persistent",
        }
        .into(),
    }
}

/// Moves `saved` to today's layout of paths ([`PATH_LAYOUT`]): a set collected under an older
/// one is collected again from the start, then reconciled. Whether it was.
fn relayout(saved: &mut Saved) -> bool {
    if saved.layout >= PATH_LAYOUT {
        return false;
    }
    saved.layout = PATH_LAYOUT;
    if saved.from.is_none() && saved.run.is_none() {
        return false;
    }
    saved.from = None;
    saved.run = None;
    saved.reconcile_owed = true;
    true
}

/// The reconcile pass's listing (`ListIdentifiers`) as pure decisions: which identifiers the
/// repository lists (by digest of their paths), and whether the listing is complete. Only a
/// complete one lets the pass mark anything deleted, so every doubt ends it.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub listed: HashSet<u128>,
    tokens: HashSet<u64>,
    empty: u32,
    pages: u64,
    restarts: u32,
}

/// What one answer leads the listing to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListingStep {
    /// Go on with this token.
    Next(String),
    /// The listing is complete.
    Complete,
    /// The token was refused: list again from the start (why, in the repository's words).
    Again(String),
    /// The listing cannot be complete: nothing is marked deleted.
    Fail(String),
}

impl Listing {
    /// A page of `headers` headers whose live ones' path digests are `live`; the reason of
    /// its first header that could not be read; the token it ends with (non-empty, with its
    /// digest).
    pub(crate) fn on_page(
        &mut self,
        headers: usize,
        live: impl Iterator<Item = u128>,
        unreadable: Option<&str>,
        token: Option<(&str, u64)>,
    ) -> ListingStep {
        if headers == 0 {
            self.empty += 1;
        } else {
            self.empty = 0;
        }
        self.pages += 1;
        self.listed.extend(live);
        // A listing with a header that could not be read is not complete.
        if let Some(why) = unreadable {
            return ListingStep::Fail(format!(
                "ListIdentifiers held a header that could not be read ({why}); nothing was marked deleted"
            ));
        }
        match token {
            None => ListingStep::Complete,
            Some((t, _)) if t.len() > MAX_TOKEN_BYTES || self.pages >= MAX_RUN_PAGES => {
                ListingStep::Fail(format!(
                    "the listing went past {MAX_RUN_PAGES} pages or sent a token of {} bytes (at most {MAX_TOKEN_BYTES}); nothing was marked deleted",
                    t.len()
                ))
            }
            Some((t, d)) if !self.tokens.insert(d) => ListingStep::Fail(format!(
                "the repository sent the resumption token {:?} twice; the listing is not complete and nothing was marked deleted",
                crate::cause::outsider(t)
            )),
            Some(_) if self.empty > MAX_EMPTY_PAGES => ListingStep::Fail(format!(
                "{} pages in a row came without a header; nothing was marked deleted",
                self.empty
            )),
            Some((t, _)) => ListingStep::Next(t.to_string()),
        }
    }

    /// An error answer `code`/`message`.
    pub(crate) fn on_refusal(&mut self, code: &str, message: &str) -> ListingStep {
        match code {
            "noRecordsMatch" => ListingStep::Complete,
            "badResumptionToken" if self.restarts < MAX_RESTARTS => {
                self.restarts += 1;
                self.listed.clear();
                self.tokens.clear();
                ListingStep::Again(crate::cause::outsider(message))
            }
            _ => ListingStep::Fail(format!(
                "ListIdentifiers was answered {}: {}; nothing was marked deleted",
                crate::cause::outsider(code),
                crate::cause::outsider(message)
            )),
        }
    }
}

/// A run's walk through its list as pure decisions (the driver, [`Collector::run`], fetches,
/// applies and saves): what it remembers of the tokens and pages seen (by digest, with the
/// run's own keys) and of pages without a record, and what each answer leads to.
#[derive(Debug, Default)]
pub(crate) struct Walk {
    tokens: HashSet<u64>,
    pages: HashSet<u64>,
    empty: u32,
}

/// What a page leads to, once its records are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PageStep {
    /// Go on with this token.
    Next(String),
    /// The list is over: the run is complete.
    Complete,
    /// The run ends here, with the reason; the next run starts the window again.
    EndEarly(String),
}

/// What an OAI-PMH error answer leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `noRecordsMatch`: an empty window, a complete run.
    Empty,
    /// A refused or expired token: the window again from the saved `from`.
    Restart,
    /// The run fails with the reason; `forget_run`: the next run starts the window again.
    Fail { reason: String, forget_run: bool },
}

impl Walk {
    /// A page with `records` records, the token it ends with (non-empty, with its digest),
    /// the digest of what it holds (`None`: nothing), after `pages` pages of this run.
    pub(crate) fn on_page(
        &mut self,
        records: usize,
        token: Option<(&str, u64)>,
        page_digest: Option<u64>,
        pages: u64,
    ) -> PageStep {
        if records == 0 {
            self.empty += 1;
        } else {
            self.empty = 0;
        }
        let Some((t, token_digest)) = token else {
            return PageStep::Complete;
        };
        if t.len() > MAX_TOKEN_BYTES {
            PageStep::EndEarly(format!(
                "the repository sent a resumption token of {} bytes (more than {MAX_TOKEN_BYTES}): {}; the run ends here",
                t.len(),
                crate::cause::cut(t, 80)
            ))
        } else if !self.tokens.insert(token_digest) {
            PageStep::EndEarly(format!(
                "the repository sent the resumption token {:?} twice; the run ends here",
                crate::cause::outsider(t)
            ))
        } else if page_digest.is_some_and(|d| !self.pages.insert(d)) {
            PageStep::EndEarly(
                "the repository sent the same records again under a new resumption token; the run ends here".into(),
            )
        } else if self.empty > MAX_EMPTY_PAGES {
            PageStep::EndEarly(format!(
                "{} pages in a row came without a record; the run ends here",
                self.empty
            ))
        } else if pages + 1 >= MAX_RUN_PAGES {
            PageStep::EndEarly(format!(
                "{MAX_RUN_PAGES} pages in one run; the run ends here"
            ))
        } else {
            PageStep::Next(t.to_string())
        }
    }

    /// An error answer `code`/`message`; `had_token`: the request carried a token;
    /// `restarts`: the run's restarts so far (counted here).
    pub(crate) fn on_refusal(
        &mut self,
        restarts: &mut u32,
        code: &str,
        message: &str,
        had_token: bool,
    ) -> Refusal {
        match code {
            "noRecordsMatch" => Refusal::Empty,
            "badResumptionToken" if had_token => {
                *restarts += 1;
                if *restarts > MAX_RESTARTS {
                    return Refusal::Fail {
                        reason: format!(
                            "the repository refused its own resumption tokens {MAX_RESTARTS} times ({}); the next run starts the window again",
                            crate::cause::outsider(message)
                        ),
                        forget_run: true,
                    };
                }
                self.tokens.clear();
                self.pages.clear();
                Refusal::Restart
            }
            _ => Refusal::Fail {
                reason: format!(
                    "ListRecords was answered {}: {}",
                    crate::cause::outsider(code),
                    crate::cause::outsider(message)
                ),
                forget_run: false,
            },
        }
    }
}

impl Collector {
    pub fn new(
        name: SetName,
        cfg: CollectConfig,
        ctx: Arc<Context>,
        poke: Poke,
        engine: Option<Arc<crate::destination::engine::Engine>>,
        hosts: crate::destination::fetch::Hosts,
    ) -> Result<Collector, String> {
        let product = format!(
            "resourcesync-hub/{} (OAI-PMH collector; +{})",
            env!("CARGO_PKG_VERSION"),
            ctx.config().base_url()
        );
        let fence = Arc::new(super::into_set::Fence::new(ctx.store().is_shared()));
        Ok(Collector {
            client: Client::new(&cfg, &product, hosts.clone())?,
            origin: Origin {
                base_url: cfg.url.clone(),
                metadata_prefix: cfg.metadata_prefix.clone(),
            },
            name,
            cfg,
            ctx,
            poke,
            applying: Default::default(),
            version: tokio::sync::Mutex::new(None),
            fence,
            engine,
            hosts,
            into: Default::default(),
        })
    }

    /// A fetcher of documents and resources within `url`'s origin, with the collector's
    /// bounds: its timeout, attempts, retry pauses, `Retry-After`, response limit, and two
    /// requests in flight per host over the process's collectors.
    pub fn fetcher(&self, url: &str) -> Result<crate::destination::fetch::Fetcher, RunError> {
        let mut f = crate::destination::config::HarvestConfig::defaults().fetch;
        f.timeout_secs = self.cfg.request_timeout_secs;
        f.idle_timeout_secs = self.cfg.request_timeout_secs.min(f.idle_timeout_secs);
        f.attempts = self.cfg.attempts;
        f.backoff_initial_ms = self.cfg.retry_base_ms;
        f.backoff_max_ms = self.cfg.max_retry_after_secs.saturating_mul(1000);
        f.max_document_bytes = self.cfg.max_response_bytes;
        // A resource a sitemap or stream names carries no length: this is its limit.
        f.max_resource_bytes = self.cfg.max_response_bytes;
        f.per_host_concurrency = super::client::IN_FLIGHT;
        f.user_agent = format!("collector; +{}", self.ctx.config().base_url());
        let scope = crate::destination::scope::Scope::new(url, &[], f.max_url_length)
            .map_err(RunError::Protocol)?;
        Ok(crate::destination::fetch::Fetcher::new(
            &f,
            scope,
            self.hosts.clone(),
        ))
    }

    /// The set as an output of resources.
    pub fn into_set(&self) -> Result<super::into_set::IntoSet, RunError> {
        let mut into = self.into.lock().expect("not poisoned");
        if let Some(i) = into.as_ref() {
            return Ok(i.clone());
        }
        let i = super::into_set::IntoSet::new(
            self.ctx.clone(),
            self.name.clone(),
            self.cfg.bytes,
            self.poke.clone(),
            self.fence.clone(),
        )
        .map_err(|e| RunError::Protocol(format!("{e:#}")))?;
        *into = Some(i.clone());
        Ok(i)
    }

    /// What the collector reads and where: its `kind`, or what discovery found at its URL
    /// (discovering now, and keeping the answer, when nothing was found yet).
    pub async fn resolve(&self, saved: &mut Saved) -> Result<(CollectKind, String), RunError> {
        if let Some(k) = self.kind_known(saved) {
            return Ok((k, self.source_url(saved)));
        }
        let fetcher = self.fetcher(&self.cfg.url)?;
        let d = super::discover::discover(&fetcher, &self.cfg.url)
            .await
            .map_err(|e| match e {
                super::discover::Undiscovered::Refused(why) => {
                    RunError::Fetch(Failure::Refused(why))
                }
                super::discover::Undiscovered::Nothing(why) => RunError::Protocol(why),
            })?;
        tracing::info!(collector = %self.name, kind = %d.kind, url = %crate::cause::outsider(&d.url), why = %d.why, "discovered what the source offers");
        let found = (d.kind().expect("discovery names a kind"), d.url.clone());
        saved.discovered = Some(d);
        self.save(saved).await?;
        Ok(found)
    }

    /// Stops following a ResourceSync source here (the collector was let go or paused).
    pub fn let_go(&self) {
        if let Some(e) = &self.engine {
            e.stop(self.name.as_str());
        }
    }

    /// The URL the collector reads: its `url` when its `kind` is given, else what discovery
    /// chose (its `url` until discovery has run).
    pub fn source_url(&self, saved: &Saved) -> String {
        match (&self.cfg.kind, &saved.discovered) {
            (None, Some(d)) => d.url.clone(),
            _ => self.cfg.url.clone(),
        }
    }

    /// The ResourceSync source as the engine follows it, reading `url`.
    pub fn engine_source(&self, url: &str) -> crate::destination::config::NamedSource {
        crate::destination::config::NamedSource {
            name: self.name.to_string(),
            url: url.to_string(),
            sets: Vec::new(),
            baseline: crate::destination::config::BaselineFrom::ResourceList,
            allow_hosts: Vec::new(),
            token_env: String::new(),
            provider: String::new(),
            weight: 1,
        }
    }

    /// The engine following this collector's ResourceSync source, with its source.
    pub fn engine(&self) -> Option<&Arc<crate::destination::engine::Engine>> {
        self.engine.as_ref()
    }

    /// A ResourceSync source: followed by the engine from now on (baseline, Change Lists,
    /// push), into the set; a run only makes sure it is.
    pub(super) async fn follow(&self, url: &str) -> Result<Report, RunError> {
        let engine = self.engine.as_ref().ok_or_else(|| {
            RunError::Protocol("no harvest engine in this process (a restart opens it)".into())
        })?;
        let source = self.engine_source(url);
        if engine.is_running(&source.name) {
            engine.check_now(&source.name);
        } else {
            let out = Arc::new(self.into_set()?);
            engine
                .start(&source, out)
                .map_err(|e| RunError::Protocol(format!("{e:#}")))?;
        }
        Ok(Report {
            words: Some(format!(
                "following the ResourceSync source {} (baseline, Change Lists and push: `admin collect {}` shows where it stands)",
                crate::cause::outsider(url),
                self.name
            )),
            ..Report::default()
        })
    }

    /// Until when the repository's `Retry-After` is being waited out, while it is.
    pub fn waiting_until(&self) -> Option<Timestamp> {
        self.client.waiting_until()
    }

    pub fn config(&self) -> &CollectConfig {
        &self.cfg
    }

    pub fn store(&self) -> &crate::store::Store {
        self.ctx.store()
    }

    /// The saved document and the admins' one, as the store has them now.
    pub async fn status(&self) -> Result<(Saved, Control), StoreError> {
        let store = self.ctx.store();
        let (saved, _) = state::load::<Saved>(store, &state::saved_key(self.name.as_str())).await?;
        let (control, _) =
            state::load::<Control>(store, &state::control_key(self.name.as_str())).await?;
        Ok((saved, control))
    }

    /// Reads the saved document, taking its version as this process's own (on becoming the
    /// collector's holder).
    pub async fn adopt(&self) -> Result<Saved, StoreError> {
        let (saved, v) =
            state::load::<Saved>(self.ctx.store(), &state::saved_key(self.name.as_str())).await?;
        *self.version.lock().await = v;
        Ok(saved)
    }

    /// Saves the document over the version this process holds; [`RunError::Lost`] when another
    /// process wrote it since.
    pub async fn save(&self, saved: &Saved) -> Result<(), RunError> {
        let mut v = self.version.lock().await;
        match state::save(
            self.ctx.store(),
            &state::saved_key(self.name.as_str()),
            saved,
            *v,
        )
        .await?
        {
            Some(new) => {
                *v = Some(new);
                Ok(())
            }
            None => Err(RunError::Lost),
        }
    }

    async fn identify(
        &self,
        trace: &mut Trace,
        cancel: &CancellationToken,
    ) -> Result<oai::Identify, RunError> {
        match self
            .client
            .call(&[("verb", "Identify")], oai::parse_identify, trace, cancel)
            .await?
        {
            Ok(i) => Ok(i),
            Err((code, message)) => Err(RunError::Protocol(format!(
                "Identify was answered {code}: {message}"
            ))),
        }
    }

    /// What the collector is known to read now: its `kind`, or what discovery found, or
    /// OAI-PMH for a collector that collected from a repository before (before `kind` was).
    pub fn kind_known(&self, saved: &Saved) -> Option<CollectKind> {
        self.cfg
            .kind
            .or_else(|| saved.discovered.as_ref().and_then(|d| d.kind()))
            .or_else(|| saved.identify.is_some().then_some(CollectKind::OaiPmh))
    }

    /// One incremental OAI-PMH run, continuing the run under way if there is one. Updates
    /// `saved` (and the store) as it goes.
    pub(super) async fn run_oai(
        &self,
        saved: &mut Saved,
        cancel: &CancellationToken,
    ) -> Result<Report, RunError> {
        let mut trace = Trace::default();
        saved.last_started = Some(now_text());
        let id = self.identify(&mut trace, cancel).await?;
        saved.identify = Some(identified(&id));
        if relayout(saved) {
            tracing::info!(collector = %self.name, "the set's records were collected under an older layout of file paths: collecting them all again, then reconciling (the old paths are recorded deleted)");
        }
        self.learn_sets(&id, &mut trace, cancel).await?;
        let mut run = match saved.run.take() {
            Some(r) => {
                tracing::info!(collector = %self.name, pages = r.pages, "continuing the run under way");
                r
            }
            None => RunPoint {
                started: id.response_date.clone(),
                from: saved
                    .from
                    .as_deref()
                    .and_then(|f| window_start(f, id.granularity)),
                ..RunPoint::default()
            },
        };
        saved.run = Some(run.clone());
        self.save(saved).await?;
        let mut report = Report::default();
        // Digests (with this run's own random keys: a peer cannot aim at a collision).
        let digest = std::collections::hash_map::RandomState::new();
        let mut walk = Walk::default();
        loop {
            if cancel.is_cancelled() {
                saved.run = Some(run);
                return Err(Failure::Cancelled.into());
            }
            let answer = self
                .list(
                    run.token.as_deref(),
                    run.from.as_deref(),
                    &mut trace,
                    cancel,
                )
                .await;
            let page = match answer {
                Ok(Ok(p)) => p,
                Ok(Err((code, message))) => {
                    match walk.on_refusal(&mut run.restarts, &code, &message, run.token.is_some()) {
                        Refusal::Empty => break,
                        Refusal::Restart => {
                            let message = crate::cause::outsider(&message);
                            tracing::warn!(collector = %self.name, %message, "the repository refused the resumption token: starting the window again from the saved from");
                            run.token = None;
                            saved.run = Some(run.clone());
                            self.save(saved).await?;
                            continue;
                        }
                        Refusal::Fail { reason, forget_run } => {
                            if forget_run {
                                saved.run = None;
                                self.save(saved).await?;
                            }
                            return Err(RunError::Protocol(reason));
                        }
                    }
                }
                Err(e) => {
                    saved.run = Some(run);
                    return Err(e.into());
                }
            };
            let at = now_text();
            // What this page holds, by digest: the same records again under a new token is
            // a repository going round in circles.
            let page_digest =
                (!page.records.is_empty() || !page.quarantined.is_empty()).then(|| {
                    digest.hash_one(
                        page.records
                            .iter()
                            .map(|r| (&r.header.identifier, &r.header.datestamp, r.header.deleted))
                            .collect::<Vec<_>>(),
                    ) ^ digest.hash_one(
                        page.quarantined
                            .iter()
                            .map(|q| &q.identifier)
                            .collect::<Vec<_>>(),
                    )
                });
            for q in page.quarantined {
                run.counts.quarantined += 1;
                run.counts.seen += 1;
                self.quarantine(saved, q.identifier, q.reason, &at);
            }
            let token = page.token.map(|t| t.value).filter(|v| !v.is_empty());
            let step = walk.on_page(
                page.records.len(),
                token.as_deref().map(|t| (t, digest.hash_one(t))),
                page_digest,
                run.pages,
            );
            // Fetching the next page while this one is applied gained 0-20% (bench_collect),
            // but a process killed meanwhile would fetch two pages again: not done.
            let counts = self.apply(page.records, saved, &at).await?;
            run.counts.add(&counts);
            run.pages += 1;
            match step {
                PageStep::EndEarly(why) => {
                    tracing::warn!(collector = %self.name, reason = %why, "run ended early");
                    report.ended_early = Some(why);
                    // The next run starts the window again (it is not saved as complete).
                    saved.run = None;
                    saved.totals.add(&run.counts);
                    report.counts = run.counts;
                    self.save(saved).await?;
                    return Ok(report);
                }
                PageStep::Next(t) => {
                    run.token = Some(t);
                    saved.run = Some(run.clone());
                    self.save(saved).await?;
                }
                PageStep::Complete => {
                    run.token = None;
                    saved.run = Some(run.clone());
                    self.save(saved).await?;
                    break;
                }
            }
        }
        saved.from = Some(run.started.clone());
        saved.run = None;
        saved.last = run.counts;
        saved.totals.add(&run.counts);
        report.counts = run.counts;
        report.pages = run.pages;
        report.requests = trace.requests;
        self.save(saved).await?;
        Ok(report)
    }

    /// Reads the repository's sets (`ListSets`, every page) and keeps them with its base URL
    /// and granularity for `/oai` (`crate::model::origin::RepositoryFacts`), when they
    /// changed. A repository without sets (`noSetHierarchy`) has none; one whose `ListSets`
    /// fails otherwise keeps what was learned before (the run goes on: sets name records,
    /// they do not hold them).
    async fn learn_sets(
        &self,
        id: &oai::Identify,
        trace: &mut Trace,
        cancel: &CancellationToken,
    ) -> Result<(), RunError> {
        let key = crate::model::origin::facts_key(self.name.as_str());
        let store = self.ctx.store();
        let (old, version) =
            state::load::<crate::model::origin::RepositoryFacts>(store, &key).await?;
        let mut facts = crate::model::origin::RepositoryFacts {
            base_url: self.cfg.url.clone(),
            day_granularity: id.granularity == Granularity::Day,
            sets: Vec::new(),
        };
        let mut token: Option<String> = None;
        for page in 0.. {
            if page == MAX_SET_PAGES {
                tracing::warn!(collector = %self.name, "ListSets: more than {MAX_SET_PAGES} pages; the sets read so far are kept");
                break;
            }
            let args: Vec<(&str, &str)> = match &token {
                Some(t) => vec![("verb", "ListSets"), ("resumptionToken", t)],
                None => vec![("verb", "ListSets")],
            };
            let answer = match self
                .client
                .call(&args, oai::parse_sets, trace, cancel)
                .await
            {
                Ok(a) => a,
                Err(Failure::GaveUp(why)) => {
                    tracing::warn!(collector = %self.name, reason = %crate::cause::outsider(&why), "ListSets failed; the sets learned before are kept");
                    facts.sets = old.sets.clone();
                    break;
                }
                Err(e) => return Err(e.into()),
            };
            match answer {
                Ok(p) => {
                    if !keep_sets(&mut facts.sets, p.sets) {
                        tracing::warn!(collector = %self.name, "ListSets: more than {MAX_SETS} sets; the first {MAX_SETS} are kept");
                        break;
                    }
                    match p.token {
                        Some(t) if t.len() <= MAX_TOKEN_BYTES && Some(&t) != token.as_ref() => {
                            token = Some(t)
                        }
                        _ => break,
                    }
                }
                Err((code, _)) if code == "noSetHierarchy" => break,
                Err((code, message)) => {
                    tracing::warn!(collector = %self.name, code = %crate::cause::outsider(&code), message = %crate::cause::outsider(&message), "ListSets failed; the sets learned before are kept");
                    facts.sets = old.sets.clone();
                    break;
                }
            }
        }
        facts.sets.sort();
        facts.sets.dedup_by(|a, b| a.0 == b.0);
        if facts != old {
            // Another process's write in between is one of the same repository's: either stands.
            let _ = state::save(store, &key, &facts, version).await?;
        }
        Ok(())
    }

    /// One `ListRecords` request: the page after `token`, or the list's first page (from
    /// `from`, of the configured OAI set).
    async fn list(
        &self,
        token: Option<&str>,
        from: Option<&str>,
        trace: &mut Trace,
        cancel: &CancellationToken,
    ) -> Result<Result<oai::Page, (String, String)>, Failure> {
        let mut args = vec![("verb", "ListRecords")];
        match token {
            Some(t) => args.push(("resumptionToken", t)),
            None => {
                args.push(("metadataPrefix", self.cfg.metadata_prefix.as_str()));
                if let Some(f) = from {
                    args.push(("from", f));
                }
                if let Some(s) = &self.cfg.set {
                    args.push(("set", s));
                }
            }
        }
        self.client
            .call(&args, oai::parse_list, trace, cancel)
            .await
    }

    /// The md5 the set holds for each path (`None`: no resource), in one store call.
    async fn held(
        &self,
        paths: Vec<String>,
    ) -> Result<HashMap<String, Option<String>>, StoreError> {
        let sc = self.ctx.set_config(&self.name);
        let keys = paths
            .iter()
            .map(|p| {
                Location::rel_path(p.clone())
                    .key(&sc)
                    .map_err(StoreError::Corrupt)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let found = self.ctx.store().resources_by_key(&self.name, &keys).await?;
        Ok(paths
            .into_iter()
            .zip(found)
            .map(|(p, r)| (p, r.and_then(|r| r.meta.md5)))
            .collect())
    }

    /// Keeps a record aside with its reason, and says so in one WARN line (identifier and
    /// reason cut to a few hundred bytes, as kept).
    pub(super) fn quarantine(
        &self,
        saved: &mut Saved,
        identifier: Option<String>,
        reason: String,
        at: &str,
    ) {
        let entry = saved.quarantine(identifier, reason, at);
        tracing::warn!(collector = %self.name, identifier = ?entry.identifier, reason = %entry.reason, "record quarantined");
    }

    /// Of `paths`, those another collector's set holds a live resource at (the same OAI
    /// identifier), with that collector's name: one store call per other collector.
    async fn claimed_elsewhere(
        &self,
        paths: &[String],
    ) -> Result<HashMap<String, SetName>, StoreError> {
        let mut out = HashMap::new();
        if paths.is_empty() {
            return Ok(out);
        }
        let config = self.ctx.config();
        let keys: Vec<crate::model::ResourceKey> = paths
            .iter()
            .map(|p| crate::model::ResourceKey(format!("path:{p}")))
            .collect();
        for name in config.collect.keys().filter(|n| *n != self.name.as_str()) {
            let Ok(other) = SetName::parse(name) else {
                continue;
            };
            let found = self.ctx.store().resources_by_key(&other, &keys).await?;
            for (p, r) in paths.iter().zip(found) {
                if r.is_some() {
                    out.entry(p.clone()).or_insert_with(|| other.clone());
                }
            }
        }
        Ok(out)
    }

    /// Fetches the record `identifier` (`GetRecord`) and applies it as a run applies a page:
    /// a change recorded and notified when the set did not hold these bytes, nothing when it
    /// did (an announcement for a record already current). What a run would quarantine is
    /// quarantined, logged, and said in the answer; the collector's saved document (its window
    /// and its quarantine list) is not touched, so a run under way is not disturbed.
    pub async fn collect_one(
        &self,
        identifier: &str,
        cancel: &CancellationToken,
    ) -> Result<Counts, RunError> {
        if self.cfg.kind.is_some_and(|k| k != CollectKind::OaiPmh) {
            return Err(RunError::Protocol(format!(
                "the collector {} reads a {} source, not an OAI-PMH repository: its next run brings the record",
                self.name,
                self.cfg.kind.map_or("", |k| k.as_str())
            )));
        }
        let args = [
            ("verb", "GetRecord"),
            ("identifier", identifier),
            ("metadataPrefix", self.cfg.metadata_prefix.as_str()),
        ];
        let mut trace = Trace::default();
        let page = match self
            .client
            .call(&args, oai::parse_list, &mut trace, cancel)
            .await?
        {
            Ok(p) => p,
            Err((code, message)) => {
                return Err(RunError::Protocol(format!(
                    "the repository answered GetRecord {identifier}: {code}: {}",
                    crate::cause::outsider(&message)
                )))
            }
        };
        let at = now_text();
        // Where `apply` notes quarantines (logged, and counted in the answer); not saved.
        let mut scratch = Saved::default();
        let mut counts = Counts::default();
        for q in page.quarantined {
            counts.quarantined += 1;
            counts.seen += 1;
            self.quarantine(&mut scratch, q.identifier, q.reason, &at);
        }
        // One record is asked for; a repository answering with others is not trusted.
        let records: Vec<Record> = page
            .records
            .into_iter()
            .filter(|r| r.header.identifier == identifier)
            .take(1)
            .collect();
        counts.add(&self.apply(records, &mut scratch, &at).await?);
        Ok(counts)
    }

    /// Applies a page's records: files first, then the changes in one batch through ingest,
    /// then the files of deleted records are removed.
    async fn apply(
        &self,
        records: Vec<Record>,
        saved: &mut Saved,
        at: &str,
    ) -> Result<Counts, RunError> {
        let _one = self.applying.lock().await;
        let mut counts = Counts {
            seen: records.len() as u64,
            ..Counts::default()
        };
        if records.is_empty() {
            return Ok(counts);
        }
        let paths: Vec<String> = records
            .iter()
            .map(|r| crate::model::origin::record_path(&r.header.identifier))
            .collect();
        // Whether another collector holds a record and this one's recording of it are one
        // step among this process's collectors (on a shared store, two processes' collectors
        // taking a brand-new identifier in the same moment may both keep it).
        let _claim = if self.ctx.config().collect.len() > 1 {
            Some(CLAIM.lock().await)
        } else {
            None
        };
        let mut held = self.held(paths.clone()).await?;
        // Records new to this set that another collector's set serves already.
        let fresh: Vec<String> = records
            .iter()
            .zip(&paths)
            .filter(|(r, p)| !r.header.deleted && held.get(*p).is_none_or(Option::is_none))
            .map(|(_, p)| p.clone())
            .collect();
        let claimed = self.claimed_elsewhere(&fresh).await?;
        let mut events = Vec::new();
        let mut files = Vec::new();
        let mut gone = Vec::new();
        let mut ids = Vec::new();
        // The other names of the records this set holds (see `map::aliases`), for the inbox.
        let mut aliases = Vec::new();
        for (rec, path) in records.iter().zip(paths) {
            let h = held.get(&path).cloned().flatten();
            if let Some(other) = claimed.get(&path).filter(|_| h.is_none()) {
                counts.quarantined += 1;
                self.quarantine(
                    saved,
                    Some(rec.header.identifier.clone()),
                    format!(
                        "the collector {other} serves this OAI identifier already; /oai names one item by one identifier, so the first collector to hold it keeps it"
                    ),
                    at,
                );
                continue;
            }
            let change = change_for(rec, &self.origin, h.as_deref());
            if change.is_ok() && !rec.header.deleted {
                if let Some(m) = &rec.metadata {
                    aliases.extend(
                        super::map::aliases(m)
                            .into_iter()
                            .map(|a| (a, rec.header.identifier.clone())),
                    );
                }
            }
            match change {
                Ok(None) => counts.unchanged += 1,
                Ok(Some(mut c)) => {
                    // Where the store can carry them: the record's OAI sets, as `collection` links.
                    for spec in &rec.header.sets {
                        c.event.ln.push(crate::model::Link {
                            rel: "collection".into(),
                            href: Location {
                                kind: LocationType::Url,
                                value: self.set_url(spec),
                            },
                            mime: None,
                        });
                    }
                    // A later record of the same page sees this one's outcome.
                    held.insert(path.clone(), c.event.md5.clone());
                    match c.event.change {
                        ChangeType::Created => counts.created += 1,
                        ChangeType::Updated => counts.updated += 1,
                        ChangeType::Deleted => {
                            counts.deleted += 1;
                            gone.push(path.clone());
                        }
                    }
                    if let Some((path, bytes)) = c.file {
                        files.push((path, bytes, c.event.change == ChangeType::Created));
                    }
                    ids.push(rec.header.identifier.clone());
                    events.push((events.len() + 1, c.event));
                }
                Err(reason) => {
                    counts.quarantined += 1;
                    self.quarantine(saved, Some(rec.header.identifier.clone()), reason, at);
                }
            }
        }
        self.ctx
            .store()
            .put_aliases(self.name.as_str(), &aliases)
            .await?;
        if events.is_empty() {
            return Ok(counts);
        }
        if !self.fence.holds() {
            return Err(RunError::Lost);
        }
        let root = self.root();
        tokio::task::spawn_blocking(move || write_files(&root, files))
            .await
            .expect("file writing does not panic")?;
        let n = self.ingest(events, &ids, saved, &mut counts, at).await?;
        (self.poke)(n);
        self.remove_files(gone).await;
        Ok(counts)
    }

    /// The folder of the set's files (a collected set always has one: config.rs gives it).
    fn root(&self) -> std::path::PathBuf {
        self.ctx
            .set_config(&self.name)
            .resource_root_dir
            .expect("a collected set has a resource_root_dir")
    }

    /// Removes the files of records recorded as deleted (one already gone is no error).
    async fn remove_files(&self, rels: Vec<String>) {
        if rels.is_empty() {
            return;
        }
        let root = self.root();
        tokio::task::spawn_blocking(move || {
            for p in rels {
                let _ = std::fs::remove_file(root.join(p));
            }
        })
        .await
        .expect("file removal does not panic");
    }

    /// Ingests the events; one the store refuses is quarantined and the rest applied.
    async fn ingest(
        &self,
        mut events: Vec<(usize, ChangeEvent)>,
        ids: &[String],
        saved: &mut Saved,
        counts: &mut Counts,
        at: &str,
    ) -> Result<usize, RunError> {
        loop {
            match ingest::ingest(&self.ctx, &self.name, events.clone()).await {
                Ok(r) => return Ok(r.applied),
                Err(IngestError::Invalid(errors)) => {
                    let bad: HashSet<usize> = errors.iter().map(|e| e.line).collect();
                    for e in errors {
                        counts.quarantined += 1;
                        self.quarantine(
                            saved,
                            ids.get(e.line - 1).cloned(),
                            format!("the store refused it: {}", e.reason),
                            at,
                        );
                    }
                    events.retain(|(line, _)| !bad.contains(line));
                    if events.is_empty() {
                        return Ok(0);
                    }
                }
                Err(IngestError::Empty) => return Ok(0),
                Err(IngestError::Store(e)) => return Err(e.into()),
            }
        }
    }

    /// The repository's URL listing an OAI set's identifiers.
    fn set_url(&self, spec: &str) -> String {
        self.client
            .url(&[
                ("verb", "ListIdentifiers"),
                ("metadataPrefix", &self.cfg.metadata_prefix),
                ("set", spec),
            ])
            .to_string()
    }

    /// The reconcile pass: lists every identifier the repository holds (`ListIdentifiers`)
    /// and, only once the listing is complete, records as deleted each resource of the set
    /// it no longer lists. Returns how many it marked.
    pub async fn reconcile(
        &self,
        saved: &mut Saved,
        cancel: &CancellationToken,
    ) -> Result<u64, RunError> {
        match self.kind_known(saved) {
            None | Some(CollectKind::OaiPmh) => {}
            // The engine's periodic checks and audits keep a ResourceSync set in step.
            Some(CollectKind::Resourcesync) => return Ok(0),
            // A sitemap's or stream's reconcile is a run that fetches every resource.
            Some(_) => {
                saved.reconcile_owed = true;
                let r = self.run(saved, cancel).await?;
                saved.last_reconcile = Some(now_text());
                saved.last_reconcile_deleted = r.counts.deleted;
                return Ok(r.counts.deleted);
            }
        }
        let mut trace = Trace::default();
        let mut token: Option<String> = None;
        let digest = std::collections::hash_map::RandomState::new();
        let mut listing = Listing::default();
        loop {
            let args: Vec<(&str, &str)> = match &token {
                Some(t) => vec![("verb", "ListIdentifiers"), ("resumptionToken", t)],
                None => {
                    let mut a = vec![
                        ("verb", "ListIdentifiers"),
                        ("metadataPrefix", self.cfg.metadata_prefix.as_str()),
                    ];
                    if let Some(s) = &self.cfg.set {
                        a.push(("set", s));
                    }
                    a
                }
            };
            let step = match self
                .client
                .call(&args, oai::parse_list, &mut trace, cancel)
                .await?
            {
                Ok(page) => {
                    let live = page.records.iter().filter(|r| !r.header.deleted).map(|r| {
                        path_hash(&crate::model::origin::record_path(&r.header.identifier))
                    });
                    let t = page.token.map(|t| t.value).filter(|v| !v.is_empty());
                    listing.on_page(
                        page.records.len(),
                        live,
                        page.quarantined.first().map(|q| q.reason.as_str()),
                        t.as_deref().map(|t| (t, digest.hash_one(t))),
                    )
                }
                Err((code, message)) => listing.on_refusal(&code, &message),
            };
            match step {
                ListingStep::Next(t) => token = Some(t),
                ListingStep::Complete => break,
                ListingStep::Again(why) => {
                    tracing::warn!(collector = %self.name, message = %why, "reconcile: the token was refused; listing again from the start");
                    token = None;
                }
                ListingStep::Fail(why) => return Err(RunError::Protocol(why)),
            }
        }
        let listed = listing.listed;
        // The listing is complete: what the set holds and the repository no longer lists.
        let store = self.ctx.store();
        let mut after = None;
        let mut marked = 0u64;
        let at = now_text();
        loop {
            let page = store
                .resources(&self.name, None, after, RECONCILE_PAGE)
                .await?;
            let mut events = Vec::new();
            let mut ids = Vec::new();
            for r in &page.items {
                let Some(path) = r.key.0.strip_prefix("path:") else {
                    continue;
                };
                if listed.contains(&path_hash(path)) {
                    continue;
                }
                ids.push(path.to_string());
                events.push((
                    events.len() + 1,
                    ChangeEvent {
                        change: ChangeType::Deleted,
                        location: Location::rel_path(path),
                        length: None,
                        md5: None,
                        mime: None,
                        lastmod: None,
                        ln: vec![],
                        datetime: None,
                        resource_set: None,
                        timestamp: None,
                    },
                ));
            }
            if !events.is_empty() {
                let mut counts = Counts::default();
                let n = self.ingest(events, &ids, saved, &mut counts, &at).await?;
                marked += n as u64;
                (self.poke)(n);
                self.remove_files(ids).await;
            }
            match page.next {
                Some(c) => after = Some(c),
                None => break,
            }
        }
        saved.last_reconcile = Some(at);
        saved.last_reconcile_deleted = marked;
        saved.totals.deleted += marked;
        self.save(saved).await?;
        Ok(marked)
    }
}

fn path_hash(path: &str) -> u128 {
    use md5::Digest as _;
    u128::from_be_bytes(md5::Md5::digest(path.as_bytes()).into())
}

/// Writes each file: a new record's in place (no list names it before its change is
/// recorded), a changed one's whole beside its place and then moved there (a reader never sees
/// half a record).
fn write_files(root: &std::path::Path, files: Vec<(String, Vec<u8>, bool)>) -> std::io::Result<()> {
    let mut made = HashSet::new();
    for (rel, bytes, new) in files {
        let path = root.join(&rel);
        let dir = path.parent().expect("a record path has a folder");
        if made.insert(dir.to_path_buf()) {
            std::fs::create_dir_all(dir)?;
        }
        if new {
            std::fs::write(&path, &bytes)?;
            continue;
        }
        let tmp = dir.join(format!(
            ".{}.part",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("r")
        ));
        std::fs::write(&tmp, &bytes)?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository listing sets for ever gives at most [`MAX_SETS`] of them.
    #[test]
    fn a_repositorys_sets_are_kept_up_to_a_bound() {
        let page = |n: usize| -> Vec<(String, String)> {
            (0..n).map(|k| (format!("s{k}"), String::new())).collect()
        };
        let mut sets = Vec::new();
        assert!(keep_sets(&mut sets, page(MAX_SETS - 1)));
        assert!(!keep_sets(&mut sets, page(5)));
        assert_eq!(sets.len(), MAX_SETS);
        assert!(!keep_sets(&mut sets, page(1)));
        assert_eq!(sets.len(), MAX_SETS);
    }

    /// The reconcile listing's decisions: complete lists what it saw; a refused token lists
    /// again from the start (three times at most, forgetting what was seen); every doubt (a
    /// header that cannot be read, a token seen twice, too long, too many empty pages)
    /// fails it, so nothing is marked deleted.
    #[test]
    fn the_reconcile_listing_is_complete_or_fails() {
        let mut l = Listing::default();
        assert_eq!(
            l.on_page(2, [1, 2].into_iter(), None, Some(("t1", 1))),
            ListingStep::Next("t1".into())
        );
        assert_eq!(
            l.on_page(1, [3].into_iter(), None, None),
            ListingStep::Complete
        );
        assert_eq!(l.listed, [1, 2, 3].into_iter().collect());
        let mut l = Listing::default();
        l.on_page(2, [1, 2].into_iter(), None, Some(("t1", 1)));
        for _ in 0..MAX_RESTARTS {
            assert!(matches!(
                l.on_refusal("badResumptionToken", "gone"),
                ListingStep::Again(_)
            ));
            assert!(l.listed.is_empty(), "what was seen is forgotten");
        }
        assert!(matches!(
            l.on_refusal("badResumptionToken", "gone"),
            ListingStep::Fail(_)
        ));
        assert_eq!(
            Listing::default().on_refusal("noRecordsMatch", ""),
            ListingStep::Complete
        );
        assert!(matches!(
            Listing::default().on_refusal("badArgument", "no"),
            ListingStep::Fail(_)
        ));
        assert!(matches!(
            Listing::default().on_page(1, [1].into_iter(), Some("not UTF-8"), None),
            ListingStep::Fail(w) if w.contains("not UTF-8")
        ));
        let mut l = Listing::default();
        l.on_page(1, [1].into_iter(), None, Some(("t", 9)));
        assert!(
            matches!(l.on_page(1, [2].into_iter(), None, Some(("t", 9))), ListingStep::Fail(w) if w.contains("twice"))
        );
        let long = "x".repeat(MAX_TOKEN_BYTES + 1);
        assert!(matches!(
            Listing::default().on_page(1, [1].into_iter(), None, Some((&long, 1))),
            ListingStep::Fail(_)
        ));
        let mut l = Listing::default();
        for k in 0..MAX_EMPTY_PAGES as u64 {
            assert_eq!(
                l.on_page(0, [].into_iter(), None, Some(("t", k))),
                ListingStep::Next("t".into())
            );
        }
        assert!(
            matches!(l.on_page(0, [].into_iter(), None, Some(("t", 99))), ListingStep::Fail(w) if w.contains("without a header"))
        );
    }

    /// The walk's decisions, page by page: a list that ends, a token seen twice, the same
    /// records under a new token, pages without records, a token too long, a refused token
    /// (restarted, then given up), an empty window, another error.
    #[test]
    fn the_walk_decides_each_answer_as_the_rules_say() {
        let next = |t: &str| PageStep::Next(t.into());
        let ends =
            |s: &PageStep, says: &str| matches!(s, PageStep::EndEarly(w) if w.contains(says));
        // (records, token, token digest, page digest, pages so far) -> what then.
        let mut w = Walk::default();
        assert_eq!(w.on_page(10, Some(("t1", 1)), Some(100), 0), next("t1"));
        assert_eq!(w.on_page(10, Some(("t2", 2)), Some(200), 1), next("t2"));
        assert_eq!(w.on_page(3, None, Some(300), 2), PageStep::Complete);
        let mut w = Walk::default();
        w.on_page(10, Some(("t1", 1)), Some(100), 0);
        assert!(ends(&w.on_page(10, Some(("t1", 1)), Some(101), 1), "twice"));
        let mut w = Walk::default();
        w.on_page(10, Some(("t1", 1)), Some(100), 0);
        assert!(ends(
            &w.on_page(10, Some(("t2", 2)), Some(100), 1),
            "same records"
        ));
        let mut w = Walk::default();
        for k in 0..MAX_EMPTY_PAGES as u64 {
            assert_eq!(
                w.on_page(0, Some(("t", 10 + k)), None, k),
                next("t"),
                "page {k}"
            );
        }
        assert!(ends(
            &w.on_page(0, Some(("t", 99)), None, 20),
            "without a record"
        ));
        let mut w = Walk::default();
        assert_eq!(
            w.on_page(1, Some(("t", 1)), None, 5),
            next("t"),
            "a record resets the count"
        );
        let long = "x".repeat(MAX_TOKEN_BYTES + 1);
        assert!(ends(
            &Walk::default().on_page(1, Some((&long, 7)), None, 0),
            "bytes"
        ));
        assert!(ends(
            &Walk::default().on_page(1, Some(("t", 7)), None, MAX_RUN_PAGES - 1),
            "pages in one run"
        ));

        let mut w = Walk::default();
        let mut restarts = 0;
        w.on_page(10, Some(("t1", 1)), Some(100), 0);
        for n in 1..=MAX_RESTARTS {
            assert_eq!(
                w.on_refusal(&mut restarts, "badResumptionToken", "expired", true),
                Refusal::Restart
            );
            assert_eq!(restarts, n);
        }
        assert_eq!(
            w.on_page(10, Some(("t1", 1)), Some(100), 0),
            next("t1"),
            "a restart forgets what was seen"
        );
        assert!(matches!(
            w.on_refusal(&mut restarts, "badResumptionToken", "expired", true),
            Refusal::Fail {
                forget_run: true,
                ..
            }
        ));
        assert!(
            matches!(
                Walk::default().on_refusal(&mut 0, "badResumptionToken", "x", false),
                Refusal::Fail { forget_run: false, ref reason } if reason.contains("badResumptionToken")
            ),
            "a refused first request is an error"
        );
        assert_eq!(
            Walk::default().on_refusal(&mut 0, "noRecordsMatch", "", true),
            Refusal::Empty
        );
        assert!(matches!(
            Walk::default().on_refusal(&mut 0, "badArgument", "no", false),
            Refusal::Fail {
                forget_run: false,
                ..
            }
        ));
    }

    #[test]
    fn the_window_starts_one_step_before_the_last_response_date() {
        assert_eq!(
            window_start("2026-11-26T10:00:00Z", Granularity::Seconds).as_deref(),
            Some("2026-11-26T09:59:59Z")
        );
        assert_eq!(
            window_start("2026-11-26T00:30:00Z", Granularity::Day).as_deref(),
            Some("2026-11-25")
        );
        assert_eq!(window_start("garbage", Granularity::Day), None);
    }
}
