//! The hub's console at `/console/`: what the admin API tells, as pages in a browser, from the
//! same domain calls (the admin API's views and stats, the hub's attempt log and actions).
//!
//! Safe by default: it needs the admin token, given once in a login form and kept as a
//! signed, `HttpOnly`, `SameSite=Strict` session cookie with an expiry (the key is shared by
//! every process on the store, so a session holds across them and across restarts; changing
//! `admin.token` ends every session); every state-changing form carries a CSRF token tied to
//! the session; every page is sent with a Content-Security-Policy that allows no inline script
//! and no framing. Pages are rendered on the server (minijinja templates compiled into the
//! binary) and read without JavaScript; a small script swaps in fresh parts while one is open.

mod collectors;
mod inbox;

use std::collections::BTreeMap;

use axum::extract::{Form, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::admin::{collect_stats, subscription_view, SubscriptionView};
use super::AppState;
use crate::error::AppError;
use crate::model::websub::{SubState, Topic};
use crate::model::Timestamp;
use crate::ui;

const COOKIE: &str = "rshub_console";
/// Subscriptions per page of the list.
const PAGE: usize = 50;
/// Seconds between live updates of an open page.
const LIVE_SECS: u32 = 5;

fn pages() -> &'static ui::Pages {
    static PAGES: std::sync::OnceLock<ui::Pages> = std::sync::OnceLock::new();
    PAGES.get_or_init(|| {
        ui::Pages::new(
            &[
                ("overview.html", include_str!("templates/overview.html")),
                ("subscriptions.html", include_str!("templates/subscriptions.html")),
                ("subscription.html", include_str!("templates/subscription.html")),
                ("confirm.html", include_str!("templates/confirm.html")),
                ("sets.html", include_str!("templates/sets.html")),
                ("collectors.html", include_str!("templates/collectors.html")),
                ("collector.html", include_str!("templates/collector.html")),
                ("collector_cells.html", include_str!("templates/collector_cells.html")),
                ("inbox.html", include_str!("templates/inbox.html")),
            ],
            json!({
                "brand": "resourcesync-hub",
                "logout": true,
                "nav_items": [
                    {"key": "overview", "href": "/console/", "label": "Overview"},
                    {"key": "subscriptions", "href": "/console/subscriptions", "label": "Subscriptions"},
                    {"key": "sets", "href": "/console/sets", "label": "Sets and topics"},
                    {"key": "collectors", "href": "/console/collectors", "label": "Collectors"},
                    {"key": "inbox", "href": "/console/inbox", "label": "Inbox"},
                ],
            }),
        )
    })
}

fn render(name: &str, ctx: serde_json::Value) -> Response {
    pages().render(name, ctx)
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route("/console/", get(overview))
        .route("/console/login", get(login_form).post(login))
        .route("/console/logout", post(logout))
        .route("/console/subscriptions", get(subscriptions))
        .route("/console/subscriptions/{id}", get(subscription))
        .route("/console/subscriptions/{id}/{action}", post(act))
        .route("/console/sets", get(sets))
        .route("/console/collectors", get(collectors::list))
        .route("/console/collectors/{name}", get(collectors::show))
        .route("/console/collectors/{name}/{action}", post(collectors::act))
        .route("/console/inbox", get(inbox::list))
        .route("/console/static/{file}", get(asset))
        .layer(axum::middleware::map_response(ui::secure))
}

/// What a console request can come to besides its page.
#[derive(Debug)]
enum ConsoleError {
    /// Not signed in: to the login form.
    SignIn,
    /// A page saying what went wrong, with its status.
    Page(StatusCode, String),
}

impl From<AppError> for ConsoleError {
    fn from(e: AppError) -> Self {
        let status = e.status();
        if status.is_server_error() {
            // Said in words in the log; the page says only what a reader can act on.
            tracing::error!(error = %crate::cause::chain(&e), "console");
            let why = match status {
                StatusCode::SERVICE_UNAVAILABLE => {
                    "the store cannot answer now; the page will work again when it does"
                }
                _ => "something went wrong on the hub's side; its log says what",
            };
            ConsoleError::Page(status, why.into())
        } else {
            ConsoleError::Page(status, e.to_string())
        }
    }
}

