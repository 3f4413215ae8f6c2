//! The OAI-PMH 2.0 repository at `/oai`, over the resource sets whose resources are XML
//! metadata records (a set opts in with `[sets.NAME.oai]`; a set collected in `oai_dc` by
//! itself). One OAI set per resource set; an item is a resource, its identifier the resource's
//! URL, its datestamp the time this store last changed it (so a harvester coming back with
//! `from` misses nothing); a deleted resource is a header with `status="deleted"`, from the
//! change log, for ever (`deletedRecord` persistent).
//!
//! Lists walk the change log in (datetime, id) order from `from` and take a change when it is
//! its resource's newest before the list's bound (`until`, or the time of the list's first
//! request): a resource appears once, at its newest change, and one changed while the list is
//! walked appears in it once (its newer change is past the bound and is seen by the next
//! `from` harvest). Resumption tokens are that position, signed: stateless, valid across
//! restarts and on every process of a shared store; a tampered one, or one of another list,
//! is `badResumptionToken`. A list's first request waits for the store's batches dated before
//! its bound ([`crate::store::SetStore::settle`]), so none lands behind a walk.
//!
//! `ListRecords` pages are kept on disk as they are made and sent again to a list reaching the
//! same position while their records are unchanged ([`cache`]).
//!
//! A set fed by an OAI-PMH collector (`[collect.NAME]`) keeps its records' identity: each is
//! served under the repository's own OAI identifier (read back from its file's path,
//! [`crate::model::origin`]; `GetRecord` takes it), in the repository's sets as sub-sets of the
//! set (`NAME:spec`, hierarchical sets, with the repository's `setName`s in `ListSets`), and,
//! in its own format, with an `<about>` in the OAI-PMH provenance schema (the repository's base
//! URL, the identifier, its datestamp, the format's namespace, when it was harvested). Its
//! datestamp stays this store's change time, so that a harvester's `from` never misses a
//! record collected late.

mod cache;
mod token;
mod walk;
mod write;

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::OaiFormat;
use crate::context::Context;
use crate::model::origin::{self, RepositoryFacts};
use crate::model::{ChangeType, Link, ResourceKey, SetName, Timestamp};
use crate::store::StoreError;

pub use token::Position;
pub use write::Body;

/// The protocol's errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OaiError {
    pub code: &'static str,
    pub message: String,
}

fn err(code: &'static str, message: impl Into<String>) -> OaiError {
    OaiError {
        code,
        message: message.into(),
    }
}

/// Why a request could not be answered at all: the store, or every build slot taken (a 503).
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Busy(#[from] crate::context::Busy),
}

/// The verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Identify,
    ListMetadataFormats,
    ListSets,
    ListIdentifiers,
    ListRecords,
    GetRecord,
}

impl Verb {
    fn parse(s: &str) -> Option<Verb> {
        Some(match s {
            "Identify" => Verb::Identify,
            "ListMetadataFormats" => Verb::ListMetadataFormats,
            "ListSets" => Verb::ListSets,
            "ListIdentifiers" => Verb::ListIdentifiers,
            "ListRecords" => Verb::ListRecords,
            "GetRecord" => Verb::GetRecord,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Identify => "Identify",
            Verb::ListMetadataFormats => "ListMetadataFormats",
            Verb::ListSets => "ListSets",
            Verb::ListIdentifiers => "ListIdentifiers",
            Verb::ListRecords => "ListRecords",
            Verb::GetRecord => "GetRecord",
        }
    }

    /// The arguments the verb takes: (required, optional, exclusive).
    fn arguments(
        self,
    ) -> (
        &'static [&'static str],
        &'static [&'static str],
        Option<&'static str>,
    ) {
        match self {
            Verb::Identify => (&[], &[], None),
            Verb::ListMetadataFormats => (&[], &["identifier"], None),
            Verb::ListSets => (&[], &[], Some("resumptionToken")),
            Verb::ListIdentifiers | Verb::ListRecords => (
                &["metadataPrefix"],
                &["from", "until", "set"],
                Some("resumptionToken"),
            ),
            Verb::GetRecord => (&["identifier", "metadataPrefix"], &[], None),
        }
    }
}

/// A request, its arguments checked against its verb.
#[derive(Debug, Clone)]
pub struct Request {
    pub verb: Verb,
    pub args: HashMap<String, String>,
}

