//! The admin API (`/admin/v1/…`, bearer `admin.token`), its OpenAPI document, and `/metrics`.
//! JSON in and out; every error is `{"error": "..."}` with the status from `error.rs`. What
//! guards it is [`guard`]; the collectors' part is [`collect`], the inbox's [`inbox`].

pub(super) mod collect;
mod guard;
mod inbox;

use std::collections::BTreeMap;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, OpenApi, ToSchema};

use super::AppState;
use crate::error::AppError;
use crate::hub::admin::{AttemptFilter, AttemptRecord};
use crate::metrics::{SetLabel, StateLabel};
use crate::model::websub::{
    DeliveryAuth, Intent, SubState, Subscription, SubscriptionFilter, SubscriptionStats, Topic,
};
use crate::model::Timestamp;
pub(super) use guard::authorize;
use guard::{throttle_guesses, ErrorBody};

#[derive(OpenApi)]
#[openapi(
    info(title = "resourcesync-hub admin API", description = "Subscriptions, topics, delivery attempts and statistics of the WebSub hub; the collectors (OAI-PMH, ResourceSync, activity streams, sitemaps)."),
    paths(collect::list_collectors, collect::show_collector, collect::audit, collect::act, inbox::list_inbox, list_subscriptions, show_subscription, patch_subscription, put_auth, delete_auth, rotate_secret, delete_subscription, reverify, retry, redeliver, pause, resume, list_topics, latest_payload, list_deliveries, stats),
    components(schemas(inbox::InboxPage, inbox::InboxEntry, inbox::ReplyView, collect::CollectorView, collect::CollectorDetail, collect::CollectorList, collect::CollectAccepted, collect::CollectAudit, crate::collect::discover::Discovered, crate::collect::state::Counts, crate::collect::state::Control, crate::collect::state::RunPoint, crate::collect::state::Identified, crate::collect::state::QuarantineEntry, crate::collect::Live, SubscriptionView, SubscriptionPage, LastSuccess, LastFailure, TopicView, TopicPayload, AttemptView, StatsView, SubscriptionCounts, PollerView, ErrorBody, Accepted, Requeued, RedeliverRequest, Redelivered, SubState, SubscriptionPatch, AuthView, DeliveryAuth, SecretRequest, crate::hub::LaneFailure)),
    modifiers(&Bearer),
    security(("bearer" = []))
)]
pub struct AdminApi;

struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Routes under `/admin/v1`; when no token is configured, every one answers 404 saying so.
pub fn routes(state: &AppState) -> Router<AppState> {
    if state.config.admin.token.is_empty() {
        return Router::new().route(
            "/admin/{*rest}",
            axum::routing::any(|| async {
                AppError::NotFound(
                    "the admin API is disabled: set admin.token (RSHUB_ADMIN_TOKEN)".into(),
                )
            }),
        );
    }
    Router::new()
        .route(
            "/admin/v1/openapi.json",
            get(|| async { Json(AdminApi::openapi()) }),
        )
        .route("/admin/v1/subscriptions", get(list_subscriptions))
        .route(
            "/admin/v1/subscriptions/{id}",
            get(show_subscription)
                .delete(delete_subscription)
                .patch(patch_subscription),
        )
        .route("/admin/v1/subscriptions/{id}/verify", post(reverify))
        .route("/admin/v1/subscriptions/{id}/retry", post(retry))
        .route("/admin/v1/subscriptions/{id}/redeliver", post(redeliver))
        .route("/admin/v1/subscriptions/{id}/pause", post(pause))
        .route("/admin/v1/subscriptions/{id}/secret", post(rotate_secret))
        .route(
            "/admin/v1/subscriptions/{id}/auth",
            axum::routing::put(put_auth).delete(delete_auth),
        )
        .route("/admin/v1/subscriptions/{id}/resume", post(resume))
        .route("/admin/v1/topics", get(list_topics))
        .route("/admin/v1/topics/latest", get(latest_payload))
        .route("/admin/v1/deliveries", get(list_deliveries))
        .route("/admin/v1/stats", get(stats))
        .merge(collect::routes())
        .merge(inbox::routes())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            throttle_guesses,
        ))
}

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, AppError> {
    q.map(|Query(t)| t)
        .map_err(|e| AppError::BadRequest(e.body_text()))
}

/// A topic filter in the normal form the store keys use (`~` and `%7E` are one topic).
fn topic_key(t: Option<String>) -> Option<String> {
    t.map(|t| {
        Topic::parse(&t)
            .map(|k| k.as_str().to_string())
            .unwrap_or(t)
    })
}

fn sub_id(p: Result<Path<String>, PathRejection>) -> Result<i64, AppError> {
    let Path(id) = p.map_err(|e| AppError::BadRequest(e.body_text()))?;
    id.parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| AppError::NotFound(format!("no subscription {id:?}")))
}