impl From<crate::store::StoreError> for ConsoleError {
    fn from(e: crate::store::StoreError) -> Self {
        AppError::from(e).into()
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        match self {
            ConsoleError::SignIn => Redirect::to("/console/login").into_response(),
            ConsoleError::Page(status, message) => pages().message(status, &message, "/console/"),
        }
    }
}

fn bad(status: StatusCode, why: impl Into<String>) -> ConsoleError {
    ConsoleError::Page(status, why.into())
}

// ---- sessions ----

/// The console's sessions: the key is shared by every process on the store (a session holds
/// across them and across restarts) and bound to the admin token (a new token ends every
/// session).
async fn sessions(st: &AppState) -> Result<ui::Sessions, ConsoleError> {
    let base = st
        .console_key
        .get_or_try_init(|| crate::store::shared_key(st.hub.store(), "console-session-key"))
        .await?;
    Ok(ui::Sessions::new(
        ui::derive_key(base, st.config.admin.token.expose()),
        COOKIE,
        st.config.base_url().starts_with("https:"),
    ))
}

const OFF: &str =
    "the console is off: it needs the admin token (set admin.token or RSHUB_ADMIN_TOKEN)";

/// The session the request's cookie holds, unless it was signed out.
async fn session(st: &AppState, headers: &HeaderMap) -> Result<ui::Session, ConsoleError> {
    if st.config.admin.token.is_empty() {
        return Err(bad(StatusCode::NOT_FOUND, OFF));
    }
    let s = sessions(st)
        .await?
        .check(headers)
        .ok_or(ConsoleError::SignIn)?;
    if signed_out(st).await?.0.contains_key(&s.nonce) {
        return Err(ConsoleError::SignIn);
    }
    Ok(s)
}

/// Where sessions ended by sign-out before their expiry are kept: in the store's state, so
/// that every process on the store refuses them, across restarts.
const SIGNED_OUT: &str = "console-signed-out-sessions";

/// The sessions signed out and not yet expired (nonce -> expiry, Unix seconds), and the
/// version of that record.
async fn signed_out(st: &AppState) -> Result<(BTreeMap<String, i64>, Option<i64>), ConsoleError> {
    Ok(match st.hub.store().state(SIGNED_OUT).await? {
        Some((json, version)) => (
            serde_json::from_str(&json).unwrap_or_default(),
            Some(version),
        ),
        None => (BTreeMap::new(), None),
    })
}

/// Ends `s` for good: a copy of its cookie replayed later opens nothing. (Only a signed-in
/// admin can add to the list, and expired entries leave it at each sign-out.)
async fn sign_out(st: &AppState, s: &ui::Session) -> Result<(), ConsoleError> {
    loop {
        let (mut out, version) = signed_out(st).await?;
        let now = Timestamp::now().micros() / 1_000_000;
        out.retain(|_, expires| *expires > now);
        out.insert(s.nonce.clone(), s.expires);
        let json = serde_json::to_string(&out).expect("a map of strings to numbers");
        if st
            .hub
            .store()
            .save_state(SIGNED_OUT, &json, version)
            .await?
            .is_some()
        {
            return Ok(());
        }
    }
}

/// The session of a state-changing request, whose form must carry the session's CSRF token.
async fn posted(
    st: &AppState,
    headers: &HeaderMap,
    csrf: &str,
) -> Result<ui::Session, ConsoleError> {
    let s = match session(st, headers).await {
        Ok(s) => s,
        Err(ConsoleError::SignIn) => {
            return Err(bad(
                StatusCode::FORBIDDEN,
                "you are not signed in (or the session ended): sign in again and repeat",
            ))
        }
        Err(e) => return Err(e),
    };
    if !ui::Sessions::csrf_ok(&s, csrf) {
        return Err(bad(StatusCode::FORBIDDEN, ui::CSRF_REFUSED));
    }
    Ok(s)
}

const TOKEN_LABEL: &str = "Admin token (admin.token)";

fn too_many(wait: u64) -> Response {
    pages().too_many_guesses(TOKEN_LABEL, wait)
}