/// Checks the arguments: `Err` with the request's arguments (for the answer's `request`
/// element, empty when they were not valid) and the error.
pub fn parse_request(pairs: &[(String, String)]) -> Result<Request, OaiError> {
    let mut args: HashMap<String, String> = HashMap::new();
    for (k, v) in pairs {
        if args.insert(k.clone(), v.clone()).is_some() {
            // A repeated verb is an illegal verb (OAI-PMH 2.0 §3.6), any other a bad argument.
            let code = if k == "verb" {
                "badVerb"
            } else {
                "badArgument"
            };
            return Err(err(code, format!("the argument {k} is repeated")));
        }
    }
    // Nothing XML cannot carry is ever echoed (badArgument answers echo no arguments).
    if let Some((k, c)) = pairs.iter().find_map(|(k, v)| {
        Some((
            k,
            k.chars().chain(v.chars()).find(|c| !write::xml_char(*c))?,
        ))
    }) {
        let code = if k == "verb" {
            "badVerb"
        } else {
            "badArgument"
        };
        return Err(err(
            code,
            format!(
                "the argument {} holds U+{:04X}, a character XML 1.0 cannot carry",
                k.chars()
                    .filter(|c| write::xml_char(*c))
                    .collect::<String>(),
                c as u32
            ),
        ));
    }
    let Some(verb) = args.remove("verb") else {
        return Err(err("badVerb", "the request has no verb"));
    };
    let Some(verb) = Verb::parse(&verb) else {
        return Err(err("badVerb", format!("{verb:?} is not an OAI-PMH verb")));
    };
    let (required, optional, exclusive) = verb.arguments();
    if let Some(x) = exclusive {
        if args.contains_key(x) {
            if args.len() > 1 {
                return Err(err(
                    "badArgument",
                    format!("{x} is an exclusive argument: send it alone with the verb"),
                ));
            }
            return Ok(Request { verb, args });
        }
    }
    for k in args.keys() {
        if !required.contains(&k.as_str()) && !optional.contains(&k.as_str()) {
            return Err(err(
                "badArgument",
                format!("{} takes no argument {k:?}", verb.as_str()),
            ));
        }
    }
    for r in required {
        if !args.contains_key(*r) {
            return Err(err(
                "badArgument",
                format!("{} needs the argument {r}", verb.as_str()),
            ));
        }
    }
    Ok(Request { verb, args })
}

/// A `from` or `until` argument: its instant and whether it was a day.
fn parse_date(s: &str, name: &str) -> Result<(Timestamp, bool), OaiError> {
    let bad = || {
        err(
            "badArgument",
            format!("{name} {s:?} is neither YYYY-MM-DD nor YYYY-MM-DDThh:mm:ssZ"),
        )
    };
    if s.len() == 10 {
        let d = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").map_err(|_| bad())?;
        let t = d.and_hms_opt(0, 0, 0).ok_or_else(bad)?.and_utc();
        return Ok((Timestamp(t.timestamp_micros()), true));
    }
    if s.len() == 20 {
        let t =
            chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%SZ").map_err(|_| bad())?;
        return Ok((Timestamp(t.and_utc().timestamp_micros()), false));
    }
    Err(bad())
}

/// The window of a list: changes dated `from <= t < until`.
fn window(
    args: &HashMap<String, String>,
) -> Result<(Option<Timestamp>, Option<Timestamp>), OaiError> {
    let from = args
        .get("from")
        .map(|f| parse_date(f, "from"))
        .transpose()?;
    let until = args
        .get("until")
        .map(|u| parse_date(u, "until"))
        .transpose()?;
    if let (Some((_, fd)), Some((_, ud))) = (from, until) {
        if fd != ud {
            return Err(err(
                "badArgument",
                "from and until have different granularities",
            ));
        }
    }
    // `until` is inclusive: up to the end of its day or second.
    let until = until.map(|(t, day)| Timestamp(t.0 + if day { 86_400_000_000 } else { 1_000_000 }));
    let from = from.map(|(t, _)| t);
    if let (Some(f), Some(u)) = (from, until) {
        if f >= u {
            return Err(err("badArgument", "from is after until"));
        }
    }
    Ok((from, until))
}

/// A set served over OAI-PMH.
#[derive(Debug, Clone)]
pub struct OaiSet {
    pub name: SetName,
    pub format: OaiFormat,
    /// Set when an OAI-PMH collector feeds it: where from, and what it learned there.
    pub collected: Option<Arc<Collected>>,
}

/// What `/oai` knows of the repository a collected set comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collected {
    pub base_url: String,
    pub facts: RepositoryFacts,
}

/// An item's origin, for its `<about>` (OAI-PMH provenance).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    pub base_url: String,
    pub identifier: String,
    /// The record's datestamp at the repository, in the repository's granularity.
    pub datestamp: String,
    pub metadata_namespace: String,
    /// When this server collected that version (its change's time).
    pub harvest_date: Timestamp,
}

/// An item of a list or `GetRecord`.
#[derive(Debug, Clone)]
pub struct Item {
    pub identifier: String,
    pub datestamp: Timestamp,
    pub set: SetName,
    pub deleted: bool,
    /// The resource as it is now (none for a deleted one).
    pub resource: Option<crate::model::Resource>,
    /// Its file under the set's `resource_root_dir`, when it has one.
    pub file: Option<std::path::PathBuf>,
    /// The repository's sets holding it, for a collected set (each served as `set:spec`).
    pub specs: Vec<String>,
    pub provenance: Option<Provenance>,
}

