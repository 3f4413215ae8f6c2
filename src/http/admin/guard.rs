//! What guards the admin API: the bearer token, checked in constant time, and the budget of
//! wrong tokens per client address (429 past it, before anything else); the error body every
//! refusal is documented with.

use axum::extract::State;
use axum::http::HeaderMap;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::AppError;
use crate::http::AppState;

#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: String,
}

/// Every admin request's bearer token is counted when wrong (per client address, see
/// [`crate::ui::Guesses`]); an address past its budget is answered 429 before anything else.
pub(super) async fn throttle_guesses(
    State(st): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let Some(given) = crate::http::bearer_token(req.headers()) else {
        // No token: nothing is guessed (the handler answers 401).
        return next.run(req).await;
    };
    let ip = crate::http::client_ip(req.extensions());
    if let Err(wait) = st.guesses.check(ip) {
        return crate::ui::too_many_guesses(wait);
    }
    if !crate::ui::token_matches(given, st.config.admin.token.expose()) {
        if let Err(wait) = st.guesses.failed(ip) {
            tracing::warn!(client = ?ip, "admin API: too many wrong tokens from one address; refusing it for {wait} s");
            return crate::ui::too_many_guesses(wait);
        }
    }
    next.run(req).await
}

pub(in crate::http) fn authorize(st: &AppState, headers: &HeaderMap) -> Result<(), AppError> {
    let given = crate::http::bearer_token(headers).ok_or_else(|| {
        AppError::Unauthorized("the admin API needs Authorization: Bearer <admin token>".into())
    })?;
    if crate::ui::token_matches(given, st.config.admin.token.expose()) {
        Ok(())
    } else {
        Err(AppError::Forbidden("the admin token is wrong".into()))
    }
}
