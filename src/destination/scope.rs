//! The trust boundary: which URLs a source may make the harvester reach. Every request the
//! destination makes (documents, resources, dump packages, redirects, the hub) is checked here
//! first, by [`super::fetch::Fetcher`], before anything connects. By default a source's
//! documents and resources must lie on the authority (scheme, host and port) of the URL it was
//! configured with; `source.allow_hosts` widens that for sources whose resources live on a CDN
//! or a second host. Also here: the one helper that shortens untrusted text for log lines and
//! messages.

use std::borrow::Cow;

/// An authority a source may name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    /// `None`: `http` or `https`.
    scheme: Option<String>,
    /// A host (lowercase; IPv6 in brackets), or `*.suffix` for every subdomain of `suffix`.
    host: String,
    /// `None`: any port.
    port: Option<u16>,
}

/// The URLs a source may make the harvester reach.
#[derive(Debug, Clone)]
pub struct Scope {
    origins: Vec<Origin>,
    /// The source's own authority, for messages (`http://127.0.0.1:8080`).
    home: String,
    max_url_length: usize,
}

/// Why a URL is not fetched. Shown in `harvest status`; never carries the URL itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("a URL of {0} bytes or more, longer than fetch.max_url_length ({1})")]
    TooLong(usize, usize),
    #[error("not an http(s) URL")]
    NotHttp,
    #[error("on {0}, outside the source's authority {1} (source.allow_hosts widens it)")]
    OffSource(String, String),
    #[error("redirected {0}")]
    Redirected(Box<Refusal>),
}

impl Scope {
    /// The scope of the source at `source_url`, widened by `allow_hosts` (`host`,
    /// `host:port` or `*.domain`).
    pub fn new(
        source_url: &str,
        allow_hosts: &[String],
        max_url_length: usize,
    ) -> Result<Scope, String> {
        let u = url::Url::parse(source_url)
            .map_err(|e| format!("source.url {source_url:?} is not a URL: {e}"))?;
        if !matches!(u.scheme(), "http" | "https") {
            return Err(format!("source.url {source_url:?} is not an http(s) URL"));
        }
        let host = u
            .host_str()
            .ok_or_else(|| format!("source.url {source_url:?} has no host"))?;
        let home = u.origin().ascii_serialization();
        let mut origins = vec![Origin {
            scheme: Some(u.scheme().to_string()),
            host: host.to_ascii_lowercase(),
            port: u.port_or_known_default(),
        }];
        for a in allow_hosts {
            origins.push(parse_allowed(a)?);
        }
        Ok(Scope {
            origins,
            home,
            max_url_length,
        })
    }

    /// The source's own authority, as `scheme://host[:port]`.
    pub fn home(&self) -> &str {
        &self.home
    }

    pub fn max_url_length(&self) -> usize {
        self.max_url_length
    }

    /// `url` parsed, when the source may make the harvester reach it.
    pub fn check(&self, url: &str) -> Result<url::Url, Refusal> {
        if url.len() > self.max_url_length {
            return Err(Refusal::TooLong(url.len(), self.max_url_length));
        }
        let u = url::Url::parse(url).map_err(|_| Refusal::NotHttp)?;
        self.check_parsed(&u)?;
        Ok(u)
    }

    /// As [`Scope::check`], for a URL already parsed (a redirect's target).
    pub fn check_parsed(&self, u: &url::Url) -> Result<(), Refusal> {
        if u.as_str().len() > self.max_url_length {
            return Err(Refusal::TooLong(u.as_str().len(), self.max_url_length));
        }
        if !matches!(u.scheme(), "http" | "https") {
            return Err(Refusal::NotHttp);
        }
        let host = u.host_str().unwrap_or("").to_ascii_lowercase();
        let port = u.port_or_known_default();
        let inside = self.origins.iter().any(|o| {
            o.scheme.as_deref().is_none_or(|s| s == u.scheme())
                && o.port.is_none_or(|p| Some(p) == port)
                && match o.host.strip_prefix("*.") {
                    Some(domain) => host
                        .strip_suffix(domain)
                        .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
                    None => o.host == host,
                }
        });
        if inside {
            Ok(())
        } else {
            Err(Refusal::OffSource(
                short(&u.origin().ascii_serialization()).into_owned(),
                self.home.clone(),
            ))
        }
    }
}

