//! ZIP packages that start with their manifest. Bitstreams are packed into a scratch ZIP as
//! they are read (md5 and length measured on the way, so the manifest describes exactly the
//! bytes packed); when a package is full, its `manifest.xml` is written as the first entry of
//! the final ZIP and the packed entries follow, copied without being compressed again. Memory
//! holds one package's manifest entries (at most 50,000), never a bitstream.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use md5::Digest;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipArchive, ZipWriter};

use crate::config::DumpCompression;
use crate::model::{ChangeType, Timestamp};
use crate::sitemap::{Ln, Md, Root, SitemapWriter};

/// How packages are cut and packed.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub max_bytes: u64,
    pub max_entries: usize,
    pub compression: DumpCompression,
    pub level: u32,
}

/// Which manifests the packer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Resource Dump Manifests (`at`, `completed`).
    Resources,
    /// Change Dump Manifests (`from`, `until`, `change` and `datetime` per entry).
    Changes,
}

/// One manifest entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub loc: String,
    pub lastmod: Option<Timestamp>,
    pub mime: Option<String>,
    /// `None` for a deleted resource of a Change Dump (no bitstream).
    pub packed: Option<Packed>,
    pub change: Option<ChangeType>,
    pub datetime: Option<Timestamp>,
}

/// A packed bitstream: where it lies in the package, and what was packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// With a leading `/`, as the manifest says it.
    pub path: String,
    pub md5: String,
    pub length: u64,
}

/// A finished package and its manifest copy, both files in the packer's folder.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Package {
    pub zip: String,
    pub manifest: String,
    pub length: u64,
    pub entries: usize,
    pub at: Timestamp,
    pub completed: Timestamp,
    pub from: Option<Timestamp>,
    pub until: Option<Timestamp>,
}

struct Open {
    zip: ZipWriter<BufWriter<File>>,
    scratch: PathBuf,
    entries: Vec<Entry>,
    bytes: u64,
    at: Timestamp,
    from: Option<Timestamp>,
}

pub struct Packer {
    dir: PathBuf,
    opts: Options,
    kind: Kind,
    /// The Capability List (every manifest's `rel="up"`).
    up: String,
    open: Option<Open>,
    packages: Vec<Package>,
    /// Where the next package's interval starts (Change Dumps).
    next_from: Option<Timestamp>,
}

/// Reads through to `inner`, measuring what passes.
struct Measured<R> {
    inner: R,
    md5: md5::Md5,
    length: u64,
}

impl<R: Read> Read for Measured<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.md5.update(&buf[..n]);
        self.length += n as u64;
        Ok(n)
    }
}

impl Packer {
    /// Packages are written into `dir` (which exists) as `00000.zip`, `00000-manifest.xml`, …
    /// `from`: where the first package's interval starts (Change Dumps; later ones start where
    /// the one before ended).
    pub fn new(
        dir: &Path,
        opts: Options,
        kind: Kind,
        up: String,
        from: Option<Timestamp>,
    ) -> Packer {
        Packer {
            dir: dir.to_path_buf(),
            opts,
            kind,
            up,
            open: None,
            packages: Vec::new(),
            next_from: from,
        }
    }

    fn options(&self, large: bool) -> SimpleFileOptions {
        let o = SimpleFileOptions::default().large_file(large);
        match self.opts.compression {
            DumpCompression::Stored => o.compression_method(CompressionMethod::Stored),
            DumpCompression::Deflate => o
                .compression_method(CompressionMethod::Deflated)
                .compression_level(Some(self.opts.level as i64)),
        }
    }

    fn open(&mut self) -> std::io::Result<&mut Open> {
        if self.open.is_none() {
            let scratch = self
                .dir
                .join(format!(".{:05}.packing", self.packages.len()));
            let zip = ZipWriter::new(BufWriter::with_capacity(
                256 * 1024,
                File::create(&scratch)?,
            ));
            self.open = Some(Open {
                zip,
                scratch,
                entries: Vec::new(),
                bytes: 0,
                at: Timestamp::now(),
                from: self.next_from,
            });
        }
        Ok(self.open.as_mut().expect("opened"))
    }

