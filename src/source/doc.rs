//! What the source serves: a document's kind, a built page, an opened one, and why one could
//! not be served.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::{activity, MemPage, PageMeta};
use crate::model::{SetName, Timestamp};
use crate::store::StoreError;

/// A document the source serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DocKind {
    SourceDescription,
    CapabilityList(SetName),
    /// The Resource List, or its index when the set spans more than one part.
    ResourceList(SetName),
    ResourceListPart(SetName, u32),
    /// The only Change List, or the Change List Index once a list has been closed.
    ChangeList(SetName),
    ChangeListNo(SetName, u32),
    /// The IIIF Change Discovery collection of a set's changes.
    Activity(SetName),
    /// One of its pages: the activities of Change List `no`.
    ActivityPage(SetName, u32),
}

impl DocKind {
    /// The label of `rshub_pages_built_total{kind}`.
    pub fn label(&self) -> &'static str {
        match self {
            DocKind::SourceDescription => "source_description",
            DocKind::CapabilityList(_) => "capability_list",
            DocKind::ResourceList(_) => "resource_list",
            DocKind::ResourceListPart(..) => "resource_list_part",
            DocKind::ChangeList(_) => "change_list",
            DocKind::ChangeListNo(..) => "change_list_no",
            DocKind::Activity(_) => "activity",
            DocKind::ActivityPage(..) => "activity_page",
        }
    }

    /// The media type the document is served as.
    pub fn media_type(&self) -> &'static str {
        match self {
            DocKind::Activity(_) | DocKind::ActivityPage(..) => activity::MEDIA_TYPE,
            _ => "application/xml",
        }
    }
}

/// A document ready to serve: its validators, and where its bytes are (memory for small hot
/// pages, else the disk cache's files).
#[derive(Debug, Clone)]
pub struct Doc {
    pub meta: Arc<PageMeta>,
    pub(super) mem: Option<Arc<MemPage>>,
}

impl Doc {
    /// Number of `<url>`/`<sitemap>` entries.
    pub fn entries(&self) -> usize {
        self.meta.entries
    }

    pub fn last_modified(&self) -> Timestamp {
        Timestamp(self.meta.last_modified)
    }

    /// The strong ETag of one form (the gzip form has its own).
    pub fn etag(&self, gzip: bool) -> &str {
        if gzip {
            &self.meta.gzip_etag
        } else {
            &self.meta.etag
        }
    }

    /// Length of one form in bytes.
    pub fn len(&self, gzip: bool) -> u64 {
        if gzip {
            self.meta.gzip_len
        } else {
            self.meta.len
        }
    }

    pub fn is_empty(&self) -> bool {
        self.meta.len == 0
    }

    /// One form's bytes when the page is held in memory.
    pub fn in_memory(&self, gzip: bool) -> Option<Bytes> {
        self.mem.as_ref().map(|m| {
            if gzip {
                m.gzip.clone()
            } else {
                m.identity.clone()
            }
        })
    }

    /// The file holding one form. It may be replaced by a newer version at any moment: open
    /// it and read from the open file ([`Source::open_document`] retries when it is already gone).
    pub fn path(&self, gzip: bool) -> &Path {
        self.meta.path(gzip)
    }

    /// One form, whole (for tools and benchmarks; the server streams from the file).
    pub fn read(&self, gzip: bool) -> std::io::Result<Bytes> {
        match self.in_memory(gzip) {
            Some(b) => Ok(b),
            None => std::fs::read(self.path(gzip)).map(Bytes::from),
        }
    }
}

/// A document opened for one response: its bytes in memory, or its file opened.
pub enum Opened {
    Memory(Doc, Bytes),
    File(Doc, std::fs::File),
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{0}")]
    NotFound(String),
    /// Every build slot is taken and the queue is full: try again shortly.
    #[error(transparent)]
    Busy(#[from] crate::context::Busy),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The page cache's files could not be written or read (disk full, permissions).
    #[error("page cache: {0}")]
    Cache(String),
}

impl From<std::io::Error> for SourceError {
    fn from(e: std::io::Error) -> Self {
        SourceError::Cache(e.to_string())
    }
}

/// Runs blocking file and formatting work on tokio's blocking pool, off the async threads
/// that ingest, the notifier and the hub run on.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SourceError> + Send + 'static,
) -> Result<T, SourceError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SourceError::Cache(format!("a page task failed: {e}")))?
}