async fn login_form(State(st): State<AppState>) -> Response {
    if st.config.admin.token.is_empty() {
        return bad(StatusCode::NOT_FOUND, OFF).into_response();
    }
    pages().login(StatusCode::OK, TOKEN_LABEL, None)
}

async fn login(
    State(st): State<AppState>,
    ext: axum::http::Extensions,
    form: Result<Form<ui::LoginForm>, axum::extract::rejection::FormRejection>,
) -> Result<Response, ConsoleError> {
    if st.config.admin.token.is_empty() {
        return Err(bad(StatusCode::NOT_FOUND, OFF));
    }
    let ip = super::client_ip(&ext);
    if let Err(wait) = st.guesses.check(ip) {
        return Ok(too_many(wait));
    }
    let Ok(Form(form)) = form else {
        return Ok(pages().login(
            StatusCode::BAD_REQUEST,
            TOKEN_LABEL,
            Some("the form was not a login form"),
        ));
    };
    if !ui::token_matches(&form.token, st.config.admin.token.expose()) {
        tracing::warn!("console: a sign-in with a wrong token was refused");
        if let Err(wait) = st.guesses.failed(ip) {
            return Ok(too_many(wait));
        }
        return Ok(pages().login(
            StatusCode::FORBIDDEN,
            TOKEN_LABEL,
            Some("That is not the admin token."),
        ));
    }
    sessions(&st)
        .await?
        .signed_in()
        .map_err(|e| bad(StatusCode::SERVICE_UNAVAILABLE, e))
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(
    State(st): State<AppState>,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Result<Response, ConsoleError> {
    let s = posted(&st, &headers, &f.csrf).await?;
    sign_out(&st, &s).await?;
    Ok((
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, sessions(&st).await?.clear()),
            (header::LOCATION, "/console/login".to_string()),
        ],
    )
        .into_response())
}

// ---- pages ----

/// A subscription as a row of the console's tables.
#[derive(Serialize)]
struct Row {
    id: String,
    state: &'static str,
    topic: String,
    callback: String,
    pending: u64,
    delivered: u64,
    given_up: u64,
    failing_since: Option<String>,
    last_error: Option<String>,
}

fn row(v: SubscriptionView) -> Row {
    Row {
        state: v.state.as_str(),
        last_error: v.last_failure.as_ref().map(|f| {
            let status = f.status.map(|s| format!("HTTP {s}")).unwrap_or_default();
            match &f.error {
                Some(e) if !status.is_empty() => format!("{status}: {e}"),
                Some(e) => e.clone(),
                None => status,
            }
        }),
        id: v.id,
        topic: v.topic,
        callback: v.callback,
        pending: v.pending,
        delivered: v.delivered,
        given_up: v.given_up,
        failing_since: v.failing_since,
    }
}

#[derive(Serialize)]
struct Bar {
    x: f64,
    y_ok: f64,
    h_ok: f64,
    y_fail: f64,
    h_fail: f64,
    label: String,
}

/// The last hour's attempts as stacked bars (delivered below, failed above), drawn by the
/// server as SVG: readable without JavaScript.
fn chart(minutes: &[crate::hub::admin::Minute]) -> serde_json::Value {
    let (bar, gap, height) = (12.0, 3.0, 120.0);
    let peak = minutes
        .iter()
        .map(|m| m.delivered + m.failed_attempts)
        .max()
        .unwrap_or(0);
    let scale = if peak == 0 { 0.0 } else { height / peak as f64 };
    let bars: Vec<Bar> = minutes
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let h_ok = m.delivered as f64 * scale;
            let h_fail = m.failed_attempts as f64 * scale;
            let at = Timestamp(m.minute * 60_000_000).to_string();
            Bar {
                x: i as f64 * (bar + gap),
                y_ok: height - h_ok,
                h_ok,
                y_fail: height - h_ok - h_fail,
                h_fail,
                label: format!(
                    "{}: {} delivered, {} failed attempts",
                    &at[..16.min(at.len())],
                    m.delivered,
                    m.failed_attempts
                ),
            }
        })
        .collect();
    let (ok, failed): (u64, u64) = minutes
        .iter()
        .fold((0, 0), |(a, b), m| (a + m.delivered, b + m.failed_attempts));
    json!({
        "width": minutes.len() as f64 * (bar + gap),
        "height": height,
        "bar": bar,
        "bars": bars,
        "peak": peak,
        "summary": format!("{ok} delivered and {failed} failed attempts in the last hour"),
    })
}

