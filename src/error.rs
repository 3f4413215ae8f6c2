//! The one mapping from errors to HTTP status.
//!
//! Policy: 4xx bodies say in plain words what was wrong with the request; 5xx bodies say
//! nothing internal (the log has the detail) and only 5xx are logged as errors. A store that
//! cannot be reached is a 503 with `Retry-After`, never a panic.
//!
//! | error                          | status |
//! |--------------------------------|--------|
//! | `NotFound`                     | 404    |
//! | `BadRequest`                   | 400    |
//! | `Unauthorized` (no token)      | 401    |
//! | `Forbidden` (wrong token/peer) | 403    |
//! | `UnsupportedMediaType`         | 415    |
//! | `Invalid` (bad change events)  | 422    |
//! | `Unavailable` (store down)     | 503    |
//!
//! The hub's errors ([`HubError`]) follow the same table, as plain text (WebSub §5.1.2), plus
//! `TooManyRequests` → 429 with `Retry-After`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::hub::HubError;
use crate::ingest::{IngestError, LineError};
use crate::source::SourceError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The request conflicts with what the server keeps (409), e.g. a window before retention.
    #[error("{0}")]
    Conflict(String),
    #[error("{message}")]
    Invalid {
        message: String,
        lines: Vec<LineError>,
    },
    #[error("service unavailable: {0}")]
    Unavailable(String),
    /// Too much work at once (page builds): 503 with a short `Retry-After`.
    #[error("{0}")]
    Busy(String),
}

impl AppError {
    pub fn status(&self) -> StatusCode {
        match self {
            AppError::NotFound(_) => StatusCode::NOT_FOUND,
            AppError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AppError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            AppError::Forbidden(_) => StatusCode::FORBIDDEN,
            AppError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            AppError::Conflict(_) => StatusCode::CONFLICT,
            AppError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            AppError::Unavailable(_) | AppError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> Self {
        AppError::Unavailable(e.to_string())
    }
}

impl From<SourceError> for AppError {
    fn from(e: SourceError) -> Self {
        match e {
            SourceError::NotFound(m) => AppError::NotFound(m),
            SourceError::Busy(m) => AppError::Busy(m),
            SourceError::Store(e) => e.into(),
            SourceError::Cache(m) => AppError::Unavailable(m),
        }
    }
}

impl From<IngestError> for AppError {
    fn from(e: IngestError) -> Self {
        match e {
            IngestError::Invalid(lines) => AppError::Invalid {
                message: e_msg(&lines),
                lines,
            },
            IngestError::Empty => AppError::BadRequest(IngestError::Empty.to_string()),
            IngestError::Store(e) => e.into(),
        }
    }
}

fn e_msg(lines: &[LineError]) -> String {
    IngestError::Invalid(lines.to_vec()).to_string()
}

/// Marks a 503 that shed load (not a store failure), for the metrics.
#[derive(Debug, Clone, Copy)]
pub struct Shed;

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = self.status();
        let busy = matches!(self, AppError::Busy(_));
        if status.is_server_error() && !busy {
            tracing::error!(error = %self, "request failed");
        }
        let mut resp = match &self {
            AppError::Invalid { message, lines } => {
                (status, Json(json!({ "error": message, "lines": lines }))).into_response()
            }
            AppError::Unavailable(_) => (
                status,
                Json(json!({ "error": "the store is unavailable; try again shortly" })),
            )
                .into_response(),
            other => (status, Json(json!({ "error": other.to_string() }))).into_response(),
        };
        if busy {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            resp.extensions_mut().insert(Shed);
        } else if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        }
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

impl HubError {
    pub fn status(&self) -> StatusCode {
        match self {
            HubError::BadRequest(_) => StatusCode::BAD_REQUEST,
            HubError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            HubError::Forbidden(_) => StatusCode::FORBIDDEN,
            HubError::NotFound(_) => StatusCode::NOT_FOUND,
            HubError::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            HubError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            HubError::Busy(_) | HubError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for HubError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = match &self {
            HubError::Store(e) => {
                tracing::error!(error = %e, "hub request failed");
                "the hub's store is unavailable; try again shortly\n".to_string()
            }
            other => format!("{other}\n"),
        };
        let mut resp = (status, body).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        match status {
            StatusCode::SERVICE_UNAVAILABLE => {
                h.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            }
            StatusCode::TOO_MANY_REQUESTS => {
                h.insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
            }
            StatusCode::UNAUTHORIZED => {
                h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        resp
    }
}