#[derive(Serialize, ToSchema)]
pub struct LastSuccess {
    pub at: String,
    pub status: Option<u16>,
}

#[derive(Serialize, ToSchema)]
pub struct LastFailure {
    pub at: String,
    pub status: Option<u16>,
    pub error: Option<String>,
}

/// A subscription (or, with `state` = `pending_verification`, a request awaiting verification,
/// whose id is `pending-<n>`). The secret itself is never shown.
#[derive(Serialize, ToSchema)]
pub struct SubscriptionView {
    pub id: String,
    pub state: SubState,
    pub topic: String,
    pub callback: String,
    pub lease_seconds: u64,
    pub lease_start: Option<String>,
    pub lease_expires: Option<String>,
    pub verified_at: Option<String>,
    pub created_at: String,
    pub secret_set: bool,
    /// The HMAC of `X-Hub-Signature`; null when the subscriber gave no secret (its
    /// deliveries are not signed).
    pub signature_algorithm: Option<String>,
    /// Messages delivered.
    pub delivered: u64,
    /// Messages given up: every attempt failed, to the end of the retry schedule (they are
    /// tried again only on `retry` or a redelivery). An attempt that failed and is retried
    /// later is a failed attempt (`retry_attempts`, the `retry` outcome), not this.
    pub given_up: u64,
    /// Messages still to deliver.
    pub pending: u64,
    /// Failed attempts at the message now at the head of the queue.
    pub retry_attempts: u32,
    pub next_attempt_at: Option<String>,
    pub last_success: Option<LastSuccess>,
    pub last_failure: Option<LastFailure>,
    /// Since when its deliveries have been held (state `paused` or `disabled`).
    pub held_since: Option<String>,
    /// Since when every attempt has failed, if its last did (it is disabled once this lies
    /// `hub.disable_after_secs` back).
    pub failing_since: Option<String>,
    /// Its own limit of deliveries a second (0: none); null: the hub's
    /// `hub.max_per_sec_per_subscriber`.
    pub max_per_sec: Option<f64>,
    /// How the hub authenticates itself to the receiver (never a key or a secret).
    pub auth: Option<AuthView>,
    /// After a rotation, until when the previous secret still signs deliveries.
    pub previous_secret_until: Option<String>,
    /// Its delivery lane in this process ended unexpectedly and was started again (a defect:
    /// the server's log has the details); null when that never happened.
    pub lane_failure: Option<crate::hub::LaneFailure>,
}

fn ts(t: Timestamp) -> String {
    t.to_string()
}

pub(super) fn view(s: Subscription, st: SubscriptionStats) -> SubscriptionView {
    SubscriptionView {
        id: s.id.to_string(),
        state: st.state.unwrap_or(SubState::Active),
        topic: s.topic.to_string(),
        callback: s.callback.to_string(),
        lease_seconds: s.lease_secs,
        lease_start: Some(ts(s.lease_start)),
        lease_expires: Some(ts(s.expires_at)),
        verified_at: Some(ts(s.verified_at)),
        created_at: ts(s.created_at),
        secret_set: s.secret.is_some(),
        signature_algorithm: s.secret.is_some().then(|| s.alg.to_string()),
        delivered: st.delivered,
        given_up: st.failed,
        pending: st.pending,
        retry_attempts: s.attempts,
        next_attempt_at: s.next_attempt_at.map(ts),
        last_success: st.last_success_at.map(|at| LastSuccess {
            at: ts(at),
            status: st.last_success_status,
        }),
        last_failure: st.last_failure_at.map(|at| LastFailure {
            at: ts(at),
            status: st.last_failure_status,
            error: st.last_failure_error.clone(),
        }),
        held_since: s.held.map(|h| ts(h.since)),
        failing_since: s.failing_since.map(ts),
        max_per_sec: s.max_per_sec,
        auth: s.auth.as_ref().map(auth_view),
        previous_secret_until: s.previous_secret.as_ref().map(|(_, until)| ts(*until)),
        lane_failure: None,
    }
}

fn pending_view(i: Intent) -> SubscriptionView {
    SubscriptionView {
        id: format!("pending-{}", i.id),
        state: SubState::PendingVerification,
        topic: i.topic.to_string(),
        callback: i.callback.to_string(),
        lease_seconds: i.lease_secs,
        lease_start: None,
        lease_expires: None,
        verified_at: None,
        created_at: ts(i.requested_at),
        secret_set: i.secret.is_some(),
        signature_algorithm: i.secret.is_some().then(|| i.alg.to_string()),
        delivered: 0,
        given_up: 0,
        pending: 0,
        retry_attempts: 0,
        next_attempt_at: None,
        last_success: None,
        last_failure: None,
        held_since: None,
        failing_since: None,
        max_per_sec: None,
        auth: None,
        previous_secret_until: None,
        lane_failure: None,
    }
}

