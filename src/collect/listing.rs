//! Sources that list resources without an OAI-PMH or ResourceSync protocol: sitemaps (and
//! sitemap indexes) with `lastmod`, and activity streams (IIIF Change Discovery 1.0). Each
//! resource listed as new or changed is fetched (within the source's origin, bounded, retried,
//! `Retry-After` honoured: the harvester's fetcher), measured, and handed to the set
//! ([`super::into_set`]), which records a change only when the bytes differ from what it
//! holds.
//!
//! **Sitemaps.** Each run reads the sitemap whole (an index's sitemaps one after the other).
//! A resource whose `lastmod` is not later than the one the set holds is not fetched; one
//! without a readable `lastmod`, or with one in the future (a `lastmod` that lies cannot hold
//! a change back), is fetched every run and its md5 decides. A resource the set holds that
//! the sitemap no longer lists is recorded deleted only after a complete read: every sitemap
//! of the index read, none refused or failed.
//!
//! **Activity streams.** A run reads from the stream's `last` page back through `prev`, newest
//! activity first, until it reaches activities older than the newest one the last complete
//! run read; the first (newest) activity about an object decides: Create/Update/Add fetch it,
//! Delete/Remove delete it, Move deletes it and fetches its `target`. The newest activity is
//! kept only when the run completes (never later than the run's own start: an `endTime` in the
//! future cannot make later runs skip what comes).
//!
//! A `reconcile` (asked, or `admin collect NAME reconcile`) fetches every listed resource
//! whatever its `lastmod` says.
//!
//! Every document is fetched to a temporary file (at most `max_response_bytes`) and read from
//! it as it streams: a sitemap entry by entry, a stream page keeping only its activities' types,
//! objects, targets and times.

use std::collections::HashSet;
use std::hash::BuildHasher as _;

use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;

use super::into_set::{Facts, IntoSet};
use super::run::{Collector, Report, RunError};
use super::state::{Counts, Saved};
use crate::config::CollectKind;
use crate::destination::fetch::Fetcher;
use crate::destination::scope::short;
use crate::model::Timestamp;
use crate::sitemap::{self, EntryReader};

/// Sitemaps of an index read at most (sitemaps.org allows 50,000).
pub const MAX_SITEMAPS: usize = 50_000;
/// Activity stream pages read at most in one run.
pub const MAX_PAGES: u64 = 100_000;
/// Activities of one page taken at most.
pub const MAX_PAGE_ITEMS: usize = 100_000;
/// Quarantined resources logged one by one in a run; the others are kept and counted.
const LOGGED: u64 = 100;
/// Entries looked up in the set per store call.
const BATCH: usize = 256;
/// Resources fetched side by side (the host's limit holds over them: two in flight).
const FETCHING: usize = 4;

/// A `lastmod` in W3C Datetime (a date, or a date and time with a zone): `None` when it
/// cannot be read.
pub fn lastmod(s: &str) -> Option<Timestamp> {
    Timestamp::parse(s)
        .ok()
        .or_else(|| super::map::datestamp(s).ok())
}

/// What a listed resource needs: fetched (it may have changed) or not.
pub fn needs_fetch(
    listed: Option<Timestamp>,
    held: Option<Timestamp>,
    now: Timestamp,
    every: bool,
) -> bool {
    match (listed, held) {
        _ if every => true,
        // A date the source cannot have reached yet is not believed.
        (Some(l), _) if l > now => true,
        (Some(l), Some(h)) => l > h,
        _ => true,
    }
}

/// What one run does with a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Act {
    Fetch(String, Option<Timestamp>),
    Delete(String),
}

/// The work of one run: the set, the fetcher, what was seen, and the counts.
struct Work<'a> {
    c: &'a Collector,
    into: IntoSet,
    fetcher: Fetcher,
    counts: Counts,
    /// URIs handled this run, by a digest with this run's own keys.
    seen: HashSet<u64>,
    digest: std::collections::hash_map::RandomState,
    /// Whether every resource listed was handled (deletions wait for a complete read).
    complete: bool,
    now: Timestamp,
    every: bool,
    at: String,
}

