//! The page cache: generated documents kept by key under a byte budget, least recently used
//! first out. Validity is the caller's business (each `Doc` carries the version it was made from).

use std::sync::{Arc, Mutex};

use lru::LruCache;

use super::Doc;

pub struct PageCache {
    inner: Mutex<Inner>,
    max_bytes: usize,
}

struct Inner {
    map: LruCache<String, Arc<Doc>>,
    bytes: usize,
    hits: u64,
    misses: u64,
}

impl PageCache {
    pub fn new(max_bytes: usize) -> PageCache {
        PageCache {
            inner: Mutex::new(Inner {
                map: LruCache::unbounded(),
                bytes: 0,
                hits: 0,
                misses: 0,
            }),
            max_bytes,
        }
    }

    pub fn get(&self, key: &str) -> Option<Arc<Doc>> {
        let mut g = self.inner.lock().expect("cache lock");
        let found = g.map.get(key).cloned();
        if found.is_some() {
            g.hits += 1;
        } else {
            g.misses += 1;
        }
        found
    }

    /// Stores a document; one larger than the whole budget is not kept.
    pub fn insert(&self, key: String, doc: Arc<Doc>) {
        let size = doc.body.len();
        let mut g = self.inner.lock().expect("cache lock");
        if let Some(old) = g.map.pop(&key) {
            g.bytes -= old.body.len();
        }
        if size > self.max_bytes {
            return;
        }
        while g.bytes + size > self.max_bytes {
            match g.map.pop_lru() {
                Some((_, old)) => g.bytes -= old.body.len(),
                None => break,
            }
        }
        g.bytes += size;
        g.map.put(key, doc);
    }

    /// (hits, misses, bytes held): for the benchmark and, later, metrics.
    pub fn stats(&self) -> (u64, u64, usize) {
        let g = self.inner.lock().expect("cache lock");
        (g.hits, g.misses, g.bytes)
    }
}