#[derive(Serialize, ToSchema)]
pub struct SubscriptionPage {
    pub items: Vec<SubscriptionView>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Exact topic URL.
    pub topic: Option<String>,
    /// Part of the callback URL.
    pub callback: Option<String>,
    pub state: Option<SubState>,
    /// `next_cursor` of the previous page.
    #[param(pattern = r"^[0-9]{0,18}$")]
    pub cursor: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

fn limit(l: Option<u32>, default: u32) -> Result<usize, AppError> {
    match l.unwrap_or(default) {
        n @ 1..=1000 => Ok(n as usize),
        n => Err(AppError::BadRequest(format!(
            "limit {n} must lie between 1 and 1000"
        ))),
    }
}

/// Lists subscriptions, filtered, in id order. Pending verifications appear only with
/// `state=pending_verification`.
#[utoipa::path(get, path = "/admin/v1/subscriptions", params(ListParams), responses(
    (status = 200, body = SubscriptionPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)")))]
async fn list_subscriptions(
    State(st): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<SubscriptionPage>, AppError> {
    authorize(&st, &headers)?;
    let p = query(q)?;
    let limit = limit(p.limit, 100)?;
    let after = match p.cursor.as_deref() {
        None | Some("") => 0,
        Some(c) => c
            .parse::<i64>()
            .map_err(|_| AppError::BadRequest(format!("cursor {c:?} is not one this API gave")))?,
    };
    let store = st.hub.store();
    if p.state == Some(SubState::PendingVerification) {
        let mut items: Vec<Intent> = store
            .hub_intents()
            .await?
            .into_iter()
            .filter(|i| i.mode != crate::model::websub::IntentMode::Denied && i.id > after)
            .filter(|i| {
                topic_key(p.topic.clone())
                    .as_deref()
                    .is_none_or(|t| i.topic.as_str() == t)
            })
            .filter(|i| {
                p.callback
                    .as_deref()
                    .is_none_or(|c| i.callback.as_str().contains(c))
            })
            .collect();
        let more = items.len() > limit;
        items.truncate(limit);
        let next_cursor = more
            .then(|| items.last().map(|i| i.id.to_string()))
            .flatten();
        return Ok(Json(SubscriptionPage {
            items: items.into_iter().map(pending_view).collect(),
            next_cursor,
        }));
    }
    let filter = SubscriptionFilter {
        topic: topic_key(p.topic.clone()),
        callback_contains: p.callback,
        state: p.state,
        after: Some(after),
        limit: limit + 1,
    };
    let mut rows = store.hub_list(filter, Timestamp::now()).await?;
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next_cursor = more
        .then(|| rows.last().map(|(s, _)| s.id.to_string()))
        .flatten();
    Ok(Json(SubscriptionPage {
        items: rows.into_iter().map(|(s, x)| view(s, x)).collect(),
        next_cursor,
    }))
}

/// One subscription: lease, verification, whether a secret is set, counters, queue, last
/// success and failure.
#[utoipa::path(get, path = "/admin/v1/subscriptions/{id}", params(("id" = String, Path, description = "Subscription id")), responses(
    (status = 200, body = SubscriptionView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody)))]
async fn show_subscription(
    State(st): State<AppState>,
    headers: HeaderMap,
    p: Result<Path<String>, PathRejection>,
) -> Result<Json<SubscriptionView>, AppError> {
    authorize(&st, &headers)?;
    detail(&st, sub_id(p)?).await
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteParams {
    /// Also tell the subscriber (a `hub.mode=denied` GET to its callback).
    pub deny: Option<bool>,
    /// The `hub.reason` of the denial.
    pub reason: Option<String>,
}

/// Deletes a subscription, optionally sending the subscriber a denial.
#[utoipa::path(delete, path = "/admin/v1/subscriptions/{id}", params(("id" = String, Path, description = "Subscription id"), DeleteParams), responses(
    (status = 204, description = "Deleted"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody)))]
async fn delete_subscription(
    State(st): State<AppState>,
    headers: HeaderMap,
    p: Result<Path<String>, PathRejection>,
    q: Result<Query<DeleteParams>, QueryRejection>,
) -> Result<StatusCode, AppError> {
    authorize(&st, &headers)?;
    let id = sub_id(p)?;
    let q = query(q)?;
    let deny = q.deny.unwrap_or(false).then(|| {
        q.reason
            .unwrap_or_else(|| "the hub's administrator ended this subscription".into())
    });
    if st.hub.delete_subscription(id, deny).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(AppError::NotFound(format!("no subscription {id}")))
    }
}

#[derive(Serialize, ToSchema)]
pub struct Accepted {
    pub message: String,
}