async fn overview(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ConsoleError> {
    let s = session(&st, &headers).await?;
    let stats = collect_stats(&st).await?;
    let c = &stats.subscriptions;
    let states: Vec<BTreeMap<&str, serde_json::Value>> = [
        ("active", "active", c.active),
        ("failing", "failing", c.failing),
        ("disabled", "disabled", c.disabled),
        ("paused", "paused", c.paused),
        ("expired", "expired", c.expired),
        (
            "pending_verification",
            "awaiting verification",
            c.pending_verification,
        ),
    ]
    .into_iter()
    .map(|(name, label, count)| {
        BTreeMap::from([
            ("name", name.into()),
            ("label", label.into()),
            ("count", count.into()),
        ])
    })
    .collect();
    let mut failing = Vec::new();
    for state in [SubState::Failing, SubState::Disabled] {
        failing.extend(list(&st, Some(state), None, None, 0, 20).await?.0);
    }
    let pollers: Vec<BTreeMap<&str, Option<String>>> = stats
        .pollers
        .iter()
        .map(|p| {
            BTreeMap::from([
                ("set", Some(p.set.clone())),
                ("watermark", p.watermark.clone()),
                ("oldest_pending", p.oldest_pending.clone()),
                ("lag", Some(ui::span(p.lag_seconds))),
            ])
        })
        .collect();
    let me = st.hub.owner().to_string();
    let processes: Vec<BTreeMap<&str, serde_json::Value>> = st
        .hub
        .processes()
        .into_iter()
        .map(|(name, partitions)| {
            BTreeMap::from([
                ("me", (name == me).into()),
                ("name", name.into()),
                ("partitions", partitions.into()),
            ])
        })
        .collect();
    let collectors = collectors::rows(&st).await?;
    Ok(render(
        "overview.html",
        json!({
            "title": "Overview",
            "nav": "overview",
            "signed_in": true,
            "csrf": s.csrf,
            "live": LIVE_SECS,
            "states": states,
            "queue_depth": stats.queue_depth,
            "delivered": stats.delivered,
            "given_up": stats.given_up,
            "chart": chart(&st.hub.attempts_per_minute(Timestamp::now())),
            "failing": failing,
            "pollers": pollers,
            "processes": processes,
            "collectors_total": collectors.len(),
            "collectors_look": collectors.into_iter().filter(|c| c["needs_look"] == true).collect::<Vec<_>>(),
        }),
    ))
}

/// Subscriptions in id order after `after`: a page of rows and whether there are more.
async fn list(
    st: &AppState,
    state: Option<SubState>,
    topic: Option<String>,
    host: Option<String>,
    after: i64,
    limit: usize,
) -> Result<(Vec<Row>, Option<i64>), ConsoleError> {
    let filter = crate::model::websub::SubscriptionFilter {
        topic,
        callback_contains: host,
        state,
        after: Some(after),
        limit: limit + 1,
    };
    let mut rows = st.hub.store().hub_list(filter, Timestamp::now()).await?;
    let more = rows.len() > limit;
    rows.truncate(limit);
    let last = rows.last().map(|(s, _)| s.id);
    Ok((
        rows.into_iter()
            .map(|(s, x)| row(super::admin::view(s, x)))
            .collect(),
        more.then_some(last).flatten(),
    ))
}

#[derive(Deserialize, Default)]
struct ListQuery {
    #[serde(default)]
    state: String,
    #[serde(default)]
    topic: String,
    #[serde(default)]
    host: String,
    #[serde(default)]
    after: String,
}

const STATES: [SubState; 5] = [
    SubState::Active,
    SubState::Failing,
    SubState::Disabled,
    SubState::Paused,
    SubState::Expired,
];

async fn subscriptions(
    State(st): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ConsoleError> {
    let s = session(&st, &headers).await?;
    let Query(q) = q.map_err(|e| bad(StatusCode::BAD_REQUEST, e.body_text()))?;
    let state = match q.state.as_str() {
        "" => None,
        name => Some(
            STATES
                .into_iter()
                .find(|s| s.as_str() == name)
                .ok_or_else(|| {
                    bad(
                        StatusCode::BAD_REQUEST,
                        format!("{name:?} is not a subscription state (active, failing, disabled, paused, expired)"),
                    )
                })?,
        ),
    };
    let topic = match q.topic.trim() {
        "" => None,
        t => Some(
            Topic::parse(t)
                .map(|k| k.as_str().to_string())
                .map_err(|e| bad(StatusCode::BAD_REQUEST, format!("the topic filter: {e}")))?,
        ),
    };
    let host = Some(q.host.trim().to_string()).filter(|h| !h.is_empty());
    if host.as_ref().is_some_and(|h| h.len() > 256) {
        return Err(bad(
            StatusCode::BAD_REQUEST,
            "the callback filter is longer than 256 characters",
        ));
    }
    let after = match q.after.as_str() {
        "" => 0,
        a => a.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
            bad(
                StatusCode::BAD_REQUEST,
                format!("{a:?} is not a position in this list"),
            )
        })?,
    };
    // Without a state asked for, the first page starts with the failing ones.
    let mut items = Vec::new();
    if state.is_none() && after == 0 {
        items = list(
            &st,
            Some(SubState::Failing),
            topic.clone(),
            host.clone(),
            0,
            200,
        )
        .await?
        .0;
    }
    let (rows, next) = list(&st, state, topic.clone(), host.clone(), after, PAGE).await?;
    let shown_first: std::collections::HashSet<String> =
        items.iter().map(|r| r.id.clone()).collect();
    items.extend(rows.into_iter().filter(|r| !shown_first.contains(&r.id)));
    let next = next.map(|n| {
        let mut u = url::form_urlencoded::Serializer::new(String::new());
        u.append_pair("state", &q.state)
            .append_pair("topic", &q.topic)
            .append_pair("host", &q.host)
            .append_pair("after", &n.to_string());
        format!("/console/subscriptions?{}", u.finish())
    });
    Ok(render(
        "subscriptions.html",
        json!({
            "title": "Subscriptions",
            "nav": "subscriptions",
            "signed_in": true,
            "csrf": s.csrf,
            "items": items,
            "next": next,
            "state_names": STATES.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            "filter": { "state": q.state, "topic": q.topic, "host": q.host },
        }),
    ))
}

