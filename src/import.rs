//! `resourcesync-hub import DIR --set NAME`: scan a folder as the DIT does (md5, length, media
//! type, mtime), compare with the store, and record what was created, updated or deleted.
//!
//! Every file becomes a `rel_path` location relative to DIR. DIR is taken as the whole truth for
//! the set's file resources: a stored `path:` resource with no file is recorded as deleted;
//! `url` resources are left alone.

use anyhow::Context as _;
use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use md5::{Digest, Md5};
use serde::Serialize;

use crate::model::SetConfig;
use crate::model::{
    ChangeType, Location, NewChange, ResourceKey, ResourceMeta, SetName, Timestamp,
};
use crate::store::{ListPolicy, Store};

#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct ImportReport {
    pub scanned: u64,
    pub created: u64,
    pub updated: u64,
    pub deleted: u64,
    pub unchanged: u64,
}

const BATCH: usize = 1000;

pub async fn import_dir(
    store: &Store,
    sc: &SetConfig,
    policy: ListPolicy,
    dir: &Path,
    progress: bool,
) -> anyhow::Result<ImportReport> {
    let set = SetName::parse(&sc.name).map_err(anyhow::Error::msg)?;
    if !dir.is_dir() {
        anyhow::bail!("{} is not a directory", dir.display());
    }
    let files: Vec<PathBuf> = walkdir::WalkDir::new(dir)
        .sort_by_file_name()
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|e| e.file_type().is_file())
        .map(|e| e.into_path())
        .collect();
    let bar = if progress {
        ProgressBar::new(files.len() as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} files  {msg}").expect("template"),
    );

    let mut report = ImportReport::default();
    let mut seen: HashSet<ResourceKey> = HashSet::with_capacity(files.len());
    let mut batch = Vec::with_capacity(BATCH);
    for path in &files {
        let rel = path
            .strip_prefix(dir)?
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        let location = Location::rel_path(rel);
        let key = location.key(sc).map_err(anyhow::Error::msg)?;
        let meta = describe(path)?;
        report.scanned += 1;
        let change = match store.resource(&set, &key).await? {
            None => Some(ChangeType::Created),
            Some(r) if changed(&r.meta, &meta) => Some(ChangeType::Updated),
            Some(_) => None,
        };
        seen.insert(key.clone());
        match change {
            Some(ChangeType::Created) => report.created += 1,
            Some(_) => report.updated += 1,
            None => report.unchanged += 1,
        }
        if let Some(change) = change {
            batch.push(NewChange {
                key,
                location,
                change,
                datetime: None,
                meta,
            });
        }
        if batch.len() >= BATCH {
            store
                .apply(&set, std::mem::take(&mut batch), policy, Timestamp::now())
                .await?;
        }
        bar.inc(1);
    }
    // Stored file resources that are gone from the folder.
    let mut cursor = None;
    loop {
        let page = store.resources(&set, None, cursor, 5000).await?;
        for r in page.items {
            if r.key.0.starts_with("path:") && !seen.contains(&r.key) {
                report.deleted += 1;
                batch.push(NewChange {
                    key: r.key,
                    location: r.location,
                    change: ChangeType::Deleted,
                    datetime: None,
                    meta: ResourceMeta::default(),
                });
            }
        }
        match page.next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    for chunk in batch.chunks(BATCH) {
        store
            .apply(&set, chunk.to_vec(), policy, Timestamp::now())
            .await?;
    }
    bar.finish_with_message(format!(
        "{} created, {} updated, {} deleted, {} unchanged",
        report.created, report.updated, report.deleted, report.unchanged
    ));
    Ok(report)
}

/// Whether a file differs from what the store holds for it: its content (md5, length) or media
/// type differ, or it was modified more than a second after the stored lastmod. A lastmod
/// that differs only by the file system's precision, or lies after the file's time (a change
/// ingested through the API for the same content), is not a change: re-importing an
/// unchanged folder records nothing, and no lastmod ever moves backwards.
fn changed(stored: &ResourceMeta, file: &ResourceMeta) -> bool {
    let newer = match (stored.lastmod, file.lastmod) {
        (Some(s), Some(f)) => f.0 > s.0 + 1_000_000,
        (None, Some(_)) => true,
        _ => false,
    };
    stored.md5 != file.md5 || stored.length != file.length || stored.mime != file.mime || newer
}

/// md5, length, media type (by extension) and mtime (to the microsecond) of one file.
pub fn describe(path: &Path) -> anyhow::Result<ResourceMeta> {
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let md = f.metadata()?;
    let mut h = Md5::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let mtime = Timestamp::from_system_time(md.modified()?).map_or(0, Timestamp::micros);
    Ok(ResourceMeta {
        length: Some(md.len()),
        md5: Some(crate::digest::hex_digest(h.finalize())),
        mime: Some(
            mime_guess::from_path(path)
                .first_or_octet_stream()
                .essence_str()
                .to_string(),
        ),
        lastmod: Some(Timestamp(mtime)),
        ln: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(md5: &str, lastmod: i64) -> ResourceMeta {
        ResourceMeta {
            md5: Some(md5.into()),
            length: Some(1),
            mime: Some("text/plain".into()),
            lastmod: Some(Timestamp(lastmod)),
            ln: vec![],
        }
    }

    #[test]
    fn only_content_or_a_later_modification_is_a_change() {
        let t = 1_700_000_000_123_456;
        assert!(!changed(&meta("a", t), &meta("a", t)));
        assert!(
            !changed(&meta("a", t), &meta("a", t - 123_456)),
            "whole-second file time vs microseconds"
        );
        assert!(
            !changed(&meta("a", t), &meta("a", t - 50_000_000)),
            "never moves lastmod backwards"
        );
        assert!(
            changed(&meta("a", t), &meta("a", t + 5_000_000)),
            "touched later"
        );
        assert!(changed(&meta("a", t), &meta("b", t)), "new content");
    }
}