/// Verifies the subscriber's intent again (a renewal with its current lease and secret).
#[utoipa::path(post, path = "/admin/v1/subscriptions/{id}/verify", params(("id" = String, Path, description = "Subscription id")), responses(
    (status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody)))]
async fn reverify(
    State(st): State<AppState>,
    headers: HeaderMap,
    p: Result<Path<String>, PathRejection>,
) -> Result<(StatusCode, Json<Accepted>), AppError> {
    authorize(&st, &headers)?;
    let id = sub_id(p)?;
    if st.hub.reverify(id).await? {
        Ok((
            StatusCode::ACCEPTED,
            Json(Accepted {
                message: "verification of intent sent".into(),
            }),
        ))
    } else {
        Err(AppError::NotFound(format!("no subscription {id}")))
    }
}

#[derive(Serialize, ToSchema)]
pub struct Requeued {
    /// Failed deliveries queued again.
    pub requeued: usize,
}

/// Retries now: queues the subscription's given-up messages again and ends the wait before
/// the next retry of its current one.
#[utoipa::path(post, path = "/admin/v1/subscriptions/{id}/retry", params(("id" = String, Path, description = "Subscription id")), responses(
    (status = 200, body = Requeued), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody)))]
async fn retry(
    State(st): State<AppState>,
    headers: HeaderMap,
    p: Result<Path<String>, PathRejection>,
) -> Result<Json<Requeued>, AppError> {
    authorize(&st, &headers)?;
    let id = sub_id(p)?;
    let n = st
        .hub
        .retry_now(id)
        .await?
        .ok_or_else(|| AppError::NotFound(format!("no subscription {id}")))?;
    Ok(Json(Requeued { requeued: n }))
}

/// A window of a subscription's messages to deliver again.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RedeliverRequest {
    /// RFC 3339 (with a zone): messages published at or after this instant. It may not lie
    /// before what the hub keeps (`hub.retention_hours`).
    #[schema(format = DateTime)]
    pub since: String,
    /// RFC 3339: messages published before this instant (default: now).
    #[schema(format = DateTime)]
    pub until: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct Redelivered {
    /// Messages queued again (those the subscriber was sent already, published in the window
    /// since it subscribed); they go next, in order, with their original `Webhook-Id`.
    pub queued: u64,
}

/// Delivers a window of the subscription's messages again: those published in
/// `[since, until)` that it was sent already, next, in order, each with its `Webhook-Id` (the
/// subscriber can tell them from new ones); messages still pending are sent at once (a wait
/// before the next retry ends). 409 when the window starts before what the hub keeps
/// (`hub.retention_hours`), naming the oldest message kept.
#[utoipa::path(post, path = "/admin/v1/subscriptions/{id}/redeliver", params(("id" = String, Path, description = "Subscription id")),
    request_body = RedeliverRequest, responses(
    (status = 202, body = Redelivered), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"),
    (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn redeliver(
    State(st): State<AppState>,
    headers: HeaderMap,
    p: Result<Path<String>, PathRejection>,
    body: Result<Json<serde_json::Value>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<Redelivered>), AppError> {
    authorize(&st, &headers)?;
    let id = sub_id(p)?;
    let req: RedeliverRequest = json_object(
        body,
        r#"{"since": "2026-01-31T12:00:00Z", "until": optional}"#,
    )?;
    let since = Timestamp::parse_zoned(&req.since, "since").map_err(AppError::BadRequest)?;
    let until = req
        .until
        .as_deref()
        .map(|u| Timestamp::parse_zoned(u, "until"))
        .transpose()
        .map_err(AppError::BadRequest)?;
    use crate::hub::admin::Redelivery;
    match st.hub.redeliver(id, since, until).await? {
        Redelivery::Queued(n) => Ok((StatusCode::ACCEPTED, Json(Redelivered { queued: n }))),
        Redelivery::NoSuchSubscription => Err(AppError::NotFound(format!("no subscription {id}"))),
        Redelivery::BeforeRetention(why) => Err(AppError::Conflict(why)),
    }
}

/// What an admin may change of a subscription.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionPatch {
    /// Deliveries a second at most (a positive number up to 10000; 0: no limit, whatever the
    /// hub's default; null: the hub's `hub.max_per_sec_per_subscriber`). Messages beyond it wait
    /// in order; none is dropped.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<f64>, minimum = 0, maximum = 10000)]
    pub max_per_sec: Option<Option<f64>>,
}

/// A request body that must be a JSON object of `T`'s fields (serde would also take an array
/// of them in order): 400 naming `example` otherwise.
fn json_object<T: serde::de::DeserializeOwned>(
    body: Result<Json<serde_json::Value>, axum::extract::rejection::JsonRejection>,
    example: &str,
) -> Result<T, AppError> {
    let bad =
        |why: String| AppError::BadRequest(format!("the body must be JSON like {example}: {why}"));
    let Json(v) = body.map_err(|e| bad(e.body_text()))?;
    if !v.is_object() {
        return Err(bad("it is not an object".into()));
    }
    serde_json::from_value(v).map_err(|e| bad(e.to_string()))
}

/// A field given, even as null (`Some(None)`), told from one left out (`None`).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// What is shown of a subscription's delivery auth: never a key or a secret.
#[derive(Serialize, ToSchema)]
pub struct AuthView {
    /// `mtls` or `oauth2`.
    pub kind: String,
    pub token_url: Option<String>,
    pub client_id: Option<String>,
    pub scope: Option<String>,
}

fn auth_view(a: &DeliveryAuth) -> AuthView {
    let mut v = AuthView {
        kind: a.kind().into(),
        token_url: None,
        client_id: None,
        scope: None,
    };
    if let DeliveryAuth::Oauth2 {
        token_url,
        client_id,
        scope,
        ..
    } = a
    {
        (v.token_url, v.client_id, v.scope) = (
            Some(token_url.clone()),
            Some(client_id.clone()),
            scope.clone(),
        );
    }
    v
}

/// Changes a subscription's settings (its delivery rate limit); answers the subscription.
#[utoipa::path(patch, path = "/admin/v1/subscriptions/{id}", params(("id" = String, Path, description = "Subscription id")),
    request_body = SubscriptionPatch, responses(
    (status = 200, body = SubscriptionView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody)))]
