//! Discovery: from the configured URL (a Source Description, a Capability List, or a base URL
//! whose `/.well-known/resourcesync` is the Source Description) to each followed set's
//! documents and its change-notification topic and hub.

use super::fetch::Fetcher;
use crate::sitemap;

/// What one Capability List offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetInfo {
    pub capability: String,
    /// A short name: the path segment before `capabilitylist.xml`, else the file name.
    pub name: String,
    pub resourcelist: Option<String>,
    pub resourcedump: Option<String>,
    pub changelist: Option<String>,
    /// The change-notification topic and the hub that serves it.
    pub topic: Option<String>,
    pub hub: Option<String>,
}

/// The sets at `url`, restricted to `wanted` (Capability List URLs or set names) when given.
pub async fn discover(f: &Fetcher, url: &str, wanted: &[String]) -> anyhow::Result<Vec<SetInfo>> {
    let doc = match f
        .document(url)
        .await
        .ok()
        .and_then(|b| sitemap::parse(&b).ok())
    {
        Some(d) => d,
        None => {
            let sd = format!("{}/.well-known/resourcesync", url.trim_end_matches('/'));
            let body = f.document(&sd).await.map_err(|e| {
                anyhow::anyhow!("{url} is neither a Source Description nor a Capability List, and {sd} cannot be read: {e}")
            })?;
            sitemap::parse(&body).map_err(|e| anyhow::anyhow!("{sd}: {e}"))?
        }
    };
    let capability_lists: Vec<String> = match doc.md.get("capability").map(String::as_str) {
        Some("description") => doc
            .entries
            .iter()
            .filter(|e| e.md.get("capability").map(String::as_str) == Some("capabilitylist"))
            .map(|e| e.loc.clone())
            .collect(),
        Some("capabilitylist") => vec![url.to_string()],
        other => anyhow::bail!(
            "{url} is a {other:?} document, not a Source Description or Capability List"
        ),
    };
    let mut out = Vec::new();
    for cap in capability_lists {
        let name = set_name(&cap);
        if !wanted.is_empty() && !wanted.iter().any(|w| *w == cap || *w == name) {
            continue;
        }
        let body = f
            .document(&cap)
            .await
            .map_err(|e| anyhow::anyhow!("Capability List {cap}: {e}"))?;
        let d = sitemap::parse(&body).map_err(|e| anyhow::anyhow!("Capability List {cap}: {e}"))?;
        let find = |c: &str| {
            d.entries
                .iter()
                .find(|e| e.md.get("capability").map(String::as_str) == Some(c))
        };
        let notification = find("change-notification");
        out.push(SetInfo {
            capability: cap.clone(),
            name,
            resourcelist: find("resourcelist").map(|e| e.loc.clone()),
            resourcedump: find("resourcedump").map(|e| e.loc.clone()),
            changelist: find("changelist").map(|e| e.loc.clone()),
            topic: notification.map(|e| e.loc.clone()),
            hub: notification.and_then(|e| {
                e.links
                    .iter()
                    .find(|l| l.get("rel").map(String::as_str) == Some("hub"))
                    .and_then(|l| l.get("href").cloned())
            }),
        });
    }
    if out.is_empty() {
        anyhow::bail!("no Capability List at {url} matches source.sets = {wanted:?}");
    }
    Ok(out)
}

/// `http://h/sets/papers/capabilitylist.xml` -> `papers`; `http://h/caps/x.xml` -> `x.xml`.
pub fn set_name(capability: &str) -> String {
    let path = capability.split(['?', '#']).next().unwrap_or("");
    let mut segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.pop() {
        Some("capabilitylist.xml") => segs.pop().unwrap_or("set").to_string(),
        Some(last) => last.to_string(),
        None => "set".into(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_from_capability_urls() {
        assert_eq!(
            super::set_name("http://h:1/sets/papers/capabilitylist.xml"),
            "papers"
        );
        assert_eq!(super::set_name("http://h/caps/x.xml"), "x.xml");
    }
}
