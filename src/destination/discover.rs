//! Discovery: from the configured URL (a Source Description, a Capability List, or a base URL
//! whose `/.well-known/resourcesync` is the Source Description) to each followed set's
//! documents and its change-notification topic and hub.

use super::fetch::Fetcher;
use super::scope::short;
use crate::sitemap;
use anyhow::Context as _;

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
    /// Documents (and the hub) its Capability List names outside the source's scope, with
    /// why: left out above.
    pub refused: Vec<(String, String)>,
}

/// Capability Lists followed at most (a Source Description listing more is cut there).
const MAX_SETS: usize = 1000;

/// The configuration asks for what the source does not have (a set it does not offer):
/// trying again will not help, so the harvester stops and says so.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigMismatch(pub String);

/// Parses a small document through the bounded reader.
pub fn parse(body: &[u8], max_token: usize) -> Result<sitemap::Document, sitemap::ReadError> {
    let mut r = sitemap::EntryReader::new(std::io::BufReader::new(sitemap::Bounded::new(
        body, max_token,
    )))?;
    let mut doc = r.header().clone();
    while let Some(e) = r.next_entry()? {
        doc.entries.push(e);
    }
    Ok(doc)
}

/// The sets at `url`, restricted to `wanted` (Capability List URLs or set names) when given,
/// and the Capability Lists the Source Description names outside the source's scope.
pub async fn discover(
    f: &Fetcher,
    url: &str,
    wanted: &[String],
    max_token: usize,
) -> anyhow::Result<(Vec<SetInfo>, Vec<(String, String)>)> {
    // The URL as given; when it answers with an HTTP error or is not a sitemap, the Source
    // Description under it (a base URL). A source that cannot be reached at all is said so.
    let first = match f.document(url).await {
        Ok(b) => parse(&b, max_token).map_err(|e| e.to_string()),
        Err(e) if e.status.is_some() || e.refused.is_some() => Err(e.message),
        Err(e) => return Err(anyhow::Error::new(e).context("cannot read the source")),
    };
    let doc = match first {
        Ok(d) => d,
        Err(why)
            if url
                .trim_end_matches('/')
                .ends_with("/.well-known/resourcesync") =>
        {
            anyhow::bail!("cannot read the Source Description {}: {why}", short(url))
        }
        Err(why) => {
            let sd = format!("{}/.well-known/resourcesync", url.trim_end_matches('/'));
            let body = f.document(&sd).await.with_context(|| {
                format!(
                    "{} is neither a Source Description nor a Capability List ({why}), and {} cannot be read",
                    short(url),
                    short(&sd),
                )
            })?;
            parse(&body, max_token).with_context(|| format!("{}", short(&sd)))?
        }
    };
    let mut refused = Vec::new();
    let admit = |loc: &str, refused: &mut Vec<(String, String)>| match f.scope().check(loc) {
        Ok(_) => true,
        Err(r) => {
            refused.push((loc.to_string(), r.to_string()));
            false
        }
    };
    let capability_lists: Vec<String> = match doc.md.get("capability").map(String::as_str) {
        Some("description") => doc
            .entries
            .iter()
            .filter(|e| e.md.get("capability").map(String::as_str) == Some("capabilitylist"))
            .filter(|e| admit(&e.loc, &mut refused))
            .map(|e| e.loc.clone())
            .take(MAX_SETS)
            .collect(),
        Some("capabilitylist") => vec![url.to_string()],
        other => anyhow::bail!(
            "{} is a {} document, not a Source Description or Capability List",
            short(url),
            other.map_or("ResourceSync".into(), |o| format!("{:?}", short(o)))
        ),
    };
    if let Some(w) = wanted.iter().find(|w| {
        !capability_lists
            .iter()
            .any(|c| *w == c || **w == set_name(c))
    }) {
        let names: Vec<String> = capability_lists.iter().map(|c| set_name(c)).collect();
        return Err(ConfigMismatch(format!(
            "source.sets names {w:?}, which the source does not offer; it offers: {}",
            names.join(", ")
        ))
        .into());
    }
    let mut out = Vec::new();
    for cap in capability_lists {
        let name = set_name(&cap);
        if !wanted.is_empty() && !wanted.iter().any(|w| *w == cap || *w == name) {
            continue;
        }
        let body = f
            .document(&cap)
            .await
            .with_context(|| format!("Capability List {}", short(&cap)))?;
        let d =
            parse(&body, max_token).with_context(|| format!("Capability List {}", short(&cap)))?;
        let mut set_refused = Vec::new();
        let mut find = |c: &str| {
            d.entries
                .iter()
                .find(|e| e.md.get("capability").map(String::as_str) == Some(c))
                .filter(|e| admit(&e.loc, &mut set_refused))
                .map(|e| e.loc.clone())
        };
        let (resourcelist, resourcedump, changelist) = (
            find("resourcelist"),
            find("resourcedump"),
            find("changelist"),
        );
        let notification = d
            .entries
            .iter()
            .find(|e| e.md.get("capability").map(String::as_str) == Some("change-notification"));
        let hub = notification
            .and_then(|e| {
                e.links
                    .iter()
                    .find(|l| l.get("rel").map(String::as_str) == Some("hub"))
                    .and_then(|l| l.get("href").cloned())
            })
            .filter(|h| admit(h, &mut set_refused));
        out.push(SetInfo {
            capability: cap.clone(),
            name,
            resourcelist,
            resourcedump,
            changelist,
            topic: notification
                .map(|e| e.loc.clone())
                .filter(|t| t.len() <= f.scope().max_url_length()),
            hub,
            refused: set_refused,
        });
    }
    if out.is_empty() {
        anyhow::bail!(
            "no Capability List at {} matches source.sets = {wanted:?}",
            short(url)
        );
    }
    Ok((out, refused))
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
