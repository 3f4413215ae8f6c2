//! The harvester's console (`/console/`): one row per source (up or down, a running
//! baseline's progress with an estimate, position, lag, held, queued, push, the last error in
//! words) and a page per source (its sets as a table, its whole `harvest status`, the last
//! audit and a button to run one),
//! refreshed while open. The same state `harvest status` reads; the same audit `harvest audit`
//! runs.
//!
//! It listens on loopback unless told otherwise (`console.listen`), and then needs a token
//! (`console.token_env`); either way every form carries a CSRF token of a signed session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Form, Path, State as AxState};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::json;

use super::config::{self, HarvestConfig};
use super::Parts;
use crate::model::Timestamp;
use crate::ui;

const COOKIE: &str = "rshub_harvest_console";
const LIVE_SECS: u32 = 2;

fn pages() -> &'static ui::Pages {
    static PAGES: std::sync::OnceLock<ui::Pages> = std::sync::OnceLock::new();
    PAGES.get_or_init(|| {
        ui::Pages::new(
            &[
                ("sources.html", include_str!("sources.html")),
                ("source.html", include_str!("source.html")),
            ],
            json!({
                "brand": "resourcesync-hub harvest",
                "nav_items": [{"key": "sources", "href": "/console/", "label": "Sources"}],
            }),
        )
    })
}

/// An audit's outcome.
#[derive(Clone, serde::Serialize)]
struct Audit {
    at: String,
    in_sync: bool,
    verdict: String,
    report: String,
}

/// What the console's handlers share.
pub(super) struct Console {
    cfg: HarvestConfig,
    parts: Arc<Parts>,
    sessions: ui::Sessions,
    /// The sign-in token, when the console is reachable from other hosts.
    token: Option<String>,
    /// Wrong sign-in tokens per client address.
    guesses: ui::Guesses,
    /// Per source: its audits.
    audits: Mutex<HashMap<String, Audits>>,
}

/// A source's audits: the last one's outcome, and when the one running now started.
#[derive(Clone, Default)]
struct Audits {
    last: Option<Audit>,
    running_since: Option<Timestamp>,
}

/// Why a console request got no page of its own.
enum Refusal {
    SignIn,
    Page(StatusCode, String),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::SignIn => Redirect::to("/console/login").into_response(),
            Refusal::Page(status, why) => page_error(status, why),
        }
    }
}

type Ctx = Arc<Console>;

pub(super) fn router(
    cfg: HarvestConfig,
    parts: Arc<Parts>,
    token: Option<String>,
) -> anyhow::Result<Router> {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key)
        .map_err(|e| anyhow::Error::new(e).context("no randomness for the console"))?;
    let ctx = Arc::new(Console {
        cfg,
        parts,
        sessions: ui::Sessions::new(key, COOKIE, false),
        token,
        guesses: Default::default(),
        audits: Default::default(),
    });
    Ok(Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route("/console/", get(sources))
        .route("/console/login", get(login_form).post(login))
        .route("/console/sources/{name}", get(source))
        .route("/console/sources/{name}/audit", post(audit))
        .route("/console/static/{file}", get(asset))
        .layer(axum::middleware::map_response(ui::secure))
        .with_state(ctx))
}

fn page_error(status: StatusCode, why: impl Into<String>) -> Response {
    pages().message(status, &why.into(), "/console/")
}

/// The session of a page request. On loopback without a token, a visitor gets one at once
/// (its cookie travels with the response); with a token, the login form.
fn session(c: &Console, headers: &HeaderMap) -> Result<(ui::Session, Option<String>), Refusal> {
    if let Some(s) = c.sessions.check(headers) {
        return Ok((s, None));
    }
    if c.token.is_some() {
        return Err(Refusal::SignIn);
    }
    if !ui::host_is_direct(headers) {
        return Err(Refusal::Page(
            StatusCode::MISDIRECTED_REQUEST,
            "without a token this console answers only requests to an IP address or localhost (set console.token_env to reach it by name)".into(),
        ));
    }
    let (cookie, s) = c
        .sessions
        .issue()
        .map_err(|e| Refusal::Page(StatusCode::SERVICE_UNAVAILABLE, e))?;
    Ok((s, Some(cookie)))
}

