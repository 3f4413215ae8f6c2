//! The mirror folder: each resource a file at a path derived from its URI, as `resync-sync
//! URI=DIR` does (a configured prefix maps to a folder; otherwise `<dir>/<host>[_<port>]/<path>`),
//! written atomically (a temporary file in the same folder tree, then a rename).

use anyhow::Context as _;
use std::path::{Component, Path, PathBuf};

use percent_encoding::percent_decode_str;

use super::{file_facts, Auditor, Holding, Item, Output};
use crate::destination::config::{MapEntry, OutputSection};

#[derive(Clone)]
pub struct Mirror {
    dir: PathBuf,
    map: Vec<MapEntry>,
    keep_deleted: bool,
    tmp: std::sync::Arc<super::Scratch>,
    /// The folder name of each URI authority seen (`host[_port]`), so that a URI is not
    /// parsed for every file: a source's resources share a few authorities.
    hosts: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>,
}

impl Mirror {
    pub fn new(cfg: &OutputSection) -> anyhow::Result<Mirror> {
        let parent = cfg.dir.join(".rshub-tmp");
        std::fs::create_dir_all(&parent)
            .with_context(|| format!("cannot create the mirror folder {}", parent.display()))?;
        // Leftovers of a run killed mid-read are removed; a running one's are kept.
        let tmp = std::sync::Arc::new(super::Scratch::open(&parent)?);
        let mut map = cfg.map.clone();
        map.sort_by_key(|m| std::cmp::Reverse(m.uri.len()));
        Ok(Mirror {
            dir: cfg.dir.clone(),
            map,
            keep_deleted: cfg.keep_deleted,
            tmp,
            hosts: Default::default(),
        })
    }
}

/// Names beginning with this are the harvester's own (download files, the scratch folder):
/// no resource can have one.
const RESERVED: &str = ".rshub-";

/// A URI path as folder components: percent-decoded segments, none of them empty, `.`, `..`
/// or holding a separator or NUL; a query is kept as part of the last name.
fn relative_path(rest: &str) -> anyhow::Result<PathBuf> {
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let path = path.split('#').next().unwrap_or("");
    let mut out = PathBuf::new();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    for (i, seg) in segments.iter().enumerate() {
        let mut name = percent_decode_str(seg).decode_utf8_lossy().into_owned();
        if i + 1 == segments.len() {
            if let Some(q) = query {
                name = format!("{name}?{q}");
            }
        }
        if name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
            anyhow::bail!(
                "the URI path segment {:?} cannot be a file name",
                crate::destination::scope::short(seg)
            );
        }
        if name.starts_with(RESERVED) {
            anyhow::bail!(
                "the URI path segment {:?} begins with {RESERVED}, kept for the harvester's own files",
                crate::destination::scope::short(seg)
            );
        }
        out.push(name);
    }
    if path.ends_with('/') || out.as_os_str().is_empty() {
        out.push("index");
    }
    debug_assert!(out.components().all(|c| matches!(c, Component::Normal(_))));
    Ok(out)
}

impl Output for Mirror {
    fn put(&self, item: &Item, file: &Path) -> anyhow::Result<String> {
        let target = self.locate(item.uri)?;
        // One rename within the folder the download lies in (made by `download_path`); the
        // folder is made again only when it has gone meanwhile.
        let mut r = std::fs::rename(file, &target);
        if r.as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound && file.exists())
        {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("cannot create {}", parent.display()))?;
            }
            r = std::fs::rename(file, &target);
        }
        match r {
            Ok(()) => Ok(target.display().to_string()),
            Err(_) if target.is_dir() => anyhow::bail!(
                "{} is a folder (another resource's path lies under this one's)",
                target.display()
            ),
            Err(e) => Err(e).with_context(|| format!("cannot move into {}", target.display())),
        }
    }

    fn put_is_quick(&self) -> bool {
        true
    }

    fn delete(&self, _set: &str, uri: &str) -> anyhow::Result<()> {
        if self.keep_deleted {
            return Ok(());
        }
        let target = self.locate(uri)?;
        match std::fs::remove_file(&target) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("cannot remove {}", target.display())),
        }
    }

    fn temp_dir(&self) -> &Path {
        self.tmp.path()
    }

    /// Beside the file's place (its folder is made by the download when missing).
    fn download_path(&self, uri: &str) -> anyhow::Result<PathBuf> {
        let target = self.locate(uri)?;
        use sha2::Digest;
        let h = crate::digest::hex_digest(sha2::Sha256::digest(uri.as_bytes()));
        Ok(target.with_file_name(format!("{RESERVED}part-{}", &h[..24])))
    }

    fn target(&self, uri: &str) -> anyhow::Result<Option<(PathBuf, PathBuf)>> {
        self.locate_in(uri).map(Some)
    }

    fn auditor(&self) -> anyhow::Result<Box<dyn Auditor + Send>> {
        Ok(Box::new(self.clone()))
    }
}