/// One `source.allow_hosts` entry.
fn parse_allowed(a: &str) -> Result<Origin, String> {
    let bad = || {
        format!(
            "source.allow_hosts: {a:?} is not a host, host:port or *.domain (no scheme, no path)"
        )
    };
    let (wild, rest) = match a.strip_prefix("*.") {
        Some(r) => (true, r),
        None => (false, a),
    };
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return Err(bad());
    }
    let u = url::Url::parse(&format!("http://{rest}")).map_err(|_| bad())?;
    let host = u.host_str().ok_or_else(bad)?.to_ascii_lowercase();
    if wild && host.starts_with('[') {
        return Err(bad());
    }
    Ok(Origin {
        scheme: None,
        host: if wild { format!("*.{host}") } else { host },
        port: u.port(),
    })
}

/// Untrusted text made fit for a log line or a message: at most about 200 bytes, cut on a
/// character boundary, with the length it had.
pub fn short(s: &str) -> Cow<'_, str> {
    cut(s, 200)
}

/// As [`short`], at most about `max` bytes (a peer's whole answer, within reason).
pub fn cut(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max && !s.contains(['\n', '\r']) {
        return Cow::Borrowed(s);
    }
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let head: String = s[..end]
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if end == s.len() {
        Cow::Owned(head)
    } else {
        Cow::Owned(format!("{head}… ({} bytes)", s.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_authority_and_what_allow_hosts_adds() {
        let s = Scope::new(
            "http://127.0.0.1:8080/.well-known/resourcesync",
            &["cdn.example.org".into(), "*.files.org".into(), "h:9".into()],
            2048,
        )
        .unwrap();
        assert!(s.check("http://127.0.0.1:8080/a/b?x=1").is_ok());
        assert!(matches!(
            s.check("http://127.0.0.1:8081/a"),
            Err(Refusal::OffSource(..))
        ));
        assert!(
            s.check("https://127.0.0.1:8080/a").is_err(),
            "another scheme"
        );
        assert!(s.check("http://localhost:8080/a").is_err(), "another name");
        assert!(s.check("https://cdn.example.org/a").is_ok());
        assert!(s.check("http://cdn.example.org:81/a").is_ok());
        assert!(s.check("http://eu.files.org/a").is_ok());
        assert!(s.check("http://files.org/a").is_err(), "the domain itself");
        assert!(s.check("http://evilfiles.org/a").is_err());
        assert!(s.check("http://h:9/a").is_ok());
        assert!(s.check("http://h:10/a").is_err());
        assert_eq!(s.check("ftp://127.0.0.1:8080/a"), Err(Refusal::NotHttp));
        assert_eq!(s.check("file:///etc/passwd"), Err(Refusal::NotHttp));
        let long = format!("http://127.0.0.1:8080/{}", "a".repeat(3000));
        assert_eq!(s.check(&long), Err(Refusal::TooLong(long.len(), 2048)));
        // A default port written out is the same authority.
        let s = Scope::new("https://example.org/sd.xml", &[], 2048).unwrap();
        assert!(s.check("https://example.org:443/x").is_ok());
        assert!(s.check("http://example.org/x").is_err());
        assert!(Scope::new("http://h/", &["http://x/".into()], 10).is_err());
    }

    #[test]
    fn short_text_for_logs() {
        assert_eq!(short("http://h/a"), "http://h/a");
        let long = "é".repeat(1000);
        let s = short(&long);
        assert!(s.len() < 230 && s.ends_with("(2000 bytes)"), "{s}");
        assert_eq!(short("a\nb"), "a b");
    }
}
