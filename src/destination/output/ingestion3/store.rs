//! Where the archive lives, through the `object_store` crate: a local folder, or S3 (any
//! S3-compatible server). The output's calls are blocking (made off the async threads), so
//! each operation runs on the runtime the harvester started with.

use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use apache_avro::types::{Record, Value};
use futures_util::TryStreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::destination::config::OutputSection;

pub struct Archive {
    store: Arc<dyn ObjectStore>,
    /// Key prefix inside the store (the part of `s3://bucket/prefix` after the bucket).
    prefix: String,
    rt: tokio::runtime::Handle,
    /// For messages: the configured root.
    root: String,
}

impl Archive {
    pub fn open(cfg: &OutputSection) -> anyhow::Result<Archive> {
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| anyhow::anyhow!("the ingestion3 output needs the tokio runtime"))?;
        let (store, prefix): (Arc<dyn ObjectStore>, String) =
            if let Some(rest) = cfg.root.strip_prefix("s3://") {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    anyhow::bail!("output.root {:?} names no bucket", cfg.root);
                }
                let mut b = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_region(&cfg.s3_region)
                    .with_virtual_hosted_style_request(!cfg.s3_path_style);
                if !cfg.s3_endpoint.is_empty() {
                    b = b
                        .with_endpoint(&cfg.s3_endpoint)
                        .with_allow_http(cfg.s3_endpoint.starts_with("http://"));
                }
                let s3 = b
                    .build()
                    .with_context(|| format!("output.root {:?}", cfg.root))?;
                (Arc::new(s3), prefix.trim_matches('/').to_string())
            } else {
                std::fs::create_dir_all(&cfg.root)
                    .with_context(|| format!("cannot create output.root {}", cfg.root))?;
                let local = object_store::local::LocalFileSystem::new_with_prefix(&cfg.root)?
                    .with_automatic_cleanup(true);
                (Arc::new(local), String::new())
            };
        Ok(Archive {
            store,
            prefix,
            rt,
            root: cfg.root.clone(),
        })
    }

    fn key(&self, path: &str) -> ObjPath {
        if self.prefix.is_empty() {
            ObjPath::from(path)
        } else {
            ObjPath::from(format!("{}/{path}", self.prefix))
        }
    }

    fn relative(&self, key: &ObjPath) -> String {
        let k = key.as_ref();
        if self.prefix.is_empty() {
            k.to_string()
        } else {
            k.strip_prefix(&format!("{}/", self.prefix))
                .unwrap_or(k)
                .to_string()
        }
    }

    fn context(
        &self,
        what: &str,
        path: &str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> anyhow::Error {
        anyhow::Error::new(e).context(format!("{what} {path} in {}", self.root))
    }

    /// Writes a small object whole (atomically: it appears complete or not at all).
    pub fn put_bytes(&self, path: &str, bytes: Vec<u8>) -> anyhow::Result<()> {
        self.rt
            .block_on(self.store.put(&self.key(path), bytes.into()))
            .map_err(|e| self.context("cannot write", path, e))?;
        Ok(())
    }

    /// Uploads a local file, in parts when it is large (multipart on S3).
    pub fn put_file(&self, path: &str, local: &Path) -> anyhow::Result<()> {
        let key = self.key(path);
        self.rt
            .block_on(async {
                let mut w = object_store::buffered::BufWriter::new(self.store.clone(), key);
                let mut f = tokio::fs::File::open(local).await?;
                tokio::io::copy(&mut f, &mut w).await?;
                tokio::io::AsyncWriteExt::shutdown(&mut w).await
            })
            .map_err(|e| self.context("cannot write", path, e))
    }

    /// Every object under `prefix` (paths relative to the archive root), sorted.
    pub fn list(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        let key = self.key(prefix);
        let mut out: Vec<String> = self
            .rt
            .block_on(self.store.list(Some(&key)).try_collect::<Vec<_>>())
            .map_err(|e| self.context("cannot list", prefix, e))?
            .into_iter()
            .map(|m| self.relative(&m.location))
            .collect();
        out.sort();
        Ok(out)
    }

    /// Whether an object exists.
    pub fn exists(&self, path: &str) -> anyhow::Result<bool> {
        match self.rt.block_on(self.store.head(&self.key(path))) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.context("cannot read", path, e)),
        }
    }

    /// Downloads an object into a new file in `dir`.
    pub fn fetch_to(&self, path: &str, dir: &Path) -> anyhow::Result<PathBuf> {
        let (file, local) = tempfile::NamedTempFile::new_in(dir)?.keep()?;
        let mut file = tokio::fs::File::from_std(file);
        self.rt
            .block_on(async {
                let got = self.store.get(&self.key(path)).await?;
                let mut stream = got.into_stream();
                while let Some(chunk) = stream.try_next().await? {
                    tokio::io::AsyncWriteExt::write_all(&mut file, &chunk)
                        .await
                        .map_err(|e| object_store::Error::Generic {
                            store: "local",
                            source: Box::new(e),
                        })?;
                }
                tokio::io::AsyncWriteExt::flush(&mut file)
                    .await
                    .map_err(|e| object_store::Error::Generic {
                        store: "local",
                        source: Box::new(e),
                    })?;
                Ok::<_, object_store::Error>(())
            })
            .map_err(|e| self.context("cannot read", path, e))?;
        Ok(local)
    }

    /// Removes every object under `prefix`.
    pub fn delete_prefix(&self, prefix: &str) -> anyhow::Result<()> {
        for p in self.list(prefix)? {
            self.rt
                .block_on(self.store.delete(&self.key(&p)))
                .map_err(|e| self.context("cannot delete", &p, e))?;
        }
        Ok(())
    }
}

