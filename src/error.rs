//! The one mapping from errors to HTTP status.
//!
//! Policy: 4xx bodies say in plain words what was wrong with the request; 5xx bodies say
//! nothing internal (the log has the whole chain of causes, printed by [`crate::cause::chain`])
//! and only 5xx are logged as errors. A store that cannot serve now is a 503 with
//! `Retry-After`, never a panic; a store whose data is wrong is a 500 without one (waiting will
//! not mend it).
//!
//! | error                          | status |
//! |--------------------------------|--------|
//! | `NotFound`                     | 404    |
//! | `BadRequest`                   | 400    |
//! | `Unauthorized` (no token)      | 401    |
//! | `Forbidden` (wrong token/peer) | 403    |
//! | `UnsupportedMediaType`         | 415    |
//! | `Conflict`                     | 409    |
//! | `Invalid` (bad change events)  | 422    |
//! | `TooManyRequests`              | 429 (`Retry-After: 60`) |
//! | `Internal` (corrupt store)     | 500    |
//! | `Unavailable` (store down)     | 503 (`Retry-After: 5`) |
//! | `Busy` (load shed)             | 503 (`Retry-After: 1`) |
//!
//! The hub's errors ([`HubError`]) become [`AppError`]s through this same table; the WebSub
//! endpoints answer them as plain text ([`PlainText`], WebSub §5.1.2), everything else as JSON.

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
    /// Too many requests from one peer (the hub's per-host limits): 429 with `Retry-After`.
    #[error("{0}")]
    TooManyRequests(String),
    /// Something is wrong on this side that waiting will not mend (a corrupt store): 500.
    #[error("internal error: {0}")]
    Internal(String),
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
            AppError::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            AppError::Unavailable(_) | AppError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The words of an answer's body: what was wrong with a request, and nothing internal
    /// for a 5xx.
    fn public_words(&self) -> String {
        match self {
            AppError::Unavailable(_) => "the store is unavailable; try again shortly".into(),
            AppError::Internal(_) => "internal error; the server's log says what".into(),
            other => other.to_string(),
        }
    }

    /// The status with the headers every rendering of it carries, logged when it is a 5xx
    /// that did not shed load.
    fn respond(&self, body: Response) -> Response {
        let status = self.status();
        let busy = matches!(self, AppError::Busy(_));
        if status.is_server_error() && !busy {
            tracing::error!(error = %self, "request failed");
        }
        let mut resp = body;
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        if busy {
            h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            resp.extensions_mut().insert(Shed);
            return resp;
        }
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

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> Self {
        let words = crate::cause::chain(&e);
        if e.may_pass() || matches!(e, StoreError::Conflict(_)) {
            AppError::Unavailable(words)
        } else {
            AppError::Internal(words)
        }
    }
}

impl From<HubError> for AppError {
    fn from(e: HubError) -> Self {
        match e {
            HubError::BadRequest(m) => AppError::BadRequest(m),
            HubError::Unauthorized(m) => AppError::Unauthorized(m),
            HubError::Forbidden(m) => AppError::Forbidden(m),
            HubError::NotFound(m) => AppError::NotFound(m),
            HubError::TooManyRequests(m) => AppError::TooManyRequests(m),
            HubError::UnsupportedMediaType(m) => AppError::UnsupportedMediaType(m),
            HubError::Busy(m) => AppError::Busy(m),
            HubError::Store(e) => e.into(),
        }
    }
}

impl From<SourceError> for AppError {
    fn from(e: SourceError) -> Self {
        match e {
            SourceError::NotFound(m) => AppError::NotFound(m),
            SourceError::Busy(b) => AppError::Busy(b.to_string()),
            SourceError::Store(e) => e.into(),
            SourceError::Cache(m) => AppError::Unavailable(m),
        }
    }
}

impl From<crate::context::Busy> for AppError {
    fn from(b: crate::context::Busy) -> Self {
        AppError::Busy(b.to_string())
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
        let body = match &self {
            AppError::Invalid { message, lines } => {
                Json(json!({ "error": message, "lines": lines })).into_response()
            }
            other => Json(json!({ "error": other.public_words() })).into_response(),
        };
        self.respond(body)
    }
}

/// An error of the WebSub endpoints (`/hub`, topics): the same status and headers as any
/// [`AppError`], answered as `text/plain` (WebSub §5.1.2).
#[derive(Debug)]
pub struct PlainText(pub AppError);

impl<E: Into<AppError>> From<E> for PlainText {
    fn from(e: E) -> Self {
        PlainText(e.into())
    }
}

impl IntoResponse for PlainText {
    fn into_response(self) -> Response {
        let e = self.0;
        let mut body = format!("{}\n", e.public_words()).into_response();
        body.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        e.respond(body)
    }
}
