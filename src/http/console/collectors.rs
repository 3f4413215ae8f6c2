//! The collectors in the console: each one's true state (running, waiting out a Retry-After
//! until when, idle until its next run, paused, stopped and why, held by another process),
//! its last run, its quarantined records, and "Run now" / "Resume", confirmed and guarded by
//! the session's CSRF token. The overview lists the ones needing a look.

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::json;

use super::{bad, posted, render, session, ConsoleError, LIVE_SECS};
use crate::collect::Action;
use crate::http::admin::collect::{view, CollectorView};
use crate::http::AppState;

/// A collector as the console shows it: the admin API's view, its state in words, whether it
/// needs a look, and what an admin can do now.
fn row(v: &CollectorView) -> serde_json::Value {
    let failing = v
        .last_outcome
        .as_deref()
        .is_some_and(|o| o.starts_with("failed"));
    let words = match v.state.as_str() {
        "running" => "running now".to_string(),
        "waiting" => "waiting out the repository's Retry-After".to_string(),
        "paused" => "paused by an admin".to_string(),
        "stopped" => format!(
            "stopped: {}",
            v.stopped
                .as_deref()
                .unwrap_or("the repository refused access")
        ),
        "elsewhere" => "held by another process of this server".to_string(),
        _ => "idle until its next run".to_string(),
    };
    json!({
        "name": v.name, "url": v.url, "state": v.state, "words": words,
        "waiting_until": v.waiting_until, "next_run": v.live.next_run,
        "last_ended": v.last_ended, "last_outcome": v.last_outcome, "last_error": v.last_error,
        "failing": failing, "quarantined": v.quarantined,
        "needs_look": failing || matches!(v.state.as_str(), "stopped" | "waiting" | "paused"),
        "can_run": matches!(v.state.as_str(), "idle" | "elsewhere"),
        "can_resume": matches!(v.state.as_str(), "stopped" | "paused"),
        "identify": v.identify, "last": v.last, "totals": v.totals,
        "window_from": v.window_from, "last_reconcile": v.last_reconcile,
        "kind": v.kind, "discovered": v.discovered,
    })
}

/// Every collector, as rows.
pub(super) async fn rows(st: &AppState) -> Result<Vec<serde_json::Value>, ConsoleError> {
    let mut out = Vec::new();
    for e in st.collectors.entries() {
        let (saved, control) = e.collector.status().await?;
        out.push(row(&view(e, &saved, control)));
    }
    Ok(out)
}

pub(super) async fn list(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ConsoleError> {
    let s = session(&st, &headers).await?;
    Ok(render(
        "collectors.html",
        json!({
            "title": "Collectors", "nav": "collectors", "signed_in": true, "csrf": s.csrf,
            "live": LIVE_SECS, "collectors": rows(&st).await?,
        }),
    ))
}

#[derive(Deserialize)]
pub(super) struct ShowQuery {
    #[serde(default)]
    done: String,
}

pub(super) async fn show(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    q: Result<axum::extract::Query<ShowQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ConsoleError> {
    let s = session(&st, &headers).await?;
    let e = st
        .collectors
        .get(&name)
        .ok_or_else(|| bad(StatusCode::NOT_FOUND, format!("no collector {name:?}")))?;
    let (saved, control) = e.collector.status().await?;
    let origin = crate::collect::map::Origin {
        base_url: e.collector.config().url.clone(),
        metadata_prefix: e.collector.config().metadata_prefix.clone(),
    };
    let quarantine: Vec<serde_json::Value> = saved
        .quarantine
        .iter()
        .rev()
        .map(|q| {
            json!({
                "identifier": q.identifier, "reason": q.reason, "at": q.at,
                "record": q.identifier.as_deref().map(|i| origin.get_record_url(i)),
            })
        })
        .collect();
    let done = match q.map(|q| q.0.done).unwrap_or_default().as_str() {
        "run" => Some("A run was asked for: it starts within seconds."),
        "resume" => Some("The collector was resumed: it runs again."),
        _ => None,
    };
    Ok(render(
        "collector.html",
        json!({
            "title": format!("Collector {name}"), "nav": "collectors", "signed_in": true,
            "csrf": s.csrf, "live": LIVE_SECS, "c": row(&view(e, &saved, control)),
            "quarantine": quarantine, "done": done,
        }),
    ))
}

#[derive(Deserialize)]
pub(super) struct ActForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    confirm: String,
}

/// "Run now" or "Resume": a page asking to confirm, then the request recorded (where the
/// process holding the collector sees it) and back to the collector's page.
pub(super) async fn act(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path((name, action)): Path<(String, String)>,
    form: Result<Form<ActForm>, axum::extract::rejection::FormRejection>,
) -> Result<Response, ConsoleError> {
    let Form(f) = form.map_err(|e| bad(StatusCode::BAD_REQUEST, e.body_text()))?;
    let s = posted(&st, &headers, &f.csrf).await?;
    if st.collectors.get(&name).is_none() {
        return Err(bad(StatusCode::NOT_FOUND, format!("no collector {name:?}")));
    }
    let (what, button, asked) = match action.as_str() {
        "run" => (
            format!("Run collector {name} now (an incremental run from its window)?"),
            "Run now",
            Action::Run,
        ),
        "resume" => (
            format!("Resume collector {name}? It runs again at once."),
            "Resume",
            Action::Resume,
        ),
        other => {
            return Err(bad(
                StatusCode::NOT_FOUND,
                format!("{other:?} is not an action (run, resume)"),
            ))
        }
    };
    let here = format!("/console/collectors/{name}");
    if f.confirm != "yes" {
        return Ok(render(
            "confirm.html",
            json!({
                "title": button, "nav": "collectors", "signed_in": true, "csrf": s.csrf,
                "what": what, "button": button, "kind": "",
                "action": format!("{here}/{action}"), "back": here,
                "fields": Vec::<(String, String)>::new(),
            }),
        ));
    }
    st.collectors.ask(&name, asked).await?;
    tracing::info!(collector = %name, action = %action, "console: asked");
    Ok(Redirect::to(&format!("{here}?done={action}")).into_response())
}