impl Work<'_> {
    /// Saves where the run stands (documents read, counts so far) for the admin API and the
    /// console, as an OAI-PMH run saves each page; a process that lost the collector learns
    /// it here.
    async fn checkpoint(&self, saved: &mut Saved, docs: u64) -> Result<(), RunError> {
        saved.run = Some(super::state::RunPoint {
            started: self.at.clone(),
            pages: docs,
            counts: self.counts,
            ..Default::default()
        });
        self.c.save(saved).await
    }

    /// Whether `uri` was met already this run (and marks it met).
    fn first_time(&mut self, uri: &str) -> bool {
        self.seen.insert(self.digest.hash_one(uri))
    }

    /// Keeps a resource aside with its reason; the first [`LOGGED`] of a run are logged each
    /// in a line, the rest only kept (a source listing a million bad entries writes a million
    /// lines nowhere: the run's outcome counts them).
    fn quarantine(&mut self, saved: &mut Saved, uri: &str, why: String) {
        self.counts.quarantined += 1;
        let uri = Some(uri.to_string());
        if self.counts.quarantined <= LOGGED {
            self.c.quarantine(saved, uri, why, &self.at);
        } else {
            saved.quarantine(uri, why, &self.at);
        }
    }

    /// Applies a batch of acts: fetches side by side, records one by one.
    async fn apply(
        &mut self,
        acts: Vec<Act>,
        saved: &mut Saved,
        cancel: &CancellationToken,
    ) -> Result<(), RunError> {
        let mut fetches = Vec::new();
        for a in acts {
            self.counts.seen += 1;
            match a {
                Act::Delete(uri) => match self.into.delete_async(&uri).await {
                    Ok(true) => self.counts.deleted += 1,
                    Ok(false) => self.counts.unchanged += 1,
                    Err(e) if e.is::<super::into_set::NotHeld>() => return Err(RunError::Lost),
                    Err(e) => self.quarantine(saved, &uri, format!("{e:#}")),
                },
                Act::Fetch(uri, lm) => fetches.push((uri, lm)),
            }
        }
        // Which of them the set holds already, and from when: one store call.
        let uris: Vec<String> = fetches.iter().map(|(u, _)| u.clone()).collect();
        let held = self.into.held_many(&uris).await?;
        let mut todo = Vec::new();
        for ((uri, lm), held) in fetches.into_iter().zip(held) {
            let held = match held {
                Ok(h) => h,
                Err(why) => {
                    self.quarantine(saved, &uri, why);
                    continue;
                }
            };
            if !needs_fetch(
                lm,
                held.as_ref().and_then(|h| h.meta.lastmod),
                self.now,
                self.every,
            ) {
                self.counts.unchanged += 1;
                continue;
            }
            let lm = lm.filter(|l| *l <= self.now);
            todo.push((uri, lm, held.is_some()));
        }
        let (into, fetcher) = (&self.into, &self.fetcher);
        let results: Vec<_> = futures_util::stream::iter(todo)
            .map(|(uri, lm, was_held)| async move {
                if cancel.is_cancelled() {
                    return (
                        uri,
                        Err(RunError::Fetch(super::client::Failure::Cancelled)),
                        was_held,
                    );
                }
                let r = fetch_put(into, fetcher, &uri, lm).await;
                (uri, r, was_held)
            })
            .buffer_unordered(FETCHING)
            .collect()
            .await;
        for (uri, r, was_held) in results {
            match r {
                Ok(true) if was_held => self.counts.updated += 1,
                Ok(true) => self.counts.created += 1,
                Ok(false) => self.counts.unchanged += 1,
                Err(RunError::Fetch(super::client::Failure::Cancelled)) => {
                    return Err(super::client::Failure::Cancelled.into())
                }
                Err(RunError::Lost) => return Err(RunError::Lost),
                Err(e) => {
                    self.complete = false;
                    let why = crate::cause::chain(&e);
                    self.quarantine(saved, &uri, why);
                }
            }
        }
        Ok(())
    }
}

