//! Fetching from the source: the destination's one way out. Every request (documents,
//! resources, dump packages, the subscription request to the hub, and every redirect) is
//! checked against the source's [`Scope`] before it connects, and every body is read through
//! [`Fetcher::read_body`]: bounded in size (a listed length, or a configured cap), cut off
//! when it stays silent or trickles (`fetch.idle_timeout_secs`, `fetch.min_bytes_per_sec`).
//! Retries (exponential backoff, `Retry-After` honoured) are only for what fails fast and may
//! pass (connection errors, 408, 429, 5xx); what is slow or wrong is handed back at once, so a
//! bad resource never holds a fetch slot for long. Resources are streamed to a file while
//! their length and md5 are computed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use md5::{Digest, Md5};
use reqwest::StatusCode;
use tokio::time::Instant;

use super::config::FetchSection;
use super::scope::{cut, short, Refusal, Scope};
use crate::digest::hex_digest;

/// The HTTP clients of a source, replaced by [`Fetcher::rest`].
#[derive(Clone)]
struct Clients {
    /// For resources: fetched as they are (no `Accept-Encoding: gzip`): a server compressing
    /// every small file on the fly costs more CPU than it saves, and the md5 is of the content.
    client: reqwest::Client,
    /// For documents (Resource List parts, Change Lists): gzip welcome, they shrink ~10×.
    documents: reqwest::Client,
    /// For dump packages (gigabytes): no limit on the whole transfer, only on silence.
    packages: reqwest::Client,
}

#[derive(Clone)]
pub struct Fetcher {
    /// Shared by every clone (the source's walks, push and checks), so that [`Fetcher::rest`]
    /// closes the idle connections of all of them.
    clients: Arc<std::sync::RwLock<Clients>>,
    cfg: FetchSection,
    scope: Arc<Scope>,
    /// A bearer token for the source's own authority (never sent elsewhere: reqwest drops
    /// `Authorization` on a redirect to another host).
    bearer: Option<String>,
    hosts: Hosts,
}

