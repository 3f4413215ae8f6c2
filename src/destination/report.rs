//! What the operator reads: `harvest status`, `harvest audit`, and the Ingestion 3 commands
//! (`snapshot`, `recreate`).

use std::collections::HashSet;
use std::sync::Arc;

use super::config::{self, HarvestConfig};
use super::documents::entry_change;
use super::output;
use super::scope::{self, short};
use super::state::{self, ChangeType, Standing, State};
use super::{Harvester, Parts};
use crate::model::Timestamp;

/// The Ingestion 3 archives of the sources `only` names (every source when `None`).
pub(super) fn ingestion3(
    cfg: &HarvestConfig,
    only: Option<&str>,
) -> anyhow::Result<Vec<Arc<output::ingestion3::Ingestion3>>> {
    if cfg.output.kind != config::OutputKind::Ingestion3 {
        anyhow::bail!("this works on the Ingestion 3 archive: set output.kind = \"ingestion3\"");
    }
    chosen(cfg, only)?
        .iter()
        .map(|s| {
            Ok(Arc::new(output::ingestion3::Ingestion3::open(
                &cfg.for_source(s),
            )?))
        })
        .collect()
}

/// `harvest snapshot [--source NAME]`: a new complete snapshot of each provider's archive
/// now (a JSON report per line).
pub async fn snapshot(cfg: &HarvestConfig, only: Option<&str>) -> anyhow::Result<String> {
    let mut lines = Vec::new();
    for out in ingestion3(cfg, only)? {
        let r = tokio::task::spawn_blocking(move || out.snapshot()).await??;
        lines.push(serde_json::to_string(&r)?);
    }
    Ok(lines.join("\n"))
}

