//! Talking to one repository: one request at a time, `gzip` accepted, a User-Agent naming the
//! product, every body bounded in size and time, redirects followed only on the repository's
//! own origin, and the protocol's rules for trouble: a 503 with `Retry-After` (seconds or an
//! HTTP date) is waited out exactly (up to `max_retry_after_secs`); timeouts, other 5xx and
//! pages that are not OAI-PMH are retried with backoff and jitter up to `attempts` times;
//! 401 and 403 stop the collector. Responses in an encoding other than UTF-8 (declared by
//! `Content-Type` or the XML declaration) are decoded to UTF-8 before they are read.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::oai::OaiError;
use crate::config::CollectConfig;
use crate::model::Timestamp;

/// The longest run of 503 answers with `Retry-After` waited out for one request.
const MAX_WAITS: u32 = 100;

/// Why a request gave no answer to read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// 401 or 403: the repository refuses this client; the collector stops until resumed.
    #[error(
        "the repository refused access ({0}); the collector is stopped until an admin resumes it"
    )]
    Refused(String),
    /// Every attempt failed (the last reason given), or an answer no retry can mend.
    #[error("{0}")]
    GaveUp(String),
    /// The server is stopping.
    #[error("stopped")]
    Cancelled,
}

/// What one request observed, for the log and the admin API.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Requests sent (retries included).
    pub requests: u64,
    /// Seconds waited on `Retry-After`.
    pub waited_secs: u64,
}

pub struct Client {
    http: reqwest::Client,
    base: url::Url,
    cfg: CollectConfig,
    /// Until when a 503's `Retry-After` is being waited out, while it is.
    waiting: std::sync::Mutex<Option<crate::model::Timestamp>>,
    /// Requests in flight at the repository's host, a run's and announced records' together,
    /// and other collectors' at that host ([`IN_FLIGHT`], over every process on a shared
    /// store): a burst of announcements queues here instead of hammering it.
    hosts: crate::destination::fetch::Hosts,
}

/// Requests in flight at once at one host (a repository's, a site's).
pub const IN_FLIGHT: usize = 2;

impl Client {
    pub fn new(
        cfg: &CollectConfig,
        product: &str,
        hosts: crate::destination::fetch::Hosts,
    ) -> Result<Client, String> {
        let base = url::Url::parse(&cfg.url).map_err(|e| format!("{}: {e}", cfg.url))?;
        let origin = base.origin();
        let http = reqwest::Client::builder()
            .user_agent(product)
            .gzip(true)
            .timeout(Duration::from_secs(cfg.request_timeout_secs))
            .connect_timeout(Duration::from_secs(cfg.request_timeout_secs.min(30)))
            .redirect(reqwest::redirect::Policy::custom(move |a| {
                if a.previous().len() >= 5 {
                    a.error("more than 5 redirects")
                } else if a.url().origin() != origin {
                    let to = a.url().to_string();
                    a.error(format!("a redirect to {to} leaves the repository's origin"))
                } else {
                    a.follow()
                }
            }))
            .build()
            .map_err(|e| crate::cause::chain(&e))?;
        Ok(Client {
            http,
            base,
            cfg: cfg.clone(),
            waiting: Default::default(),
            hosts,
        })
    }

    /// Until when the repository's `Retry-After` is being waited out, while it is.
    pub fn waiting_until(&self) -> Option<crate::model::Timestamp> {
        *self.waiting.lock().expect("the wait")
    }

    /// The URL of a request with these arguments.
    pub fn url(&self, args: &[(&str, &str)]) -> url::Url {
        let mut u = self.base.clone();
        u.query_pairs_mut().extend_pairs(args);
        u
    }

