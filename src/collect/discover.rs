//! Discovery: given only a base URL, what the source offers, and which of it a collector
//! reads.
//!
//! What is looked at, each page once, within the URL's own origin (scheme, host, port: a
//! link elsewhere is noted and never followed) and at most [`MAX_PROBES`] pages of at most
//! [`MAX_PROBE_BYTES`] each:
//! 1. the URL itself: a ResourceSync document (Source Description, Capability List or any
//!    list with `rs:md capability`), a sitemap or sitemap index, an activity stream (an
//!    `OrderedCollection`), an RFC 9727 API catalog (a linkset), or a page whose `Link`
//!    headers or `<link>` elements name `resourcesync`, `api-catalog` or `linkset`
//!    (Signposting);
//! 2. the URL with `?verb=Identify` (an OAI-PMH repository);
//! 3. `/.well-known/resourcesync` and `/.well-known/api-catalog` (RFC 9727), whose items are
//!    looked at in turn;
//! 4. `robots.txt`'s `Sitemap:` lines, then `/sitemap.xml`.
//!
//! Of what is found, the collector reads, in this order: ResourceSync (lists, Change Lists,
//! push), OAI-PMH, an activity stream, a sitemap. The reading of each answer ([`classify`],
//! [`links_of`]) is pure; [`discover`] drives it.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::config::CollectKind;
use crate::destination::fetch::{Fetcher, Probe};
use crate::destination::scope::short;

/// Pages looked at, at most, in one discovery.
pub const MAX_PROBES: usize = 12;
/// The most of a page read.
pub const MAX_PROBE_BYTES: u64 = 1024 * 1024;
/// Answers asking to wait (429, 503) taken in one discovery before it gives up until the next
/// run.
const MAX_WAITS: u32 = 3;

/// What a discovery found and chose, kept with the collector and shown to admins.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Discovered {
    /// `oai-pmh`, `resourcesync`, `activity` or `sitemap`.
    pub kind: String,
    /// The URL the collector reads.
    pub url: String,
    /// Why it was chosen, in words.
    pub why: String,
    /// Each page looked at and what it was, in order.
    pub looked: Vec<String>,
    /// When (RFC 3339).
    pub at: String,
}

impl Discovered {
    pub fn kind(&self) -> Option<CollectKind> {
        kind_named(&self.kind)
    }
}

pub fn kind_named(s: &str) -> Option<CollectKind> {
    [
        CollectKind::OaiPmh,
        CollectKind::Resourcesync,
        CollectKind::Activity,
        CollectKind::Sitemap,
    ]
    .into_iter()
    .find(|k| k.as_str() == s)
}

/// What one page is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Page {
    /// A ResourceSync document with this capability.
    ResourceSync(String),
    Sitemap {
        index: bool,
    },
    /// An activity stream (IIIF Change Discovery's `OrderedCollection`).
    Activity,
    /// An OAI-PMH `Identify` answer.
    OaiPmh,
    /// An API catalog or linkset: the URLs it names.
    Catalog(Vec<String>),
    /// `robots.txt`: its `Sitemap:` URLs.
    Robots(Vec<String>),
    /// Something else (an HTML page, say): the links it names that may lead on.
    Other(Vec<String>),
}

/// The relations that lead to what a collector reads.
const LEADING_RELS: &[&str] = &["resourcesync", "api-catalog", "linkset", "item"];

/// The targets of `Link` header values with a leading relation (RFC 8288: `<url>; rel="a b"`),
/// resolved against `base`.
pub fn links_of(values: &[String], base: &url::Url) -> Vec<String> {
    let mut out = Vec::new();
    for v in values {
        for link in split_links(v) {
            let Some((target, params)) = link
                .trim()
                .strip_prefix('<')
                .and_then(|l| l.split_once('>'))
            else {
                continue;
            };
            let rels = params
                .split(';')
                .filter_map(|p| p.trim().split_once('='))
                .filter(|(k, _)| k.trim().eq_ignore_ascii_case("rel"))
                .map(|(_, v)| v.trim().trim_matches('"').to_ascii_lowercase())
                .collect::<Vec<_>>()
                .join(" ");
            if rels.split_whitespace().any(|r| LEADING_RELS.contains(&r)) {
                if let Ok(u) = base.join(target.trim()) {
                    out.push(u.to_string());
                }
            }
        }
    }
    out
}

