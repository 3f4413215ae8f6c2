//! Where a ResourceSync, activity stream or sitemap source's resources go: the collector's
//! set, as changes recorded through ingest (so notifications, Change Lists and dumps follow).
//! It is the harvest engine's [`Output`] for the server's collectors, and what the listing
//! collectors ([`super::listing`]) hand each fetched resource to.
//!
//! - `bytes = "mirror"`: the file lies under the set's folder at the path the harvester's
//!   mirror gives a URI (`<host>[_<port>]/<path>`), served by this server at the set's URL
//!   prefix; the entry carries the original's md5, length and `lastmod`, and a `via` link to
//!   the original (ResourceSync 1.1 §12.4, republishing).
//! - `bytes = "link"`: the entry's location is the original's URL (its bytes were fetched
//!   once, to check and measure them, and are not kept).
//!
//! Recording is idempotent: a resource the set holds with the same md5 (and location)
//! records nothing, so a restart, a takeover by another process or a second reading of a
//! list records no change twice.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;

use crate::config::CollectBytes;
use crate::context::Context;
use crate::destination::output::{Auditor, Holding, Item, Mirror, Output};
use crate::ingest::{self, IngestError};
use crate::model::{ChangeEvent, ChangeType, Link, Location, SetName};

/// Called with the number of changes just committed (the notifier's poke).
pub type Poke = Arc<dyn Fn(usize) + Send + Sync>;

/// Until when this process is known to hold its collector: its lease renewed within the
/// lease's time (less a margin), by the monotonic clock. Changes are recorded only while it
/// holds, as delivery's lanes send only while their grant holds: a process that lost the
/// collector (paused, cut off from the store) records nothing beside its successor.
#[derive(Debug, Default)]
pub struct Fence {
    until: std::sync::Mutex<Option<std::time::Instant>>,
    /// On a store no other process shares, it always holds.
    shared: bool,
}

impl Fence {
    pub fn new(shared: bool) -> Fence {
        Fence {
            until: Default::default(),
            shared,
        }
    }

    /// The lease of `lease` was taken or renewed just now.
    pub fn renewed(&self, lease: std::time::Duration) {
        let margin = (lease / 10).max(std::time::Duration::from_millis(500));
        *self.until.lock().expect("not poisoned") =
            Some(std::time::Instant::now() + lease.saturating_sub(margin));
    }

    /// The lease was given up or not renewed.
    pub fn lost(&self) {
        *self.until.lock().expect("not poisoned") = None;
    }

    pub fn holds(&self) -> bool {
        !self.shared
            || self
                .until
                .lock()
                .expect("not poisoned")
                .is_some_and(|u| std::time::Instant::now() < u)
    }
}

/// A change not recorded: this process no longer holds the collector.
#[derive(Debug, thiserror::Error)]
#[error("this process no longer holds the collector: nothing recorded")]
pub struct NotHeld;

/// A collector's set as an output.
#[derive(Clone)]
pub struct IntoSet {
    ctx: Arc<Context>,
    set: SetName,
    root: PathBuf,
    mirror: Mirror,
    bytes: CollectBytes,
    poke: Poke,
    rt: tokio::runtime::Handle,
    fence: Arc<Fence>,
}

/// What a listing collector knows of a resource beside its bytes.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub mime: Option<String>,
    pub lastmod: Option<crate::model::Timestamp>,
}

impl IntoSet {
    /// The output into `set`'s folder (made when missing). Call from within the runtime.
    pub fn new(
        ctx: Arc<Context>,
        set: SetName,
        bytes: CollectBytes,
        poke: Poke,
        fence: Arc<Fence>,
    ) -> anyhow::Result<IntoSet> {
        let root = ctx
            .set_config(&set)
            .resource_root_dir
            .ok_or_else(|| anyhow::anyhow!("the collected set {set} has no folder"))?;
        let mut section = crate::destination::config::HarvestConfig::defaults().output;
        section.dir = root.clone();
        section.map = Vec::new();
        section.keep_deleted = false;
        Ok(IntoSet {
            mirror: Mirror::new(&section)?,
            root,
            ctx,
            set,
            bytes,
            poke,
            rt: tokio::runtime::Handle::current(),
            fence,
        })
    }