/// One journaled change, as exported to `<provider>/journal/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    pub seq: i64,
    /// Microseconds since the epoch.
    pub at: i64,
    /// `upsert` or `delete`.
    pub op: String,
    pub id: String,
    pub mimetype: Option<String>,
    pub document: Option<String>,
}

const JOURNAL_SCHEMA: &str = r#"{
  "namespace": "rshub", "type": "record", "name": "JournalEntry",
  "doc": "A change applied by resourcesync-hub harvest to an Ingestion 3 archive",
  "fields": [
    {"name": "seq", "type": "long"},
    {"name": "at", "type": "long", "doc": "microseconds since the epoch"},
    {"name": "op", "type": "string", "doc": "upsert or delete"},
    {"name": "id", "type": "string"},
    {"name": "mimetype", "type": ["null", "string"]},
    {"name": "document", "type": ["null", "string"]}
  ]
}"#;

fn opt(v: &Option<String>) -> Value {
    match v {
        Some(s) => Value::Union(1, Box::new(Value::String(s.clone()))),
        None => Value::Union(0, Box::new(Value::Null)),
    }
}

/// A journal segment: the entries as one snappy Avro file.
pub fn journal_segment(rows: &[JournalEntry]) -> anyhow::Result<Vec<u8>> {
    let schema = apache_avro::Schema::parse_str(JOURNAL_SCHEMA)?;
    let mut w = apache_avro::Writer::with_codec(&schema, Vec::new(), apache_avro::Codec::Snappy)?;
    for r in rows {
        let mut rec = Record::new(&schema).expect("a record schema");
        rec.put("seq", Value::Long(r.seq));
        rec.put("at", Value::Long(r.at));
        rec.put("op", r.op.as_str());
        rec.put("id", r.id.as_str());
        rec.put("mimetype", opt(&r.mimetype));
        rec.put("document", opt(&r.document));
        w.append_value(rec)?;
    }
    Ok(w.into_inner()?)
}

/// The entries of a journal segment.
pub fn read_journal(input: impl std::io::Read) -> anyhow::Result<Vec<JournalEntry>> {
    let mut out = Vec::new();
    for v in apache_avro::Reader::new(input)? {
        let Value::Record(fields) = v? else {
            anyhow::bail!("not a journal record");
        };
        let mut e = JournalEntry {
            seq: 0,
            at: 0,
            op: String::new(),
            id: String::new(),
            mimetype: None,
            document: None,
        };
        for (name, value) in fields {
            let value = match value {
                Value::Union(_, v) => *v,
                v => v,
            };
            match (name.as_str(), value) {
                ("seq", Value::Long(n)) => e.seq = n,
                ("at", Value::Long(n)) => e.at = n,
                ("op", Value::String(s)) => e.op = s,
                ("id", Value::String(s)) => e.id = s,
                ("mimetype", Value::String(s)) => e.mimetype = Some(s),
                ("document", Value::String(s)) => e.document = Some(s),
                (_, Value::Null) => {}
                (n, v) => anyhow::bail!("unexpected journal field {n}: {v:?}"),
            }
        }
        out.push(e);
    }
    Ok(out)
}