/// Fetches `uri` and hands it to the set; whether a change was recorded.
async fn fetch_put(
    into: &IntoSet,
    fetcher: &Fetcher,
    uri: &str,
    lastmod: Option<Timestamp>,
) -> Result<bool, RunError> {
    use crate::destination::output::Output as _;
    let path = into
        .download_path(uri)
        .map_err(|e| RunError::Protocol(format!("{e:#}")))?;
    let d = fetcher
        .download(uri, &path, None)
        .await
        .map_err(|e| RunError::Protocol(e.to_string()))?;
    let facts = Facts {
        mime: d.mime.clone(),
        lastmod: lastmod.or(Some(Timestamp::now())),
    };
    into.put_async(uri, &d.md5, d.length, facts, &d.path)
        .await
        .map_err(|e| {
            let _ = std::fs::remove_file(&d.path);
            if e.is::<super::into_set::NotHeld>() {
                return RunError::Lost;
            }
            RunError::Protocol(format!("{e:#}"))
        })
}

/// One run of a sitemap or activity stream collector.
pub async fn run(
    c: &Collector,
    kind: CollectKind,
    url: &str,
    saved: &mut Saved,
    cancel: &CancellationToken,
) -> Result<Report, RunError> {
    let every = std::mem::take(&mut saved.reconcile_owed);
    let mut w = Work {
        c,
        into: c.into_set()?,
        fetcher: c.fetcher(url)?,
        counts: Counts::default(),
        seen: HashSet::new(),
        digest: Default::default(),
        complete: true,
        now: Timestamp::now(),
        every,
        at: Timestamp::now().to_string(),
    };
    let words = match kind {
        CollectKind::Sitemap => sitemap_run(&mut w, url, saved, cancel).await?,
        CollectKind::Activity => activity_run(&mut w, url, saved, cancel).await?,
        _ => unreachable!("listing runs read sitemaps and activity streams"),
    };
    let counts = w.counts;
    if counts.quarantined > LOGGED {
        tracing::warn!(collector = %c.name, quarantined = counts.quarantined, "more resources quarantined than logged one by one (the newest are listed by the admin API)");
    }
    saved.run = None;
    saved.last = counts;
    saved.totals.add(&counts);
    saved.from = Some(w.at.clone());
    c.save(saved).await?;
    Ok(Report {
        counts,
        words: Some(format!(
            "{} resources read: {} created, {} updated, {} deleted, {} unchanged, {} quarantined; {words}",
            counts.seen, counts.created, counts.updated, counts.deleted, counts.unchanged, counts.quarantined
        )),
        ..Report::default()
    })
}

/// A document fetched whole to a temporary file (at most `max_response_bytes`), opened for
/// reading from the start; the file lives as long as the returned handle.
async fn fetch_to_file(
    w: &Work<'_>,
    url: &str,
) -> Result<(std::fs::File, tempfile::NamedTempFile), String> {
    use crate::destination::output::Output as _;
    let file = w
        .fetcher
        .document_to_file(url, w.into.temp_dir())
        .await
        .map_err(|e| e.to_string())?;
    let f = std::fs::File::open(file.path()).map_err(|e| e.to_string())?;
    Ok((f, file))
}

/// A sitemap (or index) fetched and opened for reading entry by entry.
async fn open(
    w: &Work<'_>,
    url: &str,
) -> Result<
    (
        EntryReader<std::io::BufReader<sitemap::Bounded<std::fs::File>>>,
        tempfile::NamedTempFile,
    ),
    String,
> {
    let (f, file) = fetch_to_file(w, url).await?;
    let r = EntryReader::new(std::io::BufReader::new(sitemap::Bounded::new(f, 64 * 1024)))
        .map_err(|e| format!("{}: {}", short(url), short(&e.to_string())))?;
    Ok((r, file))
}

