//! The dump package format, for its builder ([`Packer`], driven by the dumps module) and for
//! readers (the destination's unpacker): a ZIP whose first member is [`MANIFEST`], a Resource
//! Dump or Change Dump Manifest whose entries name their member by `path` (the member's name
//! with a leading `/`, see [`member_name`]) and give the `length` and md5 `hash` of exactly
//! the member's bytes.
//!
//! Building: bitstreams are packed into a scratch ZIP as
//! they are read (md5 and length measured on the way, so the manifest describes exactly the
//! bytes packed); when a package is full, its `manifest.xml` is written as the first entry of
//! the final ZIP and the packed entries follow, each lane's copied in one piece, not compressed again. Memory
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

/// The name of a package's first member, its manifest.
pub const MANIFEST: &str = "manifest.xml";

/// The ZIP member a manifest entry's `path` names (the path without its leading `/`;
/// resync-build writes it without one, which names the same member). `None` for a path that
/// names no member (empty, or a folder).
pub fn member_name(path: &str) -> Option<&str> {
    let m = path.strip_prefix('/').unwrap_or(path);
    (!m.is_empty() && !m.ends_with('/')).then_some(m)
}

/// A package's manifest, read whole but never more than `max_bytes`: an error says what is
/// wrong (not a ZIP, no manifest, too large).
pub fn read_manifest<R: Read + std::io::Seek>(
    z: &mut ZipArchive<R>,
    max_bytes: u64,
) -> std::io::Result<Vec<u8>> {
    let mut manifest = Vec::new();
    z.by_name(MANIFEST)
        .map_err(|e| std::io::Error::other(format!("a package without {MANIFEST}: {e}")))?
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut manifest)?;
    if manifest.len() as u64 > max_bytes {
        return Err(std::io::Error::other(format!(
            "the package's {MANIFEST} is larger than the {max_bytes} bytes a document may have"
        )));
    }
    Ok(manifest)
}

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
    entries: Vec<Entry>,
    /// Per entry with a bitstream: (lane, index in that lane's scratch ZIP).
    placed: Vec<Option<(usize, usize)>>,
    /// Jobs sent to each lane for this package.
    sent: Vec<usize>,
    bytes: u64,
    at: Timestamp,
    from: Option<Timestamp>,
}

/// Work for a lane: pack a bitstream, or finish the package's scratch ZIP.
enum Job {
    Add {
        package: usize,
        path: String,
        body: Body,
        /// Packed as it is: the bitstream is already compressed.
        stored: bool,
    },
    Close(std::sync::mpsc::Sender<std::io::Result<(PathBuf, Vec<Packed>)>>),
}

/// A bitstream to pack.
pub struct Body {
    pub reader: Box<dyn Read + Send>,
    /// Its expected length.
    pub size: u64,
    /// Its md5 when already known for exactly these bytes (the store's, for a file not
    /// modified since it was recorded, with the recorded length): not computed again.
    pub md5: Option<String>,
}

/// Whether a bitstream of this media type (or, without one, with this name) is already
/// compressed: deflating it again costs a core and saves nothing, so it is stored.
pub fn already_compressed(mime: Option<&str>, name: &str) -> bool {
    let guessed;
    let mime = match mime {
        Some(m) => m,
        None => {
            guessed = mime_guess::from_path(name).first_raw().unwrap_or("");
            guessed
        }
    };
    let mime = mime
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let (kind, sub) = mime.split_once('/').unwrap_or((mime.as_str(), ""));
    match kind {
        "video" => true,
        "audio" => !matches!(sub, "wav" | "x-wav" | "aiff" | "x-aiff" | "basic"),
        "image" => !matches!(
            sub,
            "bmp" | "x-ms-bmp" | "tiff" | "svg+xml" | "x-portable-pixmap"
        ),
        "application" => {
            matches!(
                sub,
                "pdf"
                    | "zip"
                    | "gzip"
                    | "x-gzip"
                    | "x-bzip2"
                    | "x-xz"
                    | "zstd"
                    | "x-7z-compressed"
                    | "x-rar-compressed"
                    | "vnd.rar"
                    | "epub+zip"
                    | "java-archive"
            ) || sub.starts_with("vnd.openxmlformats-officedocument.")
                || sub.starts_with("vnd.oasis.opendocument.")
        }
        _ => false,
    }
}

/// A thread compressing and hashing bitstreams into a scratch ZIP of its own, so that a
/// package is packed on every core.
struct Lane {
    tx: std::sync::mpsc::SyncSender<Job>,
    thread: std::thread::JoinHandle<()>,
}

