//! Push: the callback server a hub delivers to, and the subscription it serves. Each
//! subscription's callback URL carries a random token (`/cb/{set id}/{token}`): only the hub
//! it was given to can reach it. Verification of intent is answered only for a subscription
//! this destination asked for (topic and callback as requested), and a denial only while the
//! request is in flight. Deliveries are checked before their body is read: an unknown callback
//! is answered 410 and an unsigned delivery 202 (WebSub §8: acknowledged, ignored, counted)
//! unread; a body is read only up to `push.max_body_bytes`, at most
//! `push.max_concurrent_deliveries` at once (more: 503 with Retry-After), and then checked
//! against `X-Hub-Signature` in constant time.

use anyhow::Context as _;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, Request, State as AxState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use subtle::ConstantTimeEq;
use tokio::sync::{Notify, Semaphore};

use super::config::PushSection;
use super::fetch::Fetcher;
use super::scope::short;
use super::state::{Handle, SubState, Subscription};
use crate::model::websub::{signature, SignatureAlg};
use crate::model::Timestamp;

/// Who is woken when a delivery for a set is in the inbox: the loop of the set's source only
/// (each delivery used to wake every source, each reading the inbox: with 5,000 sources, one
/// delivery cost 5,000 trips to the state and pushed changes waited behind them).
#[derive(Clone, Default)]
pub struct Wakes(Arc<std::sync::Mutex<std::collections::HashMap<i64, Arc<Notify>>>>);

impl Wakes {
    /// The bell of a source following `set_ids` (replacing any earlier one of those sets).
    /// A delivery kept before the source listened is in the inbox: it reads it first.
    pub fn listen(&self, set_ids: impl IntoIterator<Item = i64>) -> Arc<Notify> {
        let bell = Arc::new(Notify::new());
        let mut m = self.0.lock().expect("wakes");
        for id in set_ids {
            m.insert(id, bell.clone());
        }
        bell
    }

    /// Wakes the source of `set_id`; a source busy now finds the bell rung when it next
    /// waits (a permit is kept), so no delivery waits for the next check.
    pub fn wake(&self, set_id: i64) {
        if let Some(b) = self.0.lock().expect("wakes").get(&set_id) {
            b.notify_one();
        }
    }
}

#[derive(Clone)]
struct Ctx {
    state: Handle,
    /// Wakes the source of a set when a verified delivery for it is in the state's inbox.
    inbox: Wakes,
    bodies: Arc<Semaphore>,
    max_body: u64,
    max_queued: u64,
    /// This harvester's id (see [`super::state::State::harvester_id`]), read once.
    harvester: String,
}

/// Serves the callback server on `listener` until `cancel`. A connection on which nothing has
/// moved for two minutes is let go (a hub, or anyone who found the port, cannot hold
/// connections open for nothing); longer than hubs keep idle connections for reuse (ours:
/// 60 s), so that one is not closed under a delivery just being sent on it.
pub fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    cancel: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let listener = crate::conn::Listener::new(listener, std::time::Duration::from_secs(120));
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<crate::conn::Remote>(),
        )
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await
    })
}

/// The callback routes: `GET` (verification) and `POST` (deliveries) on
/// `/cb/{set id}/{token}`; the token-less form of earlier versions answers 410 to deliveries
/// (the hub drops that subscription) and 404 to verifications.
pub async fn router(state: Handle, inbox: Wakes, cfg: &PushSection) -> anyhow::Result<Router> {
    let harvester = state.run(|s| s.harvester_id()).await?;
    Ok(Router::new()
        .route("/cb/{id}/{token}", get(verify).post(deliver))
        .route(
            "/cb/{id}",
            get(|| async { StatusCode::NOT_FOUND }).post(|| async { StatusCode::GONE }),
        )
        .with_state(Ctx {
            state,
            inbox,
            bodies: Arc::new(Semaphore::new(cfg.max_concurrent_deliveries)),
            max_body: cfg.max_body_bytes,
            max_queued: cfg.max_queued_bytes,
            harvester,
        }))
}

/// The callback routes of an embedded engine (see [`super::engine`]), served by its host.
#[derive(Clone)]
pub struct Callbacks(pub(super) Router);

impl Callbacks {
    /// The routes (`/cb/{set id}/{token}`), to be nested under the callback base's path.
    pub fn router(&self) -> Router {
        self.0.clone()
    }
}

/// The callback URL of a set under the configured base, with its token.
pub fn callback_url(base: &str, set_id: i64, token: &str) -> String {
    format!("{}/cb/{set_id}/{token}", base.trim_end_matches('/'))
}

/// A fresh callback token: the harvester's id (see [`super::state::State::harvester_id`]), a dot, and the
/// hex of 16 random bytes.
pub fn new_token(harvester: &str) -> anyhow::Result<String> {
    let hex = crate::digest::random_hex().context("no randomness for a callback token")?;
    Ok(format!("{harvester}.{hex}"))
}