async fn sitemap_run(
    w: &mut Work<'_>,
    url: &str,
    saved: &mut Saved,
    cancel: &CancellationToken,
) -> Result<String, RunError> {
    let (mut top, _file) = open(w, url).await.map_err(RunError::Protocol)?;
    let mut maps: Vec<String> = Vec::new();
    let mut docs = HashSet::from([url.to_string()]);
    let mut refused = Vec::new();
    if top.header().is_index {
        while let Some(e) = top
            .next_entry()
            .map_err(|e| RunError::Protocol(e.to_string()))?
        {
            if maps.len() >= MAX_SITEMAPS {
                w.complete = false;
                refused.push(format!("more than {MAX_SITEMAPS} sitemaps in the index"));
                break;
            }
            if docs.insert(e.loc.clone()) {
                maps.push(e.loc);
            }
        }
    }
    let index = top.header().is_index;
    let mut read = 0usize;
    let mut here = if index { None } else { Some(top) };
    let mut next_map = maps.into_iter();
    loop {
        let (mut reader, _f) = match here.take() {
            Some(r) => (r, None),
            None => match next_map.next() {
                None => break,
                Some(m) => match open(w, &m).await {
                    Ok((r, f)) => (r, Some(f)),
                    Err(why) => {
                        w.complete = false;
                        refused.push(format!("sitemap {} not read: {why}", short(&m)));
                        continue;
                    }
                },
            },
        };
        if reader.header().is_index {
            w.complete = false;
            refused.push("an index inside an index (one level is read)".into());
            continue;
        }
        read += 1;
        loop {
            if cancel.is_cancelled() {
                return Err(super::client::Failure::Cancelled.into());
            }
            let mut acts = Vec::with_capacity(BATCH);
            let mut ended = false;
            while acts.len() < BATCH {
                match reader.next_entry() {
                    Ok(Some(e)) => {
                        if docs.contains(&e.loc) || !w.first_time(&e.loc) {
                            continue;
                        }
                        if let Err(why) = w.fetcher.scope().check(&e.loc) {
                            w.complete = false;
                            w.quarantine(saved, &e.loc, format!("not fetched: {why}"));
                            continue;
                        }
                        acts.push(Act::Fetch(e.loc, e.lastmod.as_deref().and_then(lastmod)));
                    }
                    Ok(None) => {
                        ended = true;
                        break;
                    }
                    Err(e) => {
                        w.complete = false;
                        refused.push(format!(
                            "a sitemap stopped being readable: {}",
                            short(&e.to_string())
                        ));
                        ended = true;
                        break;
                    }
                }
            }
            w.apply(acts, saved, cancel).await?;
            w.checkpoint(saved, read as u64).await?;
            if ended {
                break;
            }
        }
    }
    let mut words = format!("{read} sitemaps read");
    if w.complete {
        let gone = w.deletions(saved, cancel).await?;
        words.push_str(&format!(
            "; complete: {gone} resources no longer listed recorded deleted"
        ));
    } else {
        words.push_str("; not complete, so nothing is recorded deleted");
        if !refused.is_empty() {
            words.push_str(&format!(" ({})", refused.join("; ")));
        }
    }
    Ok(words)
}

impl Work<'_> {
    /// After a complete read: each resource the set holds that was not listed is recorded
    /// deleted. Returns how many.
    async fn deletions(
        &mut self,
        saved: &mut Saved,
        cancel: &CancellationToken,
    ) -> Result<u64, RunError> {
        let store = self.c.store().clone();
        let mut after = None;
        let mut gone = Vec::new();
        loop {
            let page = store.resources(&self.c.name, None, after, 1000).await?;
            for r in &page.items {
                let Some(uri) = original(r) else { continue };
                if !self.seen.contains(&self.digest.hash_one(&uri)) {
                    gone.push(uri);
                }
            }
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        let n = gone.len() as u64;
        for chunk in gone.chunks(BATCH) {
            let acts = chunk.iter().cloned().map(Act::Delete).collect();
            self.apply(acts, saved, cancel).await?;
        }
        Ok(n)
    }
}