/// What a list request answers: its items and the token of the rest.
#[derive(Debug)]
pub struct ListPage {
    pub items: Vec<Item>,
    /// `None`: the list is complete; `Some("")`: the last page of a list that had tokens.
    pub token: Option<String>,
    pub cursor: u64,
    /// The metadata prefix of the list.
    pub prefix: String,
    /// The page's records as kept (then `items` is empty).
    pub kept: Option<(Arc<cache::Entry>, std::fs::File)>,
    /// Where to keep the page once it is written.
    pub fill: Option<(Arc<cache::ListCache>, cache::Fill)>,
}

pub struct Repository {
    ctx: Arc<Context>,
    key: tokio::sync::OnceCell<[u8; 32]>,
    /// Pages of ListRecords kept on disk (`None`: `oai.list_cache_max_bytes` is 0, or the
    /// folder could not be made).
    lists: Option<Arc<cache::ListCache>>,
    /// What the collectors learned of their repositories, read from the store at most every
    /// [`FACTS_FOR`].
    facts: tokio::sync::Mutex<Option<(std::time::Instant, Facts)>>,
}

/// What each collector learned of its repository, by collector.
type Facts = Arc<HashMap<String, RepositoryFacts>>;

/// How long what the collectors learned is taken as read (a collector learns it once a run).
const FACTS_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// An answer: small ones whole, lists streamed.
pub enum Answer {
    Text(String),
    Stream(Body),
}

/// Changes read per store call while walking a list.
const WALK_CHUNK: usize = 1000;

/// A kept page's key: where in which list of which set (and sub-set) it starts.
fn list_key(pos: &Position, page_size: usize, set: &SetName) -> String {
    // `from` only matters before the first change passed.
    let from = pos.after.is_none().then_some(pos.from).flatten();
    let sub = pos.set.as_deref().and_then(|s| split_set(s).1);
    format!(
        "{}\n{}\n{page_size}\n{set}\n{:?}\n{from:?}\n{sub:?}",
        pos.verb, pos.prefix, pos.after
    )
}

/// A `set` argument as (resource set, sub-set): `NAME` or `NAME:spec` (a collected
/// repository's set `spec`, hierarchical itself).
fn split_set(s: &str) -> (&str, Option<&str>) {
    match s.split_once(':') {
        Some((name, spec)) => (name, Some(spec)),
        None => (s, None),
    }
}

/// The token a page ends with: `None` for a list answered whole, `""` for the last page of a
/// list that had tokens.
fn token(more: bool, had_token: bool, pos: &Position, key: &[u8; 32]) -> Option<String> {
    if more {
        Some(pos.seal(key))
    } else if had_token {
        Some(String::new())
    } else {
        None
    }
}

impl Repository {
    pub fn new(ctx: Arc<Context>) -> Repository {
        let config = ctx.config();
        let lists = (config.oai.list_cache_max_bytes > 0)
            .then(|| {
                let dir = config.page_cache_dir().join("oai-lists");
                cache::ListCache::open(&dir, config.oai.list_cache_max_bytes)
                    .map_err(|e| {
                        tracing::warn!(dir = %dir.display(), error = %e, "OAI-PMH: cannot keep list pages there; every page is made for its request");
                    })
                    .ok()
                    .map(Arc::new)
            })
            .flatten();
        Repository {
            ctx,
            key: tokio::sync::OnceCell::new(),
            lists,
            facts: tokio::sync::Mutex::new(None),
        }
    }

    pub fn ctx(&self) -> &Context {
        &self.ctx
    }

    /// The key signing tokens, kept in the store so every process and restart shares it.
    async fn key(&self) -> Result<&[u8; 32], StoreError> {
        self.key
            .get_or_try_init(|| crate::store::shared_key(self.ctx.store(), "oai-token-key"))
            .await
    }

    /// The sets served over OAI-PMH, in name order.
    pub async fn sets(&self) -> Result<Vec<OaiSet>, StoreError> {
        let config = self.ctx.config();
        let facts = self.facts().await?;
        let mut out = Vec::new();
        for info in self.ctx.store().sets().await? {
            if let Some(format) = config.oai_format(info.name.as_str()) {
                let collected = config.collect.get(info.name.as_str()).map(|c| {
                    Arc::new(Collected {
                        base_url: c.url.clone(),
                        facts: facts.get(info.name.as_str()).cloned().unwrap_or_default(),
                    })
                });
                out.push(OaiSet {
                    name: info.name,
                    format,
                    collected,
                });
            }
        }
        Ok(out)
    }

    /// What each collector learned of its repository (none yet: no entry).
    async fn facts(&self) -> Result<Facts, StoreError> {
        let mut kept = self.facts.lock().await;
        if let Some((_, f)) = kept.as_ref().filter(|(at, _)| at.elapsed() < FACTS_FOR) {
            return Ok(f.clone());
        }
        let mut map = HashMap::new();
        for name in self.ctx.config().collect.keys() {
            if let Some((json, _)) = self.ctx.store().state(&origin::facts_key(name)).await? {
                match serde_json::from_str::<RepositoryFacts>(&json) {
                    Ok(f) => {
                        map.insert(name.clone(), f);
                    }
                    Err(e) => {
                        tracing::warn!(collector = %name, error = %e, "OAI-PMH: what the collector learned of its repository cannot be read; its sets are served without names");
                    }
                }
            }
        }
        let map = Arc::new(map);
        *kept = Some((std::time::Instant::now(), map.clone()));
        Ok(map)
    }

