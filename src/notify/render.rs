//! The notification payloads, as pure functions: a change notification (a `urlset` with
//! `capability="change-notification"`, `from` and `until`, entries like a Change List's) and a
//! framework notification (entries with `change` and `capability`, `rel="index"` under an index).

use crate::model::SetConfig;
use crate::model::{Change, ChangeType, Timestamp};
use crate::sitemap::entry::write_change;
use crate::sitemap::{Ln, Md, Root, SitemapWriter};

/// Change notification of `changes` (in forward chronological order) for [from, until).
pub fn change_notification(
    up: &str,
    from: Timestamp,
    until: Timestamp,
    sc: &SetConfig,
    changes: &[Change],
) -> String {
    let md = Md {
        capability: Some("change-notification"),
        from: Some(from),
        until: Some(until),
        ..Md::default()
    };
    let mut w = SitemapWriter::new(
        Root::Urlset,
        &md,
        &[Ln {
            rel: "up",
            href: up,
            mime: None,
        }],
    );
    let mut loc = String::new();
    for c in changes {
        write_change(&mut w, sc, c, &mut loc);
    }
    w.finish()
}

/// One change to the framework: a document created, updated or deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameworkEntry {
    pub loc: String,
    pub change: ChangeType,
    /// `resourcelist`, `changelist`, `capabilitylist` or `description`.
    pub capability: &'static str,
    pub datetime: Timestamp,
    /// The index the document lies under, if any.
    pub index: Option<String>,
}

/// Framework notification of `entries`; `up` is the Capability List for capability documents,
/// the Source Description for a Capability List.
pub fn framework_notification(up: Option<&str>, entries: &[FrameworkEntry]) -> String {
    let md = Md {
        capability: Some("framework-notification"),
        ..Md::default()
    };
    let links: Vec<Ln> = up
        .map(|href| Ln {
            rel: "up",
            href,
            mime: None,
        })
        .into_iter()
        .collect();
    let mut w = SitemapWriter::new(Root::Urlset, &md, &links);
    for e in entries {
        let md = Md {
            change: Some(e.change.as_str()),
            capability: Some(e.capability),
            datetime: Some(e.datetime),
            ..Md::default()
        };
        let links: Vec<Ln> = e
            .index
            .as_deref()
            .map(|href| Ln {
                rel: "index",
                href,
                mime: None,
            })
            .into_iter()
            .collect();
        w.entry(&e.loc, None, &md, &links);
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framework_entries_carry_change_capability_and_index() {
        let xml = framework_notification(
            Some("http://h/sets/a/capabilitylist.xml"),
            &[FrameworkEntry {
                loc: "http://h/sets/a/changelist/2.xml".into(),
                change: ChangeType::Created,
                capability: "changelist",
                datetime: Timestamp::from_secs(1_700_000_000),
                index: Some("http://h/sets/a/changelist.xml".into()),
            }],
        );
        let doc = crate::sitemap::parse(xml.as_bytes()).unwrap();
        assert_eq!(
            doc.md.get("capability").map(String::as_str),
            Some("framework-notification")
        );
        let e = &doc.entries[0];
        assert_eq!(e.md.get("change").map(String::as_str), Some("created"));
        assert_eq!(
            e.md.get("capability").map(String::as_str),
            Some("changelist")
        );
        assert!(
            e.links
                .iter()
                .any(|l| l["rel"] == "index" && l["href"] == "http://h/sets/a/changelist.xml"),
            "{xml}"
        );
    }
}
