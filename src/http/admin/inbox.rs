//! The inbox in the admin API (`/admin/v1/inbox`): each notification kept, what became of the
//! record it names, and the answers sent to its sender (the outbox) with their state.

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::guard::{authorize, ErrorBody};
use crate::error::AppError;
use crate::http::AppState;

pub fn routes() -> Router<AppState> {
    Router::new().route("/admin/v1/inbox", get(list_inbox))
}

/// An answer sent to a notification's sender.
#[derive(Serialize, ToSchema)]
pub struct ReplyView {
    /// `Accept`, `Reject` or `Announce`.
    pub kind: String,
    pub id: String,
    /// `pending`, `sent` or `given_up`.
    pub state: String,
    pub attempts: u32,
    pub last: Option<String>,
}

/// A notification kept by the inbox.
#[derive(Serialize, ToSchema)]
pub struct InboxEntry {
    /// Its number (its URL is `/inbox/{seq}`).
    pub seq: u64,
    /// When it was taken (RFC 3339).
    pub received: String,
    /// The declared sender (`[inbox.senders.NAME]`).
    pub sender: String,
    pub pattern: String,
    /// The notification's own id.
    pub id: String,
    /// `received`, `collected` (with `identifier` and `changed`) or `not_collected` (with `why`).
    #[schema(value_type = Object)]
    pub outcome: serde_json::Value,
    pub replies: Vec<ReplyView>,
}

#[derive(Serialize, ToSchema)]
pub struct InboxPage {
    pub notifications: Vec<InboxEntry>,
    /// The next page's number, when there is one.
    pub next_page: Option<u64>,
}

#[derive(Deserialize, utoipa::IntoParams)]
pub struct InboxQuery {
    /// From 1, newest first.
    pub page: Option<u64>,
}

#[utoipa::path(get, path = "/admin/v1/inbox", params(InboxQuery), responses(
    (status = 200, body = InboxPage), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 429, body = ErrorBody, description = "Too many wrong admin tokens from this address (Retry-After)"), (status = 404, body = ErrorBody, description = "The inbox is not enabled")))]
pub async fn list_inbox(
    State(st): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<InboxQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<InboxPage>, AppError> {
    authorize(&st, &headers)?;
    let Query(q) = q.map_err(|e| AppError::BadRequest(e.body_text()))?;
    let inbox = st.inbox.as_ref().ok_or_else(|| {
        AppError::NotFound("this server has no inbox (inbox.enabled = false)".into())
    })?;
    let (kept, next_page) = inbox
        .page(q.page.unwrap_or(1).max(1))
        .await
        .map_err(|e| AppError::Unavailable(crate::cause::chain(&e)))?;
    let notifications = kept
        .into_iter()
        .map(|k| InboxEntry {
            seq: k.seq,
            received: crate::model::Timestamp(k.received_us).to_string(),
            sender: k.sender,
            pattern: k.pattern.as_str().into(),
            id: k.notification["id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            outcome: serde_json::to_value(&k.outcome).unwrap_or_default(),
            replies: k
                .replies
                .into_iter()
                .map(|r| ReplyView {
                    kind: r.kind,
                    id: r.id,
                    state: r.state,
                    attempts: r.attempts,
                    last: r.last,
                })
                .collect(),
        })
        .collect();
    Ok(Json(InboxPage {
        notifications,
        next_page,
    }))
}
