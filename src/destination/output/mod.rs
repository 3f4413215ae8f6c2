//! Where harvested resources go: one small trait, one file per output. The mirror folder is
//! the default; the Ingestion 3 archive plugs in beside it.

pub mod ingestion3;
mod mirror;

use anyhow::Context as _;
use std::path::Path;

pub use mirror::Mirror;

/// What an output is told about a resource it receives.
#[derive(Debug, Clone)]
pub struct Item<'a> {
    pub set: &'a str,
    pub uri: &'a str,
    pub md5: &'a str,
    pub length: u64,
    /// The resource's media type (the `Content-Type` it was served with).
    pub mime: Option<&'a str>,
    /// When the source says the resource last changed (its `lastmod`, else the change's time).
    pub lastmod: Option<crate::model::Timestamp>,
}

/// An output. Calls are blocking (file or object I/O) and made off the async threads; each
/// must be atomic: after a crash the resource is either written whole or not at all.
pub trait Output: Send + Sync {
    /// Takes the verified file at `file` (the output may move it) for `item`; returns where
    /// it now lives (for the record and the `exec` hook).
    fn put(&self, item: &Item, file: &Path) -> anyhow::Result<String>;
    /// `put` is one quick filesystem call (a rename within a folder), done where the
    /// download was written, without a trip to the blocking pool; otherwise it runs there.
    fn put_is_quick(&self) -> bool {
        false
    }
    /// The resource was deleted at the source.
    fn delete(&self, set: &str, uri: &str) -> anyhow::Result<()>;
    /// Where documents being read (Resource List parts, Change Lists) are kept meanwhile.
    fn temp_dir(&self) -> &Path;
    /// Where a resource is downloaded before `put`: beside its final place, so that `put` is
    /// a rename within one folder, under a name no resource can have. One per resource (a
    /// resource is never fetched twice at once), so a leftover of a killed run is simply
    /// overwritten by the next try. Its folder may not exist yet: [`create_download`] makes
    /// it when needed.
    fn download_path(&self, uri: &str) -> anyhow::Result<std::path::PathBuf>;
    /// The file a resource gets and the output folder it lies in, for outputs that name files
    /// after URIs (the mirror): the harvester claims it before writing, so two URIs never
    /// share one. `None`: records are keyed by URI, nothing can collide.
    fn target(
        &self,
        uri: &str,
    ) -> anyhow::Result<Option<(std::path::PathBuf, std::path::PathBuf)>> {
        let _ = uri;
        Ok(None)
    }
    /// What the output holds, for `harvest audit` (called off the async threads; the
    /// auditor's own calls are quick).
    fn auditor(&self) -> anyhow::Result<Box<dyn Auditor + Send>>;
    /// Shutdown: long work in `housekeeping` stops soon, to be finished at the next start.
    fn interrupt(&self) {}
    /// Called at start and at every periodic check (blocking, off the async threads);
    /// `baselined`: every followed set has finished its baseline. The Ingestion 3 archive
    /// writes its snapshots from here.
    fn housekeeping(&self, baselined: bool) -> anyhow::Result<()> {
        let _ = baselined;
        Ok(())
    }
}

/// What an output holds of a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    Missing,
    Held {
        length: u64,
        md5: String,
    },
    /// Deliberately not kept (the Ingestion 3 archive keeps only metadata records).
    NotArchived(String),
}

/// Reads what an output holds, resource by resource, for `harvest audit`.
pub trait Auditor {
    fn holding(&mut self, uri: &str) -> anyhow::Result<Holding>;
    /// What the output holds that no `holding` call asked about (call it after them), or
    /// `None` when the output cannot tell (the harvester's record is used then).
    fn unlisted(&mut self) -> anyhow::Result<Option<Vec<String>>>;
}

/// Length and md5 (hex) of a file, or `None` when it is not there.
pub fn file_facts(path: &Path) -> Option<(u64, String)> {
    use md5::{Digest, Md5};
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut h = Md5::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        len += n as u64;
        h.update(&buf[..n]);
    }
    Some((len, crate::digest::hex_digest(h.finalize())))
}

/// A scratch folder of its own, `<parent>/<pid>-<n>`, locked for as long as it is
/// held: a harvester and a `harvest audit` or `snapshot` beside it never remove each other's
/// files, while folders left by processes that ended (killed, say) are removed at the next
/// open. Removed when dropped.
pub struct Scratch {
    path: std::path::PathBuf,
    _lock: std::fs::File,
}

impl Scratch {
    pub fn open(parent: &Path) -> anyhow::Result<Scratch> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = parent.join(format!("{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let lock = std::fs::File::create(path.join(".lock"))?;
        lock.try_lock()
            .with_context(|| format!("cannot lock the scratch folder {}", path.display()))?;
        for e in std::fs::read_dir(parent)?.flatten() {
            let p = e.path();
            if p == path {
                continue;
            }
            if !p.is_dir() {
                // Leftovers of the layout before per-process folders.
                let _ = std::fs::remove_file(&p);
                continue;
            }
            let free = std::fs::File::open(p.join(".lock")).is_ok_and(|f| f.try_lock().is_ok())
                || !p.join(".lock").exists();
            if free {
                let _ = std::fs::remove_dir_all(&p);
            }
        }
        Ok(Scratch { path, _lock: lock })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Creates (truncates) the file at a [`Output::download_path`], making its folder only when
/// the create says it is missing (the first file of a folder), not looking for every file.
pub fn create_download(path: &Path) -> std::io::Result<std::fs::File> {
    match std::fs::File::create(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::File::create(path)
        }
        r => r,
    }
}