/// A request at a callback that carries another harvester's id: two harvesters share one
/// callback URL. Said once (and counted for `harvest status`); answered 404, so the hub
/// keeps retrying the other harvester's subscription rather than dropping it.
async fn foreign(ctx: &Ctx, token: &str) -> bool {
    let Some((other, _)) = token.split_once('.') else {
        return false;
    };
    if other == ctx.harvester {
        return false;
    }
    let first = ctx
        .state
        .run(|s| {
            let n = s.counter("foreign")?;
            s.bump("foreign")?;
            Ok(n == 0)
        })
        .await;
    if first.unwrap_or(false) {
        tracing::warn!(other = %short(other), mine = %ctx.harvester, "a hub called back for another harvester's subscription: two harvesters share one callback URL (give each its own push.listen and push.callback_url)");
    }
    true
}

/// Counts a delivery ignored for `why` (shown by `harvest status`).
async fn count(ctx: &Ctx, why: &'static str) {
    let _ = ctx.state.run(move |s| s.bump(why)).await;
}

/// The subscription of set `id` when `token` is its callback's, compared in constant time.
async fn subscription_of(state: &Handle, id: i64, token: &str) -> Result<Option<Subscription>, ()> {
    let sub = state
        .run(move |s| s.subscription(id))
        .await
        .map_err(|_| ())?;
    Ok(sub.filter(|s| {
        let mine = s.callback.rsplit('/').next().unwrap_or("");
        mine.len() == token.len() && bool::from(mine.as_bytes().ct_eq(token.as_bytes()))
    }))
}

async fn verify(
    AxState(ctx): AxState<Ctx>,
    Path((id, token)): Path<(i64, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> impl IntoResponse {
    let Ok(Some(sub)) = subscription_of(&ctx.state, id, &token).await else {
        foreign(&ctx, &token).await;
        return (StatusCode::NOT_FOUND, String::new());
    };
    let mode = q.get("hub.mode").map(String::as_str);
    let topic_matches = q.get("hub.topic").is_some_and(|t| *t == sub.topic);
    match mode {
        Some("subscribe")
            if topic_matches && matches!(sub.state, SubState::Requested | SubState::Active) =>
        {
            let Some(challenge) = q.get("hub.challenge") else {
                return (StatusCode::BAD_REQUEST, String::new());
            };
            let lease = q
                .get("hub.lease_seconds")
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            if let Err(e) = ctx.state.run(move |s| s.verified(id, lease)).await {
                tracing::error!(error = %e, "recording a verification");
                return (StatusCode::SERVICE_UNAVAILABLE, String::new());
            }
            tracing::info!(topic = %sub.topic, lease_seconds = lease, "subscription verified");
            (StatusCode::OK, challenge.clone())
        }
        // A denial is an answer to a request in flight, not a way to end a subscription.
        Some("denied") if topic_matches && sub.state == SubState::Requested => {
            let reason = short(q.get("hub.reason").map_or("", String::as_str)).into_owned();
            tracing::warn!(topic = %sub.topic, reason = %reason, "the hub denied the subscription");
            let r = reason.clone();
            let _ = ctx.state.run(move |s| s.denied(id, &r)).await;
            (StatusCode::OK, String::new())
        }
        // Not a request of ours (an unsubscribe we never asked for, another topic): refuse.
        _ => (StatusCode::NOT_FOUND, String::new()),
    }
}

/// Whether `header` (`alg=hex`) is the signature of `body` under `secret`, compared in
/// constant time.
pub fn signature_ok(header: &str, secret: &str, body: &[u8]) -> bool {
    let Some((alg, _)) = header.split_once('=') else {
        return false;
    };
    let Some(alg) = SignatureAlg::parse(alg.trim()) else {
        return false;
    };
    let expected = signature(alg, secret.as_bytes(), body);
    let given = header.trim().to_ascii_lowercase();
    given.len() == expected.len() && bool::from(given.as_bytes().ct_eq(expected.as_bytes()))
}

async fn deliver(
    AxState(ctx): AxState<Ctx>,
    Path((id, token)): Path<(i64, String)>,
    req: Request,
) -> Response {
    let sub = match subscription_of(&ctx.state, id, &token).await {
        Ok(Some(s)) => s,
        // Another harvester's: not ours to end.
        Ok(None) if foreign(&ctx, &token).await => return StatusCode::NOT_FOUND.into_response(),
        // Not subscribed here (any more): 410 tells the hub to stop.
        Ok(None) => return StatusCode::GONE.into_response(),
        Err(()) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    };
    let headers: &HeaderMap = req.headers();
    let Some(sig) = headers
        .get("x-hub-signature")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        tracing::warn!(topic = %sub.topic, "delivery ignored unread: not signed");
        count(&ctx, "unsigned").await;
        return StatusCode::ACCEPTED.into_response();
    };
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "a delivery is read up to {} bytes (push.max_body_bytes)",
                ctx.max_body
            ),
        )
            .into_response()
    };
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > ctx.max_body) {
        return too_large();
    }
    let Ok(_permit) = ctx.bodies.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(axum::http::header::RETRY_AFTER, "5")],
            "busy reading other deliveries (push.max_concurrent_deliveries)",
        )
            .into_response();
    };
    let read = tokio::time::timeout(
        Duration::from_secs(30),
        axum::body::to_bytes(req.into_body(), ctx.max_body as usize),
    )
    .await;
    let body = match read {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return too_large(),
        Err(_) => {
            return (StatusCode::REQUEST_TIMEOUT, "the body took more than 30 s").into_response()
        }
    };
    if !signature_ok(&sig, sub.secret.expose(), &body) {
        tracing::warn!(topic = %sub.topic, bytes = body.len(), "delivery ignored: not signed with our secret");
        count(&ctx, "bad_signature").await;
        return StatusCode::ACCEPTED.into_response();
    }
    // Kept on disk and answered at once: the hub never waits for the harvester's work.
    let max = ctx.max_queued;
    match ctx.state.run(move |s| s.inbox_put(id, &body, max)).await {
        Ok(true) => {
            ctx.inbox.wake(id);
            StatusCode::ACCEPTED.into_response()
        }
        Ok(false) => {
            tracing::warn!(topic = %sub.topic, "delivery refused for now: the deliveries waiting fill push.max_queued_bytes");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(axum::http::header::RETRY_AFTER, "30")],
                "the harvester's delivery queue is full (push.max_queued_bytes)",
            )
                .into_response()
        }
        Err(e) => {
            tracing::error!(topic = %sub.topic, error = %crate::cause::chain(&e), "a delivery could not be kept; the hub retries it");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(axum::http::header::RETRY_AFTER, "5")],
                "the delivery could not be kept",
            )
                .into_response()
        }
    }
}