    /// The formats of a set's items: its own and, when that is not it, `oai_dc` made from what
    /// the store knows.
    pub fn formats(set: &OaiSet) -> Vec<OaiFormat> {
        let mut f = vec![set.format.clone()];
        if set.format.metadata_prefix != "oai_dc" {
            f.push(OaiFormat::oai_dc());
        }
        f
    }

    /// The earliest datestamp of the repository (its oldest change), or now when it has none.
    pub async fn earliest(&self) -> Result<Timestamp, StoreError> {
        let mut earliest: Option<Timestamp> = None;
        for s in self.sets().await? {
            let page = self
                .ctx
                .store()
                .changes(&s.name, Timestamp(0), None, None, 1)
                .await?;
            if let Some(c) = page.items.first() {
                earliest = Some(earliest.map_or(c.datetime, |e| e.min(c.datetime)));
            }
        }
        Ok(earliest.unwrap_or_else(Timestamp::now).floor_secs())
    }

    /// The item of `key` in `set` at its change of `datestamp`: `resource` as it is now (none
    /// when deleted), `links` its change's (a deletion's own links name its sets).
    fn item(
        &self,
        set: &OaiSet,
        key: &ResourceKey,
        datestamp: Timestamp,
        resource: Option<crate::model::Resource>,
        links: &[Link],
    ) -> Item {
        let sc = self.ctx.set_config(&set.name);
        let rel = key.0.strip_prefix("path:");
        let file = resource
            .as_ref()
            .and_then(|_| Some(sc.root_dir()?.join(rel?)));
        let own = set
            .collected
            .as_ref()
            .and_then(|c| Some((c, rel.and_then(origin::identifier_of)?)));
        let mut item = Item {
            identifier: key.url(&sc.url_prefix),
            datestamp,
            set: set.name.clone(),
            deleted: resource.is_none(),
            file,
            specs: Vec::new(),
            provenance: None,
            resource,
        };
        if let Some((collected, identifier)) = own {
            let links = item.resource.as_ref().map_or(links, |r| &r.meta.ln);
            item.specs = origin::specs_of(links)
                .into_iter()
                .filter(|s| origin::is_set_spec(s))
                .collect();
            let lastmod = item.resource.as_ref().and_then(|r| r.meta.lastmod);
            item.provenance = lastmod.map(|l| Provenance {
                base_url: collected.base_url.clone(),
                identifier: identifier.clone(),
                datestamp: if collected.facts.day_granularity {
                    l.to_string()[..10].to_string()
                } else {
                    l.floor_secs().to_string()
                },
                metadata_namespace: set.format.namespace.clone(),
                harvest_date: datestamp,
            });
            item.identifier = identifier;
        }
        item
    }

    /// Whether an item whose repository sets are `specs` is in the sub-set `want` (`spec` of
    /// `NAME:spec`): in it, or in a set below it.
    fn in_subset(specs: &[String], want: &str) -> bool {
        specs.iter().any(|s| {
            s == want
                || (s.len() > want.len() && s.starts_with(want) && s.as_bytes()[want.len()] == b':')
        })
    }

    /// The item an identifier names: the set whose URL prefix it lies under (the longest), and
    /// the resource there, live or deleted; `None` when no set knows it.
    pub async fn find(&self, identifier: &str) -> Result<Option<(Item, OaiSet)>, StoreError> {
        let mut sets = self.sets().await?;
        // A collected set's record, by the repository's identifier (sets in name order: the
        // collectors see to it that one holds it).
        let key = ResourceKey(format!("path:{}", origin::record_path(identifier)));
        for s in sets.iter().filter(|s| s.collected.is_some()) {
            if let Some(item) = self.first_held(s, std::slice::from_ref(&key)).await? {
                return Ok(Some((item, s.clone())));
            }
        }
        sets.sort_by_key(|s| std::cmp::Reverse(self.ctx.set_config(&s.name).url_prefix.len()));
        for s in sets {
            let sc = self.ctx.set_config(&s.name);
            let mut keys = vec![ResourceKey(format!("url:{identifier}"))];
            if let Some(rest) = identifier.strip_prefix(&sc.url_prefix) {
                let rel = percent_encoding::percent_decode_str(rest).decode_utf8_lossy();
                keys.insert(0, ResourceKey(format!("path:{rel}")));
            }
            if let Some(item) = self.first_held(&s, &keys).await? {
                return Ok(Some((item, s)));
            }
        }
        Ok(None)
    }

