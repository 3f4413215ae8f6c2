//! ResourceSync XML: writing `urlset` / `sitemapindex` documents with `rs:md` and `rs:ln`
//! (pure, allocation-light, element order as the sitemaps.org schema wants), and reading them
//! back (used by tests and by anything that consumes ResourceSync documents).

pub mod element;
pub mod entry;
mod read;

pub use read::{parse, Bounded, Document, EntryReader, ParsedEntry, ReadError};

use quick_xml::escape::escape;

use crate::model::{bare_media_type, Timestamp};

pub const SITEMAP_NS: &str = "http://www.sitemaps.org/schemas/sitemap/0.9";
pub const RS_NS: &str = "http://www.openarchives.org/rs/terms/";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Root {
    Urlset,
    SitemapIndex,
}

impl Root {
    fn tags(self) -> (&'static str, &'static str) {
        match self {
            Root::Urlset => ("urlset", "url"),
            Root::SitemapIndex => ("sitemapindex", "sitemap"),
        }
    }
}

/// The attributes of an `rs:md` element; `None` fields are left out. Written in a fixed order.
#[derive(Debug, Clone, Copy, Default)]
pub struct Md<'a> {
    pub capability: Option<&'a str>,
    pub at: Option<Timestamp>,
    pub completed: Option<Timestamp>,
    pub from: Option<Timestamp>,
    pub until: Option<Timestamp>,
    pub change: Option<&'a str>,
    pub datetime: Option<Timestamp>,
    /// Hex MD5, written as `hash="md5:…"`.
    pub md5: Option<&'a str>,
    pub length: Option<u64>,
    /// A media type; parameters (`; charset=…`) are stripped when written.
    pub mime: Option<&'a str>,
    /// Where the bitstream lies in a dump package (Resource and Change Dump Manifests).
    pub path: Option<&'a str>,
}

impl Md<'_> {
    fn is_empty(&self) -> bool {
        self.capability.is_none()
            && self.at.is_none()
            && self.completed.is_none()
            && self.from.is_none()
            && self.until.is_none()
            && self.change.is_none()
            && self.datetime.is_none()
            && self.md5.is_none()
            && self.length.is_none()
            && self.mime.is_none()
            && self.path.is_none()
    }
}

/// The attributes of an `rs:ln` element.
#[derive(Debug, Clone, Copy)]
pub struct Ln<'a> {
    pub rel: &'a str,
    pub href: &'a str,
    pub mime: Option<&'a str>,
}

/// Streams one document into a `String`. The header (`rs:ln`, `rs:md`) is kept apart from the
/// entries so it can be set after them (`completed` is only known at the end).
pub struct SitemapWriter {
    root: Root,
    head: String,
    body: String,
    entries: usize,
}

impl SitemapWriter {
    /// Starts a document with its top-level `rs:ln` links and `rs:md`.
    pub fn new(root: Root, md: &Md, links: &[Ln]) -> SitemapWriter {
        Self::with_capacity(root, md, links, 1024)
    }

    pub fn with_capacity(root: Root, md: &Md, links: &[Ln], capacity: usize) -> SitemapWriter {
        let mut w = SitemapWriter {
            root,
            head: String::new(),
            body: String::with_capacity(capacity),
            entries: 0,
        };
        w.set_header(md, links);
        w
    }

    /// Replaces the top-level `rs:ln` links and `rs:md`.
    pub fn set_header(&mut self, md: &Md, links: &[Ln]) {
        let h = &mut self.head;
        h.clear();
        h.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<");
        h.push_str(self.root.tags().0);
        h.push_str(" xmlns=\"");
        h.push_str(SITEMAP_NS);
        h.push_str("\" xmlns:rs=\"");
        h.push_str(RS_NS);
        h.push_str("\">\n");
        for l in links {
            h.push_str("  ");
            write_ln(h, l);
        }
        h.push_str("  ");
        write_md(h, md);
    }

    /// Adds one `url` (or `sitemap`) entry.
    pub fn entry(&mut self, loc: &str, lastmod: Option<Timestamp>, md: &Md, links: &[Ln]) {
        let tag = self.root.tags().1;
        let b = &mut self.body;
        b.push_str("  <");
        b.push_str(tag);
        b.push_str("><loc>");
        b.push_str(&escape(loc));
        b.push_str("</loc>");
        if let Some(t) = lastmod {
            b.push_str("<lastmod>");
            t.write_w3c(b);
            b.push_str("</lastmod>");
        }
        if !md.is_empty() {
            write_md(b, md);
        }
        for l in links {
            write_ln(b, l);
        }
        b.truncate(b.trim_end().len());
        b.push_str("</");
        b.push_str(tag);
        b.push_str(">\n");
        self.entries += 1;
    }

    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Adds `count` entries, one after the other in `entries`, exactly as [`Self::entry`]
    /// wrote them before (kept by the caller): a page brought up to date copies the entries
    /// nothing changed.
    pub fn raw_entries(&mut self, entries: &str, count: usize) {
        self.body.push_str(entries);
        self.entries += count;
    }

