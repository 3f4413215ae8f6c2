//! The collectors in the admin API (`/admin/v1/collect…`): each one's window, runs, counters,
//! quarantine and last error, and the actions run now, reconcile now, pause and resume.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use utoipa::ToSchema;

use super::guard::{authorize, ErrorBody};
use crate::collect::state::{Control, Counts, Identified, QuarantineEntry, RunPoint, Saved};
use crate::collect::{Action, Entry, Live};
use crate::error::AppError;
use crate::http::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin/v1/collect", get(list_collectors))
        .route("/admin/v1/collect/{name}", get(show_collector))
        .route("/admin/v1/collect/{name}/audit", get(audit))
        .route("/admin/v1/collect/{name}/{action}", post(act))
}

/// A collector as the admin API shows it.
#[derive(Serialize, ToSchema)]
pub struct CollectorView {
    /// The resource set it feeds (its `[collect.NAME]`).
    pub name: String,
    pub url: String,
    /// What the source is (`oai-pmh`, `resourcesync`, `activity`, `sitemap`): configured, or
    /// discovered; absent until discovery has run.
    pub kind: Option<String>,
    /// What discovery found at `url`, what it chose and why (a collector without `kind`).
    pub discovered: Option<crate::collect::discover::Discovered>,
    pub metadata_prefix: String,
    /// The OAI set harvested, if not the whole repository.
    pub oai_set: Option<String>,
    pub interval_secs: u64,
    /// `running`, `waiting` (a 503's Retry-After is waited out until `waiting_until`), `idle`,
    /// `paused`, `stopped` (a 401/403 until resumed) or `elsewhere` (another process holds it).
    pub state: String,
    /// While `waiting`: until when (RFC 3339).
    pub waiting_until: Option<String>,
    pub live: Live,
    /// The next run's window start: the `responseDate` at the start of the last complete run.
    pub window_from: Option<String>,
    /// The run under way (or interrupted), with its checkpoint.
    pub run: Option<RunPoint>,
    pub identify: Option<Identified>,
    pub last_started: Option<String>,
    pub last_ended: Option<String>,
    pub last_outcome: Option<String>,
    pub last_error: Option<String>,
    /// Why it stopped itself, when it did.
    pub stopped: Option<String>,
    pub last: Counts,
    pub totals: Counts,
    /// Records quarantined in all (the newest are listed in the detail).
    pub quarantined: u64,
    pub last_reconcile: Option<String>,
    pub last_reconcile_deleted: u64,
    pub control: Control,
}

/// One collector with its quarantined records (the newest first).
#[derive(Serialize, ToSchema)]
pub struct CollectorDetail {
    #[serde(flatten)]
    pub collector: CollectorView,
    pub quarantine: Vec<QuarantineEntry>,
    /// A ResourceSync source: where the harvest engine stands with it (`harvest status`:
    /// sets, positions, queue, refusals, subscriptions), when this process follows it.
    pub following: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct CollectorList {
    pub collectors: Vec<CollectorView>,
}

#[derive(Serialize, ToSchema)]
pub struct CollectAccepted {
    pub name: String,
    pub action: String,
    pub control: Control,
    pub message: String,
}

/// A collector's state in one word, and until when it waits out a `Retry-After` (the admin
/// API, the CLI and the console say the same).
pub(in crate::http) fn state_of(
    e: &Entry,
    saved: &Saved,
    control: &Control,
) -> (&'static str, Option<String>) {
    let live = e.live();
    let resumed = saved
        .stopped
        .as_ref()
        .is_none_or(|(_, r)| control.resumes > *r);
    let waiting = live
        .doing
        .as_ref()
        .and_then(|_| e.collector.waiting_until());
    let state = if let Some(until) = waiting {
        return ("waiting", Some(until.to_string()));
    } else if live.doing.is_some() {
        "running"
    } else if control.paused {
        "paused"
    } else if !resumed {
        "stopped"
    } else if !live.held_here {
        "elsewhere"
    } else {
        "idle"
    };
    (state, None)
}

pub(in crate::http) fn view(e: &Entry, saved: &Saved, control: Control) -> CollectorView {
    let c = e.collector.config();
    let live = e.live();
    let (state, waiting_until) = state_of(e, saved, &control);
    CollectorView {
        name: e.collector.name.to_string(),
        url: c.url.clone(),
        kind: e
            .collector
            .kind_known(saved)
            .map(|k| k.as_str().to_string()),
        discovered: saved.discovered.clone(),
        metadata_prefix: c.metadata_prefix.clone(),
        oai_set: c.set.clone(),
        interval_secs: c.interval_secs,
        state: state.into(),
        waiting_until,
        live,
        window_from: saved.from.clone(),
        run: saved.run.clone(),
        identify: saved.identify.clone(),
        last_started: saved.last_started.clone(),
        last_ended: saved.last_ended.clone(),
        last_outcome: saved.last_outcome.clone(),
        last_error: saved.last_error.clone(),
        stopped: saved
            .stopped
            .as_ref()
            .filter(|(_, r)| control.resumes <= *r)
            .map(|(w, _)| w.clone()),
        last: saved.last,
        totals: saved.totals,
        quarantined: saved.totals.quarantined,
        last_reconcile: saved.last_reconcile.clone(),
        last_reconcile_deleted: saved.last_reconcile_deleted,
        control,
    }
}

fn entry(
    st: &AppState,
    p: Result<Path<String>, PathRejection>,
) -> Result<&std::sync::Arc<Entry>, AppError> {
    let Path(name) = p.map_err(|e| AppError::BadRequest(e.body_text()))?;
    st.collectors.get(&name).ok_or_else(|| {
        AppError::NotFound(format!(
            "no collector {name:?}: collectors are the [collect.NAME] tables of the configuration"
        ))
    })
}

#[utoipa::path(get, path = "/admin/v1/collect", responses(
    (status = 200, body = CollectorList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)")))]
pub async fn list_collectors(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<CollectorList>, AppError> {
    authorize(&st, &headers)?;
    let mut collectors = Vec::new();
    for e in st.collectors.entries() {
        let (saved, control) = e.collector.status().await?;
        collectors.push(view(e, &saved, control));
    }
    Ok(Json(CollectorList { collectors }))
}

#[utoipa::path(get, path = "/admin/v1/collect/{name}", params(("name" = String, Path, description = "The collector (and resource set) name")), responses(
    (status = 200, body = CollectorDetail), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody)))]