    /// The item of the first of `keys` set `s` has a change of (live or deleted), if any.
    async fn first_held(
        &self,
        s: &OaiSet,
        keys: &[ResourceKey],
    ) -> Result<Option<Item>, StoreError> {
        let store = self.ctx.store();
        let latest = store
            .latest_changes(&s.name, keys, Timestamp(i64::MAX))
            .await?;
        for key in keys {
            if let Some((dt, _)) = latest.get(key) {
                let r = store.resource(&s.name, key).await?;
                return Ok(Some(self.item(s, key, *dt, r, &[])));
            }
        }
        Ok(None)
    }

    /// Where a list request starts: its token's position, or a new list's from its arguments
    /// (bounded by `until` or now); the protocol's error when neither holds.
    fn position(req: &Request, sets: &[OaiSet], key: &[u8; 32]) -> Result<Position, OaiError> {
        if let Some(t) = req.args.get("resumptionToken") {
            return match Position::open(key, t) {
                Some(p) if p.verb == req.verb.as_str() => Ok(p),
                _ => Err(err(
                    "badResumptionToken",
                    "the resumption token is not one of this repository's for this verb",
                )),
            };
        }
        let prefix = req.args.get("metadataPrefix").cloned().unwrap_or_default();
        let (from, until) = window(&req.args)?;
        let set = req.args.get("set").cloned();
        if let Some(s) = &set {
            let (name, sub) = split_set(s);
            let known = sets
                .iter()
                .any(|o| o.name.as_str() == name && (sub.is_none() || o.collected.is_some()));
            if !known {
                return Err(err("noRecordsMatch", format!("there is no set {s:?}")));
            }
        }
        let servable = sets
            .iter()
            .filter(|o| {
                set.as_ref()
                    .is_none_or(|s| o.name.as_str() == split_set(s).0)
            })
            .any(|o| Self::formats(o).iter().any(|f| f.metadata_prefix == prefix));
        if !servable {
            return Err(err(
                "cannotDisseminateFormat",
                format!("no item is available as {prefix:?}"),
            ));
        }
        let now = Timestamp::now();
        Ok(Position {
            verb: req.verb.as_str().into(),
            prefix,
            from: from.map(|t| t.0),
            bound: until.map_or(now.0, |u| u.0.min(now.0)),
            set,
            at_set: None,
            after: None,
            cursor: 0,
        })
    }