async fn patch_subscription(
    State(st): State<AppState>,
    headers: HeaderMap,
    p: Result<Path<String>, PathRejection>,
    body: Result<Json<serde_json::Value>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<SubscriptionView>, AppError> {
    authorize(&st, &headers)?;
    let id = sub_id(p)?;
    let req: SubscriptionPatch = json_object(body, r#"{"max_per_sec": 5}"#)?;
    if let Some(Some(n)) = req.max_per_sec {
        if !(0.0..=crate::config::MAX_PER_SEC).contains(&n) {
            return Err(AppError::BadRequest(format!(
                "max_per_sec {n} must lie between 0 (no limit) and {}",
                crate::config::MAX_PER_SEC
            )));
        }
    }
    let change = crate::model::websub::SubscriptionChange {
        max_per_sec: req.max_per_sec,
        ..Default::default()
    };
    apply_change(&st, id, change).await
}

/// A subscription's new secret.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretRequest {
    /// The new `hub.secret` (1 to 199 bytes). The previous one keeps signing deliveries (a
    /// second `v1,` signature in `webhook-signature`) for `hub.secret_grace_secs`;
    /// `X-Hub-Signature` uses the new one at once.
    #[schema(min_length = 1, max_length = 199)]
    pub secret: String,
}

/// Rotates a subscription's secret without a gap (as a re-subscription with a new
/// `hub.secret` does): answers the subscription, with until when the previous secret signs.
#[utoipa::path(post, path = "/admin/v1/subscriptions/{id}/secret", params(("id" = String, Path, description = "Subscription id")),
    request_body = SecretRequest, responses(
    (status = 200, body = SubscriptionView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody)))]
async fn rotate_secret(
    State(st): State<AppState>,
    headers: HeaderMap,
    p: Result<Path<String>, PathRejection>,
    body: Result<Json<serde_json::Value>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<SubscriptionView>, AppError> {
    authorize(&st, &headers)?;
    let id = sub_id(p)?;
    let req: SecretRequest = json_object(body, r#"{"secret": "…"}"#)?;
    if req.secret.is_empty() || req.secret.len() > crate::hub::MAX_SECRET_BYTES {
        return Err(AppError::BadRequest(format!(
            "the secret must be 1 to {} bytes",
            crate::hub::MAX_SECRET_BYTES
        )));
    }
    let until = Timestamp::now().plus_secs(st.hub.settings().secret_grace.as_secs());
    let change = crate::model::websub::SubscriptionChange {
        secret: Some((req.secret.into(), until)),
        ..Default::default()
    };
    apply_change(&st, id, change).await
}

/// Sets how the hub authenticates itself to the subscription's receiver, for deliveries and
/// verifications: `{"mtls": {"certificate": PEM, "key": PEM, "ca": PEM (optional)}}` (an https
/// callback) or `{"oauth2": {"token_url", "client_id", "client_secret", "scope" (optional)}}`
/// (the token URL under the callbacks' address policy). Answers the subscription; keys and
/// secrets are never shown back. 400 with the reason when the certificate, key or CA do not
/// parse or the token URL is refused.
#[utoipa::path(put, path = "/admin/v1/subscriptions/{id}/auth", params(("id" = String, Path, description = "Subscription id")),
    request_body = DeliveryAuth, responses(
    (status = 200, body = SubscriptionView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody)))]