fn with_cookie(r: Response, cookie: Option<String>) -> Response {
    match cookie {
        Some(c) => ([(header::SET_COOKIE, c)], r).into_response(),
        None => r,
    }
}

const TOKEN_LABEL: &str = "Console token (the variable console.token_env names)";

async fn login_form(AxState(c): AxState<Ctx>) -> Response {
    if c.token.is_none() {
        return Redirect::to("/console/").into_response();
    }
    pages().login(StatusCode::OK, TOKEN_LABEL, None)
}

async fn login(
    AxState(c): AxState<Ctx>,
    ext: axum::http::Extensions,
    form: Result<Form<ui::LoginForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let Some(token) = &c.token else {
        return Redirect::to("/console/").into_response();
    };
    let ip = crate::conn::client_ip(&ext);
    let too_many = |wait| pages().too_many_guesses(TOKEN_LABEL, wait);
    if let Err(wait) = c.guesses.check(ip) {
        return too_many(wait);
    }
    let given = form.map(|Form(f)| f.token).unwrap_or_default();
    if !ui::token_matches(&given, token) {
        tracing::warn!("harvest console: a sign-in with a wrong token was refused");
        if let Err(wait) = c.guesses.failed(ip) {
            return too_many(wait);
        }
        return pages().login(
            StatusCode::FORBIDDEN,
            TOKEN_LABEL,
            Some("That is not the console's token."),
        );
    }
    c.sessions
        .signed_in()
        .unwrap_or_else(|e| page_error(StatusCode::SERVICE_UNAVAILABLE, e))
}

