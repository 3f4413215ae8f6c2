//! The disk tier of the page cache: every generated document and its gzip form as files in the
//! cache directory, with a small JSON record per page naming the version it was built from.
//!
//! - Pages are written to their file while they are generated, after room left for their head,
//!   which is written last; then the file is read once for its MD5 and gzip form
//!   ([`Spool::finish`]): memory stays bounded whatever the page size.
//! - Files are written under temporary names and renamed into place, the record last: a crash
//!   never leaves a torn page behind a record. [`DiskCache::open`] removes leftovers.
//! - A new version of a page gets new file names; the old files are unlinked
//!   [`RETIRED_KEPT`] later, so a response already reading them finishes from the open file and
//!   one that named them a moment before (nginx told by `X-Accel-Redirect` to send them) still
//!   finds them.
//! - Least recently used pages go first past the byte budget. Records survive a restart, so
//!   pages do too.

use std::collections::VecDeque;
use std::fs;
use std::io::{self, BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lru::LruCache;
use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::digest::hex_digest;

/// What is known of a stored page without reading it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PageMeta {
    /// The page's cache key (its [`super::DocKind`]).
    pub key: String,
    /// What it was generated from; a different version means regenerate.
    pub version: String,
    /// Strong ETag of the identity form (quoted MD5).
    pub etag: String,
    /// Strong ETag of the gzip form (a different representation has a different tag).
    pub gzip_etag: String,
    /// Microseconds since the epoch.
    pub last_modified: i64,
    /// When the page was built (microseconds since the epoch).
    #[serde(default)]
    pub built_at: i64,
    /// Number of `<url>`/`<sitemap>` entries.
    pub entries: usize,
    pub len: u64,
    pub gzip_len: u64,
    /// File stem in the cache directory: `<stem>.xml` and `<stem>.xml.gz`.
    pub stem: String,
    /// Those two files' absolute paths, made once (they are asked for with every request).
    #[serde(skip)]
    pub files: Arc<[PathBuf; 2]>,
}

impl PageMeta {
    pub fn bytes(&self) -> u64 {
        self.len + self.gzip_len
    }

    /// The file holding one form.
    pub fn path(&self, gzip: bool) -> &Path {
        &self.files[gzip as usize]
    }
}

pub struct DiskCache {
    dir: PathBuf,
    tmp: PathBuf,
    max_bytes: u64,
    inner: Mutex<Inner>,
}

struct Inner {
    map: LruCache<String, Arc<PageMeta>>,
    bytes: u64,
    /// Pages replaced or evicted, oldest first, with when: their files go [`RETIRED_KEPT`]
    /// later. Behind nginx, the server answers with a file's name and nginx opens it after:
    /// a page rebuilt in between would otherwise send nginx to its fallback, and the server
    /// would send the whole page through it (several a second under steady ingest).
    retired: VecDeque<(Instant, Arc<PageMeta>)>,
}

/// How long the files of a replaced or evicted page stay (see [`Inner::retired`]).
pub const RETIRED_KEPT: Duration = Duration::from_secs(2);

/// A page's two files: `<stem>.xml` and `<stem>.xml.gz` in `dir`.
fn files_of(dir: &Path, stem: &str) -> Arc<[PathBuf; 2]> {
    Arc::new([
        dir.join(format!("{stem}.xml")),
        dir.join(format!("{stem}.xml.gz")),
    ])
}

fn sha_hex(s: &str, n: usize) -> String {
    let mut h = hex_digest(Sha256::digest(s.as_bytes()));
    h.truncate(n);
    h
}