async fn put_auth(
    State(st): State<AppState>,
    headers: HeaderMap,
    p: Result<Path<String>, PathRejection>,
    body: Result<Json<serde_json::Value>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<SubscriptionView>, AppError> {
    authorize(&st, &headers)?;
    let id = sub_id(p)?;
    let auth: DeliveryAuth = json_object(
        body,
        r#"{"oauth2": {"token_url": "https://…", "client_id": "…", "client_secret": "…"}}"#,
    )?;
    let (sub, _) = st
        .hub
        .store()
        .hub_detail(id, Timestamp::now())
        .await?
        .ok_or_else(|| AppError::NotFound(format!("no subscription {id}")))?;
    st.hub
        .clients()
        .check(&sub, &auth)
        .map_err(AppError::BadRequest)?;
    set_auth(&st, id, Some(auth)).await
}

/// Removes the subscription's delivery auth (deliveries go as to any receiver).
#[utoipa::path(delete, path = "/admin/v1/subscriptions/{id}/auth", params(("id" = String, Path, description = "Subscription id")), responses(
    (status = 200, body = SubscriptionView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody)))]
async fn delete_auth(
    State(st): State<AppState>,
    headers: HeaderMap,
    p: Result<Path<String>, PathRejection>,
) -> Result<Json<SubscriptionView>, AppError> {
    authorize(&st, &headers)?;
    let id = sub_id(p)?;
    set_auth(&st, id, None).await
}

async fn set_auth(
    st: &AppState,
    id: i64,
    auth: Option<DeliveryAuth>,
) -> Result<Json<SubscriptionView>, AppError> {
    let change = crate::model::websub::SubscriptionChange {
        auth: Some(auth),
        ..Default::default()
    };
    apply_change(st, id, change).await
}

/// Applies an admin's change to a subscription and answers it as it now stands.
async fn apply_change(
    st: &AppState,
    id: i64,
    change: crate::model::websub::SubscriptionChange,
) -> Result<Json<SubscriptionView>, AppError> {
    if st.hub.change(id, change).await?.is_none() {
        return Err(AppError::NotFound(format!("no subscription {id}")));
    }
    detail(st, id).await
}

async fn detail(st: &AppState, id: i64) -> Result<Json<SubscriptionView>, AppError> {
    subscription_view(st, id).await.map(Json)
}

/// One subscription as the admin API and the console show it.
pub(super) async fn subscription_view(
    st: &AppState,
    id: i64,
) -> Result<SubscriptionView, AppError> {
    let (s, x) = st
        .hub
        .store()
        .hub_detail(id, Timestamp::now())
        .await?
        .ok_or_else(|| AppError::NotFound(format!("no subscription {id}")))?;
    let mut v = view(s, x);
    v.lane_failure = st.hub.lane_failure(id);
    Ok(v)
}

/// Pauses a subscription's deliveries: nothing is sent (an attempt under way finishes), its
/// messages keep accumulating, and resume delivers them in order. Answers the subscription.
#[utoipa::path(post, path = "/admin/v1/subscriptions/{id}/pause", params(("id" = String, Path, description = "Subscription id")), responses(
    (status = 200, body = SubscriptionView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody)))]
async fn pause(
    State(st): State<AppState>,
    headers: HeaderMap,
    p: Result<Path<String>, PathRejection>,
) -> Result<Json<SubscriptionView>, AppError> {
    hold(
        st,
        headers,
        p,
        Some(crate::model::websub::HoldReason::Paused),
    )
    .await
}

/// Resumes a paused or disabled subscription: what it missed is delivered in order from where
/// it stopped (and a disabled one gets a whole `hub.disable_after_secs` again).
#[utoipa::path(post, path = "/admin/v1/subscriptions/{id}/resume", params(("id" = String, Path, description = "Subscription id")), responses(
    (status = 200, body = SubscriptionView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody)))]
async fn resume(
    State(st): State<AppState>,
    headers: HeaderMap,
    p: Result<Path<String>, PathRejection>,
) -> Result<Json<SubscriptionView>, AppError> {
    hold(st, headers, p, None).await
}

async fn hold(
    st: AppState,
    headers: HeaderMap,
    p: Result<Path<String>, PathRejection>,
    reason: Option<crate::model::websub::HoldReason>,
) -> Result<Json<SubscriptionView>, AppError> {
    authorize(&st, &headers)?;
    let id = sub_id(p)?;
    if st.hub.hold(id, reason).await?.is_none() {
        return Err(AppError::NotFound(format!("no subscription {id}")));
    }
    detail(&st, id).await
}

#[derive(Serialize, ToSchema)]
pub struct TopicView {
    pub topic: String,
    pub subscribers: u64,
    pub last_publish: Option<String>,
}

/// Every topic the hub knows, with subscriber counts and the last publish time.
#[utoipa::path(get, path = "/admin/v1/topics", responses(
    (status = 200, body = Vec<TopicView>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)")))]