fn sub_id(id: &str) -> Result<i64, ConsoleError> {
    id.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
        bad(
            StatusCode::NOT_FOUND,
            format!("{id:?} is not a subscription id"),
        )
    })
}

#[derive(Serialize)]
struct AttemptRow {
    at: String,
    webhook_id: String,
    outcome: &'static str,
    status: Option<u16>,
    latency: String,
    error: Option<String>,
}

#[derive(Deserialize, Default)]
struct DoneQuery {
    #[serde(default)]
    done: String,
    #[serde(default)]
    n: Option<u64>,
    #[serde(default)]
    p: Option<u64>,
}

async fn subscription(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<DoneQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ConsoleError> {
    let s = session(&st, &headers).await?;
    let id = sub_id(&id)?;
    let view = subscription_view(&st, id).await?;
    let attempts: Vec<AttemptRow> = st
        .hub
        .attempts(&crate::hub::admin::AttemptFilter {
            subscription_id: Some(id),
            limit: 50,
            ..Default::default()
        })
        .into_iter()
        .map(|a| AttemptRow {
            at: a.at.to_string(),
            webhook_id: a.webhook_id,
            outcome: a.outcome,
            status: a.status,
            latency: format!("{:.0} ms", a.duration_ms),
            error: a.error,
        })
        .collect();
    let q = q.map(|Query(q)| q).unwrap_or_default();
    let n = q.n.unwrap_or(0);
    let done = match q.done.as_str() {
        "redeliver" => Some(format!(
            "{n} message(s) already sent queued again; {} pending sent now.",
            q.p.unwrap_or(0)
        )),
        "retry" => Some(format!(
            "{n} given-up message(s) queued to be tried again now."
        )),
        "verify" => Some("A new verification of intent was sent.".to_string()),
        _ => None,
    };
    Ok(render(
        "subscription.html",
        json!({
            "title": format!("Subscription #{id}"),
            "nav": "subscriptions",
            "signed_in": true,
            "csrf": s.csrf,
            "live": LIVE_SECS,
            "s": view,
            "attempts": attempts,
            "done": done,
        }),
    ))
}

#[derive(Deserialize)]
struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    confirm: String,
    #[serde(default)]
    window: String,
    #[serde(default)]
    since: String,
    #[serde(default)]
    until: String,
}