/// Why a fetch failed: `retry` when another try within this pass may succeed; `refused` when
/// the URL (or a redirect) lies outside the source's scope: the source's error, not to retry.
/// `message` is whole words ("http://…: connection refused (nothing listens on that port)");
/// the error underneath (the HTTP client's, the file system's) stays its `source()`, so a
/// log line printing the chain has both, and code can look at it.
#[derive(Debug, Clone)]
pub struct FetchError {
    pub message: String,
    pub retry: bool,
    pub retry_after: Option<Duration>,
    pub refused: Option<Refusal>,
    /// The HTTP status, when the server answered with one that is not a success.
    pub status: Option<u16>,
    pub cause: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl FetchError {
    pub fn fail(message: String) -> FetchError {
        FetchError {
            message,
            retry: false,
            retry_after: None,
            refused: None,
            status: None,
            cause: None,
        }
    }

    /// With the error underneath kept as its cause.
    pub fn caused_by(mut self, e: impl std::error::Error + Send + Sync + 'static) -> FetchError {
        self.cause = Some(Arc::new(e));
        self
    }

    fn refused(url: &str, r: Refusal) -> FetchError {
        FetchError {
            message: format!("{}: refused: {r}", short(url)),
            refused: Some(r),
            ..FetchError::fail(String::new())
        }
    }
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FetchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// What every server sees of this harvester, shared by the fetchers of all its sources:
/// per authority (scheme, host, port), at most `fetch.per_host_concurrency` requests in
/// flight, request starts at least `fetch.per_host_delay_ms` apart, and a pause after a 429
/// or 503 (as long as its `Retry-After`, else the initial backoff) for that authority only.
#[derive(Clone, Default)]
pub struct Hosts {
    gates: Arc<std::sync::Mutex<std::collections::HashMap<String, Arc<Gate>>>>,
    /// The slots this process shares with others at each authority, when it shares them
    /// (the server's collectors on a shared store).
    shared: Option<Arc<dyn SharedSlots>>,
    /// The least time between two request starts at some authorities, whatever a fetcher's
    /// own `per_host_delay_ms` (the server's collectors' `requests_per_sec`).
    delays: Arc<std::collections::HashMap<String, Duration>>,
}

/// Requests in flight at an authority, limited over several processes: a slot is entered
/// after this process's own, and held until the request's body is read (the guard dropped).
#[async_trait::async_trait]
pub trait SharedSlots: Send + Sync {
    async fn enter(&self, authority: &str) -> Box<dyn std::any::Any + Send>;
}

struct Gate {
    slots: Arc<tokio::sync::Semaphore>,
    /// The earliest start of the next request.
    next: tokio::sync::Mutex<Instant>,
}

/// A request's place at its authority: held until its body is read.
pub struct HostSlot(
    #[allow(dead_code)] tokio::sync::OwnedSemaphorePermit,
    #[allow(dead_code)] Option<Box<dyn std::any::Any + Send>>,
);

impl Hosts {
    /// Hosts with their own least times between request starts (`delays`, by authority), and
    /// limits that hold over this process and others through `shared`, when given.
    pub fn with(
        delays: std::collections::HashMap<String, Duration>,
        shared: Option<Arc<dyn SharedSlots>>,
    ) -> Hosts {
        Hosts {
            shared,
            delays: Arc::new(delays),
            ..Hosts::default()
        }
    }

    fn gate(&self, authority: &str, per_host: usize) -> Arc<Gate> {
        self.gates
            .lock()
            .expect("hosts lock")
            .entry(authority.to_string())
            .or_insert_with(|| {
                Arc::new(Gate {
                    slots: Arc::new(tokio::sync::Semaphore::new(per_host.max(1))),
                    next: tokio::sync::Mutex::new(Instant::now()),
                })
            })
            .clone()
    }

    /// Waits for a slot at `authority` and for its turn.
    async fn enter(&self, authority: &str, cfg: &FetchSection) -> HostSlot {
        self.enter_with(authority, cfg.per_host_concurrency, cfg.per_host_delay_ms)
            .await
    }

    /// Waits for one of `per_host` slots at `authority` (and the processes' shared one) and
    /// for its turn, request starts `delay_ms` apart (or the authority's own delay, when longer).
    pub async fn enter_with(&self, authority: &str, per_host: usize, delay_ms: u64) -> HostSlot {
        let gate = self.gate(authority, per_host);
        let permit = gate
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let mut next = gate.next.lock().await;
        let now = Instant::now();
        if *next > now {
            tokio::time::sleep_until(*next).await;
        }
        let delay = Duration::from_millis(delay_ms)
            .max(self.delays.get(authority).copied().unwrap_or_default());
        *next = Instant::now().max(*next) + delay;
        drop(next);
        let shared = match &self.shared {
            Some(s) => Some(s.enter(authority).await),
            None => None,
        };
        HostSlot(permit, shared)
    }

    /// `authority` asked for a pause: no request starts there before `for_` has passed.
    async fn pause(&self, authority: &str, cfg: &FetchSection, for_: Duration) {
        let gate = self.gate(authority, cfg.per_host_concurrency);
        let mut next = gate.next.lock().await;
        *next = (*next).max(Instant::now() + for_);
        tracing::info!(
            authority,
            pause_secs = for_.as_secs_f64(),
            "the server asked to slow down: paused"
        );
    }
}

/// A page read by [`Fetcher::probe`].
#[derive(Debug, Clone, Default)]
pub struct Probe {
    /// The `Link` header values, each cut to 4 KB.
    pub links: Vec<String>,
    pub body: Vec<u8>,
}

/// A resource on disk, with what it measured.
#[derive(Debug)]
pub struct Downloaded {
    pub path: PathBuf,
    pub length: u64,
    pub md5: String,
    /// The response's `Content-Type`.
    pub mime: Option<String>,
}

/// The TLS configuration of every client of the harvester (the Mozilla roots of
/// `webpki-roots`, as reqwest's own): built once, its root store shared. A client building its
/// own held 16 KB more; three clients a source made that 240 MB at 5,000 sources.
fn tls() -> &'static rustls::ClientConfig {
    static TLS: std::sync::OnceLock<rustls::ClientConfig> = std::sync::OnceLock::new();
    TLS.get_or_init(|| {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
    })
}

impl Clients {
    fn new(cfg: &FetchSection, scope: &Arc<Scope>) -> Clients {
        let agent = if cfg.user_agent.is_empty() {
            concat!("resourcesync-hub-harvest/", env!("CARGO_PKG_VERSION")).to_string()
        } else {
            format!(
                "resourcesync-hub-harvest/{} ({})",
                env!("CARGO_PKG_VERSION"),
                cfg.user_agent
            )
        };
        // Idle connections kept per server: documents and packages are read one after the
        // other (one is enough), resources side by side.
        let base = |idle: usize| {
            let s = scope.clone();
            reqwest::Client::builder()
                .use_preconfigured_tls(tls().clone())
                .connect_timeout(Duration::from_secs(
                    cfg.timeout_secs.min(cfg.idle_timeout_secs).min(30),
                ))
                .no_proxy()
                // An aggregator talks to hundreds of servers: an idle connection is kept one
                // second (plenty for the next request of a walk), then closed, so that
                // descriptors follow the work in flight rather than the number of sources
                // finishing a baseline (two seconds: 1,400 descriptors at 500 sources).
                .pool_idle_timeout(Duration::from_secs(1))
                .pool_max_idle_per_host(idle)
                .user_agent(agent.clone())
                // Every redirect target is checked against the scope before it is followed.
                .redirect(reqwest::redirect::Policy::custom(move |a| {
                    if a.previous().len() >= 10 {
                        return a.error("more than 10 redirects");
                    }
                    match s.check_parsed(a.url()) {
                        Ok(()) => a.follow(),
                        Err(r) => a.error(r),
                    }
                }))
        };
        let builder = |idle| base(idle).timeout(Duration::from_secs(cfg.timeout_secs));
        Clients {
            client: builder(cfg.per_host_concurrency)
                .no_gzip()
                .build()
                .expect("an HTTP client"),
            documents: builder(1).build().expect("an HTTP client"),
            packages: base(1).no_gzip().build().expect("an HTTP client"),
        }
    }
}

impl Fetcher {
    pub fn new(cfg: &FetchSection, scope: Scope, hosts: Hosts) -> Fetcher {
        let scope = Arc::new(scope);
        Fetcher {
            clients: Arc::new(std::sync::RwLock::new(Clients::new(cfg, &scope))),
            cfg: cfg.clone(),
            scope,
            bearer: None,
            hosts,
        }
    }