    /// One OAI-PMH request, retried as the rules say, its answer read by `read`. `Ok(Err)` is
    /// the repository's OAI-PMH error (`noRecordsMatch`, `badResumptionToken`, …).
    pub async fn call<T>(
        &self,
        args: &[(&str, &str)],
        read: impl Fn(&[u8]) -> Result<T, OaiError>,
        trace: &mut Trace,
        cancel: &CancellationToken,
    ) -> Result<Result<T, (String, String)>, Failure> {
        let url = self.url(args);
        let mut attempt = 0u32;
        let mut waits = 0u32;
        loop {
            trace.requests += 1;
            let answer = tokio::select! {
                a = async {
                    let authority = self.base.origin().ascii_serialization();
                    let _turn = self.hosts.enter_with(&authority, IN_FLIGHT, 0).await;
                    self.once(&url).await
                } => a,
                _ = cancel.cancelled() => return Err(Failure::Cancelled),
            };
            let failed = match answer {
                Answer::Body(body) => match read(&body) {
                    Ok(t) => return Ok(Ok(t)),
                    Err(OaiError::Protocol { code, message }) => return Ok(Err((code, message))),
                    Err(OaiError::NotOai(why)) => format!("{url}: not an OAI-PMH response: {why}"),
                },
                Answer::Wait(d) if waits < MAX_WAITS => {
                    waits += 1;
                    let d = d.min(Duration::from_secs(self.cfg.max_retry_after_secs));
                    tracing::info!(%url, secs = d.as_secs_f64(), "the repository is busy (503): waiting as its Retry-After asks");
                    trace.waited_secs += d.as_secs();
                    *self.waiting.lock().expect("the wait") =
                        Some(crate::model::Timestamp::now().plus_secs(d.as_secs()));
                    let waited = tokio::select! {
                        _ = tokio::time::sleep(d) => true,
                        _ = cancel.cancelled() => false,
                    };
                    *self.waiting.lock().expect("the wait") = None;
                    if waited {
                        continue;
                    }
                    return Err(Failure::Cancelled);
                }
                Answer::Wait(_) => format!("{url}: busy (503) {MAX_WAITS} times in a row"),
                Answer::Refused(why) => return Err(Failure::Refused(why)),
                Answer::Final(why) => return Err(Failure::GaveUp(format!("{url}: {why}"))),
                Answer::Retry(why) => format!("{url}: {why}"),
            };
            attempt += 1;
            if attempt >= self.cfg.attempts {
                return Err(Failure::GaveUp(format!(
                    "{failed} (after {attempt} attempts)"
                )));
            }
            let d = crate::backoff::jittered(
                crate::backoff::Backoff::nth(
                    Duration::from_millis(self.cfg.retry_base_ms),
                    Duration::from_millis(self.cfg.retry_base_ms).saturating_mul(1 << 16),
                    attempt,
                ),
                crate::hub::random_unit(),
            );
            tracing::warn!(reason = %failed, attempt, retry_in_ms = d.as_millis() as u64, "OAI-PMH request failed; retrying");
            tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = cancel.cancelled() => return Err(Failure::Cancelled),
            }
        }
    }

    async fn once(&self, url: &url::Url) -> Answer {
        let resp = match self.http.get(url.clone()).send().await {
            Ok(r) => r,
            Err(e) => return Answer::Retry(crate::cause::chain(&e)),
        };
        let status = resp.status();
        match status.as_u16() {
            401 | 403 => return Answer::Refused(status.to_string()),
            503 => {
                if let Some(d) = resp
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(Timestamp::retry_after)
                {
                    return Answer::Wait(d);
                }
                return Answer::Retry(format!("{status} without Retry-After"));
            }
            s if s >= 500 || s == 429 || s == 408 => return Answer::Retry(status.to_string()),
            _ => {}
        }
        let charset = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(charset_of)
            .map(str::to_string);
        let body = match self.body(resp).await {
            Ok(b) => b,
            Err(Bounded::TooLarge) => {
                return Answer::Final(format!(
                    "the answer is larger than collect max_response_bytes ({})",
                    self.cfg.max_response_bytes
                ))
            }
            Err(Bounded::Broken(why)) => return Answer::Retry(why),
        };
        if !status.is_success() {
            // Some repositories send their OAI-PMH errors with a 4xx status: read those; any
            // other 4xx answer is final.
            if body.windows(7).any(|w| w == b"OAI-PMH") {
                return Answer::Body(to_utf8(body, charset.as_deref()));
            }
            return Answer::Final(status.to_string());
        }
        Answer::Body(to_utf8(body, charset.as_deref()))
    }

    /// The body, read as it comes and given up past `max_response_bytes`.
    async fn body(&self, resp: reqwest::Response) -> Result<Vec<u8>, Bounded> {
        let max = self.cfg.max_response_bytes;
        if resp.content_length().is_some_and(|n| n > max) {
            return Err(Bounded::TooLarge);
        }
        let mut out = Vec::new();
        let mut resp = resp;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| Bounded::Broken(crate::cause::chain(&e)))?
        {
            if out.len() as u64 + chunk.len() as u64 > max {
                return Err(Bounded::TooLarge);
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }
}

enum Answer {
    Body(Vec<u8>),
    Wait(Duration),
    Retry(String),
    Refused(String),
    Final(String),
}

enum Bounded {
    TooLarge,
    Broken(String),
}

/// The `charset` parameter of a media type.
fn charset_of(ct: &str) -> Option<&str> {
    ct.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| v.trim().trim_matches('"'))
    })
}

/// The encoding an XML declaration at the start of `body` names.
fn declared_encoding(body: &[u8]) -> Option<String> {
    let head = &body[..body.len().min(200)];
    if !head.starts_with(b"<?xml") {
        return None;
    }
    let end = head.windows(2).position(|w| w == b"?>")?;
    let decl = std::str::from_utf8(&head[..end]).ok()?;
    let at = decl.find("encoding")?;
    let rest = decl[at + 8..].trim_start().strip_prefix('=')?.trim_start();
    let quote = rest.chars().next()?;
    let rest = &rest[1..];
    Some(rest[..rest.find(quote)?].to_string())
}

/// The body as UTF-8: decoded from the encoding the XML declaration names (or, without one,
/// the `Content-Type` charset), with the declaration's encoding rewritten to match. A UTF-8
/// body, or one in an encoding nobody names, is left as it is (the reader then says what is
/// wrong with it).
pub fn to_utf8(body: Vec<u8>, charset: Option<&str>) -> Vec<u8> {
    let declared = declared_encoding(&body);
    let Some(label) = declared.as_deref().or(charset) else {
        return body;
    };
    let Some(enc) = encoding_rs::Encoding::for_label(label.as_bytes()) else {
        return body;
    };
    if enc == encoding_rs::UTF_8 {
        return body;
    }
    let (text, _, _) = enc.decode(&body);
    let text = match &declared {
        Some(d) => text
            .replacen(&format!("encoding=\"{d}\""), "encoding=\"UTF-8\"", 1)
            .replacen(&format!("encoding='{d}'"), "encoding='UTF-8'", 1),
        None => text.into_owned(),
    };
    text.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_latin1_page_is_read_as_utf8() {
        let body = b"<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?><x>caf\xe9</x>".to_vec();
        let out = String::from_utf8(to_utf8(body, None)).unwrap();
        assert_eq!(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?><x>café</x>");
        let by_header = to_utf8(b"<x>\xe9</x>".to_vec(), Some("windows-1252"));
        assert_eq!(by_header, "<x>é</x>".as_bytes());
        let utf8 = "<x>é</x>".as_bytes().to_vec();
        assert_eq!(to_utf8(utf8.clone(), Some("utf-8")), utf8);
        assert_eq!(
            charset_of("text/xml; charset=\"ISO-8859-1\""),
            Some("ISO-8859-1")
        );
    }
}