/// The redelivery window a form asks for.
fn window(f: &ActionForm, now: Timestamp) -> Result<(Timestamp, Option<Timestamp>), ConsoleError> {
    let since = f.since.trim();
    if !since.is_empty() {
        let since =
            Timestamp::parse_zoned(since, "from").map_err(|e| bad(StatusCode::BAD_REQUEST, e))?;
        let until = match f.until.trim() {
            "" => None,
            u => Some(
                Timestamp::parse_zoned(u, "until").map_err(|e| bad(StatusCode::BAD_REQUEST, e))?,
            ),
        };
        if until.is_some_and(|u| u <= since) {
            return Err(bad(
                StatusCode::BAD_REQUEST,
                "the window's end is not after its start",
            ));
        }
        return Ok((since, until));
    }
    let secs: i64 = f
        .window
        .trim()
        .parse()
        .ok()
        .filter(|s| (1..=30 * 86_400).contains(s))
        .ok_or_else(|| {
            bad(
                StatusCode::BAD_REQUEST,
                "choose a window, or give its start as RFC 3339 (2026-11-26T10:00:00Z)",
            )
        })?;
    Ok((Timestamp(now.micros() - secs * 1_000_000), None))
}

async fn act(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    form: Result<Form<ActionForm>, axum::extract::rejection::FormRejection>,
) -> Result<Response, ConsoleError> {
    let Form(f) = form.map_err(|e| bad(StatusCode::BAD_REQUEST, e.body_text()))?;
    let s = posted(&st, &headers, &f.csrf).await?;
    let id = sub_id(&id)?;
    let here = format!("/console/subscriptions/{id}");
    let view = subscription_view(&st, id).await?;
    let now = Timestamp::now();
    let (title, what, button, kind) = match action.as_str() {
        "redeliver" => {
            let (since, until) = window(&f, now)?;
            (
                "Redeliver a window",
                format!(
                    "Deliver again to {} every message of {} published from {since} until {}?",
                    view.callback,
                    view.topic,
                    until.map_or("now".to_string(), |u| u.to_string())
                ),
                "Redeliver",
                "",
            )
        }
        "retry" => (
            "Retry now",
            format!("Try the given-up messages of subscription #{id} again at once?"),
            "Retry now",
            "",
        ),
        "verify" => (
            "Verify again",
            format!("Send {} a new verification of intent?", view.callback),
            "Verify again",
            "",
        ),
        "delete" => (
            "Delete the subscription",
            format!(
                "Delete subscription #{id} of {} to {}? Its {} queued message(s) are dropped.",
                view.callback, view.topic, view.pending
            ),
            "Delete",
            "danger",
        ),
        other => {
            return Err(bad(
                StatusCode::NOT_FOUND,
                format!("{other:?} is not an action (redeliver, retry, verify, delete)"),
            ))
        }
    };
    if f.confirm != "yes" {
        return Ok(render(
            "confirm.html",
            json!({
                "title": title,
                "nav": "subscriptions",
                "signed_in": true,
                "csrf": s.csrf,
                "what": what,
                "button": button,
                "kind": kind,
                "action": format!("{here}/{action}"),
                "back": here,
                "fields": vec![("window", f.window.clone()), ("since", f.since.clone()), ("until", f.until.clone())],
            }),
        ));
    }
    let gone = || bad(StatusCode::NOT_FOUND, format!("no subscription {id}"));
    let done = match action.as_str() {
        "redeliver" => {
            let (since, until) = window(&f, now)?;
            use crate::hub::admin::Redelivery;
            match st.hub.redeliver(id, since, until).await? {
                Redelivery::Queued(n) => format!("redeliver&n={n}&p={}", view.pending),
                Redelivery::NoSuchSubscription => return Err(gone()),
                Redelivery::BeforeRetention(why) => return Err(bad(StatusCode::CONFLICT, why)),
            }
        }
        "retry" => format!("retry&n={}", st.hub.retry_now(id).await?.ok_or_else(gone)?),
        "verify" => {
            if !st.hub.reverify(id).await? {
                return Err(gone());
            }
            "verify".to_string()
        }
        _ => {
            if !st.hub.delete_subscription(id, None).await? {
                return Err(gone());
            }
            tracing::info!(subscription = id, "console: subscription deleted");
            return Ok(Redirect::to("/console/subscriptions").into_response());
        }
    };
    tracing::info!(subscription = id, action = %action, "console: action taken");
    Ok(Redirect::to(&format!("{here}?done={done}")).into_response())
}