/// A `Link` header value's links (commas inside `<…>` or quotes do not split).
fn split_links(v: &str) -> Vec<&str> {
    let (mut out, mut start, mut angle, mut quote) = (Vec::new(), 0, false, false);
    for (i, c) in v.char_indices() {
        match c {
            '<' if !quote => angle = true,
            '>' if !quote => angle = false,
            '"' if !angle => quote = !quote,
            ',' if !angle && !quote => {
                out.push(&v[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&v[start..]);
    out
}

/// What the page at `url` with this answer is.
pub fn classify(url: &url::Url, probe: &Probe) -> Page {
    let body = &probe.body;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX_PROBE_BYTES as usize)]);
    let head = text.trim_start_matches('\u{feff}').trim_start();
    if url.path().ends_with("/robots.txt") {
        let sitemaps = text
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("sitemap")
                    .then(|| url.join(v.trim()).ok())
                    .flatten()
            })
            .map(|u| u.to_string())
            .take(MAX_PROBES)
            .collect();
        return Page::Robots(sitemaps);
    }
    if head.starts_with('{') {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(head) else {
            return Page::Other(Vec::new());
        };
        if let Some(sets) = v.get("linkset").and_then(|l| l.as_array()) {
            let mut urls = Vec::new();
            for set in sets {
                let Some(o) = set.as_object() else { continue };
                for (rel, targets) in o {
                    if rel == "anchor" {
                        continue;
                    }
                    for t in targets.as_array().into_iter().flatten() {
                        if let Some(h) = t.get("href").and_then(|h| h.as_str()) {
                            if let Ok(u) = url.join(h) {
                                urls.push(u.to_string());
                            }
                        }
                    }
                }
            }
            return Page::Catalog(urls);
        }
        let kind = v.get("type").and_then(|t| t.as_str()).unwrap_or("");
        if kind == "OrderedCollection" || kind == "OrderedCollectionPage" {
            return Page::Activity;
        }
        return Page::Other(Vec::new());
    }
    if head.starts_with('<') {
        if head.contains("<OAI-PMH") && head.contains("<Identify") {
            return Page::OaiPmh;
        }
        if let Ok(doc) = crate::destination::discover::parse(body, 64 * 1024) {
            return match doc.md.get("capability") {
                Some(c) => Page::ResourceSync(c.clone()),
                None => Page::Sitemap {
                    index: doc.is_index,
                },
            };
        }
        return Page::Other(html_links(head, url));
    }
    Page::Other(Vec::new())
}

/// `<link rel=… href=…>` elements of an HTML page with a leading relation, resolved.
fn html_links(html: &str, base: &url::Url) -> Vec<String> {
    let lower = html.to_ascii_lowercase();
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = lower[at..].find("<link") {
        let start = at + i;
        let Some(end) = lower[start..].find('>').map(|e| start + e) else {
            break;
        };
        let tag = &html[start..end];
        let rel = attribute(tag, "rel")
            .unwrap_or_default()
            .to_ascii_lowercase();
        if rel.split_whitespace().any(|r| LEADING_RELS.contains(&r)) {
            if let Some(h) = attribute(tag, "href").and_then(|h| base.join(&h).ok()) {
                out.push(h.to_string());
            }
        }
        at = end;
        if out.len() >= MAX_PROBES {
            break;
        }
    }
    out
}

/// An attribute's value in a tag (quoted with `"` or `'`, or bare).
fn attribute(tag: &str, name: &str) -> Option<String> {
    let lower = tag.to_ascii_lowercase();
    let mut from = 0;
    while let Some(i) = lower[from..].find(name) {
        let at = from + i;
        from = at + name.len();
        let before_ok = at > 0 && lower.as_bytes()[at - 1].is_ascii_whitespace();
        let rest = tag[at + name.len()..].trim_start();
        if !before_ok || !rest.starts_with('=') {
            continue;
        }
        let rest = rest[1..].trim_start();
        let value = match rest.chars().next() {
            Some(q @ ('"' | '\'')) => rest[1..].split(q).next().unwrap_or(""),
            _ => rest
                .split(|c: char| c.is_whitespace() || c == '>')
                .next()
                .unwrap_or(""),
        };
        return Some(value.to_string());
    }
    None
}

/// What a discovery found so far: the best candidate of each kind, in the order found.
#[derive(Debug, Default)]
struct Findings {
    found: Vec<(CollectKind, String, String)>,
    looked: Vec<String>,
}