    /// The sets a list at `pos` walks, in name order: those of its `set` (a sub-set's parent),
    /// served in its format, from the one it stands in on.
    fn scope<'a>(sets: &'a [OaiSet], pos: &Position) -> Vec<&'a OaiSet> {
        sets.iter()
            .filter(|o| {
                pos.set
                    .as_ref()
                    .is_none_or(|s| o.name.as_str() == split_set(s).0)
            })
            .filter(|o| {
                Self::formats(o)
                    .iter()
                    .any(|f| f.metadata_prefix == pos.prefix)
            })
            .filter(|o| {
                pos.at_set
                    .as_ref()
                    .is_none_or(|a| o.name.as_str() >= a.as_str())
            })
            .collect()
    }

    /// The kept page found at `pos` in set `s`, when it is still what the list would make
    /// there: the page to send (`last`: `s` is the list's last set). `Err` gives back the
    /// stretch a page made again must stop at, when the kept one was not the set's last.
    #[allow(clippy::too_many_arguments)]
    async fn kept_page(
        &self,
        lists: &Arc<cache::ListCache>,
        page_key: &str,
        e: Arc<cache::Entry>,
        s: &OaiSet,
        pos: &mut Position,
        last: bool,
        had_token: bool,
        key: &[u8; 32],
    ) -> Result<Result<ListPage, Option<(i64, i64)>>, Failure> {
        let Some(file) = self.still(lists, page_key, &s.name, &e, pos.bound).await? else {
            // Made again over the same stretch of the log: the pages after it keep their keys.
            return Ok(Err((!e.exhausted).then_some(e.next_after)));
        };
        self.ctx.metrics().oai_list_pages_kept.inc();
        let store = self.ctx.store();
        // The set's last page then: is it still?
        let exhausted = e.exhausted
            && store
                .changes(
                    &s.name,
                    Timestamp(0),
                    Some(Timestamp(pos.bound)),
                    Some(store.change_cursor(Timestamp(e.next_after.0), e.next_after.1)),
                    1,
                )
                .await?
                .items
                .is_empty();
        let more = !exhausted || !last;
        pos.after = if exhausted {
            Some((i64::MAX, i64::MAX))
        } else {
            Some(e.next_after)
        };
        let cursor = pos.cursor;
        pos.cursor += e.items as u64;
        Ok(Ok(ListPage {
            items: Vec::new(),
            token: token(more, had_token, pos, key),
            cursor,
            prefix: pos.prefix.clone(),
            kept: Some((e, file)),
            fill: None,
        }))
    }

    /// A page of `ListIdentifiers` / `ListRecords`, from its arguments or its token: the sets
    /// in scope walked in name order from the position, each a chunk of its change log at a
    /// time ([`walk::Scan`] decides what a chunk gives the page), or a kept page sent instead.
    pub async fn list(
        &self,
        req: &Request,
        page_size: usize,
        sets: &[OaiSet],
    ) -> Result<Result<ListPage, OaiError>, Failure> {
        let key = *self.key().await?;
        let mut pos = match Self::position(req, sets, &key) {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        let mut items = Vec::new();
        let store = self.ctx.store();
        // Every change dated before the bound that this process is writing, in the log first.
        store.settle(Timestamp(pos.bound)).await;
        let sub: Option<String> = pos
            .set
            .as_deref()
            .and_then(|s| split_set(s).1)
            .map(str::to_string);
        let scope = Self::scope(sets, &pos);
        let had_token = req.args.contains_key("resumptionToken");
        // Pages of ListRecords are kept (see [`cache`]): the page's key where it starts, the
        // keys of its items, how it ended, and whether it took items from more than one set
        // (then it is not kept).
        let lists = self
            .lists
            .as_ref()
            .filter(|_| req.verb == Verb::ListRecords);
        let mut start_key: Option<String> = None;
        // What the store had recorded before the page's set was read (kept with the page).
        let mut mark: Option<i64> = None;
        let mut item_keys: Vec<(String, i64, i64)> = Vec::new();
        let mut end: Option<(bool, Option<(i64, i64)>)> = None;
        let mut crossed = false;
        let mut scan = walk::Scan::new(page_size);
        let mut more = false;
        let last = scope.len().saturating_sub(1);
        'sets: for (n, s) in scope.into_iter().enumerate() {
            if pos.at_set.as_deref() != Some(s.name.as_str()) {
                pos.at_set = Some(s.name.to_string());
                pos.after = None;
            }
            scan.stop_at = None;
            if !items.is_empty() {
                crossed = true;
            } else if let Some(lists) = lists {
                let page_key = list_key(&pos, page_size, &s.name);
                if let Some(e) = lists.get(&page_key) {
                    let kept = self
                        .kept_page(lists, &page_key, e, s, &mut pos, n == last, had_token, &key)
                        .await?;
                    match kept {
                        Ok(page) => return Ok(Ok(page)),
                        Err(stop_at) => scan.stop_at = stop_at,
                    }
                }
                mark = store.recorded_through(&s.name).await?;
                start_key = Some(page_key);
            }
            loop {
                let (changes, seen, last_chunk) = self.read_chunk(s, &pos, sub.as_deref()).await?;
                let (taken, chunk_end) = scan.chunk(&mut pos.after, &seen, items.len(), last_chunk);
                let taken: Vec<&crate::model::Change> =
                    taken.into_iter().map(|i| &changes[i]).collect();
                for (item, c) in self.items_of(s, &taken).await?.into_iter().zip(&taken) {
                    items.push(item);
                    if lists.is_some() {
                        item_keys.push((c.key.0.clone(), c.datetime.0, c.id));
                    }
                }
                match chunk_end {
                    walk::ChunkEnd::More | walk::ChunkEnd::StretchEmpty => {}
                    walk::ChunkEnd::Stretch => {
                        end = Some((false, scan.stop_at));
                        more = true;
                        break 'sets;
                    }
                    walk::ChunkEnd::Full { exhausted } => {
                        end = Some((exhausted, pos.after));
                        more = !(exhausted && n == last);
                        if exhausted {
                            // Next time, the next set.
                            pos.after = Some((i64::MAX, i64::MAX));
                        }
                        break 'sets;
                    }
                    walk::ChunkEnd::SetDone => {
                        end = Some((true, pos.after));
                        continue 'sets;
                    }
                }
            }
        }
        let cursor = pos.cursor;
        pos.cursor += items.len() as u64;
        if items.is_empty() && !more && !had_token {
            return Ok(Err(err(
                "noRecordsMatch",
                "no item matches these arguments",
            )));
        }
        // Kept when it holds one set's items and the stretch it covers had settled.
        let settled = pos.bound - self.visibility_lag();
        let fill = match (lists, start_key, end, mark) {
            (Some(lists), Some(page_key), Some((exhausted, Some(next_after))), Some(mark))
                if !crossed && !items.is_empty() && next_after.0 < settled =>
            {
                let keys = item_keys;
                let fill = cache::Fill {
                    key: page_key,
                    bound: pos.bound,
                    next_after,
                    mark,
                    exhausted,
                    items: items.len(),
                    keys,
                };
                Some((lists.clone(), fill))
            }
            _ => None,
        };
        let token = token(more, had_token, &pos, &key);
        Ok(Ok(ListPage {
            items,
            token,
            cursor,
            prefix: pos.prefix,
            kept: None,
            fill,
        }))
    }

    /// The next chunk of set `s`'s change log after `pos` (within its window), each change
    /// weighed as [`walk::Scan`] needs it (its resource's newest before the bound? in the
    /// sub-set `sub`?), and whether the store has none after it.
    async fn read_chunk(
        &self,
        s: &OaiSet,
        pos: &Position,
        sub: Option<&str>,
    ) -> Result<(Vec<crate::model::Change>, Vec<walk::Seen>, bool), StoreError> {
        let store = self.ctx.store();
        let after = pos
            .after
            .map(|(dt, id)| store.change_cursor(Timestamp(dt), id));
        let page = store
            .changes(
                &s.name,
                Timestamp(pos.from.unwrap_or(0)),
                Some(Timestamp(pos.bound)),
                after,
                WALK_CHUNK,
            )
            .await?;
        let keys: Vec<ResourceKey> = page.items.iter().map(|c| c.key.clone()).collect();
        let latest = store
            .latest_changes(&s.name, &keys, Timestamp(pos.bound))
            .await?;
        let seen = page
            .items
            .iter()
            .map(|c| walk::Seen {
                at: (c.datetime.0, c.id),
                newest: latest.get(&c.key) == Some(&(c.datetime, c.id)),
                wanted: sub.is_none_or(|want| Self::in_subset(&origin::specs_of(&c.meta.ln), want)),
            })
            .collect();
        Ok((page.items, seen, page.next.is_none()))
    }

    /// The items of the changes `taken` from set `s`: each resource as it is now (read in one
    /// store call; none for a deletion).
    async fn items_of(
        &self,
        s: &OaiSet,
        taken: &[&crate::model::Change],
    ) -> Result<Vec<Item>, StoreError> {
        let live_keys: Vec<ResourceKey> = taken
            .iter()
            .filter(|c| c.change != ChangeType::Deleted)
            .map(|c| c.key.clone())
            .collect();
        let now = self
            .ctx
            .store()
            .resources_by_key(&s.name, &live_keys)
            .await?;
        let mut now: HashMap<ResourceKey, crate::model::Resource> = live_keys
            .into_iter()
            .zip(now)
            .filter_map(|(k, r)| Some((k, r?)))
            .collect();
        Ok(taken
            .iter()
            .map(|c| {
                let r = now.remove(&c.key);
                self.item(s, &c.key, c.datetime.floor_secs(), r, &c.meta.ln)
            })
            .collect())
    }

    /// The kept page's file, open, when the page is still what the list bounded by `bound`
    /// would make there; `None` when it is not (or cannot be read: then it is forgotten).
    async fn still(
        &self,
        lists: &Arc<cache::ListCache>,
        key: &str,
        set: &SetName,
        e: &Arc<cache::Entry>,
        bound: i64,
    ) -> Result<Option<std::fs::File>, StoreError> {
        let store = self.ctx.store();
        let made = e.bound();
        // Whether a change is dated between the page's bound and the list's, either way round.
        let dated_between = || async {
            let (lo, hi) = (bound.min(made), bound.max(made));
            let page = store
                .changes(set, Timestamp(lo), Some(Timestamp(hi)), None, 1)
                .await?;
            Ok::<_, StoreError>(!page.items.is_empty())
        };
        if bound < made && dated_between().await? {
            // A list older than the page holds a change dated in between.
            return Ok(None);
        }
        // What the store recorded since the page was read, dated before either bound (never
        // the clock: the rules let a writer date a change back into the page's stretch).
        let recorded = store
            .earliest_recorded_after(set, e.mark, Timestamp(made.max(bound)))
            .await?;
        if recorded.is_some_and(|dt| dt.0 <= e.next_after.0) {
            // Dated into (or before) the stretch the page covers: it is made again.
            return Ok(None);
        }
        // Changes since, after the stretch: each of the page's resources must still have the
        // newest change it holds (its keys are read from the file opened to send it). So must
        // they for a list bounded later than the page's, when a change is dated in between:
        // one recorded before the page was read but dated after its bound (on arrival, while a
        // walk begun earlier went on) is no change "since", yet supersedes a record it holds.
        let check = recorded.is_some() || (bound > made && dated_between().await?);
        let page = e.clone();
        let opened = tokio::task::spawn_blocking(move || {
            let mut f = page.open()?;
            let keys = if check {
                Some(page.keys(&mut f)?)
            } else {
                None
            };
            Ok::<_, std::io::Error>((f, keys))
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        let Ok((file, keys)) = opened else {
            lists.forget(key);
            return Ok(None);
        };
        if let Some(keys) = keys {
            let resource_keys: Vec<ResourceKey> = keys
                .iter()
                .map(|(k, _, _)| ResourceKey(k.clone()))
                .collect();
            let latest = store
                .latest_changes(set, &resource_keys, Timestamp(bound))
                .await?;
            let moved = keys
                .iter()
                .zip(&resource_keys)
                .any(|((_, dt, id), k)| latest.get(k) != Some(&(Timestamp(*dt), *id)));
            if moved {
                return Ok(None);
            }
            e.seen_at(bound);
        }
        Ok(Some(file))
    }

    /// How long after its datetime a change may still become visible (µs): the store's own
    /// lag, or `notify.hold_back_secs` when the operator says writers may be later.
    fn visibility_lag(&self) -> i64 {
        let hold_back = self.ctx.config().notify.hold_back_secs as i64 * 1_000_000;
        self.ctx.store().visibility_lag_micros().max(hold_back)
    }

    /// A weak validator of the answer to `pairs` and when what it depends on last changed:
    /// the same while no served set changed (two such answers differ only in their
    /// `responseDate` and, on a list's first page, in the bound its token carries, and a
    /// harvester continuing with either gets the same records).
    pub async fn validator(
        &self,
        pairs: &[(String, String)],
    ) -> Result<(String, Timestamp), StoreError> {
        use sha2::Digest as _;
        let config = self.ctx.config();
        let mut h = sha2::Sha256::new();
        let mut sorted: Vec<&(String, String)> = pairs.iter().collect();
        sorted.sort();
        for (k, v) in sorted {
            for part in [k.as_bytes(), b"=", v.as_bytes(), b"&"] {
                h.update(part);
            }
        }
        let about = serde_json::json!([env!("CARGO_PKG_VERSION"), config.base_url(), config.oai]);
        h.update(about.to_string().as_bytes());
        let mut newest = Timestamp(0);
        for s in self.sets().await? {
            h.update(format!("|{}:{}", s.name, s.format.metadata_prefix).as_bytes());
            if let Some(c) = &s.collected {
                // Its repository's sets and their names (ListSets), and what provenance says.
                h.update(format!("{:?}", (&c.base_url, &c.facts)).as_bytes());
            }
            if let Some(c) = self.ctx.store().latest_change(&s.name).await? {
                h.update(format!(":{}:{}", c.datetime.0, c.id).as_bytes());
                newest = newest.max(c.datetime);
            }
        }
        let mut tag = crate::digest::hex_digest(h.finalize());
        tag.truncate(32);
        Ok((tag, newest))
    }

    /// Answers one request (the pairs of its query or form).
    pub async fn answer(&self, pairs: &[(String, String)]) -> Result<Answer, Failure> {
        let config = self.ctx.config();
        let base = format!("{}/oai", config.base_url());
        let req = match parse_request(pairs) {
            Ok(r) => r,
            Err(e) => return Ok(Answer::Text(write::error(&base, None, &e))),
        };
        let fail = |e: OaiError| Ok(Answer::Text(write::error(&base, Some(&req), &e)));
        match req.verb {
            Verb::Identify => {
                let earliest = self.earliest().await?;
                Ok(Answer::Text(write::identify(
                    &base,
                    &req,
                    &config.oai,
                    earliest,
                )))
            }
            Verb::ListSets => {
                if req.args.contains_key("resumptionToken") {
                    return fail(err(
                        "badResumptionToken",
                        "ListSets is answered whole: it has no tokens",
                    ));
                }
                let sets = self.sets().await?;
                Ok(Answer::Text(write::list_sets(&base, &req, &sets)))
            }
            Verb::ListMetadataFormats => {
                let formats = match req.args.get("identifier") {
                    Some(id) => match self.find(id).await? {
                        Some((_, set)) => Self::formats(&set),
                        None => return fail(err("idDoesNotExist", format!("no item {id:?}"))),
                    },
                    None => {
                        let mut all = vec![OaiFormat::oai_dc()];
                        for s in self.sets().await? {
                            if !all
                                .iter()
                                .any(|f| f.metadata_prefix == s.format.metadata_prefix)
                            {
                                all.push(s.format);
                            }
                        }
                        all
                    }
                };
                Ok(Answer::Text(write::list_metadata_formats(
                    &base, &req, &formats,
                )))
            }
            Verb::GetRecord => {
                let id = &req.args["identifier"];
                let prefix = &req.args["metadataPrefix"];
                let Some((item, set)) = self.find(id).await? else {
                    return fail(err("idDoesNotExist", format!("no item {id:?}")));
                };
                if !Self::formats(&set)
                    .iter()
                    .any(|f| &f.metadata_prefix == prefix)
                {
                    return fail(err(
                        "cannotDisseminateFormat",
                        format!("the item is not available as {prefix:?}"),
                    ));
                }
                match write::get_record(&base, &req, &item, prefix, &set.format).await {
                    Ok(t) => Ok(Answer::Text(t)),
                    Err(e) => fail(e),
                }
            }
            Verb::ListIdentifiers | Verb::ListRecords => {
                let page_size = config.oai.page_size;
                // A new list's bound is now: the batches being applied are waited for before
                // a build slot is taken (the list waits again, briefly, for those dated up to
                // its bound). A token's bound is older.
                if !req.args.contains_key("resumptionToken") {
                    self.ctx.store().settle(Timestamp::now()).await;
                }
                // A page is made on the documents' bounded build slots, held until it is
                // written out.
                let slot = self.ctx.build_slot().await?;
                let sets = self.sets().await?;
                match self.list(&req, page_size, &sets).await? {
                    Ok(page) => {
                        let formats = sets
                            .into_iter()
                            .map(|s| (s.name.to_string(), s.format))
                            .collect();
                        Ok(Answer::Stream(write::list(base, req, page, formats, slot)))
                    }
                    Err(e) => fail(e),
                }
            }
        }
    }
}
