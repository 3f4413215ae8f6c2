//! `/oai`: the OAI-PMH repository, by GET (query) or POST (form).

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::error::AppError;
use crate::oaipmh::{Answer, Failure};

fn pairs(s: &[u8]) -> Vec<(String, String)> {
    url::form_urlencoded::parse(s).into_owned().collect()
}

/// The answer; to a GET, with a weak `ETag` and `Last-Modified`, or a 304 when the
/// harvester's copy is still the answer.
async fn answer(
    st: &AppState,
    pairs: Vec<(String, String)>,
    conditional: Option<&HeaderMap>,
) -> Result<Response, AppError> {
    let Some(repo) = &st.oai else {
        return Err(AppError::NotFound(
            "the OAI-PMH repository is off (oai.enabled = false)".into(),
        ));
    };
    let mut out = HeaderMap::new();
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/xml; charset=utf-8"),
    );
    if let Some(headers) = conditional {
        let (tag, newest) = repo.validator(&pairs).await?;
        let last_modified = newest.floor_secs();
        let strong = format!("\"{tag}\"");
        out.insert(
            header::ETAG,
            HeaderValue::from_str(&format!("W/{strong}")).expect("hex is ascii"),
        );
        out.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_str(&last_modified.to_http_date()).expect("a date is ascii"),
        );
        if super::documents::not_modified(headers, &strong, last_modified) {
            out.remove(header::CONTENT_TYPE);
            return Ok((StatusCode::NOT_MODIFIED, out).into_response());
        }
    }
    match repo.answer(&pairs).await {
        Ok(Answer::Text(t)) => Ok((out, t).into_response()),
        Ok(Answer::Stream(s)) => Ok((out, Body::from_stream(s)).into_response()),
        Err(Failure::Store(e)) => Err(e.into()),
        Err(Failure::Busy(e)) => Err(e.into()),
    }
}

/// `GET /oai?verb=…`.
pub async fn get(
    State(st): State<AppState>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    answer(&st, pairs(q.unwrap_or_default().as_bytes()), Some(&headers)).await
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
    answer(&st, pairs(&body), None).await
}