    fn clients(&self) -> Clients {
        self.clients.read().expect("clients lock").clone()
    }

    /// Closes the source's idle connections (those of requests under way close when they
    /// end): a source whose walk is over holds no descriptor while it waits for its next
    /// notification or check. Building new clients costs microseconds (the TLS
    /// configuration is shared).
    pub fn rest(&self) {
        *self.clients.write().expect("clients lock") = Clients::new(&self.cfg, &self.scope);
    }

    /// Sends `Authorization: Bearer <token>` with every request to the source's own
    /// authority (scheme, host and port of its URL), and to no other.
    pub fn with_bearer(mut self, token: String) -> Fetcher {
        self.bearer = Some(token);
        self
    }

    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    pub fn max_document_bytes(&self) -> u64 {
        self.cfg.max_document_bytes
    }

    /// Runs `op` up to `fetch.attempts` times while its error says to retry, waiting with
    /// exponential backoff (and at least the server's `Retry-After`).
    async fn with_retries<T, F, Fut>(&self, mut op: F) -> Result<T, FetchError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, FetchError>>,
    {
        let mut backoff = crate::backoff::Backoff::new(
            Duration::from_millis(self.cfg.backoff_initial_ms),
            Duration::from_millis(self.cfg.backoff_max_ms),
        );
        let mut attempt = 1;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) if e.retry && attempt < self.cfg.attempts => {
                    // The schedule's pause, or longer when the server's Retry-After says so.
                    let pause = backoff.pause().max(e.retry_after.unwrap_or_default());
                    tracing::debug!(error = %crate::cause::chain(&e), attempt, pause_ms = pause.as_millis() as u64, "retrying");
                    tokio::time::sleep(pause).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends `req` for `url` (checked against the scope first) and waits for the response
    /// headers at most `fetch.idle_timeout_secs`; a status that is not a success is an error.
    async fn send(
        &self,
        url: &str,
        req: impl FnOnce(url::Url) -> reqwest::RequestBuilder,
    ) -> Result<(reqwest::Response, HostSlot), FetchError> {
        let (r, slot) = self.send_unchecked(url, req).await?;
        if let Err(e) = check_status(url, &r) {
            if matches!(e.status, Some(429 | 503)) {
                let wait = e
                    .retry_after
                    .unwrap_or(Duration::from_millis(self.cfg.backoff_initial_ms));
                let authority = r.url().origin().ascii_serialization();
                self.hosts.pause(&authority, &self.cfg, wait).await;
            }
            return Err(e);
        }
        Ok((r, slot))
    }

    /// As [`Fetcher::send`], whatever the status.
    async fn send_unchecked(
        &self,
        url: &str,
        req: impl FnOnce(url::Url) -> reqwest::RequestBuilder,
    ) -> Result<(reqwest::Response, HostSlot), FetchError> {
        let u = self
            .scope
            .check(url)
            .map_err(|r| FetchError::refused(url, r))?;
        let origin = u.origin().ascii_serialization();
        let slot = self.hosts.enter(&origin, &self.cfg).await;
        let idle = Duration::from_secs(self.cfg.idle_timeout_secs);
        // The parsed URL itself: a string would be parsed again.
        let mut rb = req(u);
        if let Some(t) = &self.bearer {
            if origin == self.scope.home() {
                rb = rb.bearer_auth(t);
            }
        }
        let r = tokio::time::timeout(idle, rb.send())
            .await
            .map_err(|_| {
                FetchError::fail(format!(
                    "{}: no response in {} s (fetch.idle_timeout_secs)",
                    short(url),
                    idle.as_secs()
                ))
            })?
            .map_err(|e| transport(url, e, self.cfg.timeout_secs))?;
        Ok((r, slot))
    }

    /// A body, chunk by chunk, to `each`: at most `limit` bytes (an error as soon as the
    /// `Content-Length` or the bytes read pass it; `what` names the limit in the message), cut
    /// off when a window of `fetch.idle_timeout_secs` brings nothing or less than
    /// `fetch.min_bytes_per_sec` on average. Returns the bytes read.
    async fn read_body(
        &self,
        url: &str,
        r: &mut reqwest::Response,
        limit: u64,
        what: &str,
        mut each: impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<u64, FetchError> {
        let too_long = |n: String| {
            FetchError::fail(format!("{}: {n}, more than {what} ({limit})", short(url)))
        };
        if let Some(n) = r.content_length().filter(|n| *n > limit) {
            return Err(too_long(format!("Content-Length {n}")));
        }
        let idle = Duration::from_secs(self.cfg.idle_timeout_secs);
        let need = self.cfg.min_bytes_per_sec.saturating_mul(idle.as_secs());
        let (mut window_end, mut in_window, mut total) = (Instant::now() + idle, 0u64, 0u64);
        loop {
            let next = tokio::time::timeout_at(window_end, r.chunk()).await;
            let window_over = next.is_err() || Instant::now() >= window_end;
            match next {
                Err(_) => {}
                Ok(Err(e)) => return Err(transport(url, e, self.cfg.timeout_secs)),
                Ok(Ok(None)) => return Ok(total),
                Ok(Ok(Some(chunk))) => {
                    total += chunk.len() as u64;
                    in_window += chunk.len() as u64;
                    if total > limit {
                        return Err(too_long(format!("more than {limit} bytes")));
                    }
                    each(&chunk).map_err(|e| FetchError::fail(format!("writing: {e}")))?;
                }
            }
            if window_over {
                if in_window == 0 || in_window < need {
                    return Err(FetchError::fail(format!(
                        "{}: too slow: {in_window} bytes in {} s (fetch.idle_timeout_secs, fetch.min_bytes_per_sec); tried again at a later pass",
                        short(url),
                        idle.as_secs()
                    )));
                }
                window_end = Instant::now() + idle;
                in_window = 0;
            }
        }
    }

    /// A small document (a Source Description, a Capability List) whole, at most
    /// `fetch.max_document_bytes`.
    pub async fn document(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        self.with_retries(|| async {
            let (mut r, _slot) = self.send(url, |u| self.clients().documents.get(u)).await?;
            let mut out = Vec::new();
            self.read_body(
                url,
                &mut r,
                self.cfg.max_document_bytes,
                "fetch.max_document_bytes",
                |c| {
                    out.extend_from_slice(c);
                    Ok(())
                },
            )
            .await?;
            Ok(out)
        })
        .await
    }

    /// A page read to learn what a site offers (discovery): its `Link` headers (at most 32,
    /// each cut to 4 KB) and its body, at most `max` bytes; one try, no retry (a page
    /// that is not there is an answer). A status other than 2xx is the error.
    pub async fn probe(&self, url: &str, max: u64) -> Result<Probe, FetchError> {
        let (mut r, _slot) = self.send(url, |u| self.clients().documents.get(u)).await?;
        let links = r
            .headers()
            .get_all(reqwest::header::LINK)
            .iter()
            .take(32)
            .map(|v| cut(v.to_str().unwrap_or(""), 4096).into_owned())
            .collect();
        let mut body = Vec::new();
        self.read_body(url, &mut r, max, "the discovery limit", |c| {
            body.extend_from_slice(c);
            Ok(())
        })
        .await?;
        Ok(Probe { links, body })
    }

    /// A document streamed into a temporary file under `dir` (Resource List parts and Change
    /// Lists may be large), at most `fetch.max_document_bytes`; the file is removed when the
    /// returned handle drops.
    pub async fn document_to_file(
        &self,
        url: &str,
        dir: &Path,
    ) -> Result<tempfile::NamedTempFile, FetchError> {
        self.with_retries(|| async {
            let (mut r, _slot) = self.send(url, |u| self.clients().documents.get(u)).await?;
            let tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| local(dir, e))?;
            let mut w = std::io::BufWriter::new(tmp.as_file());
            self.read_body(
                url,
                &mut r,
                self.cfg.max_document_bytes,
                "fetch.max_document_bytes",
                |c| w.write_all(c),
            )
            .await?;
            w.flush().map_err(|e| local(dir, e))?;
            drop(w);
            Ok(tmp)
        })
        .await
    }

    /// A resource into the file `path` (created or truncated), measured on the way: at most
    /// its `listed` length plus one byte, or `fetch.max_resource_bytes` when unlisted. The
    /// file is removed when the fetch fails.
    pub async fn download(
        &self,
        url: &str,
        path: &Path,
        listed: Option<u64>,
    ) -> Result<Downloaded, FetchError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let (limit, what) = match listed {
            Some(l) => (l, "its listed length"),
            None => (self.cfg.max_resource_bytes, "fetch.max_resource_bytes"),
        };
        let r = self
            .with_retries(|| async {
                let (mut r, _slot) = self.send(url, |u| self.clients().client.get(u)).await?;
                let mime = r
                    .headers()
                    .get(reqwest::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(|s| short(s).into_owned());
                let file = super::output::create_download(path).map_err(|e| local(dir, e))?;
                let mut w = std::io::BufWriter::new(&file);
                let mut h = Md5::new();
                let length = self
                    .read_body(url, &mut r, limit, what, |c| {
                        h.update(c);
                        w.write_all(c)
                    })
                    .await?;
                w.flush().map_err(|e| local(dir, e))?;
                Ok(Downloaded {
                    path: path.to_path_buf(),
                    length,
                    md5: hex_digest(h.finalize()),
                    mime,
                })
            })
            .await;
        if r.is_err() {
            let _ = std::fs::remove_file(path);
        }
        r
    }

    /// A form POST (the subscription request to a hub); the status and the start of the
    /// answer's text.
    pub async fn post_form(
        &self,
        url: &str,
        form: &[(&str, &str)],
    ) -> Result<(StatusCode, String), FetchError> {
        let (mut r, _slot) = self
            .send_unchecked(url, |u| self.clients().documents.post(u).form(form))
            .await?;
        let idle = Duration::from_secs(self.cfg.idle_timeout_secs);
        let status = r.status();
        let mut text = Vec::new();
        while text.len() < 4096 {
            match tokio::time::timeout(idle, r.chunk()).await {
                Ok(Ok(Some(c))) => text.extend_from_slice(&c),
                _ => break,
            }
        }
        Ok((
            status,
            short(String::from_utf8_lossy(&text).trim()).into_owned(),
        ))
    }
}

impl Fetcher {
    /// A large file (a dump package) into `path`, resumed where it stopped: after a dropped
    /// connection, and after a restart (`path` and `<path>.etag` are kept), a try asks for the
    /// rest with `Range` and `If-Range` (the ETag of the first response) and starts over when
    /// the server answers with the whole file (it changed). Never more than `expected` (the
    /// dump's listed length; `fetch.max_resource_bytes` when unlisted) is read: a longer
    /// package fails at once, without a retry. Returns the file's length.
    pub async fn download_resumable(
        &self,
        url: &str,
        path: &Path,
        expected: Option<u64>,
    ) -> Result<u64, FetchError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let etag_path = path.with_extension("etag");
        let limit = expected.unwrap_or(self.cfg.max_resource_bytes);
        let r = self
            .with_retries(|| async {
                let have = std::fs::metadata(path).map_or(0, |m| m.len());
                if have > 0 && expected == Some(have) {
                    return Ok(have);
                }
                if have >= limit {
                    let _ = std::fs::remove_file(path);
                    return Err(FetchError::fail(format!(
                        "{}: a partial download of {have} bytes, the dump lists {limit}",
                        short(url)
                    )));
                }
                let etag = std::fs::read_to_string(&etag_path).ok();
                let (mut r, _slot) = self
                    .send_unchecked(url, |u| {
                        let mut req = self.clients().packages.get(u);
                        if let (true, Some(tag)) = (have > 0, &etag) {
                            req = req
                                .header(reqwest::header::RANGE, format!("bytes={have}-"))
                                .header(reqwest::header::IF_RANGE, tag.as_str());
                        }
                        req
                    })
                    .await?;
                if r.status() == StatusCode::RANGE_NOT_SATISFIABLE {
                    // The partial file is longer than the file now: the next try starts over.
                    let _ = std::fs::remove_file(path);
                    return Err(FetchError {
                        retry: true,
                        ..FetchError::fail(format!(
                            "{}: the partial download is longer than the file now; starting over",
                            short(url)
                        ))
                    });
                }
                check_status(url, &r)?;
                let resumed = r.status() == StatusCode::PARTIAL_CONTENT;
                if resumed {
                    let start = r
                        .headers()
                        .get(reqwest::header::CONTENT_RANGE)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.strip_prefix("bytes "))
                        .and_then(|v| v.split('-').next())
                        .and_then(|v| v.parse::<u64>().ok());
                    if start != Some(have) {
                        let _ = std::fs::remove_file(path);
                        return Err(FetchError {
                            retry: true,
                            ..FetchError::fail(format!(
                                "{}: the server resumed at {}, not at {have}; starting over",
                                short(url),
                                start.map_or("an unknown offset".into(), |s| s.to_string())
                            ))
                        });
                    }
                    tracing::info!(url = %short(url), from = have, "resuming a package download");
                } else if let Some(tag) = r
                    .headers()
                    .get(reqwest::header::ETAG)
                    .and_then(|v| v.to_str().ok())
                    .filter(|t| t.len() <= 256)
                {
                    std::fs::write(&etag_path, tag).map_err(|e| local(dir, e))?;
                } else {
                    let _ = std::fs::remove_file(&etag_path);
                }
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(resumed)
                    .write(true)
                    .truncate(!resumed)
                    .open(path)
                    .map_err(|e| local(dir, e))?;
                let mut w = std::io::BufWriter::new(&file);
                let start = if resumed { have } else { 0 };
                self.read_body(
                    url,
                    &mut r,
                    limit - start,
                    "the dump's listed length",
                    |c| w.write_all(c),
                )
                .await?;
                w.flush().map_err(|e| local(dir, e))?;
                let len = std::fs::metadata(path).map_err(|e| local(dir, e))?.len();
                match expected {
                    Some(e) if e != len => Err(FetchError::fail(format!(
                        "{}: {len} bytes, the dump lists {e}",
                        short(url)
                    ))),
                    _ => Ok(len),
                }
            })
            .await;
        // What cannot be resumed is not kept (a dropped connection's partial file is).
        if r.as_ref().is_err_and(|e| !e.retry) {
            let _ = std::fs::remove_file(path);
            let _ = std::fs::remove_file(&etag_path);
        }
        r
    }
}