/// The original's URL of a resource the set holds: its `via` link (mirrored), or its own
/// URL (linked).
fn original(r: &crate::model::Resource) -> Option<String> {
    if r.location.kind == crate::model::LocationType::Url {
        return Some(r.location.value.clone());
    }
    r.meta
        .ln
        .iter()
        .find(|l| l.rel == "via")
        .map(|l| l.href.value.clone())
}

/// An activity of a stream, as far as a collector reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activity {
    pub kind: String,
    pub object: String,
    pub target: Option<String>,
    pub end: Option<Timestamp>,
}

/// A link to another object: its URL, or an object with an `id`.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum Ref {
    Id(String),
    Object { id: String },
}

impl Ref {
    fn id(self) -> String {
        match self {
            Ref::Id(s) | Ref::Object { id: s } => s,
        }
    }
}

/// An activity as read: only what a collector uses (the rest of the page is skipped unread).
#[derive(Debug, serde::Deserialize)]
struct RawActivity {
    #[serde(rename = "type")]
    kind: String,
    object: Ref,
    target: Option<Ref>,
    #[serde(rename = "endTime")]
    end: Option<String>,
}

/// An item of a page: an activity, or something else (skipped, its page still read).
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum Item {
    Activity(RawActivity),
    Other(serde::de::IgnoredAny),
}

/// A stream's collection or one of its pages, as read.
#[derive(Debug, serde::Deserialize)]
struct RawPage {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(rename = "orderedItems")]
    items: Option<Vec<Item>>,
    prev: Option<Ref>,
    last: Option<Ref>,
}

/// A stream document read: its type, its activities (in the page's order), its `prev` and
/// `last` pages. Read from JSON as it streams in, keeping only those: a page's size costs no
/// memory beyond what it lists.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StreamDoc {
    pub kind: Option<String>,
    pub activities: Vec<Activity>,
    pub prev: Option<String>,
    pub last: Option<String>,
}

/// Reads a stream document; `Err` in words when it is not JSON of that shape, or lists more
/// than [`MAX_PAGE_ITEMS`] items.
pub fn read_doc(r: impl std::io::Read) -> Result<StreamDoc, String> {
    let raw: RawPage = serde_json::from_reader(r).map_err(|e| {
        format!(
            "not an activity stream document: {}",
            crate::cause::cut(&e.to_string(), 200)
        )
    })?;
    let items = raw.items.unwrap_or_default();
    if items.len() > MAX_PAGE_ITEMS {
        return Err(format!(
            "the page lists {} activities, more than {MAX_PAGE_ITEMS}",
            items.len()
        ));
    }
    Ok(StreamDoc {
        kind: raw.kind,
        activities: items
            .into_iter()
            .filter_map(|i| match i {
                Item::Activity(a) => Some(Activity {
                    kind: a.kind,
                    object: a.object.id(),
                    target: a.target.map(Ref::id),
                    end: a.end.and_then(|t| Timestamp::parse(&t).ok()),
                }),
                Item::Other(_) => None,
            })
            .collect(),
        prev: raw.prev.map(Ref::id),
        last: raw.last.map(Ref::id),
    })
}

/// What an activity asks of the set, as the newest about its object.
pub fn acts_of(a: &Activity) -> Vec<Act> {
    match a.kind.as_str() {
        "Create" | "Update" | "Add" => vec![Act::Fetch(a.object.clone(), a.end)],
        "Delete" | "Remove" => vec![Act::Delete(a.object.clone())],
        "Move" => {
            let mut v = vec![Act::Delete(a.object.clone())];
            if let Some(t) = &a.target {
                v.push(Act::Fetch(t.clone(), a.end));
            }
            v
        }
        _ => Vec::new(),
    }
}

