//! Pages of `ListRecords` kept on disk, so that a list walked again is sent from a file instead
//! of being made again (each record's file opened, read and checked).
//!
//! An entry is the `<record>`s of one page that starts at a position of one set's change log
//! (its key) and ends at another (`next_after`), as they were for one bound (the moment the
//! list was first asked for), with what the store had recorded when it was read (its mark,
//! [`crate::store::SetStore::recorded_through`]). It is still the page for a later bound while
//! no change recorded since is dated at or before its stretch's end (the rules let a writer
//! date a change into a stretch already kept: the store's record says so, the clock cannot)
//! and each of its resources' newest change is the one it holds (kept in the file with its
//! key); a page found stale is made again over the same stretch, so the pages after it keep
//! their keys. Only stretches that had settled are kept (their last change dated more than the
//! store's visibility lag before the bound), so that pages are not made twice while writers
//! catch up.
//!
//! File: the records, then the items' `[key, datetime, id]` as a JSON array, then that array's
//! length (8 bytes, little endian). Written under a temporary name and renamed into place; files are unlinked when their
//! entry is replaced or evicted (a response already reading one finishes from the open file).
//! The directory is emptied when the server starts: the entries are only remembered in memory.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use lru::LruCache;

/// One stored page.
#[derive(Debug)]
pub struct Entry {
    pub path: PathBuf,
    /// Bytes of `<record>`s at the start of the file.
    pub records_len: u64,
    file_len: u64,
    /// The bound the page was made for, or a later one it was found to be the page of
    /// (µs): it holds the changes before it.
    pub bound: std::sync::atomic::AtomicI64,
    /// The last position of the log the page covers (the next page's key).
    pub next_after: (i64, i64),
    /// What the store had recorded before the page was read
    /// ([`crate::store::SetStore::recorded_through`]): a change recorded later that is dated
    /// at or before `next_after` lands in the page's stretch, whatever the clock said.
    pub mark: i64,
    /// The page ended with its set's log (new changes land in it).
    pub exhausted: bool,
    /// Items it counts for the cursor (headers and records, left-out records included).
    pub items: usize,
}

/// What a page being made will be stored as.
#[derive(Debug)]
pub struct Fill {
    pub key: String,
    pub bound: i64,
    pub next_after: (i64, i64),
    /// See [`Entry::mark`].
    pub mark: i64,
    pub exhausted: bool,
    pub items: usize,
    /// Its items' resource keys and positions (datetime µs, id).
    pub keys: Vec<(String, i64, i64)>,
}

/// Entries remembered at most, whatever their bytes (each is a few hundred bytes of memory;
/// a budget of small pages must not grow it without end).
const MAX_ENTRIES: usize = 100_000;

pub struct ListCache {
    dir: PathBuf,
    max_bytes: u64,
    max_entries: usize,
    inner: Mutex<Inner>,
    /// Each file's name is new: a request holding an entry never opens its replacement.
    seq: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for ListCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListCache").field("dir", &self.dir).finish()
    }
}

struct Inner {
    map: LruCache<String, Arc<Entry>>,
    bytes: u64,
}

/// A page being written: records first, then [`Writer::finish`].
pub struct Writer {
    file: BufWriter<tempfile::NamedTempFile>,
    len: u64,
}

impl Writer {
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.len += bytes.len() as u64;
        self.file.write_all(bytes)
    }
}

impl ListCache {
    /// Empties (creating) `dir` and keeps at most `max_bytes` of pages there.
    pub fn open(dir: &Path, max_bytes: u64) -> io::Result<ListCache> {
        match fs::remove_dir_all(dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        fs::create_dir_all(dir)?;
        Ok(ListCache {
            dir: dir.to_path_buf(),
            max_bytes,
            max_entries: MAX_ENTRIES,
            inner: Mutex::new(Inner {
                map: LruCache::unbounded(),
                bytes: 0,
            }),
            seq: Default::default(),
        })
    }

    pub fn get(&self, key: &str) -> Option<Arc<Entry>> {
        self.inner
            .lock()
            .expect("list cache lock")
            .map
            .get(key)
            .cloned()
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.inner.lock().expect("list cache lock").bytes
    }

    /// A page to write. Blocking.
    pub fn writer(&self) -> io::Result<Writer> {
        let file = match tempfile::NamedTempFile::new_in(&self.dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(&self.dir)?;
                tempfile::NamedTempFile::new_in(&self.dir)?
            }
            r => r?,
        };
        Ok(Writer {
            file: BufWriter::with_capacity(256 * 1024, file),
            len: 0,
        })
    }

