//! Incremental Resource List parts: a part's page made from its last build here (its entries
//! copied as stretches from the old file) and the changes since, or built whole when the two
//! do not fit together.

use super::*;

/// Entries of the Resource List pages whose last build is kept as the start of the next, all
/// pages together (16 bytes an entry: 16 MB; 800 KB for a part of 50,000).
pub(super) const BASES_MAX_ENTRIES: usize = 1 << 20;

/// Entry bytes gathered before they are moved to the spool.
pub(super) const SPOOL_AT: usize = 1 << 20;

/// Where each entry of a page being built lies, for the next build of it: the change it is
/// current to, and (position in the part, length) of every entry in order.
pub(super) struct Base {
    pub(super) last_seq: i64,
    pub(super) entries: Vec<(i64, u32)>,
}

/// A Resource List part as last built here: its identity file, where its first entry starts,
/// and where each entry lies ([`Base`]). The next build copies the entries no change touched
/// since then instead of reading them from the store and writing them again.
pub(super) struct PartBase {
    pub(super) file: PathBuf,
    pub(super) head: u64,
    pub(super) built: Base,
}

/// `g`, a part's page being built, made from `base` (the part's page as built before) and
/// `delta` (what changed since): entries no change touched are copied from the old file.
/// `None` when the two do not fit together (the file gone or not as remembered, a resource
/// in neither): the page is then built whole.
pub(super) fn merge(
    mut g: Gen<SitemapWriter>,
    base: &PartBase,
    delta: PartDelta,
    sc: &SetConfig,
) -> Option<Gen<SitemapWriter>> {
    match merge_into(&mut g, base, delta, sc) {
        Ok(true) => Some(g),
        Ok(false) => {
            tracing::debug!(file = %base.file.display(), "page built whole: its last build does not fit the changes since");
            None
        }
        Err(e) => {
            tracing::debug!(file = %base.file.display(), error = %e, "page built whole: its last build could not be read");
            None
        }
    }
}

pub(super) fn merge_into(
    g: &mut Gen<SitemapWriter>,
    base: &PartBase,
    delta: PartDelta,
    sc: &SetConfig,
) -> std::io::Result<bool> {
    let mut old = Stretch::new(std::fs::File::open(&base.file)?, base.head);
    let mut entries = base.built.entries.iter().copied().peekable();
    let mut changed = delta.changed.into_iter().peekable();
    // No resource came or went since: the positions are the last build's.
    let positions = delta
        .positions
        .unwrap_or_else(|| base.built.entries.iter().map(|&(p, _)| p).collect());
    let mut kept = Vec::with_capacity(positions.len());
    let mut loc = String::new();
    for pos in positions {
        // Entries of resources gone since.
        while let Some((_, len)) = entries.next_if(|&(p, _)| p < pos) {
            if !old.pass(len, &mut g.w)? {
                return Ok(false);
            }
        }
        let was = entries.next_if(|&(p, _)| p == pos);
        if let Some((_, r)) = changed.next_if(|(p, _)| *p == pos) {
            // The untouched entries before it go first.
            if !old.pass(was.map_or(0, |(_, len)| len), &mut g.w)? {
                return Ok(false);
            }
            let before = g.w.pending();
            write_resource(&mut g.w, sc, &r, &mut loc);
            kept.push((pos, (g.w.pending() - before) as u32));
        } else if let Some((_, len)) = was {
            old.keep(len);
            kept.push((pos, len));
        } else {
            // Neither changed nor in the last build.
            return Ok(false);
        }
        if changed.peek().is_some_and(|(p, _)| *p < pos) {
            return Ok(false);
        }
        if old.bytes >= SPOOL_AT && !old.copy(&mut g.w)? {
            return Ok(false);
        }
        if g.w.pending() >= SPOOL_AT {
            g.spool_entries()?;
        }
    }
    if changed.next().is_some() || !old.copy(&mut g.w)? {
        return Ok(false);
    }
    g.spool_entries()?;
    g.base = Some(Base {
        last_seq: delta.last_seq,
        entries: kept,
    });
    Ok(true)
}

/// A part's last build read from where its entries begin: the untouched entries are copied
/// a stretch at a time, one read each, rather than one at a time (that copy was 14–23 of the
/// ~114 samples a second serving adds under `bench_load`).
pub(super) struct Stretch {
    pub(super) file: std::fs::File,
    /// Bytes to pass over before the stretch (entries of resources changed or gone).
    pub(super) skip: u64,
    /// The stretch's entries' lengths, and their sum.
    pub(super) lens: Vec<u32>,
    pub(super) bytes: usize,
    pub(super) buf: Vec<u8>,
}