impl Findings {
    fn add(&mut self, kind: CollectKind, url: &str, how: String) {
        if !self.found.iter().any(|(k, _, _)| *k == kind) {
            self.found.push((kind, url.to_string(), how));
        }
    }

    /// Notes what the page at `url` (reached as `how`) is; the URLs it leads on to are added
    /// to `next`. What it is, in words.
    fn note(
        &mut self,
        page: Page,
        url: &str,
        how: &str,
        base: &url::Url,
        next: &mut Vec<String>,
    ) -> String {
        match page {
            Page::ResourceSync(c) => {
                let c = short(&c).into_owned();
                self.add(
                    CollectKind::Resourcesync,
                    url,
                    format!("{how} is a ResourceSync {c}"),
                );
                format!("a ResourceSync {c}")
            }
            Page::OaiPmh => {
                self.add(
                    CollectKind::OaiPmh,
                    base.as_str(),
                    format!("{how} answers OAI-PMH Identify"),
                );
                "an OAI-PMH repository".into()
            }
            Page::Activity => {
                self.add(
                    CollectKind::Activity,
                    url,
                    format!("{how} is an activity stream"),
                );
                "an activity stream".into()
            }
            Page::Sitemap { index } => {
                let what = if index {
                    "a sitemap index"
                } else {
                    "a sitemap"
                };
                self.add(CollectKind::Sitemap, url, format!("{how} is {what}"));
                what.into()
            }
            Page::Catalog(urls) => {
                let n = urls.len();
                next.extend(urls);
                format!("a linkset naming {n} URLs")
            }
            Page::Robots(urls) => {
                let n = urls.len();
                next.extend(urls);
                format!("robots.txt naming {n} sitemaps")
            }
            Page::Other(urls) => {
                next.extend(urls);
                "none of these".into()
            }
        }
    }

    /// The preferred of what was found.
    fn choose(self) -> Result<Discovered, String> {
        let order = [
            CollectKind::Resourcesync,
            CollectKind::OaiPmh,
            CollectKind::Activity,
            CollectKind::Sitemap,
        ];
        let best = order
            .iter()
            .find_map(|k| self.found.iter().find(|(f, _, _)| f == k));
        match best {
            Some((kind, url, how)) => {
                let others: Vec<String> = self
                    .found
                    .iter()
                    .filter(|(k, _, _)| k != kind)
                    .map(|(k, u, _)| format!("{} at {}", k.as_str(), short(u)))
                    .collect();
                let mut why = format!("{how}; ");
                why.push_str(match kind {
                    CollectKind::Resourcesync => "ResourceSync is read first: its lists carry md5 and length, its Change Lists every change, and its hub pushes them",
                    CollectKind::OaiPmh => "OAI-PMH is read before activity streams and sitemaps: it lists deletions and changes by date",
                    CollectKind::Activity => "an activity stream is read before a sitemap: it lists deletions and changes in order",
                    CollectKind::Sitemap => "only a sitemap was found: each run reads it whole",
                });
                if !others.is_empty() {
                    why.push_str(&format!(" (also found: {})", others.join(", ")));
                }
                Ok(Discovered {
                    kind: kind.as_str().into(),
                    url: url.clone(),
                    why,
                    looked: self.looked,
                    at: crate::model::Timestamp::now().to_string(),
                })
            }
            None => Err(format!(
                "nothing a collector reads was found (no ResourceSync document, OAI-PMH repository, activity stream or sitemap); looked at: {}",
                self.looked.join("; ")
            )),
        }
    }
}

/// Why discovery found nothing to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undiscovered {
    /// The URL given answered 401 or 403: the source refuses this server (the collector
    /// stops until an admin resumes it, as for a repository that refuses).
    Refused(String),
    /// Nothing a collector reads was found, in words naming each page looked at.
    Nothing(String),
}