    /// Bytes of the entries written since [`Self::take_entries`] was last called: the
    /// difference around one [`Self::entry`] is that entry's length.
    pub fn pending(&self) -> usize {
        self.body.len()
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Takes the entries written since the last call, for a caller streaming the document
    /// out: it then writes [`Self::head`] + the taken entries + [`Self::tail`].
    pub fn take_entries(&mut self) -> String {
        std::mem::take(&mut self.body)
    }

    /// The XML declaration, the root's start tag and the top-level `rs:ln`/`rs:md`.
    pub fn head(&self) -> &str {
        &self.head
    }

    /// The root's end tag.
    pub fn tail(&self) -> String {
        format!("</{}>\n", self.root.tags().0)
    }

    /// The document. The small header is inserted in front of the body in place, so a large
    /// page is never held twice.
    pub fn finish(self) -> String {
        let close = self.root.tags().0;
        let mut out = self.body;
        out.reserve(self.head.len() + close.len() + 4);
        out.insert_str(0, &self.head);
        out.push_str("</");
        out.push_str(close);
        out.push_str(">\n");
        out
    }
}

fn attr(buf: &mut String, name: &str, value: &str) {
    buf.push(' ');
    buf.push_str(name);
    buf.push_str("=\"");
    buf.push_str(&escape(value));
    buf.push('"');
}

fn time_attr(buf: &mut String, name: &str, t: Timestamp) {
    buf.push(' ');
    buf.push_str(name);
    buf.push_str("=\"");
    t.write_w3c(buf);
    buf.push('"');
}

fn write_md(buf: &mut String, md: &Md) {
    buf.push_str("<rs:md");
    if let Some(v) = md.capability {
        attr(buf, "capability", v);
    }
    for (name, t) in [
        ("at", md.at),
        ("completed", md.completed),
        ("from", md.from),
        ("until", md.until),
    ] {
        if let Some(t) = t {
            time_attr(buf, name, t);
        }
    }
    if let Some(v) = md.change {
        attr(buf, "change", v);
    }
    if let Some(t) = md.datetime {
        time_attr(buf, "datetime", t);
    }
    if let Some(h) = md.md5 {
        buf.push_str(" hash=\"md5:");
        buf.push_str(&escape(h));
        buf.push('"');
    }
    if let Some(n) = md.length {
        buf.push_str(" length=\"");
        buf.push_str(itoa_u64(n, &mut [0u8; 20]));
        buf.push('"');
    }
    if let Some(m) = md.mime {
        attr(buf, "type", bare_media_type(m));
    }
    if let Some(p) = md.path {
        attr(buf, "path", p);
    }
    buf.push_str("/>\n");
}

fn write_ln(buf: &mut String, l: &Ln) {
    buf.push_str("<rs:ln");
    attr(buf, "rel", l.rel);
    attr(buf, "href", l.href);
    if let Some(m) = l.mime {
        attr(buf, "type", bare_media_type(m));
    }
    buf.push_str("/>\n");
}

fn itoa_u64(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[i..]).expect("digits")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_change_list_like_the_spec() {
        let t = |s: &str| Timestamp::parse(s).unwrap();
        let mut w = SitemapWriter::new(
            Root::Urlset,
            &Md {
                capability: Some("changelist"),
                from: Some(t("2013-01-03T00:00:00Z")),
                ..Md::default()
            },
            &[Ln {
                rel: "up",
                href: "http://example.com/dataset1/capabilitylist.xml",
                mime: None,
            }],
        );
        w.entry(
            "http://example.com/res1.html?a=1&b=2",
            Some(t("2000-01-01T01:01:00Z")),
            &Md {
                change: Some("created"),
                datetime: Some(t("2013-01-03T11:00:00Z")),
                md5: Some("1584abdf8ebdc9802ac0c6a7402c03b6"),
                length: Some(8876),
                mime: Some("text/html; charset=utf-8"),
                ..Md::default()
            },
            &[Ln {
                rel: "describedby",
                href: "http://example.com/m.xml",
                mime: Some("application/xml"),
            }],
        );
        assert_eq!(
            w.finish(),
            r#"<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
  <rs:ln rel="up" href="http://example.com/dataset1/capabilitylist.xml"/>
  <rs:md capability="changelist" from="2013-01-03T00:00:00Z"/>
  <url><loc>http://example.com/res1.html?a=1&amp;b=2</loc><lastmod>2000-01-01T01:01:00Z</lastmod><rs:md change="created" datetime="2013-01-03T11:00:00Z" hash="md5:1584abdf8ebdc9802ac0c6a7402c03b6" length="8876" type="text/html"/>
<rs:ln rel="describedby" href="http://example.com/m.xml" type="application/xml"/></url>
</urlset>
"#
        );
    }

    #[test]
    fn index_and_round_trip() {
        let mut w = SitemapWriter::new(
            Root::SitemapIndex,
            &Md {
                capability: Some("resourcelist"),
                ..Md::default()
            },
            &[],
        );
        w.entry("http://h/1.xml", None, &Md::default(), &[]);
        w.entry("http://h/2.xml", None, &Md::default(), &[]);
        let doc = parse(w.finish().as_bytes()).unwrap();
        assert!(doc.is_index);
        assert_eq!(
            doc.md.get("capability").map(String::as_str),
            Some("resourcelist")
        );
        assert_eq!(
            doc.entries
                .iter()
                .map(|e| e.loc.as_str())
                .collect::<Vec<_>>(),
            ["http://h/1.xml", "http://h/2.xml"]
        );
        assert_eq!(itoa_u64(0, &mut [0; 20]), "0");
        assert_eq!(itoa_u64(u64::MAX, &mut [0; 20]), u64::MAX.to_string());
    }
}