    /// Stores a written page as `fill` says, replacing the key's entry. Blocking.
    pub fn put(&self, w: Writer, fill: Fill) -> io::Result<()> {
        let records_len = w.len;
        let mut file = w.file.into_inner().map_err(|e| e.into_error())?;
        let keys = serde_json::to_vec(&fill.keys)?;
        file.write_all(&keys)?;
        file.write_all(&(keys.len() as u64).to_le_bytes())?;
        let file_len = records_len + keys.len() as u64 + 8;
        let mut h = sha2::Sha256::default();
        sha2::Digest::update(&mut h, fill.key.as_bytes());
        let mut name = crate::digest::hex_digest(sha2::Digest::finalize(h));
        name.truncate(32);
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.dir.join(format!("{name}-{seq}.records"));
        let entry = Arc::new(Entry {
            path,
            records_len,
            file_len,
            bound: fill.bound.into(),
            next_after: fill.next_after,
            mark: fill.mark,
            exhausted: fill.exhausted,
            items: fill.items,
        });
        let mut g = self.inner.lock().expect("list cache lock");
        // Renamed under the lock: two pages of one key put at once leave the entry and the
        // file of the same one.
        file.persist(&entry.path).map_err(|e| e.error)?;
        if let Some(old) = g.map.put(fill.key, entry.clone()) {
            g.bytes -= old.file_len;
            let _ = fs::remove_file(&old.path);
        }
        g.bytes += file_len;
        while g.bytes > self.max_bytes || g.map.len() > self.max_entries {
            let Some((_, old)) = g.map.pop_lru() else {
                break;
            };
            g.bytes -= old.file_len;
            let _ = fs::remove_file(&old.path);
        }
        Ok(())
    }

    /// Forgets a page whose file could not be read.
    pub fn forget(&self, key: &str) {
        let mut g = self.inner.lock().expect("list cache lock");
        if let Some(old) = g.map.pop(key) {
            g.bytes -= old.file_len;
            let _ = fs::remove_file(&old.path);
        }
    }
}

impl Entry {
    pub fn bound(&self) -> i64 {
        self.bound.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Found to be the page of a later bound too: checked from there next time.
    pub fn seen_at(&self, bound: i64) {
        self.bound
            .fetch_max(bound, std::sync::atomic::Ordering::Relaxed);
    }

    /// The page's file, open at its start, when it is still the one recorded. Blocking.
    pub fn open(&self) -> io::Result<File> {
        let f = File::open(&self.path)?;
        if f.metadata()?.len() != self.file_len {
            return Err(io::Error::other(
                "a list page's file is not the one recorded",
            ));
        }
        Ok(f)
    }

    /// The page's items' resource keys and positions, read from its file as [`Entry::open`]
    /// gave it, which is left at its start again. Blocking.
    pub fn keys(&self, f: &mut File) -> io::Result<Vec<(String, i64, i64)>> {
        f.seek(SeekFrom::End(-8))?;
        let mut n = [0u8; 8];
        f.read_exact(&mut n)?;
        let n = u64::from_le_bytes(n);
        if n + 8 > self.file_len - self.records_len {
            return Err(io::Error::other(
                "a list page's file is not the one recorded",
            ));
        }
        f.seek(SeekFrom::Start(self.records_len))?;
        let mut keys = Vec::with_capacity(n as usize);
        f.take(n).read_to_end(&mut keys)?;
        f.rewind()?;
        serde_json::from_slice(&keys).map_err(io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(key: &str, n: usize) -> Fill {
        Fill {
            key: key.into(),
            bound: 7,
            next_after: (5, 6),
            mark: 3,
            exhausted: false,
            items: n,
            keys: (0..n)
                .map(|i| (format!("path:r{i}\n.xml"), 5, i as i64))
                .collect(),
        }
    }

    #[test]
    fn a_page_is_kept_replaced_and_evicted_past_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ListCache::open(&dir.path().join("lists"), 200).unwrap();
        let mut w = cache.writer().unwrap();
        w.write(b"<record>a</record>").unwrap();
        w.write(b"<record>b</record>").unwrap();
        cache.put(w, fill("one", 2)).unwrap();
        let e = cache.get("one").unwrap();
        assert_eq!(e.records_len, 36);
        let mut f = e.open().unwrap();
        assert_eq!(e.keys(&mut f).unwrap(), fill("one", 2).keys);
        let mut text = String::new();
        f.take(e.records_len).read_to_string(&mut text).unwrap();
        assert_eq!(text, "<record>a</record><record>b</record>");
        // Replaced: the old entry's file is gone.
        let mut w = cache.writer().unwrap();
        w.write(b"<record>c</record>").unwrap();
        cache.put(w, fill("one", 1)).unwrap();
        let e1 = cache.get("one").unwrap();
        assert_eq!(e1.keys(&mut e1.open().unwrap()).unwrap().len(), 1);
        assert!(e.open().is_err(), "the replaced entry's file is gone");
        // A second key over the budget evicts the first.
        let mut w = cache.writer().unwrap();
        w.write(&[b'x'; 150]).unwrap();
        cache.put(w, fill("two", 1)).unwrap();
        assert!(cache.get("one").is_none());
        assert!(cache.get("two").is_some());
        assert!(cache.bytes() <= 200, "{}", cache.bytes());
        assert_eq!(fs::read_dir(dir.path().join("lists")).unwrap().count(), 1);
        // Past the count of entries, the least recently used go too.
        let mut cache = cache;
        cache.max_entries = 2;
        for key in ["a", "b", "c"] {
            let mut w = cache.writer().unwrap();
            w.write(b"<record/>").unwrap();
            cache.put(w, fill(key, 0)).unwrap();
        }
        assert!(cache.get("two").is_none() && cache.get("a").is_none());
        assert!(cache.get("b").is_some() && cache.get("c").is_some());
        assert_eq!(fs::read_dir(dir.path().join("lists")).unwrap().count(), 2);
        // Opened again, the folder is emptied.
        drop(cache);
        let cache = ListCache::open(&dir.path().join("lists"), 200).unwrap();
        assert!(cache.get("two").is_none());
        assert_eq!(fs::read_dir(dir.path().join("lists")).unwrap().count(), 0);
    }
}