async fn list_topics(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Vec<TopicView>>, AppError> {
    authorize(&st, &headers)?;
    let topics = st.hub.store().hub_topics().await?;
    Ok(Json(
        topics
            .into_iter()
            .map(|t| TopicView {
                topic: t.topic.to_string(),
                subscribers: t.subscribers,
                last_publish: t.last_publish.map(ts),
            })
            .collect(),
    ))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TopicParams {
    /// The topic URL: http(s), with a host name.
    #[param(
        pattern = r"^https?://[a-z]([a-z0-9-]*[a-z0-9])?(\.[a-z]([a-z0-9-]*[a-z0-9])?)*(:[0-9]{1,4})?(/[^\s#]*)?$"
    )]
    pub topic: String,
}

#[derive(Serialize, ToSchema)]
pub struct TopicPayload {
    pub topic: String,
    pub subscribers: u64,
    pub content_type: Option<String>,
    pub published_at: Option<String>,
    /// The latest payload as text (absent before the first publish).
    pub payload: Option<String>,
}

/// A topic's latest payload.
#[utoipa::path(get, path = "/admin/v1/topics/latest", params(TopicParams), responses(
    (status = 200, body = TopicPayload), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody)))]
async fn latest_payload(
    State(st): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<TopicParams>, QueryRejection>,
) -> Result<Json<TopicPayload>, AppError> {
    authorize(&st, &headers)?;
    let q = query(q)?;
    let topic = Topic::parse(&q.topic).map_err(AppError::BadRequest)?;
    let info = st
        .hub
        .topic(&topic)
        .await?
        .ok_or_else(|| AppError::NotFound(format!("no topic {topic}")))?;
    Ok(Json(TopicPayload {
        topic: topic.to_string(),
        subscribers: info.subscribers,
        content_type: info.latest.as_ref().map(|m| m.content_type.clone()),
        published_at: info.latest.as_ref().map(|m| ts(m.published_at)),
        payload: info
            .latest
            .as_ref()
            .map(|m| String::from_utf8_lossy(&m.body).into_owned()),
    }))
}

#[derive(Serialize, ToSchema)]
pub struct AttemptView {
    pub at: String,
    pub subscription_id: String,
    pub topic: String,
    pub message_id: i64,
    /// delivered, retry (a failed attempt, tried again later), given_up (a failed attempt
    /// that was the schedule's last) or gone (410: the subscription ends).
    pub outcome: String,
    pub status: Option<u16>,
    pub error: Option<String>,
    pub duration_ms: f64,
}

