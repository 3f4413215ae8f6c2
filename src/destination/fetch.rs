//! Fetching from the source: documents and resources, with retries (exponential backoff,
//! `Retry-After` honoured) for what may pass (timeouts, connection errors, 408, 429, 5xx), and
//! resources streamed to a temporary file while their length and md5 are computed, so memory
//! stays bounded whatever their size.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use md5::{Digest, Md5};
use reqwest::StatusCode;

use super::config::FetchSection;
use crate::digest::hex_digest;

#[derive(Clone)]
pub struct Fetcher {
    /// For resources: fetched as they are (no `Accept-Encoding: gzip`): a server compressing
    /// every small file on the fly costs more CPU than it saves, and the md5 is of the content.
    client: reqwest::Client,
    /// For documents (Resource List parts, Change Lists): gzip welcome, they shrink ~10×.
    documents: reqwest::Client,
    /// For dump packages (gigabytes): no limit on the whole transfer, only on silence.
    packages: reqwest::Client,
    cfg: FetchSection,
}

/// Why a fetch failed: `retry` when another try may succeed.
#[derive(Debug, Clone)]
pub struct FetchError {
    pub message: String,
    pub retry: bool,
    pub retry_after: Option<Duration>,
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
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

impl Fetcher {
    pub fn new(cfg: &FetchSection) -> Fetcher {
        let base = || {
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(cfg.timeout_secs.min(30)))
                .no_proxy()
                .user_agent(concat!(
                    "resourcesync-hub-harvest/",
                    env!("CARGO_PKG_VERSION")
                ))
        };
        let builder = || base().timeout(Duration::from_secs(cfg.timeout_secs));
        Fetcher {
            client: builder().no_gzip().build().expect("an HTTP client"),
            documents: builder().build().expect("an HTTP client"),
            packages: base()
                .read_timeout(Duration::from_secs(cfg.timeout_secs))
                .no_gzip()
                .build()
                .expect("an HTTP client"),
            cfg: cfg.clone(),
        }
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Runs `op` up to `fetch.attempts` times while its error says to retry, waiting with
    /// exponential backoff (and at least the server's `Retry-After`).
    async fn with_retries<T, F, Fut>(&self, mut op: F) -> Result<T, FetchError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, FetchError>>,
    {
        let mut wait = Duration::from_millis(self.cfg.backoff_initial_ms);
        let max = Duration::from_millis(self.cfg.backoff_max_ms);
        let mut attempt = 1;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) if e.retry && attempt < self.cfg.attempts => {
                    let pause = e
                        .retry_after
                        .unwrap_or(wait)
                        .max(wait)
                        .min(max.max(e.retry_after.unwrap_or_default()));
                    tracing::debug!(error = %e.message, attempt, pause_ms = pause.as_millis() as u64, "retrying");
                    tokio::time::sleep(pause).await;
                    wait = (wait * 2).min(max);
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A document (a Capability List, a Resource List part, a Change List…), whole. Fine for
    /// documents up to the sitemap limit of 50 MB; resources go through [`Fetcher::download`].
    pub async fn document(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        self.with_retries(|| async {
            let r = self
                .documents
                .get(url)
                .send()
                .await
                .map_err(|e| transport(url, e))?;
            check_status(url, &r)?;
            let b = r.bytes().await.map_err(|e| transport(url, e))?;
            Ok(b.to_vec())
        })
        .await
    }

    /// A document streamed into a temporary file under `dir` (for Resource List parts and
    /// Change Lists that may be large); the file is removed when the returned handle drops.
    pub async fn document_to_file(
        &self,
        url: &str,
        dir: &Path,
    ) -> Result<tempfile::NamedTempFile, FetchError> {
        self.with_retries(|| async {
            let tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| local(dir, e))?;
            let mut r = self
                .documents
                .get(url)
                .send()
                .await
                .map_err(|e| transport(url, e))?;
            check_status(url, &r)?;
            copy_body(url, &mut r, tmp.as_file(), dir, |_| {}).await?;
            Ok(tmp)
        })
        .await
    }

    /// A resource into the file `path` (created or truncated), measured on the way.
    pub async fn download(&self, url: &str, path: &Path) -> Result<Downloaded, FetchError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        self.with_retries(|| async {
            let file = std::fs::File::create(path).map_err(|e| local(dir, e))?;
            let mut r = self
                .client
                .get(url)
                .send()
                .await
                .map_err(|e| transport(url, e))?;
            check_status(url, &r)?;
            let mime = r
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let mut h = Md5::new();
            let mut length = 0u64;
            copy_body(url, &mut r, &file, dir, |chunk| {
                h.update(chunk);
                length += chunk.len() as u64;
            })
            .await?;
            Ok(Downloaded {
                path: path.to_path_buf(),
                length,
                md5: hex_digest(h.finalize()),
                mime,
            })
        })
        .await
    }
}