/// A transport error of a request to `url` (whose whole exchange may take `timeout_secs`).
fn transport(url: &str, e: reqwest::Error, timeout_secs: u64) -> FetchError {
    // A redirect the scope refused.
    let mut src: Option<&dyn std::error::Error> = Some(&e);
    while let Some(s) = src {
        if let Some(r) = s.downcast_ref::<Refusal>() {
            let r = Refusal::Redirected(Box::new(r.clone()));
            return FetchError {
                message: format!("{}: {r}", short(url)),
                refused: Some(r),
                ..FetchError::fail(String::new())
            };
        }
        src = s.source();
    }
    let slow = e.is_timeout();
    let retry = !slow && (e.is_connect() || e.is_request() || e.is_body());
    let e = e.without_url();
    let words = in_words(&e, timeout_secs).unwrap_or_else(|| crate::cause::chain(&e));
    FetchError {
        retry,
        ..FetchError::fail(format!("{}: {words}", short(url)))
    }
    .caused_by(e)
}

/// A transport error as a reader says it ("connection refused", "timed out"), when its
/// causes name a known one; the technical chain otherwise.
fn in_words(e: &reqwest::Error, timeout_secs: u64) -> Option<String> {
    use std::io::ErrorKind;
    if e.is_timeout() {
        return Some(if e.is_connect() {
            "timed out connecting".to_string()
        } else {
            format!("timed out after {timeout_secs} s (fetch.timeout_secs)")
        });
    }
    let mut src: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            let words = match io.kind() {
                ErrorKind::ConnectionRefused => "connection refused (nothing listens on that port)",
                ErrorKind::ConnectionReset => "connection reset by the server",
                ErrorKind::ConnectionAborted => "connection aborted",
                ErrorKind::TimedOut => "timed out connecting",
                ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => {
                    "host or network unreachable"
                }
                ErrorKind::UnexpectedEof => "the server closed the connection early",
                _ => "",
            };
            if !words.is_empty() {
                return Some(words.into());
            }
        }
        let text = s.to_string();
        if text.contains("dns error") || text.contains("failed to lookup address") {
            return Some(format!(
                "cannot resolve the host name ({})",
                crate::cause::chain(s)
            ));
        }
        if text.contains("certificate") {
            return Some(format!("TLS: {text}"));
        }
        src = s.source();
    }
    None
}