impl DiskCache {
    /// Opens (creating) the cache directory and reads back the pages it holds, removing
    /// temporary files, records whose files are missing or short, and files no record names.
    pub fn open(dir: &Path, max_bytes: u64) -> io::Result<DiskCache> {
        // Absolute, so that the pages' paths are (nginx is sent to them by name).
        let dir = &std::path::absolute(dir)?;
        let tmp = dir.join("tmp");
        fs::create_dir_all(&tmp)?;
        for e in fs::read_dir(&tmp)? {
            let _ = fs::remove_file(e?.path());
        }
        let mut records = Vec::new();
        let mut files = Vec::new();
        for e in fs::read_dir(dir)? {
            let e = e?;
            let path = e.path();
            if !e.file_type()?.is_file() {
                continue;
            }
            if path.extension().is_some_and(|x| x == "json") {
                let meta = fs::read(&path)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<PageMeta>(&b).ok())
                    .map(|m| PageMeta {
                        files: files_of(dir, &m.stem),
                        ..m
                    })
                    .filter(|m| {
                        size_of(m.path(false)) == Some(m.len)
                            && size_of(m.path(true)) == Some(m.gzip_len)
                            && path.file_stem().is_some_and(|s| *s == *sha_hex(&m.key, 32))
                    });
                match meta {
                    Some(m) => {
                        let modified = e.metadata()?.modified()?;
                        records.push((modified, m));
                    }
                    None => {
                        tracing::warn!(file = %path.display(), "page cache record unreadable or its files are incomplete: removed");
                        let _ = fs::remove_file(&path);
                    }
                }
            } else {
                files.push(path);
            }
        }
        records.sort_by_key(|(t, _)| *t);
        let mut inner = Inner {
            map: LruCache::unbounded(),
            bytes: 0,
            retired: VecDeque::new(),
        };
        let live: std::collections::HashSet<String> =
            records.iter().map(|(_, m)| m.stem.clone()).collect();
        for f in files {
            let stem = f
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.split('.').next())
                .unwrap_or_default()
                .to_string();
            if !live.contains(&stem) {
                let _ = fs::remove_file(&f);
            }
        }
        for (_, m) in records {
            inner.bytes += m.bytes();
            inner.map.put(m.key.clone(), Arc::new(m));
        }
        let cache = DiskCache {
            dir: dir.to_path_buf(),
            tmp,
            max_bytes,
            inner: Mutex::new(inner),
        };
        // Nothing has been served yet: what the budget evicts now goes at once.
        let evicted = {
            let mut g = cache.inner.lock().expect("disk cache lock");
            cache.evict(&mut g, Instant::now());
            std::mem::take(&mut g.retired)
        };
        for (_, m) in evicted {
            cache.remove_files(&m);
        }
        Ok(cache)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The stored page of `key` when it was built from `version`.
    pub fn get(&self, key: &str, version: &str) -> Option<Arc<PageMeta>> {
        let mut g = self.inner.lock().expect("disk cache lock");
        g.map.get(key).filter(|m| m.version == version).cloned()
    }

    /// The stored page of `key`, whatever version it was built from.
    pub fn latest(&self, key: &str) -> Option<Arc<PageMeta>> {
        self.inner
            .lock()
            .expect("disk cache lock")
            .map
            .get(key)
            .cloned()
    }

    /// Bytes held (both forms of every page).
    pub fn bytes(&self) -> u64 {
        self.inner.lock().expect("disk cache lock").bytes
    }

    /// A spool for a page about to be generated, its head (at most `head_room` bytes) to be
    /// written in front of its entries at the end. A cache folder removed while the server
    /// runs (an operator clearing the cache) is made again, rather than every build failing.
    pub fn spool(&self, head_room: usize) -> io::Result<Spool> {
        let file = match tempfile::NamedTempFile::new_in(&self.tmp) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(&self.tmp)?;
                tempfile::NamedTempFile::new_in(&self.tmp)?
            }
            r => r?,
        };
        let mut file = BufWriter::with_capacity(256 * 1024, file);
        file.seek(io::SeekFrom::Start(head_room as u64))?;
        Ok(Spool {
            file,
            head_room,
            tmp: self.tmp.clone(),
        })
    }

    /// Moves a finished page into place and records it (replacing the key's previous
    /// version), then evicts past the budget. Blocking file work: call it off the async threads.
    pub fn put(
        &self,
        key: &str,
        version: &str,
        last_modified: i64,
        page: Finished,
    ) -> io::Result<Arc<PageMeta>> {
        let stem = format!("{}-{}", sha_hex(key, 32), sha_hex(version, 16));
        let meta = PageMeta {
            key: key.to_string(),
            version: version.to_string(),
            etag: page.etag,
            gzip_etag: page.gzip_etag,
            last_modified,
            built_at: crate::model::Timestamp::now().0,
            entries: page.entries,
            len: page.len,
            gzip_len: page.gzip_len,
            files: files_of(&self.dir, &stem),
            stem,
        };
        // The same version put again (its files at the same paths): no longer retired, so
        // no purge unlinks the files about to be written there.
        self.inner
            .lock()
            .expect("disk cache lock")
            .retired
            .retain(|(_, m)| m.stem != meta.stem);
        page.identity
            .persist(meta.path(false))
            .map_err(|e| e.error)?;
        page.gzip.persist(meta.path(true)).map_err(|e| e.error)?;
        let mut rec = tempfile::NamedTempFile::new_in(&self.tmp)?;
        serde_json::to_writer(&mut rec, &meta)?;
        rec.persist(self.dir.join(format!("{}.json", sha_hex(key, 32))))
            .map_err(|e| e.error)?;
        let meta = Arc::new(meta);
        let now = Instant::now();
        let mut g = self.inner.lock().expect("disk cache lock");
        if let Some(old) = g.map.put(meta.key.clone(), meta.clone()) {
            g.bytes -= old.bytes();
            if old.stem != meta.stem {
                g.retired.push_back((now, old));
            }
        }
        g.bytes += meta.bytes();
        self.evict(&mut g, now);
        self.purge_retired(&mut g, now);
        Ok(meta)
    }

    /// Evicts least recently used pages until the budget holds (keeping at least the newest).
    /// Their records go at once, their files [`RETIRED_KEPT`] later.
    fn evict(&self, g: &mut Inner, now: Instant) {
        while g.bytes > self.max_bytes && g.map.len() > 1 {
            let Some((key, old)) = g.map.pop_lru() else {
                break;
            };
            g.bytes -= old.bytes();
            let _ = fs::remove_file(self.dir.join(format!("{}.json", sha_hex(&key, 32))));
            g.retired.push_back((now, old));
        }
    }

    /// Removes the files of pages retired [`RETIRED_KEPT`] before `now`, unless a page of the
    /// same version is current again. Under the lock, as the records change: a page put again
    /// with the same version meanwhile (its files at the same paths) is never unlinked.
    fn purge_retired(&self, g: &mut Inner, now: Instant) {
        while let Some((at, m)) = g.retired.front() {
            if now.duration_since(*at) < RETIRED_KEPT {
                break;
            }
            if g.map.peek(&m.key).is_none_or(|live| live.stem != m.stem) {
                self.remove_files(m);
            }
            g.retired.pop_front();
        }
    }

    /// [`Self::purge_retired`] as if at `now` (tests: time made to pass, not waited for).
    #[cfg(test)]
    fn purge_retired_at(&self, now: Instant) {
        self.purge_retired(&mut self.inner.lock().expect("disk cache lock"), now);
    }

    fn remove_files(&self, m: &PageMeta) {
        for f in m.files.iter() {
            let _ = fs::remove_file(f);
        }
    }
}