impl Fetcher {
    /// A large file (a dump package) into `path`, resumed where it stopped: after a dropped
    /// connection, and after a restart (`path` and `<path>.etag` are kept), a try asks for the
    /// rest with `Range` and `If-Range` (the ETag of the first response) and starts over when
    /// the server answers with the whole file (it changed). Returns the file's length.
    pub async fn download_resumable(
        &self,
        url: &str,
        path: &Path,
        expected: Option<u64>,
    ) -> Result<u64, FetchError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let etag_path = path.with_extension("etag");
        self.with_retries(|| async {
            let have = std::fs::metadata(path).map_or(0, |m| m.len());
            if have > 0 && expected == Some(have) {
                return Ok(have);
            }
            let etag = std::fs::read_to_string(&etag_path).ok();
            let mut req = self.packages.get(url);
            if let (true, Some(tag)) = (have > 0, &etag) {
                req = req
                    .header(reqwest::header::RANGE, format!("bytes={have}-"))
                    .header(reqwest::header::IF_RANGE, tag.as_str());
            }
            let mut r = req.send().await.map_err(|e| transport(url, e))?;
            let resumed = r.status() == StatusCode::PARTIAL_CONTENT;
            // The partial file cannot be continued: drop it, and the next try starts over.
            let start_over = |why: String| {
                let _ = std::fs::remove_file(path);
                Err(FetchError {
                    message: format!("GET {url}: {why}; starting over"),
                    retry: true,
                    retry_after: None,
                })
            };
            if r.status() == StatusCode::RANGE_NOT_SATISFIABLE {
                return start_over("the partial download is longer than the file now".into());
            }
            check_status(url, &r)?;
            if resumed {
                let start = r
                    .headers()
                    .get(reqwest::header::CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("bytes "))
                    .and_then(|v| v.split('-').next())
                    .and_then(|v| v.parse::<u64>().ok());
                if start != Some(have) {
                    return start_over(format!("the server resumed at {start:?}, not at {have}"));
                }
            } else if let Some(tag) = r
                .headers()
                .get(reqwest::header::ETAG)
                .and_then(|v| v.to_str().ok())
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
            if resumed {
                tracing::info!(url, from = have, "resuming a package download");
            }
            copy_body(url, &mut r, &file, dir, |_| {}).await?;
            let len = std::fs::metadata(path).map_err(|e| local(dir, e))?.len();
            match expected {
                Some(e) if e != len => Err(FetchError {
                    message: format!("GET {url}: {len} bytes, the dump lists {e}"),
                    retry: false,
                    retry_after: None,
                }),
                _ => Ok(len),
            }
        })
        .await
    }
}

/// Streams a response body into `file` (buffered), showing each chunk to `each` on the way.
async fn copy_body(
    url: &str,
    r: &mut reqwest::Response,
    file: &std::fs::File,
    dir: &Path,
    mut each: impl FnMut(&[u8]),
) -> Result<(), FetchError> {
    let mut w = std::io::BufWriter::new(file);
    while let Some(chunk) = r.chunk().await.map_err(|e| transport(url, e))? {
        each(&chunk);
        w.write_all(&chunk).map_err(|e| local(dir, e))?;
    }
    w.flush().map_err(|e| local(dir, e))
}

fn transport(url: &str, e: reqwest::Error) -> FetchError {
    FetchError {
        message: format!("GET {url}: {e}"),
        retry: e.is_timeout() || e.is_connect() || e.is_request() || e.is_body(),
        retry_after: None,
    }
}

fn local(dir: &Path, e: std::io::Error) -> FetchError {
    FetchError {
        message: format!("writing under {}: {e}", dir.display()),
        retry: false,
        retry_after: None,
    }
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
        .and_then(|v| {
            v.trim()
                .parse::<u64>()
                .ok()
                .map(Duration::from_secs)
                .or_else(|| {
                    crate::model::Timestamp::parse_http_date(v).map(|t| {
                            Duration::from_micros(
                                (t.0 - crate::model::Timestamp::now().0).max(0) as u64
                            )
                        })
                })
        });
    Err(FetchError {
        message: format!("GET {url}: {s}"),
        retry,
        retry_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn retries_only_what_may_pass() {
        let cfg = FetchSection {
            concurrency: 1,
            timeout_secs: 5,
            attempts: 3,
            backoff_initial_ms: 1,
            backoff_max_ms: 2,
            max_tries: 1,
            skip_failed: false,
        };
        let f = Fetcher::new(&cfg);
        let calls = std::sync::atomic::AtomicU32::new(0);
        let r: Result<(), _> = f
            .with_retries(|| async {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Err(FetchError {
                    message: "503".into(),
                    retry: true,
                    retry_after: None,
                })
            })
            .await;
        assert!(r.is_err());
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
        calls.store(0, std::sync::atomic::Ordering::SeqCst);
        let _ = f
            .with_retries(|| async {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Err::<(), _>(FetchError {
                    message: "404".into(),
                    retry: false,
                    retry_after: None,
                })
            })
            .await;
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