fn local(dir: &Path, e: std::io::Error) -> FetchError {
    FetchError::fail(format!("writing under {}", dir.display())).caused_by(e)
}

fn check_status(url: &str, r: &reqwest::Response) -> Result<(), FetchError> {
    let s = r.status();
    if s.is_success() {
        return Ok(());
    }
    let retry = s == StatusCode::TOO_MANY_REQUESTS
        || s == StatusCode::REQUEST_TIMEOUT
        || s.is_server_error();
    let retry_after = r
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::model::Timestamp::retry_after);
    Err(FetchError {
        retry,
        retry_after,
        status: Some(s.as_u16()),
        ..FetchError::fail(format!("{}: {s}", short(url)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn retries_only_what_may_pass() {
        let cfg = crate::destination::config::HarvestConfig::defaults().fetch;
        let cfg = FetchSection {
            attempts: 3,
            backoff_initial_ms: 1,
            backoff_max_ms: 2,
            ..cfg
        };
        let f = Fetcher::new(
            &cfg,
            Scope::new("http://127.0.0.1:1/", &[], 2048).unwrap(),
            Hosts::default(),
        );
        let calls = std::sync::atomic::AtomicU32::new(0);
        let r: Result<(), _> = f
            .with_retries(|| async {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Err(FetchError {
                    retry: true,
                    ..FetchError::fail("503".into())
                })
            })
            .await;
        assert!(r.is_err());
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
        calls.store(0, std::sync::atomic::Ordering::SeqCst);
        let _ = f
            .with_retries(|| async {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Err::<(), _>(FetchError::fail("404".into()))
            })
            .await;
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Outside the scope: refused before connecting.
        let e = f.document("http://127.0.0.1:2/x").await.unwrap_err();
        assert!(e.refused.is_some() && !e.retry, "{e}");
    }
}