/// Discovers what `base` offers, through `fetcher` (its scope: `base`'s origin).
pub async fn discover(fetcher: &Fetcher, base: &str) -> Result<Discovered, Undiscovered> {
    let b = url::Url::parse(base)
        .map_err(|e| Undiscovered::Nothing(format!("{base:?} is not a URL: {e}")))?;
    let origin = b.origin();
    let root = |p: &str| b.join(p).map(|u| u.to_string()).unwrap_or_default();
    let mut identify = b.clone();
    identify.query_pairs_mut().append_pair("verb", "Identify");
    let mut queue: VecDeque<(String, &'static str)> = VecDeque::from([
        (base.to_string(), "the URL given"),
        (
            identify.to_string(),
            "the URL given, asked for OAI-PMH Identify",
        ),
        (
            root("/.well-known/resourcesync"),
            "its /.well-known/resourcesync",
        ),
        (
            root("/.well-known/api-catalog"),
            "its API catalog (RFC 9727)",
        ),
        (root("/robots.txt"), "its robots.txt"),
        (root("/sitemap.xml"), "its /sitemap.xml"),
    ]);
    let mut seen = std::collections::HashSet::new();
    let mut f = Findings::default();
    let mut probes = 0;
    let mut waits = 0;
    while let Some((url, how)) = queue.pop_front() {
        if !seen.insert(url.clone()) {
            continue;
        }
        let Ok(u) = url::Url::parse(&url) else {
            continue;
        };
        if u.origin() != origin {
            f.looked.push(format!(
                "{} ({how}): not followed, it is on another origin than the URL given",
                short(&url)
            ));
            continue;
        }
        if probes >= MAX_PROBES {
            f.looked.push(format!(
                "{}: not looked at, past {MAX_PROBES} pages",
                short(&url)
            ));
            continue;
        }
        // Enough is known once a ResourceSync source is found: nothing is read before it.
        if f.found
            .iter()
            .any(|(k, _, _)| *k == CollectKind::Resourcesync)
        {
            break;
        }
        probes += 1;
        let probe = match fetcher.probe(&url, MAX_PROBE_BYTES).await {
            Ok(p) => p,
            // A source that asks to wait is asked again once the host's pause (its
            // `Retry-After`, which holds for every request to it) is over, a few times at most.
            Err(e) if matches!(e.status, Some(429 | 503)) => {
                waits += 1;
                if waits > MAX_WAITS {
                    return Err(Undiscovered::Nothing(format!(
                        "{} asked to wait ({}) {waits} times; discovery tries again at the next run",
                        short(&url),
                        e.status.unwrap_or_default()
                    )));
                }
                seen.remove(&url);
                probes -= 1;
                queue.push_front((url, how));
                continue;
            }
            Err(e) if how.starts_with("the URL given") && matches!(e.status, Some(401 | 403)) => {
                let status = e.status.unwrap_or_default();
                let reason = reqwest::StatusCode::from_u16(status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("");
                return Err(Undiscovered::Refused(format!(
                    "{status} {reason} at {}",
                    short(&url)
                )));
            }
            Err(e) => {
                f.looked.push(format!(
                    "{} ({how}): {}",
                    short(&url),
                    short(&e.to_string())
                ));
                continue;
            }
        };
        let mut next: Vec<String> = links_of(&probe.links, &u);
        let said = f.note(classify(&u, &probe), &url, how, &b, &mut next);
        let n = next.len();
        // What one page leads on to is bounded as the pages are: the words kept (`looked`)
        // stay a few kilobytes whatever a catalog lists.
        next.truncate(MAX_PROBES);
        f.looked.push(if n > 0 {
            format!("{} ({how}): {said}, linking to {n}", short(&url))
        } else {
            format!("{} ({how}): {said}", short(&url))
        });
        // What a page links to is looked at before the fixed places that follow it.
        for l in next.into_iter().rev() {
            queue.push_front((l, "a URL it links to"));
        }
    }
    f.choose().map_err(Undiscovered::Nothing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(body: &str) -> Probe {
        Probe {
            body: body.as_bytes().to_vec(),
            ..Probe::default()
        }
    }

    fn at(u: &str) -> url::Url {
        url::Url::parse(u).unwrap()
    }

    #[test]
    fn each_kind_of_page_is_told_apart() {
        let base = at("http://s.example/");
        let rs = r#"<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md capability="description"/><url><loc>http://s.example/cl.xml</loc></url></urlset>"#;
        let plain = r#"<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>http://s.example/a</loc><lastmod>2024-01-01</lastmod></url></urlset>"#;
        let index = r#"<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><sitemap><loc>http://s.example/s1.xml</loc></sitemap></sitemapindex>"#;
        let oai = r#"<?xml version="1.0"?><OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/"><responseDate>2024-01-01T00:00:00Z</responseDate><Identify><repositoryName>r</repositoryName></Identify></OAI-PMH>"#;
        let stream = r#"{"@context":"http://iiif.io/api/discovery/1/context.json","id":"http://s.example/as","type":"OrderedCollection","last":{"id":"http://s.example/as/p3","type":"OrderedCollectionPage"}}"#;
        let catalog = r#"{"linkset":[{"anchor":"http://s.example/.well-known/api-catalog","item":[{"href":"/oai"},{"href":"http://other.example/x"}]}]}"#;
        let html = r#"<html><head><LINK REL="resourcesync" HREF="/rs/sd.xml"><link rel="stylesheet" href="/s.css"></head></html>"#;
        let cases: Vec<(&str, &str, Page)> = vec![
            (
                "http://s.example/sd.xml",
                rs,
                Page::ResourceSync("description".into()),
            ),
            (
                "http://s.example/sitemap.xml",
                plain,
                Page::Sitemap { index: false },
            ),
            (
                "http://s.example/sitemap.xml",
                index,
                Page::Sitemap { index: true },
            ),
            ("http://s.example/oai?verb=Identify", oai, Page::OaiPmh),
            ("http://s.example/as", stream, Page::Activity),
            (
                "http://s.example/.well-known/api-catalog",
                catalog,
                Page::Catalog(vec![
                    "http://s.example/oai".into(),
                    "http://other.example/x".into(),
                ]),
            ),
            (
                "http://s.example/",
                html,
                Page::Other(vec!["http://s.example/rs/sd.xml".into()]),
            ),
            (
                "http://s.example/robots.txt",
                "User-agent: *\nDisallow: /x\nSitemap: /sm.xml\nsitemap:http://s.example/b.xml\n",
                Page::Robots(vec![
                    "http://s.example/sm.xml".into(),
                    "http://s.example/b.xml".into(),
                ]),
            ),
            ("http://s.example/", "{not json", Page::Other(vec![])),
            (
                "http://s.example/",
                "<html><body>hello</body></html>",
                Page::Other(vec![]),
            ),
            ("http://s.example/", "", Page::Other(vec![])),
        ];
        for (u, body, want) in cases {
            assert_eq!(classify(&at(u), &probe(body)), want, "{u}: {body}");
        }
        let _ = base;
    }

    #[test]
    fn link_headers_lead_on_by_their_relation_only() {
        let base = at("http://s.example/page");
        let values = vec![
            r#"</rs/sd.xml>; rel="resourcesync", </a,b>; rel="author""#.to_string(),
            r#"<https://s.example/.well-known/api-catalog>; rel="api-catalog""#.to_string(),
            r#"</ls>; rel="linkset"; type="application/linkset+json""#.to_string(),
            r#"garbage"#.to_string(),
        ];
        assert_eq!(
            links_of(&values, &base),
            vec![
                "http://s.example/rs/sd.xml",
                "https://s.example/.well-known/api-catalog",
                "http://s.example/ls"
            ]
        );
    }

    #[test]
    fn the_preferred_kind_is_chosen_and_the_others_named() {
        let mut f = Findings::default();
        f.add(
            CollectKind::Sitemap,
            "http://s/sm.xml",
            "robots.txt names it".into(),
        );
        f.add(
            CollectKind::OaiPmh,
            "http://s/oai",
            "the URL answers Identify".into(),
        );
        let d = f.choose().unwrap();
        assert_eq!(d.kind, "oai-pmh");
        assert_eq!(d.url, "http://s/oai");
        assert!(
            d.why.contains("also found: sitemap at http://s/sm.xml"),
            "{}",
            d.why
        );
        let none = Findings {
            looked: vec!["http://s/ (the URL given): none of these".into()],
            ..Findings::default()
        };
        let e = none.choose().unwrap_err();
        assert!(
            e.contains("nothing a collector reads was found") && e.contains("none of these"),
            "{e}"
        );
    }

    proptest::proptest! {
        /// Whatever a page holds, reading it ends and names only URLs.
        #[test]
        fn any_page_is_read_without_panic(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2000), robots in proptest::prelude::any::<bool>()) {
            let u = at(if robots { "http://s.example/robots.txt" } else { "http://s.example/x" });
            let p = Probe { body, links: vec![] };
            match classify(&u, &p) {
                Page::Catalog(v) | Page::Robots(v) | Page::Other(v) => {
                    for l in v { proptest::prop_assert!(url::Url::parse(&l).is_ok()); }
                }
                _ => {}
            }
        }

        #[test]
        fn any_link_header_is_read_without_panic(v in ".{0,300}") {
            let _ = links_of(&[v], &at("http://s.example/"));
        }
    }
}