fn size_of(p: &Path) -> Option<u64> {
    fs::metadata(p).ok().map(|m| m.len())
}

/// A page being generated: the entries go to its page file as they are written, after room
/// for its head, which is written last (a Resource List part's `completed` is known only
/// then). Writing them to a file of their own and copying that into the page was 8% of a
/// loaded server's samples (ext4's writes of the copy).
pub struct Spool {
    file: BufWriter<tempfile::NamedTempFile>,
    head_room: usize,
    tmp: PathBuf,
}

/// Where a page's ETag comes from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Validator {
    /// Its bytes (MD5): built again with the same bytes, on any process, it keeps its ETag.
    Content,
    /// A random value per build: for pages whose bytes carry the moment they were built (a
    /// Resource List's `completed`), which no two builds share anyway; their MD5 was 8% of a
    /// loaded server's samples.
    Build,
}

/// A generated page, in temporary files of the cache directory.
pub struct Finished {
    identity: tempfile::NamedTempFile,
    gzip: tempfile::NamedTempFile,
    pub etag: String,
    pub gzip_etag: String,
    pub len: u64,
    pub gzip_len: u64,
    pub entries: usize,
    /// Where the entries begin in the page.
    pub entries_at: u64,
}

/// `head` made `room` bytes long with spaces before its last line's end (where a head ends
/// with an element or a JSON member: whitespace there means nothing).
fn padded(head: &[u8], room: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(room);
    let (body, end) = match head.strip_suffix(b"\n") {
        Some(b) => (b, &b"\n"[..]),
        None => (head, &b""[..]),
    };
    out.extend_from_slice(body);
    out.resize(room - end.len(), b' ');
    out.extend_from_slice(end);
    out
}