fn lane_loop(
    rx: std::sync::mpsc::Receiver<Job>,
    dir: PathBuf,
    lane: usize,
    options: impl Fn(bool, bool) -> SimpleFileOptions,
) {
    let mut zip: Option<ZipWriter<BufWriter<File>>> = None;
    let mut scratch = PathBuf::new();
    let mut packed: Vec<Packed> = Vec::new();
    let mut failed: Option<std::io::Error> = None;
    while let Ok(job) = rx.recv() {
        match job {
            Job::Add {
                package,
                path,
                body,
                stored,
            } => {
                if failed.is_some() {
                    continue;
                }
                let r = (|| -> std::io::Result<Packed> {
                    if zip.is_none() {
                        // One scratch file per package: the last one may still be assembled.
                        scratch = scratch_path(&dir, lane, package);
                        zip = Some(ZipWriter::new(BufWriter::with_capacity(
                            256 * 1024,
                            File::create(&scratch)?,
                        )));
                    }
                    let z = zip.as_mut().expect("opened");
                    let large = body.size >= u32::MAX as u64 / 2;
                    z.start_file(path.as_str(), options(large, stored))
                        .map_err(zip_err)?;
                    let mut m = Measured {
                        inner: body.reader,
                        md5: body.md5.is_none().then(md5::Md5::new),
                        length: 0,
                    };
                    std::io::copy(&mut m, z)?;
                    let md5 = match (m.md5, body.md5) {
                        (Some(h), _) => crate::digest::hex_digest(h.finalize()),
                        (None, known) => known.expect("either known or measured"),
                    };
                    Ok(Packed {
                        path: format!("/{path}"),
                        md5,
                        length: m.length,
                    })
                })();
                match r {
                    Ok(p) => packed.push(p),
                    Err(e) => failed = Some(e),
                }
            }
            Job::Close(reply) => {
                let r = match failed.take() {
                    Some(e) => Err(e),
                    None => (|| {
                        if let Some(z) = zip.take() {
                            z.finish().map_err(zip_err)?.flush()?;
                        }
                        Ok((scratch.clone(), std::mem::take(&mut packed)))
                    })(),
                };
                zip = None;
                packed.clear();
                let _ = reply.send(r);
            }
        }
    }
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
    lanes: Vec<Lane>,
    next_lane: usize,
    /// The package being assembled (manifest + raw copies) while the lanes pack the next.
    assembling: Option<std::thread::JoinHandle<std::io::Result<Package>>>,
}

/// Reads through to `inner`, measuring what passes (its md5 unless already known).
struct Measured<R> {
    inner: R,
    md5: Option<md5::Md5>,
    length: u64,
}

