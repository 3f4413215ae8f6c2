//! One entry of a document from the model: a resource (Resource Lists) or a change (Change
//! Lists, notifications), with its links resolved against the set's URL prefix.

use super::{Ln, Md, SitemapWriter};
use crate::model::{Change, ChangeType, Link, Resource, SetConfig};

/// A link's (rel, URL, type); a link whose href no longer resolves is left out, and logged.
fn link_urls(sc: &SetConfig, ln: &[Link]) -> Vec<(String, String, Option<String>)> {
    ln.iter()
        .filter_map(|l| match l.href.key(sc) {
            Ok(k) => Some((l.rel.clone(), k.url(&sc.url_prefix), l.mime.clone())),
            Err(e) => {
                tracing::warn!(set = %sc.name, error = %e, "link left out: its href no longer resolves");
                None
            }
        })
        .collect()
}

/// Writes a resource entry: its URL, `lastmod`, hash, length, type and links.
pub fn write_resource(w: &mut SitemapWriter, sc: &SetConfig, r: &Resource, loc: &mut String) {
    loc.clear();
    r.key.to_url(&sc.url_prefix, loc);
    let md = Md {
        md5: r.meta.md5.as_deref(),
        length: r.meta.length,
        mime: r.meta.mime.as_deref(),
        ..Md::default()
    };
    entry(w, sc, loc, r.meta.lastmod, &md, &r.meta.ln);
}

/// Writes a change entry: `datetime` always, `lastmod` and resource metadata for
/// created/updated entries.
pub fn write_change(w: &mut SitemapWriter, sc: &SetConfig, c: &Change, loc: &mut String) {
    loc.clear();
    c.key.to_url(&sc.url_prefix, loc);
    let deleted = c.change == ChangeType::Deleted;
    let md = Md {
        change: Some(c.change.as_str()),
        datetime: Some(c.datetime),
        md5: if deleted { None } else { c.meta.md5.as_deref() },
        length: if deleted { None } else { c.meta.length },
        mime: if deleted {
            None
        } else {
            c.meta.mime.as_deref()
        },
        ..Md::default()
    };
    let lastmod = if deleted { None } else { c.meta.lastmod };
    entry(
        w,
        sc,
        loc,
        lastmod,
        &md,
        if deleted { &[] } else { &c.meta.ln },
    );
}

/// Writes one entry with its links resolved (none allocated when it has none).
fn entry(
    w: &mut SitemapWriter,
    sc: &SetConfig,
    loc: &str,
    lastmod: Option<crate::model::Timestamp>,
    md: &Md,
    ln: &[Link],
) {
    if ln.is_empty() {
        return w.entry(loc, lastmod, md, &[]);
    }
    let links = link_urls(sc, ln);
    let lns: Vec<Ln> = links
        .iter()
        .map(|(rel, href, mime)| Ln {
            rel,
            href,
            mime: mime.as_deref(),
        })
        .collect();
    w.entry(loc, lastmod, md, &lns);
}