/// `harvest recreate --at T [--source NAME]`: the provider's record set as of `at`, as a new
/// activity.
pub async fn recreate(
    cfg: &HarvestConfig,
    at: Timestamp,
    only: Option<&str>,
) -> anyhow::Result<String> {
    if only.is_none() && cfg.sources.len() > 1 {
        anyhow::bail!(
            "several sources archive here: say which with --source ({})",
            cfg.sources
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let out = ingestion3(cfg, only)?.remove(0);
    let r = tokio::task::spawn_blocking(move || out.recreate(at)).await??;
    Ok(serde_json::to_string(&r)?)
}

/// `harvest status`: position, lag, subscription, queue, failures and refusals, as text.
pub fn status(cfg: &HarvestConfig) -> anyhow::Result<String> {
    status_of(cfg, None)
}

/// `harvest status [--source NAME]`: [`status`] of one source, or of every source.
pub fn status_of(cfg: &HarvestConfig, only: Option<&str>) -> anyhow::Result<String> {
    status_in(cfg, &open_state(cfg)?, only)
}

/// The harvest state, which must exist (a harvester has run).
fn open_state(cfg: &HarvestConfig) -> anyhow::Result<State> {
    let db = cfg.database_path();
    if !db.exists() {
        anyhow::bail!(
            "no harvest state at {} (state.dir): nothing harvested yet",
            db.display()
        );
    }
    Ok(State::open(&db)?)
}

/// [`status_of`] read from `state`.
pub(super) fn status_in(
    cfg: &HarvestConfig,
    state: &State,
    only: Option<&str>,
) -> anyhow::Result<String> {
    let mut out = open_files(cfg);
    let all_sets = state.sets()?;
    let sources = chosen(cfg, only)?;
    if !cfg.sources.is_empty() && only.is_none() {
        out.push_str(&summary(state, &sources, &all_sets)?);
        return Ok(out);
    }
    let shares = shares(&cfg.source_list());
    let mut sets = Vec::new();
    for source in &sources {
        if source.name.is_empty() {
            out.push_str(&format!("source {}\n", source.url));
        } else {
            out.push_str(&format!("source {} ({})\n", source.name, source.url));
        }
        if let Some(share) = shares.get(&source.name).filter(|_| cfg.sources.len() > 1) {
            out.push_str(&format!(
                "  share:            {} of the walks when every source wants one (weight {})\n",
                percent(*share),
                source.weight
            ));
        }
        match state.source_failing(&source.name)? {
            Some((e, since)) => out.push_str(&format!(
                "  reachable:        NO, failing since {since}: {e}\n"
            )),
            None => out.push_str("  reachable:        yes\n"),
        }
        for s in all_sets.iter().filter(|s| s.source == source.name) {
            sets.push(s.clone());
            let f = set_facts(state, s)?;
            out.push_str(&format!(
            "set {}\n  capability list:  {}\n  baseline:         {}\n  position:         {}\n  newest at source: {}\n  lag:              {}\n  resources held:   {}\n  changes applied:  {}\n  pending:          {}\n  last check:       {}\n  last push:        {}\n",
            f.name,
            f.capability,
            f.baseline,
            f.position.as_deref().unwrap_or("-"),
            f.newest_at_source.as_deref().unwrap_or("-"),
            f.lag,
            f.held,
            f.applied,
            f.pending,
            f.last_check.as_deref().unwrap_or("-"),
            f.last_push.as_deref().unwrap_or("-"),
        ));
            if let Some(e) = &f.last_error {
                out.push_str(&format!("  last error:       {e}\n"));
            }
            match &f.subscription {
                Some(sub) => {
                    out.push_str(&format!(
                        "  subscription:     {} at {} (topic {}, callback {}, lease until {})\n",
                        sub.state,
                        sub.hub,
                        sub.topic,
                        sub.callback,
                        sub.lease_until.as_deref().unwrap_or("-"),
                    ));
                    if let Some(r) = &sub.no_push_because {
                        out.push_str(&format!("  no push because:  {r}\n"));
                    }
                }
                None => out.push_str("  subscription:     none\n"),
            }
        }
    }
    let problems = state.problems()?;
    if !problems.is_empty() {
        out.push_str("\nnot applied yet:\n");
        for (_, p) in problems {
            let what = match p.standing {
                Standing::Skipped => "SKIPPED",
                Standing::Failed => "FAILED",
                Standing::Trying => "retrying",
            };
            out.push_str(&format!(
                "  {what:8} {} {} {} (tries {}): {}\n",
                p.change.change.as_str(),
                short(&p.change.uri),
                p.change.datetime,
                p.tries,
                short(&p.last_error.unwrap_or_default())
            ));
        }
    }
    for source in sources
        .iter()
        .filter(|_| cfg.output.kind == config::OutputKind::Ingestion3)
    {
        let (n, first) = output::ingestion3::not_archived(&cfg.for_source(source), 10)?;
        if n > 0 {
            out.push_str(&format!(
                "\nnot archived{} ({n}; listed in the next snapshot's _LOGS/skipped.csv):\n",
                if source.name.is_empty() {
                    String::new()
                } else {
                    format!(" from {}", source.name)
                }
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
    let (waiting, bytes) = state.inbox_size()?;
    if waiting > 0 {
        out.push_str(&format!(
            "deliveries waiting to be applied: {waiting} ({bytes} bytes; push.max_queued_bytes)\n"
        ));
    }
    let foreign = state.counter("foreign")?;
    if foreign > 0 {
        out.push_str(&format!(
            "callback requests for another harvester: {foreign} (two harvesters share one callback URL: give each its own push.listen and push.callback_url)\n"
        ));
    }
    Ok(out)
}

/// One set as `harvest status` and the console's source page show it.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct SetFacts {
    pub name: String,
    pub capability: String,
    /// `done` or `not finished`.
    pub baseline: String,
    pub position: Option<String>,
    pub newest_at_source: Option<String>,
    pub lag: String,
    pub held: u64,
    pub applied: u64,
    pub pending: u64,
    pub last_check: Option<String>,
    pub last_push: Option<String>,
    pub last_error: Option<String>,
    pub subscription: Option<SubscriptionFacts>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct SubscriptionFacts {
    pub state: String,
    pub hub: String,
    pub topic: String,
    pub callback: String,
    pub lease_until: Option<String>,
    pub no_push_because: Option<String>,
}

/// What the state says of set `s`.
pub(crate) fn set_facts(state: &State, s: &state::SetRow) -> anyhow::Result<SetFacts> {
    let lag = match (s.source_latest, s.position) {
        (Some(l), Some(p)) if l >= p => format!("{:.1} s", (l.0 - p.0) as f64 / 1e6),
        (Some(_), Some(_)) => "0 s (up to date)".into(),
        _ => "unknown".into(),
    };
    let time = |t: Option<crate::model::Timestamp>| t.map(|t| t.to_string());
    Ok(SetFacts {
        name: s.name.clone(),
        capability: s.capability.clone(),
        baseline: if s.baseline_done {
            "done"
        } else {
            "not finished"
        }
        .into(),
        position: time(s.position),
        newest_at_source: time(s.source_latest),
        lag,
        held: state.count_held(s.id)?,
        applied: state.applied_count(s.id)?,
        pending: state.count_pending(s.id)?,
        last_check: time(s.checked_at),
        last_push: time(s.last_push_at),
        last_error: s.last_error.as_deref().map(|e| short(e).into_owned()),
        subscription: state.subscription(s.id)?.map(|sub| SubscriptionFacts {
            state: sub.state.to_string(),
            lease_until: sub
                .verified_at
                .zip(sub.lease_secs)
                .map(|(v, l)| v.plus_secs(l).to_string()),
            no_push_because: sub
                .reason
                .as_deref()
                .map(|r| scope::cut(r, 800).into_owned()),
            hub: sub.hub,
            topic: sub.topic,
            callback: sub.callback,
        }),
    })
}

/// The console's page of source `name`: its `harvest status` (of it alone when the
/// configuration names several sources) and its sets, from one reading of the state.
pub(crate) fn source_page(
    cfg: &HarvestConfig,
    state: &State,
    name: &str,
) -> anyhow::Result<(String, Vec<SetFacts>)> {
    let only = (!cfg.sources.is_empty()).then_some(name);
    let status = status_in(cfg, state, only)?;
    let sets = state
        .sets()?
        .iter()
        .filter(|s| s.source == name)
        .map(|s| set_facts(state, s))
        .collect::<anyhow::Result<_>>()?;
    Ok((status, sets))
}

/// One source as an aggregator's status shows it (a line of `harvest status`, a row of the
/// console).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct SourceRow {
    pub name: String,
    pub url: String,
    pub up: bool,
    pub sets: usize,
    pub baselined: usize,
    /// The oldest position of its sets.
    pub position: Option<String>,
    /// The largest lag of its sets, in seconds.
    pub lag_secs: Option<f64>,
    pub held: u64,
    pub queued: u64,
    /// Its subscriptions' states (`active`, `requested/active`, `-`).
    pub push: String,
    /// Changes given up on or failing past their tries.
    pub failed: usize,
    /// Why it is down, or its sets' last error, in words.
    pub error: Option<String>,
    /// Its share of the walks when every source wants one (its weight over the sum), as
    /// text (`2.1%`).
    pub share: String,
}

/// The rows of `sources` (every source: the shares are of their sum), from the state.
pub(crate) fn source_rows(
    state: &State,
    sources: &[config::NamedSource],
    all_sets: &[state::SetRow],
) -> anyhow::Result<Vec<SourceRow>> {
    let problems = state.problems()?;
    let shares = shares(sources);
    let mut out = Vec::new();
    for source in sources {
        let sets: Vec<&state::SetRow> = all_sets
            .iter()
            .filter(|s| s.source == source.name)
            .collect();
        let failing = state.source_failing(&source.name)?;
        let position = sets.iter().filter_map(|s| s.position).min();
        let lag = sets
            .iter()
            .filter_map(|s| s.source_latest.zip(s.position))
            .map(|(l, p)| (l.0 - p.0).max(0))
            .max();
        let (mut held, mut queued) = (0u64, 0u64);
        let mut push: Vec<String> = Vec::new();
        for s in &sets {
            held += state.count_held(s.id)?;
            queued += state.count_pending(s.id)?;
            let sub = state
                .subscription(s.id)?
                .map_or("none".to_string(), |x| x.state.to_string());
            if !push.contains(&sub) {
                push.push(sub);
            }
        }
        let failed = problems
            .iter()
            .filter(|(set_id, p)| {
                p.standing != Standing::Trying && sets.iter().any(|s| s.id == *set_id)
            })
            .count();
        let error = failing
            .as_ref()
            .map(|(e, since)| format!("DOWN since {since}: {e}"))
            .or_else(|| sets.iter().find_map(|s| s.last_error.clone()));
        out.push(SourceRow {
            share: percent(shares.get(&source.name).copied().unwrap_or(0.0)),
            name: source.name.clone(),
            url: source.url.clone(),
            up: failing.is_none(),
            sets: sets.len(),
            baselined: sets.iter().filter(|s| s.baseline_done).count(),
            position: position.map(|p| p.to_string()),
            lag_secs: lag.map(|l| l as f64 / 1e6),
            held,
            queued,
            push: if push.is_empty() {
                "-".to_string()
            } else {
                push.join("/")
            },
            failed,
            error: error.map(|e| short(&e).into_owned()),
        });
    }
    Ok(out)
}

/// Each source's share of the walks when every source wants one: its weight over the sum.
fn shares(sources: &[config::NamedSource]) -> std::collections::HashMap<String, f64> {
    let sum: f64 = sources.iter().map(|s| f64::from(s.weight)).sum();
    sources
        .iter()
        .map(|s| (s.name.clone(), f64::from(s.weight) / sum.max(1.0)))
        .collect()
}

/// A share as a percentage with the digits it needs (0.02% of 5,000 sources).
fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p >= 10.0 {
        format!("{p:.0}%")
    } else if p >= 0.1 {
        format!("{p:.1}%")
    } else {
        format!("{p:.3}%")
    }
}

/// The limit of open files a harvester started from this shell gets, and how many sources it
/// allows at the configured concurrency (one line; empty where no limit is known).
pub(crate) fn open_files(cfg: &HarvestConfig) -> String {
    let n = cfg.source_list().len();
    let c = cfg.fetch.concurrency;
    match crate::conn::open_files_ceiling() {
        Ok(limit) => format!(
            "open files: limit {limit} (the hard limit) allows {} sources at fetch.concurrency {c}; this configuration has {n}{}\n",
            super::sources_allowed(limit, c),
            if super::too_many_sources(n, c, limit).is_some() { ": TOO MANY, the harvester refuses to start" } else { "" }
        ),
        Err(_) => String::new(),
    }
}

/// One line per source (an aggregator's `harvest status`): reachable or not, its oldest
/// position and largest lag, resources held, changes queued, the subscriptions' states,
/// failures, and the last error in words.
fn summary(
    state: &State,
    sources: &[config::NamedSource],
    all_sets: &[state::SetRow],
) -> anyhow::Result<String> {
    let width = sources.iter().map(|s| s.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for r in source_rows(state, sources, all_sets)? {
        out.push_str(&format!(
            "{:width$}  {}  share {}  sets {}/{} baselined  position {}  lag {}  held {}  queued {}  push {}  failed {}{}\n",
            r.name,
            if r.up { "up  " } else { "down" },
            r.share,
            r.baselined,
            r.sets,
            r.position.as_deref().unwrap_or("-"),
            r.lag_secs.map_or("-".into(), |l| format!("{l:.1} s")),
            r.held,
            r.queued,
            r.push,
            r.failed,
            r.error.map(|e| format!("  {e}")).unwrap_or_default(),
        ));
    }
    out.push_str("(harvest status --source NAME: one source in detail)\n");
    Ok(out)
}

/// A count and the first few of what it counts, for a report.
#[derive(Default)]
pub(super) struct Sample {
    pub(super) n: u64,
    pub(super) first: Vec<String>,
}

impl Sample {
    pub(super) fn add(&mut self, what: String) {
        self.n += 1;
        if self.first.len() < 20 {
            self.first.push(what);
        }
    }

    pub(super) fn list(&self, out: &mut String, what: &str) {
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
    audit_of(cfg, None).await
}

/// The sources `only` names (every source when `None`), or an error listing the names.
fn chosen(cfg: &HarvestConfig, only: Option<&str>) -> anyhow::Result<Vec<config::NamedSource>> {
    let all = cfg.source_list();
    match only {
        None => Ok(all),
        Some(name) => {
            let picked: Vec<_> = all.iter().filter(|s| s.name == name).cloned().collect();
            if picked.is_empty() {
                anyhow::bail!(
                    "no source named {name:?}; the configuration has: {}",
                    all.iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            Ok(picked)
        }
    }
}

/// `harvest audit [--source NAME]`: [`audit`] of one source, or of every source.
pub async fn audit_of(cfg: &HarvestConfig, only: Option<&str>) -> anyhow::Result<(String, bool)> {
    audit_with(
        &Parts::open(cfg, false, Default::default())?,
        cfg,
        only,
        None,
    )
    .await
}

/// [`audit_of`] on a process's parts (the running harvester's, for its console: its fetch
/// limits and its state); `given`: the output audited (the embedded engine's), else each
/// source's own.
pub(crate) async fn audit_with(
    parts: &Arc<Parts>,
    cfg: &HarvestConfig,
    only: Option<&str>,
    given: Option<Arc<dyn super::Output>>,
) -> anyhow::Result<(String, bool)> {
    let sources = chosen(cfg, only)?;
    let mut out = String::new();
    let mut in_sync = true;
    let many = !cfg.sources.is_empty();
    for source in &sources {
        let h = Harvester::new(cfg, source, String::new(), parts, given.clone())?;
        if many {
            out.push_str(&format!("source {} ({}):\n", source.name, source.url));
        }
        let output = h.output().clone();
        let mut auditor = tokio::task::spawn_blocking(move || output.auditor()).await??;
        let sets = match h.discover().await {
            Ok(s) => s,
            Err(e) if many => {
                in_sync = false;
                out.push_str(&format!("  cannot read it: {}\n", short(&format!("{e:#}"))));
                continue;
            }
            Err(e) => return Err(e),
        };
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
                loop {
                    // A batch of entries, looked up in the state in one trip.
                    let mut batch = Vec::with_capacity(256);
                    while batch.len() < 256 {
                        let Some(e) = r.next_entry()? else { break };
                        let c = entry_change(&e, ChangeType::Created, Timestamp(0));
                        let uri = short(&c.uri).into_owned();
                        if let Err(why) = h.fetcher().scope().check(&c.uri) {
                            refused.add(format!("{uri}: {why}"));
                            continue;
                        }
                        if docs.contains(&c.uri) {
                            refused.add(format!("{uri}: a list document, listed as a resource"));
                            continue;
                        }
                        let target = match h.output().target(&c.uri) {
                            Ok(Some((root, t))) => {
                                Some((root.display().to_string(), t.display().to_string()))
                            }
                            _ => None,
                        };
                        batch.push((c, target));
                    }
                    if batch.is_empty() {
                        break;
                    }
                    let set_id = s.row.id;
                    let looked = h
                        .state()
                        .run(move |st| {
                            batch
                                .into_iter()
                                .map(|(c, target)| {
                                    let other = match &target {
                                        Some((root, t)) => st.claim_conflict(root, t, &c.uri)?,
                                        None => None,
                                    };
                                    let held = match c.md5 {
                                        None => st.held(set_id, &c.uri)?,
                                        Some(_) => None,
                                    };
                                    Ok((c, other, held))
                                })
                                .collect::<Result<Vec<_>, _>>()
                        })
                        .await?;
                    for (c, other, held) in looked {
                        let uri = short(&c.uri).into_owned();
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
                                    && held.as_ref().is_some_and(|held| c.newer_than(held))
                                {
                                    differ.add(format!("{uri} (the list's lastmod is newer than the copy's; it has no md5 to compare)"));
                                }
                            }
                        }
                        listed.insert(c.uri);
                    }
                }
            }
            // The mirror: what the harvester's record holds for this set. (The archive tells
            // what it holds itself, over all sets, below.)
            let mut extra = Sample::default();
            if cfg.output.kind == config::OutputKind::Mirror {
                let set_id = s.row.id;
                for u in h.state().run(move |st| st.held_uris(set_id)).await? {
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
    }
    out.push_str(if in_sync {
        "IN SYNC\n"
    } else {
        "NOT IN SYNC\n"
    });
    Ok((out, in_sync))
}
