//! The memory tier of the page cache: small pages (both forms) kept by key under a byte
//! budget, least recently used first out. Large pages are served from the disk tier's files.
//! Validity is the caller's business (each page carries the version it was made from).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use lru::LruCache;

use super::disk::PageMeta;

/// A page held in memory.
#[derive(Debug)]
pub struct MemPage {
    pub meta: Arc<PageMeta>,
    pub identity: Bytes,
    pub gzip: Bytes,
}

impl MemPage {
    fn bytes(&self) -> usize {
        self.identity.len() + self.gzip.len()
    }
}

pub struct PageCache {
    inner: Mutex<Inner>,
    max_bytes: usize,
}

struct Inner {
    map: LruCache<String, Arc<MemPage>>,
    bytes: usize,
}

impl PageCache {
    pub fn new(max_bytes: usize) -> PageCache {
        PageCache {
            inner: Mutex::new(Inner {
                map: LruCache::unbounded(),
                bytes: 0,
            }),
            max_bytes,
        }
    }

    /// The page of `key` when it was built from `version`.
    pub fn get(&self, key: &str, version: &str) -> Option<Arc<MemPage>> {
        let mut g = self.inner.lock().expect("cache lock");
        g.map
            .get(key)
            .filter(|p| p.meta.version == version)
            .cloned()
    }

    /// The page held for `key`, whatever version it was built from.
    pub fn latest(&self, key: &str) -> Option<Arc<MemPage>> {
        self.inner.lock().expect("cache lock").map.get(key).cloned()
    }

    /// Stores a page; one larger than the whole budget is not kept.
    pub fn insert(&self, page: Arc<MemPage>) {
        let size = page.bytes();
        let mut g = self.inner.lock().expect("cache lock");
        if let Some(old) = g.map.pop(&page.meta.key) {
            g.bytes -= old.bytes();
        }
        if size > self.max_bytes {
            return;
        }
        while g.bytes + size > self.max_bytes {
            match g.map.pop_lru() {
                Some((_, old)) => g.bytes -= old.bytes(),
                None => break,
            }
        }
        g.bytes += size;
        g.map.put(page.meta.key.clone(), page);
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.inner.lock().expect("cache lock").bytes
    }
}