impl Stretch {
    pub(super) fn new(file: std::fs::File, at: u64) -> Stretch {
        Stretch {
            file,
            skip: at,
            lens: Vec::new(),
            bytes: 0,
            buf: Vec::new(),
        }
    }

    /// The next entry is copied.
    pub(super) fn keep(&mut self, len: u32) {
        self.lens.push(len);
        self.bytes += len as usize;
    }

    /// The next entry (`len` bytes) is not: the stretch before it is copied to `w` first.
    pub(super) fn pass(&mut self, len: u32, w: &mut SitemapWriter) -> std::io::Result<bool> {
        let ok = self.copy(w)?;
        self.skip += u64::from(len);
        Ok(ok)
    }

    /// Writes the stretch to `w`, checking each entry is one as written before: `false` when
    /// one is not (the file is not the build remembered).
    pub(super) fn copy(&mut self, w: &mut SitemapWriter) -> std::io::Result<bool> {
        use std::io::{Read, Seek};
        if self.lens.is_empty() {
            return Ok(true);
        }
        if self.skip > 0 {
            self.file
                .seek(std::io::SeekFrom::Current(self.skip as i64))?;
            self.skip = 0;
        }
        self.buf.resize(self.bytes, 0);
        self.file.read_exact(&mut self.buf)?;
        let Ok(text) = std::str::from_utf8(&self.buf) else {
            return Ok(false);
        };
        let mut at = 0;
        for &len in &self.lens {
            let e = &text.as_bytes()[at..at + len as usize];
            if !(e.starts_with(b"  <url>") && e.ends_with(b"</url>\n")) {
                return Ok(false);
            }
            at += len as usize;
        }
        w.raw_entries(text, self.lens.len());
        self.lens.clear();
        self.bytes = 0;
        Ok(true)
    }
}

impl Source {
    pub(super) async fn resource_list_part(
        &self,
        set: &SetName,
        part: &PartInfo,
        indexed: bool,
        at: Timestamp,
        key: &str,
    ) -> Result<Gen<SitemapWriter>, SourceError> {
        let sc = Arc::new(self.set_config(set));
        let up = self.urls().capability_list(set);
        let index = self.urls().resource_list(set);
        let mut links = vec![Ln {
            rel: "up",
            href: &up,
            mime: None,
        }];
        if indexed {
            links.push(Ln {
                rel: "index",
                href: &index,
                mime: None,
            });
        }
        let md = |completed| Md {
            capability: Some("resourcelist"),
            at: Some(at),
            completed,
            ..Md::default()
        };
        // Its head is made again with `completed` at the end: begun with the longest one (a
        // time with microseconds), so the page leaves room for it.
        let new = || {
            self.gen(SitemapWriter::new(
                Root::Urlset,
                &md(Some(Timestamp(at.0 | 1))),
                &links,
            ))
        };
        let mut gen = None;
        if part.count > 0 {
            // The last build here, brought up to date: its entries copied where no change
            // touched them since, the others written anew.
            let base = self.bases.lock().expect("bases").get(key).cloned();
            if let Some(base) = base.filter(|b| b.built.last_seq <= part.last_seq) {
                let limit = (part.count as usize / 4).max(self.config().source.store_page_size);
                let built = Built {
                    count: base.built.entries.len(),
                    last_position: base.built.entries.last().map_or(0, |&(p, _)| p),
                };
                if let Some(delta) = self
                    .store()
                    .part_delta(set, part.no, base.built.last_seq, built, limit)
                    .await?
                {
                    let (g, sc) = (new()?, sc.clone());
                    gen = blocking(move || Ok(merge(g, &base, delta, &sc)))
                        .await?
                        .inspect(|_| {
                            self.metrics().pages_brought_up_to_date.inc();
                        });
                }
            }
        }
        let mut gen = match gen {
            Some(g) => g,
            None if part.count == 0 => new()?,
            None => self.whole_part(new()?, set, part, sc).await?,
        };
        gen.w.set_header(&md(Some(Timestamp::now())), &links);
        Ok(gen)
    }