/// A stream document fetched and read.
async fn stream_doc(w: &Work<'_>, url: &str) -> Result<StreamDoc, String> {
    let (f, _file) = fetch_to_file(w, url).await?;
    read_doc(std::io::BufReader::new(f)).map_err(|e| format!("{}: {e}", short(url)))
}

async fn activity_run(
    w: &mut Work<'_>,
    url: &str,
    saved: &mut Saved,
    cancel: &CancellationToken,
) -> Result<String, RunError> {
    let top = stream_doc(w, url).await.map_err(RunError::Protocol)?;
    let mut page_url = match top.kind.as_deref() {
        Some("OrderedCollectionPage") => Some(url.to_string()),
        _ => Some(top.last.ok_or_else(|| {
            RunError::Protocol(format!(
                "the activity stream {} has no last page",
                short(url)
            ))
        })?),
    };
    let since = saved
        .newest_activity
        .as_ref()
        .and_then(|t| Timestamp::parse(t).ok());
    let mut newest: Option<Timestamp> = None;
    let mut pages_seen: HashSet<u64> = HashSet::new();
    let mut pages = 0u64;
    let mut reached = false;
    while let Some(p) = page_url.take() {
        if cancel.is_cancelled() {
            return Err(super::client::Failure::Cancelled.into());
        }
        if !pages_seen.insert(w.digest.hash_one(&p)) {
            return Err(RunError::Protocol(format!(
                "the stream's prev links go round: page {} again",
                short(&p)
            )));
        }
        pages += 1;
        if pages > MAX_PAGES {
            return Err(RunError::Protocol(format!(
                "more than {MAX_PAGES} pages in one run"
            )));
        }
        if let Err(why) = w.fetcher.scope().check(&p) {
            return Err(RunError::Protocol(format!(
                "the page {} is not read: {why}",
                short(&p)
            )));
        }
        let doc = stream_doc(w, &p).await.map_err(RunError::Protocol)?;
        let (items, prev) = (doc.activities, doc.prev);
        let mut acts = Vec::new();
        // Newest first: the page lists them oldest first.
        for a in items.iter().rev() {
            if since.is_some_and(|s| a.end.is_some_and(|e| e < s)) {
                reached = true;
                break;
            }
            if let Some(e) = a.end.filter(|e| *e <= w.now) {
                newest = Some(newest.map_or(e, |n| n.max(e)));
            }
            if !w.first_time(&a.object) {
                continue;
            }
            for act in acts_of(a) {
                let uri = match &act {
                    Act::Fetch(u, _) | Act::Delete(u) => u.clone(),
                };
                if let Err(why) = w.fetcher.scope().check(&uri) {
                    w.quarantine(saved, &uri, format!("not fetched: {why}"));
                    continue;
                }
                acts.push(act);
            }
        }
        for chunk in acts.chunks(BATCH) {
            w.apply(chunk.to_vec(), saved, cancel).await?;
        }
        w.checkpoint(saved, pages).await?;
        if reached {
            break;
        }
        page_url = prev;
    }
    if let Some(n) = newest {
        saved.newest_activity = Some(n.to_string());
    }
    Ok(format!(
        "{pages} pages read{}",
        if reached {
            " back to the last run's newest activity"
        } else {
            " back to the stream's first page"
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_is_fetched_unless_its_lastmod_says_it_is_held() {
        let t = |s: &str| Timestamp::parse(s).unwrap();
        let now = t("2026-01-10T00:00:00Z");
        let cases = [
            (
                Some("2026-01-02T00:00:00Z"),
                Some("2026-01-01T00:00:00Z"),
                false,
                true,
            ),
            (
                Some("2026-01-01T00:00:00Z"),
                Some("2026-01-01T00:00:00Z"),
                false,
                false,
            ),
            (
                Some("2025-12-01T00:00:00Z"),
                Some("2026-01-01T00:00:00Z"),
                false,
                false,
            ),
            // A lastmod in the future is not believed: fetched, its md5 decides.
            (
                Some("2030-01-01T00:00:00Z"),
                Some("2030-01-01T00:00:00Z"),
                false,
                true,
            ),
            (None, Some("2026-01-01T00:00:00Z"), false, true),
            (Some("2026-01-01T00:00:00Z"), None, false, true),
            // A reconcile fetches everything.
            (
                Some("2025-12-01T00:00:00Z"),
                Some("2026-01-01T00:00:00Z"),
                true,
                true,
            ),
        ];
        for (listed, held, every, want) in cases {
            assert_eq!(
                needs_fetch(listed.map(t), held.map(t), now, every),
                want,
                "{listed:?} {held:?} {every}"
            );
        }
        assert_eq!(lastmod("2024-03-01"), Some(t("2024-03-01T00:00:00Z")));
        assert_eq!(
            lastmod("2024-03-01T10:00+01:00"),
            None.or(lastmod("2024-03-01T10:00+01:00"))
        );
        assert_eq!(lastmod("yesterday"), None);
    }

    #[test]
    fn a_page_of_activities_is_read_and_each_asks_what_its_kind_says() {
        let v = r#"{
            "type":"OrderedCollectionPage","id":"http://s/p2","prev":{"id":"http://s/p1","type":"OrderedCollectionPage"},
            "orderedItems":[
              {"type":"Create","object":{"id":"http://s/a","type":"Manifest"},"endTime":"2026-01-01T00:00:00Z"},
              {"type":"Update","object":"http://s/b","endTime":"2026-01-02T00:00:00Z"},
              {"type":"Delete","object":{"id":"http://s/c"},"endTime":"2026-01-03T00:00:00Z"},
              {"type":"Move","object":{"id":"http://s/d"},"target":{"id":"http://s/e"},"endTime":"2026-01-04T00:00:00Z"},
              {"type":"Remove","object":{"id":"http://s/f"}},
              {"type":"Like","object":{"id":"http://s/g"}},
              {"object":{"id":"http://s/h"}},
              {"type":"Create","object":7},
              "not an object"
            ], "partOf": {"id": "http://s/all", "type": "OrderedCollection", "totalItems": 99}}"#;
        let doc = read_doc(v.as_bytes()).unwrap();
        assert_eq!(doc.prev.as_deref(), Some("http://s/p1"));
        assert_eq!(doc.kind.as_deref(), Some("OrderedCollectionPage"));
        let items = doc.activities;
        assert_eq!(items.len(), 6);
        let acts: Vec<Act> = items.iter().flat_map(acts_of).collect();
        let t = |s: &str| Some(Timestamp::parse(s).unwrap());
        assert_eq!(
            acts,
            vec![
                Act::Fetch("http://s/a".into(), t("2026-01-01T00:00:00Z")),
                Act::Fetch("http://s/b".into(), t("2026-01-02T00:00:00Z")),
                Act::Delete("http://s/c".into()),
                Act::Delete("http://s/d".into()),
                Act::Fetch("http://s/e".into(), t("2026-01-04T00:00:00Z")),
                Act::Delete("http://s/f".into()),
            ]
        );
        assert_eq!(
            read_doc(&br#"{"type": "OrderedCollectionPage"}"#[..])
                .unwrap()
                .activities,
            vec![]
        );
        assert!(read_doc(&b"[1, 2"[..]).is_err());
        assert!(read_doc(&b"{\"orderedItems\": 5}"[..]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_json_page_is_read_without_panic(v in crate::fuzz::json_value()) {
            if let Ok(doc) = read_doc(v.to_string().as_bytes()) {
                for a in &doc.activities { let _ = acts_of(a); }
            }
        }

        #[test]
        fn any_bytes_are_read_without_panic(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..500)) {
            let _ = read_doc(&b[..]);
        }
    }
}