impl From<AttemptRecord> for AttemptView {
    fn from(a: AttemptRecord) -> Self {
        AttemptView {
            at: ts(a.at),
            subscription_id: a.subscription_id.to_string(),
            topic: a.topic.to_string(),
            message_id: a.message_id,
            outcome: a.outcome.to_string(),
            status: a.status,
            error: a.error,
            duration_ms: a.duration_ms,
        }
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveryParams {
    /// A subscription id.
    #[param(pattern = r"^[0-9]{0,18}$")]
    pub subscription: Option<String>,
    pub topic: Option<String>,
    /// delivered, retry (a failed attempt, tried again later), given_up (a failed attempt
    /// that was the schedule's last) or gone (410: the subscription ends).
    pub outcome: Option<String>,
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// Recent delivery attempts (the last 10,000 since the server started), newest first.
#[utoipa::path(get, path = "/admin/v1/deliveries", params(DeliveryParams), responses(
    (status = 200, body = Vec<AttemptView>), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)")))]
async fn list_deliveries(
    State(st): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<DeliveryParams>, QueryRejection>,
) -> Result<Json<Vec<AttemptView>>, AppError> {
    authorize(&st, &headers)?;
    let q = query(q)?;
    let subscription_id = match q.subscription.as_deref() {
        None | Some("") => None,
        Some(s) => Some(
            s.parse::<i64>()
                .map_err(|_| AppError::BadRequest(format!("subscription {s:?} is not an id")))?,
        ),
    };
    let f = AttemptFilter {
        subscription_id,
        topic: topic_key(q.topic),
        outcome: q.outcome,
        limit: limit(q.limit, 100)?,
    };
    Ok(Json(
        st.hub
            .attempts(&f)
            .into_iter()
            .map(AttemptView::from)
            .collect(),
    ))
}

#[derive(Serialize, ToSchema)]
pub struct SubscriptionCounts {
    pub active: u64,
    pub failing: u64,
    pub expired: u64,
    pub paused: u64,
    pub disabled: u64,
    pub pending_verification: u64,
}

#[derive(Serialize, ToSchema)]
pub struct PollerView {
    pub set: String,
    /// Change notifications cover every change dated before this.
    pub watermark: Option<String>,
    /// The oldest change not yet notified, if any.
    pub oldest_pending: Option<String>,
    /// Its age in seconds (0 when none is waiting).
    pub lag_seconds: f64,
}

#[derive(Serialize, ToSchema)]
pub struct StatsView {
    pub subscriptions: SubscriptionCounts,
    /// Messages delivered, and given up (the retry schedule exhausted), over all time.
    pub delivered: u64,
    pub given_up: u64,
    /// Attempts since the server started, by outcome.
    pub attempts_by_outcome: BTreeMap<String, u64>,
    /// Messages waiting for delivery over all live subscriptions.
    pub queue_depth: u64,
    pub pollers: Vec<PollerView>,
}

/// Totals by outcome, queue depth, subscriptions by state, and each set's poller position and lag.
#[utoipa::path(get, path = "/admin/v1/stats", responses(
    (status = 200, body = StatsView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)")))]
async fn stats(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<StatsView>, AppError> {
    authorize(&st, &headers)?;
    Ok(Json(collect_stats(&st).await?))
}

pub(super) async fn collect_stats(st: &AppState) -> Result<StatsView, AppError> {
    let store = st.hub.store();
    let now = Timestamp::now();
    let t = store.hub_totals(now).await?;
    let attempts_by_outcome: BTreeMap<String, u64> = st
        .hub
        .attempt_counts()
        .into_iter()
        .map(|(k, n)| (k.to_string(), n))
        .collect();
    let mut pollers = Vec::new();
    if st.config.notify.enabled {
        for set in store.sets().await? {
            let state = store.notify_state(&set.name).await?;
            let oldest = match &state {
                Some(s) => store
                    .changes(&set.name, s.watermark, None, None, 1)
                    .await?
                    .items
                    .first()
                    .map(|c| c.datetime),
                None => None,
            };
            let lag = oldest.map_or(0.0, |o| ((now.micros() - o.micros()).max(0) as f64) / 1e6);
            pollers.push(PollerView {
                set: set.name.to_string(),
                watermark: state.map(|s| ts(s.watermark)),
                oldest_pending: oldest.map(ts),
                lag_seconds: lag,
            });
        }
    }
    Ok(StatsView {
        subscriptions: SubscriptionCounts {
            active: t.active,
            failing: t.failing,
            expired: t.expired,
            paused: t.paused,
            disabled: t.disabled,
            pending_verification: t.pending_verification,
        },
        delivered: t.delivered,
        given_up: t.failed,
        attempts_by_outcome,
        queue_depth: t.queue_depth,
        pollers,
    })
}

/// `GET /metrics`: Prometheus text format, gauges read from the store now.
pub async fn metrics(State(st): State<AppState>) -> Response {
    let m = st.hub.metrics();
    m.delivering.set(i64::from(st.hub.is_delivering()));
    m.partitions_held.set(st.hub.partitions_held() as i64);
    match collect_stats(&st).await {
        Ok(s) => {
            m.queue_depth.set(s.queue_depth as i64);
            for (state, n) in [
                ("active", s.subscriptions.active),
                ("failing", s.subscriptions.failing),
                ("expired", s.subscriptions.expired),
                ("paused", s.subscriptions.paused),
                ("disabled", s.subscriptions.disabled),
                ("pending_verification", s.subscriptions.pending_verification),
            ] {
                m.subscriptions
                    .get_or_create(&StateLabel { state })
                    .set(n as i64);
            }
            for p in s.pollers {
                m.poller_lag_seconds
                    .get_or_create(&SetLabel { set: p.set })
                    .set(p.lag_seconds);
            }
        }
        Err(_) => {
            m.store_errors.inc();
        }
    }
    for e in st.collectors.entries() {
        let Ok((saved, _)) = e.collector.status().await else {
            m.store_errors.inc();
            continue;
        };
        let collector = e.collector.name.to_string();
        let t = &saved.totals;
        for (outcome, n) in [
            ("seen", t.seen),
            ("created", t.created),
            ("updated", t.updated),
            ("deleted", t.deleted),
            ("unchanged", t.unchanged),
            ("quarantined", t.quarantined),
        ] {
            m.collect_records
                .get_or_create(&crate::metrics::CollectorOutcomeLabel {
                    collector: collector.clone(),
                    outcome,
                })
                .set(n as i64);
        }
        let label = crate::metrics::CollectorLabel { collector };
        let failing = saved.last_error.is_some() || saved.stopped.is_some();
        m.collect_failing
            .get_or_create(&label)
            .set(i64::from(failing));
        m.collect_running
            .get_or_create(&label)
            .set(i64::from(e.live().doing.is_some()));
        if !failing {
            if let Some(t) = saved
                .last_ended
                .as_deref()
                .and_then(|t| Timestamp::parse(t).ok())
            {
                m.collect_last_success
                    .get_or_create(&label)
                    .set(t.0 / 1_000_000);
            }
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
        .into_response()
}