impl<R: Read> Read for Measured<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(h) = &mut self.md5 {
            h.update(&buf[..n]);
        }
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
        let n = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(1, 4));
        let lanes = (0..n)
            .map(|i| {
                let (tx, rx) = std::sync::mpsc::sync_channel(32);
                let dir = dir.to_path_buf();
                let thread = std::thread::Builder::new()
                    .name(format!("dump-lane-{i}"))
                    .spawn(move || {
                        lane_loop(rx, dir, i, move |large, stored| {
                            file_options(opts, large, stored)
                        })
                    })
                    .expect("a dump packing thread");
                Lane { tx, thread }
            })
            .collect();
        Packer {
            dir: dir.to_path_buf(),
            opts,
            kind,
            up,
            open: None,
            packages: Vec::new(),
            next_from: from,
            lanes,
            next_lane: 0,
            assembling: None,
        }
    }

    fn open(&mut self) -> &mut Open {
        if self.open.is_none() {
            self.open = Some(Open {
                entries: Vec::new(),
                placed: Vec::new(),
                sent: vec![0; self.lanes.len()],
                bytes: 0,
                at: Timestamp::now(),
                from: self.next_from,
            });
        }
        self.open.as_mut().expect("opened")
    }

    /// Packs one bitstream read from `body` at `path` (without the leading `/`) and records
    /// its manifest entry. The bitstream is read, hashed (unless its md5 is known) and
    /// compressed (unless it already is, see [`already_compressed`]) by one of the packing
    /// lanes.
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &mut self,
        loc: String,
        lastmod: Option<Timestamp>,
        mime: Option<String>,
        change: Option<ChangeType>,
        datetime: Option<Timestamp>,
        path: &str,
        body: Body,
    ) -> std::io::Result<()> {
        let size = body.size;
        let stored = already_compressed(mime.as_deref(), path);
        let lane = self.next_lane;
        self.next_lane = (lane + 1) % self.lanes.len();
        self.lanes[lane]
            .tx
            .send(Job::Add {
                package: self.package_no(),
                path: path.to_string(),
                body,
                stored,
            })
            .map_err(|_| std::io::Error::other("a dump packing thread stopped"))?;
        let open = self.open();
        let index = open.sent[lane];
        open.sent[lane] += 1;
        open.bytes += size;
        open.entries.push(Entry {
            loc,
            lastmod,
            mime,
            packed: None,
            change,
            datetime,
        });
        open.placed.push(Some((lane, index)));
        Ok(())
    }

    /// Records an entry without a bitstream (a deletion in a Change Dump).
    pub fn add_without_bitstream(
        &mut self,
        loc: String,
        change: ChangeType,
        datetime: Timestamp,
    ) -> std::io::Result<()> {
        let open = self.open();
        open.entries.push(Entry {
            loc,
            lastmod: None,
            mime: None,
            packed: None,
            change: Some(change),
            datetime: Some(datetime),
        });
        open.placed.push(None);
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
        let Some(mut open) = self.open.take() else {
            return Ok(());
        };
        self.next_from = until;
        // Each lane finishes its scratch ZIP and tells what it packed, in order.
        let mut scratch: Vec<Option<(PathBuf, Vec<Packed>)>> = Vec::new();
        let mut first_error = None;
        for (i, lane) in self.lanes.iter().enumerate() {
            if open.sent[i] == 0 {
                scratch.push(None);
                continue;
            }
            let (tx, rx) = std::sync::mpsc::channel();
            let got = lane
                .tx
                .send(Job::Close(tx))
                .ok()
                .and_then(|_| rx.recv().ok())
                .unwrap_or_else(|| Err(std::io::Error::other("a dump packing thread stopped")));
            match got {
                Ok(s) => scratch.push(Some(s)),
                Err(e) => {
                    first_error.get_or_insert(e);
                    scratch.push(None);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        for (e, placed) in open.entries.iter_mut().zip(&open.placed) {
            if let Some((lane, index)) = placed {
                e.packed = scratch[*lane]
                    .as_ref()
                    .and_then(|s| s.1.get(*index))
                    .cloned();
            }
        }
        let completed = Timestamp::now();
        let n = self.package_no();
        let manifest = self.manifest(&open, completed, until);
        let (dir, opts) = (self.dir.clone(), self.opts);
        // At most one package assembles while the next is packed (bounded disk and threads).
        self.collect_assembled()?;
        self.assembling = Some(std::thread::spawn(move || {
            assemble(&dir, opts, n, &manifest, &open, &scratch, completed, until)
        }));
        Ok(())
    }

    /// The number of the package being packed now.
    fn package_no(&self) -> usize {
        self.packages.len() + self.assembling.is_some() as usize
    }

    /// Waits for the package being assembled, if any.
    fn collect_assembled(&mut self) -> std::io::Result<()> {
        let Some(t) = self.assembling.take() else {
            return Ok(());
        };
        let p = t
            .join()
            .map_err(|_| std::io::Error::other("a dump assembly thread panicked"))??;
        self.packages.push(p);
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
        self.collect_assembled()?;
        let packages = std::mem::take(&mut self.packages);
        self.stop_lanes();
        Ok(packages)
    }

    fn stop_lanes(&mut self) {
        for lane in self.lanes.drain(..) {
            drop(lane.tx);
            let _ = lane.thread.join();
        }
    }
}

impl Drop for Packer {
    /// A build abandoned midway: the lanes stop and their scratch files go.
    fn drop(&mut self) {
        self.stop_lanes();
        if let Some(t) = self.assembling.take() {
            let _ = t.join();
        }
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().ends_with(".packing") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

fn scratch_path(dir: &Path, lane: usize, package: usize) -> PathBuf {
    dir.join(format!(".lane-{lane}-{package:05}.packing"))
}

/// Writes package `n`: its manifest first, then each lane's packed entries, copied in one
/// piece per lane (not compressed again; members need not follow the manifest's order);
/// the manifest copy beside it.
#[allow(clippy::too_many_arguments)]
fn assemble(
    dir: &Path,
    opts: Options,
    n: usize,
    manifest: &str,
    open: &Open,
    scratch: &[Option<(PathBuf, Vec<Packed>)>],
    completed: Timestamp,
    until: Option<Timestamp>,
) -> std::io::Result<Package> {
    let zip_name = format!("{n:05}.zip");
    let manifest_name = format!("{n:05}-manifest.xml");
    let final_tmp = dir.join(format!(".{zip_name}.tmp"));
    {
        let mut archives: Vec<Option<ZipArchive<File>>> = Vec::new();
        for s in scratch {
            archives.push(match s {
                Some((p, _)) => Some(ZipArchive::new(File::open(p)?).map_err(zip_err)?),
                None => None,
            });
        }
        let mut out = ZipWriter::new(BufWriter::with_capacity(
            256 * 1024,
            File::create(&final_tmp)?,
        ));
        out.start_file(MANIFEST, file_options(opts, false, false))
            .map_err(zip_err)?;
        out.write_all(manifest.as_bytes())?;
        // Each lane's entries in one copy (members need not be in the manifest's order;
        // copied one by one they cost a seek and two small reads each, a fifth of the build).
        for a in archives.into_iter().flatten() {
            out.merge_archive(a).map_err(zip_err)?;
        }
        let mut f = out.finish().map_err(zip_err)?;
        f.flush()?;
        f.get_ref().sync_all()?;
    }
    for (p, _) in scratch.iter().flatten() {
        std::fs::remove_file(p)?;
    }
    std::fs::write(dir.join(&manifest_name), manifest.as_bytes())?;
    std::fs::rename(&final_tmp, dir.join(&zip_name))?;
    let length = std::fs::metadata(dir.join(&zip_name))?.len();
    Ok(Package {
        zip: zip_name,
        manifest: manifest_name,
        length,
        entries: open.entries.len(),
        at: open.at,
        completed,
        from: open.from,
        until,
    })
}

fn file_options(opts: Options, large: bool, stored: bool) -> SimpleFileOptions {
    let o = SimpleFileOptions::default().large_file(large);
    match opts.compression {
        _ if stored => o.compression_method(CompressionMethod::Stored),
        DumpCompression::Stored => o.compression_method(CompressionMethod::Stored),
        DumpCompression::Deflate => o
            .compression_method(CompressionMethod::Deflated)
            .compression_level(Some(opts.level as i64)),
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
                Body {
                    size: body.len() as u64,
                    reader: Box::new(std::io::Cursor::new(body.into_bytes())),
                    md5: None,
                },
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

    /// Compressed media go in as they are and text is deflated; an md5 handed in (the
    /// store's) is the manifest's, one not handed in is measured.
    #[test]
    fn compressed_media_are_stored_and_a_known_md5_is_not_computed_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Packer::new(
            dir.path(),
            opts(10),
            Kind::Resources,
            "http://h/cap".into(),
            None,
        );
        let text = "plain text that deflates well ".repeat(100);
        let items: [(&str, Option<&str>, Option<&str>); 3] = [
            (
                "resources/a.pdf",
                Some("application/pdf"),
                Some("0123456789abcdef0123456789abcdef"),
            ),
            ("resources/b.txt", Some("text/plain"), None),
            ("resources/c.jpg", None, None),
        ];
        for (path, mime, md5) in items {
            p.add(
                format!("http://h/{path}"),
                None,
                mime.map(String::from),
                None,
                None,
                path,
                Body {
                    size: text.len() as u64,
                    reader: Box::new(std::io::Cursor::new(text.clone().into_bytes())),
                    md5: md5.map(String::from),
                },
            )
            .unwrap();
        }
        let packages = p.finish(None).unwrap();
        let mut z =
            ZipArchive::new(File::open(dir.path().join(&packages[0].zip)).unwrap()).unwrap();
        let method = |z: &mut ZipArchive<File>, name: &str| z.by_name(name).unwrap().compression();
        assert_eq!(method(&mut z, "resources/a.pdf"), CompressionMethod::Stored);
        assert_eq!(
            method(&mut z, "resources/c.jpg"),
            CompressionMethod::Stored,
            "by its name"
        );
        assert_eq!(
            method(&mut z, "resources/b.txt"),
            CompressionMethod::Deflated
        );
        let mut manifest = String::new();
        z.by_index(0)
            .unwrap()
            .read_to_string(&mut manifest)
            .unwrap();
        let doc = crate::sitemap::parse(manifest.as_bytes()).unwrap();
        let hash = |path: &str| {
            doc.entries
                .iter()
                .find(|e| e.md["path"] == path)
                .map(|e| e.md["hash"].clone())
                .unwrap()
        };
        assert_eq!(
            hash("/resources/a.pdf"),
            "md5:0123456789abcdef0123456789abcdef"
        );
        assert_eq!(
            hash("/resources/b.txt"),
            format!(
                "md5:{}",
                crate::digest::hex_digest(md5::Md5::digest(text.as_bytes()))
            )
        );
        assert!(!already_compressed(Some("text/xml; charset=utf-8"), "x"));
        assert!(already_compressed(Some("Application/Zip"), "x"));
        assert!(already_compressed(
            Some("application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
            "x"
        ));
        assert!(!already_compressed(Some("image/tiff"), "x.tif"));
    }

    #[test]
    fn a_manifest_path_names_one_member_with_or_without_its_slash() {
        assert_eq!(member_name("/resources/a/b.txt"), Some("resources/a/b.txt"));
        assert_eq!(member_name("resources/a/b.txt"), Some("resources/a/b.txt"));
        assert_eq!(member_name("/"), None);
        assert_eq!(member_name(""), None);
        assert_eq!(member_name("/resources/"), None);
    }
}