    /// Packs one bitstream read from `body` (`size`: its expected length, for ZIP64) at
    /// `path` (without the leading `/`) and records its manifest entry.
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &mut self,
        loc: String,
        lastmod: Option<Timestamp>,
        mime: Option<String>,
        change: Option<ChangeType>,
        datetime: Option<Timestamp>,
        path: &str,
        size: u64,
        body: impl Read,
    ) -> std::io::Result<()> {
        let options = self.options(size >= u32::MAX as u64 / 2);
        let open = self.open()?;
        open.zip.start_file(path, options).map_err(zip_err)?;
        let mut m = Measured {
            inner: body,
            md5: md5::Md5::new(),
            length: 0,
        };
        std::io::copy(&mut m, &mut open.zip)?;
        open.bytes += m.length;
        open.entries.push(Entry {
            loc,
            lastmod,
            mime,
            packed: Some(Packed {
                path: format!("/{path}"),
                md5: crate::digest::hex_digest(m.md5.finalize()),
                length: m.length,
            }),
            change,
            datetime,
        });
        Ok(())
    }

    /// Records an entry without a bitstream (a deletion in a Change Dump).
    pub fn add_without_bitstream(
        &mut self,
        loc: String,
        change: ChangeType,
        datetime: Timestamp,
    ) -> std::io::Result<()> {
        let open = self.open()?;
        open.entries.push(Entry {
            loc,
            lastmod: None,
            mime: None,
            packed: None,
            change: Some(change),
            datetime: Some(datetime),
        });
        Ok(())
    }

    /// Whether the open package has reached its size or entry limit.
    pub fn is_full(&self) -> bool {
        self.open.as_ref().is_some_and(|o| {
            o.entries.len() >= self.opts.max_entries || o.bytes >= self.opts.max_bytes
        })
    }

    /// Closes the open package (`until`: where its interval ends, for Change Dumps).
    pub fn close(&mut self, until: Option<Timestamp>) -> std::io::Result<()> {
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        self.next_from = until;
        let completed = Timestamp::now();
        let n = self.packages.len();
        let zip_name = format!("{n:05}.zip");
        let manifest_name = format!("{n:05}-manifest.xml");
        let manifest = self.manifest(&open, completed, until);
        open.zip.finish().map_err(zip_err)?.flush()?;
        let final_tmp = self.dir.join(format!(".{zip_name}.tmp"));
        {
            let mut packed = ZipArchive::new(File::open(&open.scratch)?).map_err(zip_err)?;
            let mut out = ZipWriter::new(BufWriter::with_capacity(
                256 * 1024,
                File::create(&final_tmp)?,
            ));
            out.start_file("manifest.xml", self.options(false))
                .map_err(zip_err)?;
            out.write_all(manifest.as_bytes())?;
            for i in 0..packed.len() {
                out.raw_copy_file(packed.by_index_raw(i).map_err(zip_err)?)
                    .map_err(zip_err)?;
            }
            let mut f = out.finish().map_err(zip_err)?;
            f.flush()?;
            f.get_ref().sync_all()?;
        }
        std::fs::remove_file(&open.scratch)?;
        std::fs::write(self.dir.join(&manifest_name), manifest.as_bytes())?;
        std::fs::rename(&final_tmp, self.dir.join(&zip_name))?;
        let length = std::fs::metadata(self.dir.join(&zip_name))?.len();
        self.packages.push(Package {
            zip: zip_name,
            manifest: manifest_name,
            length,
            entries: open.entries.len(),
            at: open.at,
            completed,
            from: open.from,
            until,
        });
        Ok(())
    }

    fn manifest(&self, open: &Open, completed: Timestamp, until: Option<Timestamp>) -> String {
        let md = match self.kind {
            Kind::Resources => Md {
                capability: Some("resourcedump-manifest"),
                at: Some(open.at),
                completed: Some(completed),
                ..Md::default()
            },
            Kind::Changes => Md {
                capability: Some("changedump-manifest"),
                from: open.from,
                until,
                ..Md::default()
            },
        };
        let mut w = SitemapWriter::with_capacity(
            Root::Urlset,
            &md,
            &[Ln {
                rel: "up",
                href: &self.up,
                mime: None,
            }],
            open.entries.len() * 256,
        );
        for e in &open.entries {
            let p = e.packed.as_ref();
            w.entry(
                &e.loc,
                e.lastmod,
                &Md {
                    change: e.change.map(ChangeType::as_str),
                    datetime: e.datetime,
                    md5: p.map(|p| p.md5.as_str()),
                    length: p.map(|p| p.length),
                    mime: e.mime.as_deref(),
                    path: p.map(|p| p.path.as_str()),
                    ..Md::default()
                },
                &[],
            );
        }
        w.finish()
    }

    /// Closes the last package; returns every package written, in order.
    pub fn finish(mut self, until: Option<Timestamp>) -> std::io::Result<Vec<Package>> {
        self.close(until)?;
        Ok(self.packages)
    }
}

fn zip_err(e: zip::result::ZipError) -> std::io::Error {
    std::io::Error::other(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(max_entries: usize) -> Options {
        Options {
            max_bytes: 1 << 30,
            max_entries,
            compression: DumpCompression::Deflate,
            level: 1,
        }
    }

    #[test]
    fn packages_start_with_their_manifest_and_describe_what_they_hold() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Packer::new(
            dir.path(),
            opts(2),
            Kind::Resources,
            "http://h/cap".into(),
            None,
        );
        for i in 0..3u32 {
            let body = format!("bitstream {i} ").repeat(100);
            p.add(
                format!("http://h/r/{i}"),
                None,
                Some("text/plain".into()),
                None,
                None,
                &format!("resources/r/{i}"),
                body.len() as u64,
                body.as_bytes(),
            )
            .unwrap();
            if p.is_full() {
                p.close(None).unwrap();
            }
        }
        let packages = p.finish(None).unwrap();
        assert_eq!(
            packages.iter().map(|p| p.entries).collect::<Vec<_>>(),
            [2, 1]
        );
        let mut z =
            ZipArchive::new(File::open(dir.path().join(&packages[0].zip)).unwrap()).unwrap();
        assert_eq!(z.by_index(0).unwrap().name().unwrap(), "manifest.xml");
        let mut manifest = String::new();
        z.by_index(0)
            .unwrap()
            .read_to_string(&mut manifest)
            .unwrap();
        assert_eq!(
            manifest,
            std::fs::read_to_string(dir.path().join(&packages[0].manifest)).unwrap(),
            "the copy beside the package is the manifest inside it"
        );
        let doc = crate::sitemap::parse(manifest.as_bytes()).unwrap();
        assert_eq!(doc.md["capability"], "resourcedump-manifest");
        let e = &doc.entries[1];
        assert_eq!(e.md["path"], "/resources/r/1");
        let mut body = Vec::new();
        z.by_name("resources/r/1")
            .unwrap()
            .read_to_end(&mut body)
            .unwrap();
        assert_eq!(e.md["length"], body.len().to_string());
        assert_eq!(
            e.md["hash"],
            format!("md5:{}", crate::digest::hex_digest(md5::Md5::digest(&body)))
        );
        assert!(std::fs::read_dir(dir.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with('.')));
    }
}
