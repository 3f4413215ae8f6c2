//! List documents of a source: fetched to a temporary file and read entry by entry, an
//! index's parts one at a time (one level of index only), and their entries as changes.

use std::collections::HashSet;

use super::state::{Change, ChangeType};
use super::{fetch, max_token, scope::short, Followed, Harvester};
use crate::model::Timestamp;
use crate::sitemap::{self, EntryReader, ParsedEntry};

/// A document fetched to a temporary file, read entry by entry (the file lives as long as this).
pub(super) struct OnDisk {
    pub(super) reader: EntryReader<std::io::BufReader<sitemap::Bounded<std::fs::File>>>,
    pub(super) _file: tempfile::NamedTempFile,
}

/// One document of a list: the list itself (already open), or an entry of its index.
pub(super) enum Part {
    Here(Box<OnDisk>),
    There(ParsedEntry),
}

impl Harvester {
    pub(super) async fn open_doc(
        &self,
        url: &str,
        what: &str,
    ) -> Result<OnDisk, fetch::FetchError> {
        let file = self
            .fetcher()
            .document_to_file(url, self.output().temp_dir())
            .await
            .map_err(|e| fetch::FetchError {
                message: format!("{what} {e}"),
                ..e
            })?;
        let bad = |e: String| fetch::FetchError::fail(format!("{what} {}: {e}", short(url)));
        let f = std::fs::File::open(file.path())
            .map_err(|e| bad("cannot open its downloaded copy".into()).caused_by(e))?;
        // The reader's error says what is wrong with the document in words; cut to a line.
        let reader = EntryReader::new(std::io::BufReader::new(sitemap::Bounded::new(
            f,
            max_token(&self.cfg),
        )))
        .map_err(|e| bad(short(&e.to_string()).into_owned()))?;
        Ok(OnDisk {
            reader,
            _file: file,
        })
    }

    /// A list's header and its documents: itself when it is not an index, else the entries
    /// of its index (each opened with [`Harvester::open_part`] when its turn comes, so only
    /// one part is on disk at a time); and the URLs of the documents read so far (never
    /// resources).
    pub(super) async fn list_parts(
        &self,
        set: &Followed,
        url: &str,
        what: &str,
    ) -> anyhow::Result<(sitemap::Document, Vec<Part>, HashSet<String>)> {
        let mut d = self.open_doc(url, what).await?;
        let header = d.reader.header().clone();
        let mut docs = HashSet::from([url.to_string()]);
        if !header.is_index {
            return Ok((header, vec![Part::Here(Box::new(d))], docs));
        }
        let mut parts = Vec::new();
        while let Some(e) = d.reader.next_entry()? {
            if !self.admit(set, &e.loc, &HashSet::new()).await? {
                continue;
            }
            if !docs.insert(e.loc.clone()) {
                let why = "a list document listed again in its own index";
                self.refuse(&set.info.name, set.row.id, &e.loc, why).await?;
                continue;
            }
            parts.push(Part::There(e));
        }
        Ok((header, parts, docs))
    }

    /// Opens a part of a list; `None` when it is refused (recorded): outside the scope, or an
    /// index itself (the spec allows one level of index).
    pub(super) async fn open_part(
        &self,
        set: &Followed,
        part: Part,
        what: &str,
        docs: &mut HashSet<String>,
    ) -> anyhow::Result<Option<OnDisk>> {
        let e = match part {
            Part::Here(d) => return Ok(Some(*d)),
            Part::There(e) => e,
        };
        docs.insert(e.loc.clone());
        let why = match self.open_doc(&e.loc, what).await {
            Ok(d) if !d.reader.header().is_index => return Ok(Some(d)),
            Ok(_) => "a sitemap index inside an index (one level is allowed)".to_string(),
            Err(err) => match err.refused {
                Some(r) => r.to_string(),
                None => return Err(err.into()),
            },
        };
        self.refuse(&set.info.name, set.row.id, &e.loc, &why)
            .await?;
        Ok(None)
    }
}

/// A Resource List entry as a change of kind `kind` at `datetime`.
pub(super) fn entry_change(e: &ParsedEntry, kind: ChangeType, datetime: Timestamp) -> Change {
    Change {
        uri: e.loc.clone(),
        change: kind,
        datetime,
        md5: md5_of(e),
        length: e.md.get("length").and_then(|l| l.parse().ok()),
        lastmod: e.lastmod.as_deref().and_then(|l| Timestamp::parse(l).ok()),
    }
}

/// A Change List / notification entry as a change (its `datetime`, or its `lastmod` for
/// ResourceSync 1.0 lists without one); `None` for an entry without a change or a date.
pub(super) fn change_of(e: &ParsedEntry) -> Option<Change> {
    let kind = ChangeType::parse(e.md.get("change")?)?;
    let dt =
        e.md.get("datetime")
            .or(e.lastmod.as_ref())
            .and_then(|d| Timestamp::parse(d).ok())?;
    Some(entry_change(e, kind, dt))
}

/// The md5 of an entry's `hash` (`md5:<hex> sha-256:<hex>`).
pub(super) fn md5_of(e: &ParsedEntry) -> Option<String> {
    e.md.get("hash")?
        .split_whitespace()
        .find_map(|h| h.strip_prefix("md5:"))
        .filter(|h| h.len() == 32)
        .map(|h| h.to_ascii_lowercase())
}