/// Asks the hub for a subscription (or its renewal, keeping the secret). The answer to come
/// is the hub's verification request to the callback. The hub is reached through the
/// fetcher, so it too must lie inside the source's scope.
pub async fn subscribe(
    fetcher: &Fetcher,
    state: &Handle,
    set_id: i64,
    hub: &str,
    topic: &str,
    callback: &str,
    lease_secs: u64,
) -> anyhow::Result<()> {
    let mut fresh = [0u8; 24];
    getrandom::fill(&mut fresh).context("no randomness for hub.secret")?;
    let (h, t, cb) = (hub.to_string(), topic.to_string(), callback.to_string());
    // The secret is kept across renewals; a new one with a new hub or topic.
    let secret = state
        .run(move |s| {
            let secret = match s.subscription(set_id)? {
                Some(old) if old.topic == t && old.hub == h => old.secret,
                _ => crate::digest::hex_digest(fresh).into(),
            };
            s.requested(&Subscription {
                set_id,
                hub: h,
                topic: t,
                callback: cb,
                secret: secret.clone(),
                state: SubState::Requested,
                requested_at: Timestamp::now(),
                verified_at: None,
                lease_secs: None,
                reason: None,
            })?;
            Ok(secret)
        })
        .await?;
    let lease = lease_secs.to_string();
    let (status, text) = fetcher
        .post_form(
            hub,
            &[
                ("hub.mode", "subscribe"),
                ("hub.topic", topic),
                ("hub.callback", callback),
                ("hub.secret", secret.expose()),
                ("hub.lease_seconds", lease.as_str()),
            ],
        )
        .await
        .with_context(|| format!("cannot reach the hub {}", short(hub)))?;
    if !status.is_success() {
        anyhow::bail!(
            "the hub {} refused the subscription: {status}: {}",
            short(hub),
            super::scope::cut(text.trim(), 500)
        );
    }
    tracing::info!(hub = %short(hub), topic = %short(topic), "subscription requested");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_of_every_algorithm() {
        for alg in [
            SignatureAlg::Sha1,
            SignatureAlg::Sha256,
            SignatureAlg::Sha384,
            SignatureAlg::Sha512,
        ] {
            let h = signature(alg, b"s3cret", b"<x/>");
            assert!(signature_ok(&h, "s3cret", b"<x/>"), "{h}");
            assert!(!signature_ok(&h, "other", b"<x/>"));
            assert!(!signature_ok(&h, "s3cret", b"<y/>"));
        }
        assert!(!signature_ok("md5=00", "s3cret", b"<x/>"));
        assert!(!signature_ok("garbage", "s3cret", b"<x/>"));
    }
}