    /// Where the set keeps `uri`: its path under the set's folder, or its URL.
    pub fn location(&self, uri: &str) -> anyhow::Result<Location> {
        Ok(match self.bytes {
            CollectBytes::Link => Location::url(uri),
            CollectBytes::Mirror => {
                let path = self.mirror.locate(uri)?;
                let rel = path
                    .strip_prefix(&self.root)
                    .context("a mirrored path lies outside the set's folder")?;
                let rel: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                Location::rel_path(rel.join("/"))
            }
        })
    }

    fn key(&self, location: &Location) -> anyhow::Result<crate::model::ResourceKey> {
        location
            .key(&self.ctx.set_config(&self.set))
            .map_err(anyhow::Error::msg)
    }

    /// The resource the set holds at `location`, if any.
    async fn held_at(&self, location: &Location) -> anyhow::Result<Option<crate::model::Resource>> {
        Ok(self
            .ctx
            .store()
            .resource(&self.set, &self.key(location)?)
            .await?)
    }

    /// The resources the set holds for `uris`, in one store call, in order: each `None` where
    /// it holds none, or why `uri` cannot be one of its resources.
    pub async fn held_many(
        &self,
        uris: &[String],
    ) -> Result<Vec<Result<Option<crate::model::Resource>, String>>, crate::store::StoreError> {
        let keys: Vec<Result<crate::model::ResourceKey, String>> = uris
            .iter()
            .map(|u| {
                self.location(u)
                    .and_then(|l| self.key(&l))
                    .map_err(|e| format!("{e:#}"))
            })
            .collect();
        let asked: Vec<crate::model::ResourceKey> = keys
            .iter()
            .filter_map(|k| k.as_ref().ok().cloned())
            .collect();
        let mut found = self
            .ctx
            .store()
            .resources_by_key(&self.set, &asked)
            .await?
            .into_iter();
        Ok(keys
            .into_iter()
            .map(|k| k.map(|_| found.next().flatten()))
            .collect())
    }

    /// Records `uri`'s verified bytes at `file` (moved into place or removed): a change when
    /// the set did not hold these bytes there. Whether a change was recorded.
    pub async fn put_async(
        &self,
        uri: &str,
        md5: &str,
        length: u64,
        facts: Facts,
        file: &Path,
    ) -> anyhow::Result<bool> {
        let location = self.location(uri)?;
        self.put_at(uri, location, md5, length, facts, file).await
    }

    /// [`IntoSet::put_async`] at `location`, `uri`'s place in the set.
    async fn put_at(
        &self,
        uri: &str,
        location: Location,
        md5: &str,
        length: u64,
        facts: Facts,
        file: &Path,
    ) -> anyhow::Result<bool> {
        if !self.fence.holds() {
            let _ = std::fs::remove_file(file);
            return Err(NotHeld.into());
        }
        let held = self.held_at(&location).await?;
        if held
            .as_ref()
            .is_some_and(|h| h.meta.md5.as_deref() == Some(md5) && h.location == location)
        {
            let _ = std::fs::remove_file(file);
            return Ok(false);
        }
        match self.bytes {
            CollectBytes::Mirror => {
                let (m, f) = (self.mirror.clone(), file.to_path_buf());
                let (set, uri, md5) = (self.set.to_string(), uri.to_string(), md5.to_string());
                let (mime, lastmod) = (facts.mime.clone(), facts.lastmod);
                tokio::task::spawn_blocking(move || {
                    let item = Item {
                        set: &set,
                        uri: &uri,
                        md5: &md5,
                        length,
                        mime: mime.as_deref(),
                        lastmod,
                    };
                    m.put(&item, &f)
                })
                .await??;
            }
            CollectBytes::Link => {
                let _ = std::fs::remove_file(file);
            }
        }
        let ln = match self.bytes {
            CollectBytes::Mirror => vec![Link {
                rel: "via".into(),
                href: Location::url(uri),
                mime: facts.mime.clone(),
            }],
            CollectBytes::Link => Vec::new(),
        };
        let event = ChangeEvent {
            change: if held.is_some() {
                ChangeType::Updated
            } else {
                ChangeType::Created
            },
            location,
            length: Some(length),
            md5: Some(md5.to_string()),
            mime: facts.mime,
            lastmod: facts.lastmod,
            ln,
            datetime: None,
            resource_set: None,
            timestamp: None,
        };
        self.record(event).await
    }