pub async fn show_collector(
    State(st): State<AppState>,
    headers: HeaderMap,
    p: Result<Path<String>, PathRejection>,
) -> Result<Json<CollectorDetail>, AppError> {
    authorize(&st, &headers)?;
    let e = entry(&st, p)?;
    let (saved, control) = e.collector.status().await?;
    let following = match e.collector.engine() {
        Some(engine) if engine.is_running(e.collector.name.as_str()) => {
            let url = e.collector.source_url(&saved);
            Some(
                engine
                    .status(&e.collector.engine_source(&url))
                    .await
                    .unwrap_or_else(|err| format!("cannot read the engine's state: {err:#}")),
            )
        }
        _ => None,
    };
    Ok(Json(CollectorDetail {
        collector: view(e, &saved, control),
        quarantine: saved.quarantine.iter().rev().cloned().collect(),
        following,
    }))
}

/// A ResourceSync collector's audit, as `harvest audit` says it.
#[derive(Serialize, ToSchema)]
pub struct CollectAudit {
    pub name: String,
    /// Whether the set holds every resource the source's Resource List lists, as listed
    /// (md5 and length; without them, not older than its `lastmod`), and nothing more.
    pub in_sync: bool,
    /// The report: per set of the source, what is listed, missing, different, held but no
    /// longer listed, refused; the last line `IN SYNC` or `NOT IN SYNC`.
    pub report: String,
}

#[utoipa::path(get, path = "/admin/v1/collect/{name}/audit", params(("name" = String, Path, description = "The collector (and resource set) name")), responses(
    (status = 200, body = CollectAudit), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody),
    (status = 409, body = ErrorBody, description = "Not a ResourceSync collector, or not followed by this process")))]
pub async fn audit(
    State(st): State<AppState>,
    headers: HeaderMap,
    p: Result<Path<String>, PathRejection>,
) -> Result<Json<CollectAudit>, AppError> {
    authorize(&st, &headers)?;
    let e = entry(&st, p)?;
    let c = &e.collector;
    let (saved, _) = c.status().await?;
    if c.kind_known(&saved) != Some(crate::config::CollectKind::Resourcesync) {
        return Err(AppError::Conflict(format!(
            "{} is not a ResourceSync collector: an audit reads a source's Resource List; a sitemap's or activity stream's reconcile (POST …/reconcile) fetches every resource again",
            c.name
        )));
    }
    let (Some(engine), true) = (c.engine(), e.live().held_here) else {
        return Err(AppError::Conflict(format!(
            "another process follows {}: ask it (its admin API) for the audit",
            c.name
        )));
    };
    let url = c.source_url(&saved);
    let out = c
        .into_set()
        .map_err(|err| AppError::Busy(crate::cause::chain(&err)))?;
    let (report, in_sync) = engine
        .audit(&c.engine_source(&url), std::sync::Arc::new(out))
        .await
        .map_err(|err| AppError::Busy(format!("the audit could not read the source: {err:#}")))?;
    Ok(Json(CollectAudit {
        name: c.name.to_string(),
        in_sync,
        report,
    }))
}

#[utoipa::path(post, path = "/admin/v1/collect/{name}/{action}", params(
    ("name" = String, Path, description = "The collector (and resource set) name"),
    ("action" = String, Path, description = "`run` (an incremental run now), `reconcile` (a reconcile pass now), `pause` or `resume`")),
    responses((status = 202, body = CollectAccepted), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody)))]
pub async fn act(
    State(st): State<AppState>,
    headers: HeaderMap,
    p: Result<Path<(String, String)>, PathRejection>,
) -> Result<(StatusCode, Json<CollectAccepted>), AppError> {
    authorize(&st, &headers)?;
    let Path((name, action)) = p.map_err(|e| AppError::BadRequest(e.body_text()))?;
    let e = entry(&st, Ok(Path(name.clone())))?;
    let (a, message) = match action.as_str() {
        "run" => (
            Action::Run,
            "an incremental run starts as soon as the collector is free",
        ),
        "reconcile" => (
            Action::Reconcile,
            "a reconcile pass starts as soon as the collector is free",
        ),
        "pause" => (
            Action::Pause,
            "paused: the run under way stops after its page and nothing runs until resumed",
        ),
        "resume" => (
            Action::Resume,
            "resumed: an interrupted run goes on where it stopped",
        ),
        other => {
            return Err(AppError::NotFound(format!(
                "no action {other:?}: run, reconcile, pause or resume"
            )))
        }
    };
    let control = st.collectors.ask(e.collector.name.as_str(), a).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(CollectAccepted {
            name,
            action,
            control,
            message: message.into(),
        }),
    ))
}