#[derive(Serialize)]
struct TopicRow {
    url: String,
    subscribers: u64,
    last_publish: Option<String>,
}

async fn sets(State(st): State<AppState>, headers: HeaderMap) -> Result<Response, ConsoleError> {
    let s = session(&st, &headers).await?;
    let store = st.ctx.store();
    let topics = st.hub.store().hub_topics().await?;
    let stats = collect_stats(&st).await?;
    let mut out = Vec::new();
    for set in store.sets().await? {
        let name = set.name.to_string();
        let counts = store.counts(&set.name).await?;
        let lists = store.changelists(&set.name).await?;
        let open = lists.last();
        let newest = store
            .latest_change(&set.name)
            .await?
            .map(|c| c.datetime.to_string());
        let lag = stats
            .pollers
            .iter()
            .find(|p| p.set == name)
            .map_or("the notifier is off".to_string(), |p| {
                ui::span(p.lag_seconds)
            });
        let set_topics: Vec<TopicRow> = [
            st.config.change_topic(&name),
            st.config.framework_topic(&name),
        ]
        .into_iter()
        .map(|url| {
            let t = topics
                .iter()
                .find(|t| t.topic.as_str() == url || t.topic.to_string() == url);
            TopicRow {
                subscribers: t.map_or(0, |t| t.subscribers),
                last_publish: t.and_then(|t| t.last_publish).map(|p| p.to_string()),
                url,
            }
        })
        .collect();
        out.push(json!({
            "capability_list": st.ctx.urls().capability_list(&set.name),
            "name": name,
            "resources": counts.resources,
            "changes": counts.changes,
            "lists": lists.len(),
            "open_no": open.map(|l| l.no),
            "open_count": open.map(|l| l.count),
            "open_from": open.map(|l| l.from.to_string()),
            "newest": newest,
            "lag": lag,
            "topics": set_topics,
        }));
    }
    let mut collectors = Vec::new();
    for e in st.collectors.entries() {
        let c = e.collector.config();
        let (state, last) = match e.collector.status().await {
            Ok((saved, control)) => (
                match super::admin::collect::state_of(e, &saved, &control) {
                    (_, Some(until)) => {
                        format!("waiting until {until} (the repository's Retry-After)")
                    }
                    (state, None) => state.to_string(),
                },
                saved
                    .last_outcome
                    .map(|o| format!("{}: {o}", saved.last_ended.unwrap_or_default()))
                    .unwrap_or_else(|| "no run has ended yet".into()),
            ),
            Err(err) => ("unknown".into(), crate::cause::chain(&err)),
        };
        collectors.push(json!({
            "name": e.collector.name.to_string(), "url": c.url.clone(), "state": state, "last": last,
        }));
    }
    Ok(render(
        "sets.html",
        json!({
            "title": "Sets and topics",
            "nav": "sets",
            "signed_in": true,
            "csrf": s.csrf,
            "live": LIVE_SECS,
            "sets": out,
            "collectors": collectors,
        }),
    ))
}

/// The console's script, style sheet and icon.
async fn asset(Path(file): Path<String>) -> Response {
    ui::asset(&file).unwrap_or_else(|| {
        bad(StatusCode::NOT_FOUND, format!("no console file {file:?}")).into_response()
    })
}