    /// Part `part` written whole, with where each entry lies when the store tells positions.
    pub(super) async fn whole_part(
        &self,
        mut gen: Gen<SitemapWriter>,
        set: &SetName,
        part: &PartInfo,
        sc: Arc<SetConfig>,
    ) -> Result<Gen<SitemapWriter>, SourceError> {
        let limit = self.config().source.store_page_size;
        // Every change up to the part's `last_seq` as planned is in what is read from here on.
        gen.base = Some(Base {
            last_seq: part.last_seq,
            entries: Vec::with_capacity(part.count as usize),
        });
        let mut after = 0;
        loop {
            let Some(items) = self
                .store()
                .part_resources(set, part.no, after, limit)
                .await?
            else {
                break;
            };
            let Some(&(last, _)) = items.last() else {
                return Ok(gen);
            };
            after = last;
            let full = items.len() == limit;
            let sc = sc.clone();
            gen = blocking(move || {
                let mut g = gen;
                let mut loc = String::new();
                let base = g.base.as_mut().expect("set above");
                for (pos, r) in &items {
                    let before = g.w.pending();
                    write_resource(&mut g.w, &sc, r, &mut loc);
                    base.entries.push((*pos, (g.w.pending() - before) as u32));
                }
                g.spool_entries()?;
                Ok(g)
            })
            .await?;
            if !full {
                return Ok(gen);
            }
        }
        // A backend without positions: pages of resources, nothing kept for the next build.
        gen.base = None;
        let mut cursor = None;
        loop {
            let page = self
                .store()
                .resources(set, Some(part.no), cursor, limit)
                .await?;
            let (items, next) = (page.items, page.next);
            let sc = sc.clone();
            gen = gen
                .write_rows(move |w| {
                    let mut loc = String::new();
                    for r in &items {
                        write_resource(w, &sc, r, &mut loc);
                    }
                })
                .await?;
            match next {
                Some(c) => cursor = Some(c),
                None => return Ok(gen),
            }
        }
    }

    /// Keeps what the next build of `key` can start from, other pages' dropped past
    /// [`BASES_MAX_ENTRIES`] entries in all.
    pub(super) fn keep_base(&self, key: &str, base: PartBase) {
        let mut bases = self.bases.lock().expect("bases");
        bases.remove(key);
        if base.built.entries.len() > BASES_MAX_ENTRIES {
            return;
        }
        let mut held: usize = bases.values().map(|b| b.built.entries.len()).sum();
        while held + base.built.entries.len() > BASES_MAX_ENTRIES {
            let Some(k) = bases.keys().next().cloned() else {
                break;
            };
            held -= bases.remove(&k).map_or(0, |b| b.built.entries.len());
        }
        bases.insert(key.to_string(), Arc::new(base));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer() -> SitemapWriter {
        SitemapWriter::new(Root::Urlset, &Md::default(), &[])
    }

    /// Stretches of a last build are copied as they are, what lies between them passed over;
    /// a file whose entries are not where the build left them is refused (the page is then
    /// built whole), not copied.
    #[test]
    fn stretches_are_copied_whole_and_a_file_not_as_built_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            "  <url><loc>a</loc></url>\n",
            "  <url><loc>bb</loc></url>\n",
            "  <url><loc>ccc</loc></url>\n",
        );
        let file = dir.path().join("page");
        std::fs::write(&file, format!("HEAD{a}{b}{c}")).unwrap();
        let len = |e: &str| e.len() as u32;

        let mut old = Stretch::new(std::fs::File::open(&file).unwrap(), 4);
        let mut w = writer();
        old.keep(len(a));
        assert!(old.pass(len(b), &mut w).unwrap());
        old.keep(len(c));
        assert!(old.copy(&mut w).unwrap());
        assert_eq!((w.take_entries(), w.entries()), (format!("{a}{c}"), 2));

        // Lengths that cut the entries elsewhere than where they end.
        let mut old = Stretch::new(std::fs::File::open(&file).unwrap(), 4);
        let mut w = writer();
        old.keep(len(a) + 3);
        old.keep(len(b) - 3);
        assert!(!old.copy(&mut w).unwrap());
        assert_eq!(w.entries(), 0);

        // A file shorter than the build remembered.
        let mut old = Stretch::new(std::fs::File::open(&file).unwrap(), 4);
        old.keep(len(a) + len(b) + len(c) + 1);
        assert!(old.copy(&mut writer()).is_err());
    }
}