    /// Records `uri` deleted when the set holds it, and removes its file. Whether a change
    /// was recorded.
    pub async fn delete_async(&self, uri: &str) -> anyhow::Result<bool> {
        let location = self.location(uri)?;
        if self.held_at(&location).await?.is_none() {
            return Ok(false);
        }
        let ln = match self.bytes {
            CollectBytes::Mirror => vec![Link {
                rel: "via".into(),
                href: Location::url(uri),
                mime: None,
            }],
            CollectBytes::Link => Vec::new(),
        };
        let event = ChangeEvent {
            change: ChangeType::Deleted,
            location,
            length: None,
            md5: None,
            mime: None,
            lastmod: None,
            ln,
            datetime: None,
            resource_set: None,
            timestamp: None,
        };
        let recorded = self.record(event).await?;
        if self.bytes == CollectBytes::Mirror {
            let (m, set, uri) = (self.mirror.clone(), self.set.to_string(), uri.to_string());
            tokio::task::spawn_blocking(move || m.delete(&set, &uri)).await??;
        }
        Ok(recorded)
    }

    /// Records one change through ingest; the store's refusal is the error, in words.
    async fn record(&self, event: ChangeEvent) -> anyhow::Result<bool> {
        if !self.fence.holds() {
            return Err(NotHeld.into());
        }
        match ingest::ingest(&self.ctx, &self.set, vec![(1, event)]).await {
            Ok(r) => {
                (self.poke)(r.applied);
                Ok(r.applied > 0)
            }
            Err(IngestError::Invalid(errors)) => Err(anyhow::anyhow!(
                "the set cannot hold it: {}",
                errors
                    .iter()
                    .map(|e| e.reason.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
            Err(IngestError::Empty) => Ok(false),
            Err(IngestError::Store(e)) => Err(e.into()),
        }
    }
}

impl Output for IntoSet {
    fn put(&self, item: &Item, file: &Path) -> anyhow::Result<String> {
        let facts = Facts {
            mime: item.mime.map(str::to_string),
            lastmod: item.lastmod,
        };
        let location = self.location(item.uri)?;
        let at = location.value.clone();
        self.rt
            .block_on(self.put_at(item.uri, location, item.md5, item.length, facts, file))?;
        Ok(at)
    }

    fn delete(&self, _set: &str, uri: &str) -> anyhow::Result<()> {
        self.rt.block_on(self.delete_async(uri)).map(|_| ())
    }

    fn temp_dir(&self) -> &Path {
        self.mirror.temp_dir()
    }

    fn download_path(&self, uri: &str) -> anyhow::Result<PathBuf> {
        match self.bytes {
            CollectBytes::Mirror => self.mirror.download_path(uri),
            CollectBytes::Link => {
                use sha2::Digest;
                let h = crate::digest::hex_digest(sha2::Sha256::digest(uri.as_bytes()));
                Ok(self.mirror.temp_dir().join(format!("link-{}", &h[..24])))
            }
        }
    }

    fn target(&self, uri: &str) -> anyhow::Result<Option<(PathBuf, PathBuf)>> {
        match self.bytes {
            CollectBytes::Mirror => self.mirror.target(uri),
            CollectBytes::Link => Ok(None),
        }
    }

    fn auditor(&self) -> anyhow::Result<Box<dyn Auditor + Send>> {
        Ok(Box::new(self.clone()))
    }
}

impl Auditor for IntoSet {
    /// What the set holds for `uri` (called on the runtime's threads: the store's answer is
    /// waited for in place).
    fn holding(&mut self, uri: &str) -> anyhow::Result<Holding> {
        let location = self.location(uri)?;
        let held = tokio::task::block_in_place(|| self.rt.block_on(self.held_at(&location)))?;
        Ok(match held {
            Some(r) => Holding::Held {
                length: r.meta.length.unwrap_or(0),
                md5: r.meta.md5.unwrap_or_default(),
            },
            None => Holding::Missing,
        })
    }

    fn unlisted(&mut self) -> anyhow::Result<Option<Vec<String>>> {
        Ok(None)
    }
}