/// Reads the running harvester's state (its one handle, on the blocking pool).
async fn read<T: Send + 'static>(
    c: &Ctx,
    f: impl FnOnce(&super::State, &Console) -> anyhow::Result<T> + Send + 'static,
) -> Result<T, Refusal> {
    let console = c.clone();
    c.parts
        .state
        .run_any(move |s| f(s, &console))
        .await
        .map_err(|e| {
            Refusal::Page(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the harvest state cannot be read now: {e:#}"),
            )
        })
}

async fn sources(AxState(c): AxState<Ctx>, headers: HeaderMap) -> Response {
    let (s, cookie) = match session(&c, &headers) {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    let rows = match read(&c, |state, c| {
        let sets = state.sets()?;
        super::report::source_rows(state, &c.cfg.source_list(), &sets)
    })
    .await
    {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    let (mut up, mut down, mut running) = (0, 0, 0);
    // What needs a look first: sources down, then baselines running, then the rest by name.
    let mut rows = rows;
    rows.sort_by_key(|r| {
        (
            r.up,
            c.parts.baselines.of(&r.name).is_empty(),
            r.name.clone(),
        )
    });
    let rows: Vec<serde_json::Value> = rows
        .into_iter()
        .map(|r| {
            if r.up {
                up += 1;
            } else {
                down += 1;
            }
            let baselines: Vec<serde_json::Value> = c
                .parts
                .baselines
                .of(&r.name)
                .into_iter()
                .map(|b| {
                    json!({
                        "set": b.set, "done": b.done, "total": b.total,
                        "left": b.left_secs.map(|l| ui::span(l as f64)),
                    })
                })
                .collect();
            running += baselines.len();
            json!({
                "name": r.name, "up": r.up, "sets": r.sets, "baselined": r.baselined,
                "position": r.position, "lag": r.lag_secs.map_or("—".to_string(), ui::span),
                "held": r.held, "queued": r.queued, "push": r.push, "error": r.error,
                "baselines": baselines, "share": r.share,
            })
        })
        .collect();
    let page = pages().render(
        "sources.html",
        json!({
            "title": "Sources", "nav": "sources", "signed_in": true, "csrf": s.csrf,
            "live": LIVE_SECS, "sources": rows, "up": up, "down": down, "running": running,
            "now": Timestamp::now().to_string(),
            "open_files": super::report::open_files(&c.cfg).trim_end(),
        }),
    );
    with_cookie(page, cookie)
}

/// The configured source named `name` (`""` is the single `[source]`, shown as `-`).
fn named(c: &Console, name: &str) -> Result<config::NamedSource, Refusal> {
    let name = if name == "-" { "" } else { name };
    c.cfg
        .source_list()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| Refusal::Page(StatusCode::NOT_FOUND, format!("no source named {name:?}")))
}

async fn source(
    AxState(c): AxState<Ctx>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let (s, cookie) = match session(&c, &headers) {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    let src = match named(&c, &name) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let only = src.name.clone();
    let (status, sets) = match read(&c, move |state, c| {
        super::report::source_page(&c.cfg, state, &only)
    })
    .await
    {
        Ok(t) => t,
        Err(r) => return r.into_response(),
    };
    let Audits {
        last: audit,
        running_since: started,
    } = c
        .audits
        .lock()
        .expect("audits")
        .get(&src.name)
        .cloned()
        .unwrap_or_default();
    let page = pages().render(
        "source.html",
        json!({
            "title": if src.name.is_empty() { "The source" } else { src.name.as_str() },
            "nav": "sources", "signed_in": true, "csrf": s.csrf, "live": LIVE_SECS,
            "name": if src.name.is_empty() { "-" } else { src.name.as_str() },
            "url": src.url, "status": status, "sets": sets, "audit": audit,
            "audit_running": started.is_some(),
            "audit_started": started.map(|t| t.to_string()),
        }),
    );
    with_cookie(page, cookie)
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

/// Starts an audit of the source (one at a time per source) and goes back to its page, which
/// shows the verdict when it is in.
async fn audit(
    AxState(c): AxState<Ctx>,
    headers: HeaderMap,
    Path(name): Path<String>,
    form: Result<Form<CsrfForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let csrf = form.map(|Form(f)| f.csrf).unwrap_or_default();
    let ok = c
        .sessions
        .check(&headers)
        .is_some_and(|s| ui::Sessions::csrf_ok(&s, &csrf));
    if !ok {
        return page_error(StatusCode::FORBIDDEN, ui::CSRF_REFUSED);
    }
    let src = match named(&c, &name) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let back = format!(
        "/console/sources/{}",
        if src.name.is_empty() { "-" } else { &src.name }
    );
    {
        let mut audits = c.audits.lock().expect("audits");
        let entry = audits.entry(src.name.clone()).or_default();
        if entry.running_since.is_some() {
            return Redirect::to(&back).into_response();
        }
        entry.running_since = Some(Timestamp::now());
    }
    let ctx = c.clone();
    // On the harvester's own parts (its fetch limits, its state) and its task tracker: the
    // audit takes its place among the walks, and shutdown stops it.
    c.parts.tasks.spawn(async move {
        let only = (!ctx.cfg.sources.is_empty()).then_some(src.name.as_str());
        let audit = super::report::audit_with(&ctx.parts, &ctx.cfg, only, None);
        let done = tokio::select! {
            r = audit => r,
            _ = ctx.parts.cancel.cancelled() => return,
        };
        let result = match done {
            Ok((report, in_sync)) => Audit {
                at: Timestamp::now().to_string(),
                in_sync,
                verdict: if in_sync { "IN SYNC" } else { "NOT IN SYNC" }.into(),
                report,
            },
            Err(e) => Audit {
                at: Timestamp::now().to_string(),
                in_sync: false,
                verdict: "the audit could not run".into(),
                report: format!("{e:#}"),
            },
        };
        tracing::info!(source = %src.name, verdict = %result.verdict, "console: audit done");
        ctx.audits.lock().expect("audits").insert(
            src.name.clone(),
            Audits {
                last: Some(result),
                running_since: None,
            },
        );
    });
    Redirect::to(&back).into_response()
}

async fn asset(Path(file): Path<String>) -> Response {
    ui::asset(&file)
        .unwrap_or_else(|| page_error(StatusCode::NOT_FOUND, format!("no console file {file:?}")))
}