impl Mirror {
    /// The path a resource has (or would have) in the mirror.
    pub fn locate(&self, uri: &str) -> anyhow::Result<PathBuf> {
        self.locate_in(uri).map(|(_, path)| path)
    }

    /// The folder of the mirror a resource lies in (`output.dir`, or a mapped folder) and
    /// its path.
    fn locate_in(&self, uri: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        for m in &self.map {
            if let Some(rest) = uri.strip_prefix(&m.uri) {
                return Ok((m.dir.clone(), m.dir.join(relative_path(rest)?)));
            }
        }
        // The path as written (not as the URL parser normalises it), so that an encoded `..`
        // is refused rather than resolved.
        let after_scheme = uri.find("://").map_or(0, |i| i + 3);
        let split = uri[after_scheme..]
            .find(['/', '?'])
            .map_or(uri.len(), |i| after_scheme + i);
        let (authority, rest) = uri.split_at(split);
        let known = self.hosts.lock().expect("hosts").get(authority).cloned();
        let host = match known {
            Some(h) => h,
            None => {
                let u = url::Url::parse(uri).with_context(|| {
                    format!("{:?} is not a URL", crate::destination::scope::short(uri))
                })?;
                let host = match u.port() {
                    Some(p) => format!("{}_{p}", u.host_str().unwrap_or("_")),
                    None => u.host_str().unwrap_or("_").to_string(),
                };
                let mut hosts = self.hosts.lock().expect("hosts");
                // Bounded: a list naming endless hosts only costs parsing again.
                if hosts.len() >= 4096 {
                    hosts.clear();
                }
                hosts.insert(authority.to_string(), host.clone());
                host
            }
        };
        Ok((
            self.dir.clone(),
            self.dir.join(host).join(relative_path(rest)?),
        ))
    }
}

impl Auditor for Mirror {
    fn holding(&mut self, uri: &str) -> anyhow::Result<Holding> {
        Ok(match file_facts(&self.locate(uri)?) {
            Some((length, md5)) => Holding::Held { length, md5 },
            None => Holding::Missing,
        })
    }

    /// The mirror cannot tell its files from others in the folder: the harvester's record
    /// says what it holds.
    fn unlisted(&mut self) -> anyhow::Result<Option<Vec<String>>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_from_uris() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = OutputSection {
            dir: dir.path().to_path_buf(),
            map: vec![MapEntry {
                uri: "http://h:8080/files/papers/".into(),
                dir: "/srv/papers".into(),
            }],
            ..crate::destination::config::HarvestConfig::defaults().output
        };
        let m = Mirror::new(&cfg).unwrap();
        assert_eq!(
            m.locate("http://h:8080/files/papers/a/b%20c.pdf").unwrap(),
            Path::new("/srv/papers/a/b c.pdf")
        );
        assert_eq!(
            m.locate("http://x.org:81/d/e?x=1").unwrap(),
            dir.path().join("x.org_81/d/e?x=1")
        );
        assert_eq!(
            m.locate("http://x.org/").unwrap(),
            dir.path().join("x.org/index")
        );
        assert!(m.locate("http://x.org/a/%2e%2e/b").is_err());
        assert!(m.locate("http://x.org/a/%2Fetc").is_err());
        assert!(
            m.locate("http://x.org/a/.rshub-part-0").is_err(),
            "reserved"
        );
        assert!(m.locate("http://x.org/.rshub-tmp/x").is_err(), "reserved");
        let part = m.download_path("http://x.org/a/b").unwrap();
        assert_eq!(
            m.locate("HTTP://X.org:80/a/b").unwrap(),
            dir.path().join("x.org/a/b"),
            "the host as the URL parser writes it"
        );
        assert_eq!(part.parent(), Some(dir.path().join("x.org/a").as_path()));
    }
}
