//! Where harvested resources go: one small trait, one file per output. The mirror folder is
//! the default; the Ingestion 3 archive plugs in beside it.

pub mod ingestion3;
mod mirror;

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
}

/// An output. Calls are blocking (file or object I/O) and made off the async threads; each
/// must be atomic: after a crash the resource is either written whole or not at all.
pub trait Output: Send + Sync {
    /// Takes the verified file at `file` (the output may move it) for `item`; returns where
    /// it now lives (for the record and the `exec` hook).
    fn put(&self, item: &Item, file: &Path) -> anyhow::Result<String>;
    /// The resource was deleted at the source.
    fn delete(&self, set: &str, uri: &str) -> anyhow::Result<()>;
    /// Where documents being read (Resource List parts, Change Lists) are kept meanwhile.
    fn temp_dir(&self) -> &Path;
    /// Where a resource is downloaded before `put`: beside its final place, so that `put` is
    /// a rename within one folder. One per resource (a resource is never fetched twice at
    /// once), so a leftover of a killed run is simply overwritten by the next try.
    fn download_path(&self, uri: &str) -> anyhow::Result<std::path::PathBuf>;
    /// The path a resource has (or would have) in the output, for audits.
    fn locate(&self, uri: &str) -> anyhow::Result<std::path::PathBuf>;
    /// Called at start and at every periodic check (blocking, off the async threads);
    /// `baselined`: every followed set has finished its baseline. The Ingestion 3 archive
    /// writes its snapshots from here.
    fn housekeeping(&self, baselined: bool) -> anyhow::Result<()> {
        let _ = baselined;
        Ok(())
    }
}
