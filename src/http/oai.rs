//! `/oai`: the OAI-PMH repository, by GET (query) or POST (form).

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::error::AppError;
use crate::oaipmh::{Answer, Failure};

fn pairs(s: &[u8]) -> Vec<(String, String)> {
    url::form_urlencoded::parse(s).into_owned().collect()
}

async fn answer(st: &AppState, pairs: Vec<(String, String)>) -> Result<Response, AppError> {
    let Some(repo) = &st.oai else {
        return Err(AppError::NotFound(
            "the OAI-PMH repository is off (oai.enabled = false)".into(),
        ));
    };
    let ct = [(header::CONTENT_TYPE, "text/xml; charset=utf-8")];
    match repo.answer(&pairs).await {
        Ok(Answer::Text(t)) => Ok((ct, t).into_response()),
        Ok(Answer::Stream(s)) => Ok((ct, Body::from_stream(s)).into_response()),
        Err(Failure::Store(e)) => Err(e.into()),
        Err(Failure::Busy(e)) => Err(e.into()),
    }
}

/// `GET /oai?verb=…`.
pub async fn get(State(st): State<AppState>, RawQuery(q): RawQuery) -> Result<Response, AppError> {
    answer(&st, pairs(q.unwrap_or_default().as_bytes())).await
}

/// `POST /oai` with an `application/x-www-form-urlencoded` body.
pub async fn post(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, AppError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(crate::model::bare_media_type)
        .unwrap_or("");
    if !ct.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        return Err(AppError::UnsupportedMediaType(format!(
            "an OAI-PMH POST is a form (application/x-www-form-urlencoded), not {ct:?}"
        )));
    }
    answer(&st, pairs(&body)).await
}