impl Spool {
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all(bytes)
    }

    /// Ends the page: `head` in the room left for it (or, longer than that, the page copied
    /// behind it), `tail` after the entries, then the page read once for its MD5 (when its
    /// ETag comes from its bytes) and its gzip form. Blocking: call it off the async threads.
    pub fn finish(
        self,
        head: &[u8],
        tail: &[u8],
        entries: usize,
        validator: Validator,
    ) -> io::Result<Finished> {
        let mut identity = self.file.into_inner().map_err(|e| e.into_error())?;
        let room = self.head_room;
        let identity = if head.len() <= room {
            use std::os::unix::fs::FileExt;
            identity.as_file().write_all_at(&padded(head, room), 0)?;
            identity.write_all(tail)?;
            identity
        } else {
            // A head longer than foreseen: the page written again behind it.
            let mut whole = tempfile::NamedTempFile::new_in(&self.tmp)?;
            {
                let mut out = BufWriter::with_capacity(256 * 1024, whole.as_file_mut());
                out.write_all(head)?;
                identity.seek(io::SeekFrom::Start(room as u64))?;
                io::copy(&mut identity, &mut out)?;
                out.write_all(tail)?;
                out.flush()?;
            }
            whole
        };
        let entries_at = room.max(head.len()) as u64;
        let mut page = identity.reopen()?;
        let gzip = tempfile::NamedTempFile::new_in(&self.tmp)?;
        let mut gz = flate2::write::GzEncoder::new(
            BufWriter::with_capacity(64 * 1024, gzip.as_file()),
            flate2::Compression::fast(),
        );
        let mut md5 = (validator == Validator::Content).then(Md5::new);
        let mut len = 0u64;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = page.read(&mut buf)?;
            if n == 0 {
                break;
            }
            if let Some(m) = &mut md5 {
                m.update(&buf[..n]);
            }
            gz.write_all(&buf[..n])?;
            len += n as u64;
        }
        gz.finish()?.flush()?;
        let gzip_len = gzip.as_file().metadata()?.len();
        let hex = match md5 {
            Some(m) => hex_digest(m.finalize()),
            None => format!(
                "b{}",
                crate::digest::random_hex().map_err(|e| io::Error::other(e.to_string()))?
            ),
        };
        Ok(Finished {
            identity,
            gzip,
            etag: format!("\"{hex}\""),
            gzip_etag: format!("\"{hex}-gzip\""),
            len,
            gzip_len,
            entries,
            entries_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    fn page(c: &DiskCache, body: &str) -> Finished {
        page_with(c, body, Validator::Content)
    }

    fn page_with(c: &DiskCache, body: &str, v: Validator) -> Finished {
        let mut s = c.spool(6).unwrap();
        s.write(body.as_bytes()).unwrap();
        s.finish(b"<head>", b"</head>", 1, v).unwrap()
    }

    /// Same bytes, same ETag when it comes from the content; a build's own otherwise (and a
    /// gzip form's ETag is never the identity form's).
    #[test]
    fn etags_from_the_content_repeat_and_etags_of_a_build_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path(), 1 << 20).unwrap();
        let (a, b) = (page(&c, "same"), page(&c, "same"));
        assert_eq!(a.etag, b.etag);
        let (x, y) = (
            page_with(&c, "same", Validator::Build),
            page_with(&c, "same", Validator::Build),
        );
        assert_ne!(x.etag, y.etag);
        assert_ne!(x.etag, a.etag);
        assert_ne!(x.etag, x.gzip_etag);
        assert!(x.etag.starts_with('"') && x.etag.ends_with('"') && x.etag.len() == 35);
    }

    /// A head shorter than its room is padded where whitespace means nothing; one longer
    /// than its room gets the page written again behind it; both forms hold the same bytes.
    #[test]
    fn the_head_goes_in_front_of_the_entries_whatever_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path(), 1 << 20).unwrap();
        for (room, head, want) in [
            (12, "<a><b/>\n", "<a><b/>    \n<e/></a>"),
            (8, "<a><b/>\n", "<a><b/>\n<e/></a>"),
            (3, "<a><b/>\n", "<a><b/>\n<e/></a>"),
        ] {
            let mut s = c.spool(room).unwrap();
            s.write(b"<e/>").unwrap();
            let f = s
                .finish(head.as_bytes(), b"</a>", 1, Validator::Content)
                .unwrap();
            assert_eq!(f.entries_at, room.max(head.len()) as u64);
            let m = c.put("k", &format!("v{room}"), 7, f).unwrap();
            assert_eq!(fs::read_to_string(m.path(false)).unwrap(), want);
            let mut unzipped = String::new();
            flate2::read::GzDecoder::new(File::open(m.path(true)).unwrap())
                .read_to_string(&mut unzipped)
                .unwrap();
            assert_eq!(unzipped, want);
        }
    }

    #[test]
    fn pages_survive_reopening_and_a_new_version_replaces_the_old_files() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path(), 1 << 20).unwrap();
        let m = c.put("k", "v1", 7, page(&c, "one")).unwrap();
        assert_eq!(fs::read(m.path(false)).unwrap(), b"<head>one</head>");
        let mut gz = flate2::read::GzDecoder::new(File::open(m.path(true)).unwrap());
        let mut s = String::new();
        gz.read_to_string(&mut s).unwrap();
        assert_eq!(s, "<head>one</head>");
        assert_eq!(
            m.etag,
            format!("\"{}\"", hex_digest(Md5::digest(b"<head>one</head>")))
        );
        let m2 = c.put("k", "v2", 8, page(&c, "two")).unwrap();
        assert!(
            m.path(false).exists() && m.path(true).exists(),
            "the old version's files stay a moment (nginx may have been told to send them)"
        );
        c.purge_retired_at(Instant::now() + RETIRED_KEPT);
        assert!(
            !m.path(false).exists() && !m.path(true).exists(),
            "the old version's files are removed after that"
        );
        assert!(m2.path(false).exists() && m2.path(true).exists());
        // A version put again after it was replaced keeps its files through the purge.
        let m3 = c.put("k", "v3", 9, page(&c, "three")).unwrap();
        let again = c.put("k", "v2", 10, page(&c, "two again")).unwrap();
        assert_eq!(again.stem, m2.stem);
        c.purge_retired_at(Instant::now() + RETIRED_KEPT);
        assert_eq!(
            fs::read(again.path(false)).unwrap(),
            b"<head>two again</head>"
        );
        assert!(!m3.path(false).exists());
        let m2 = again;
        drop(c);
        let c = DiskCache::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(c.get("k", "v2").as_deref(), Some(&*m2));
        assert!(c.get("k", "v1").is_none());
    }

    #[test]
    fn a_torn_page_is_dropped_at_open_and_the_budget_evicts_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path(), 200).unwrap();
        let a = c.put("a", "v", 1, page(&c, &"x".repeat(60))).unwrap();
        let b = c.put("b", "v", 1, page(&c, &"y".repeat(60))).unwrap();
        assert!(c.get("a", "v").is_none(), "a was evicted: {}", c.bytes());
        assert!(a.path(false).exists(), "its files stay a moment");
        c.purge_retired_at(Instant::now() + RETIRED_KEPT);
        assert!(!a.path(false).exists());
        assert!(c.get("b", "v").is_some());
        fs::write(b.path(false), b"short").unwrap();
        drop(c);
        let c = DiskCache::open(dir.path(), 200).unwrap();
        assert!(
            c.get("b", "v").is_none(),
            "a page whose file is torn is not served"
        );
        assert_eq!(c.bytes(), 0);
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "only tmp/ is left"
        );
    }
}
