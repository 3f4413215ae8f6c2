//! DPLA's `dpla.avro.v1.OriginalRecord` (Ingestion 3 storage specification, seed 004): the
//! schema with the seed's fields, the media types its `mimetype` enum can hold, and a part
//! writer that streams records into snappy-compressed Avro object container files.

use std::io::Write;

use apache_avro::types::{Record, Value};
use apache_avro::{Codec, Schema, Writer};

/// The schema's name without the `dpla.avro.` prefix, as the seed names files with it.
pub const SCHEMA_NAME: &str = "OriginalRecord.v1";

/// The seed's schema, field for field; `doc` says which software wrote the file.
pub fn schema_json() -> String {
    format!(
        r#"{{
  "namespace": "dpla.avro.v1",
  "type": "record",
  "name": "OriginalRecord",
  "doc": "Harvested from a ResourceSync source by resourcesync-hub {}",
  "fields": [
    {{"name": "id", "type": "string"}},
    {{"name": "ingestDate", "type": "long", "doc": "UNIX timestamp"}},
    {{"name": "provider", "type": "string"}},
    {{"name": "document", "type": "string"}},
    {{"name": "mimetype",
     "type": {{"name": "MimeType",
              "type": "enum",
              "symbols": ["application_json", "application_xml", "text_turtle"]}}}}
  ]
}}"#,
        env!("CARGO_PKG_VERSION")
    )
}

pub fn schema() -> Schema {
    Schema::parse_str(&schema_json()).expect("the OriginalRecord schema parses")
}

/// The `MimeType` symbol of a resource's media type (parameters ignored), or `None` when the
/// enum cannot hold it: JSON, XML and Turtle, with their usual aliases.
pub fn mime_symbol(media_type: &str) -> Option<&'static str> {
    let t = media_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match t.as_str() {
        "application/json" | "text/json" | "application/ld+json" => Some("application_json"),
        "application/xml" | "text/xml" => Some("application_xml"),
        "text/turtle" | "application/x-turtle" | "application/turtle" => Some("text_turtle"),
        _ if t.starts_with("application/") && t.ends_with("+json") => Some("application_json"),
        _ if t.starts_with("application/") && t.ends_with("+xml") => Some("application_xml"),
        _ => None,
    }
}

/// The `MimeType` enum's symbols, in order.
pub const SYMBOLS: [&str; 3] = ["application_json", "application_xml", "text_turtle"];

/// One harvested record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginalRecord {
    /// The resource's URI.
    pub id: String,
    /// UNIX time (seconds) of the start of the harvest.
    pub ingest_date: i64,
    pub provider: String,
    pub document: String,
    /// A [`mime_symbol`].
    pub mimetype: &'static str,
}

/// Writes records into one Avro file (snappy), as they come.
pub struct PartWriter<'s, W: Write> {
    writer: Writer<'s, W>,
    schema: &'s Schema,
    pub records: u64,
}

impl<'s, W: Write> PartWriter<'s, W> {
    pub fn new(schema: &'s Schema, out: W) -> anyhow::Result<PartWriter<'s, W>> {
        Ok(PartWriter {
            writer: Writer::with_codec(schema, out, Codec::Snappy)?,
            schema,
            records: 0,
        })
    }

    pub fn append(&mut self, r: &OriginalRecord) -> anyhow::Result<()> {
        let mut rec = Record::new(self.schema).expect("a record schema");
        rec.put("id", r.id.as_str());
        rec.put("ingestDate", Value::Long(r.ingest_date));
        rec.put("provider", r.provider.as_str());
        rec.put("document", r.document.as_str());
        let index = SYMBOLS
            .iter()
            .position(|s| *s == r.mimetype)
            .ok_or_else(|| anyhow::anyhow!("{:?} is not a MimeType symbol", r.mimetype))?;
        rec.put(
            "mimetype",
            Value::Enum(index as u32, r.mimetype.to_string()),
        );
        self.writer.append_value(rec)?;
        self.records += 1;
        Ok(())
    }

    /// Bytes handed to the output so far (blocks are flushed as they fill), for cutting
    /// files at a size.
    pub fn flush(&mut self) -> anyhow::Result<()> {
        self.writer.flush()?;
        Ok(())
    }

    /// Flushes the last block and gives the output back.
    pub fn finish(self) -> anyhow::Result<W> {
        Ok(self.writer.into_inner()?)
    }
}

/// Every record of an Avro file.
pub fn read_all(input: impl std::io::Read) -> anyhow::Result<Vec<OriginalRecord>> {
    let mut out = Vec::new();
    for_each(input, |r| {
        out.push(r);
        Ok(())
    })?;
    Ok(out)
}

/// Streams the records of an Avro file through `f` (memory bounded by one block).
pub fn for_each(
    input: impl std::io::Read,
    mut f: impl FnMut(OriginalRecord) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let reader = apache_avro::Reader::new(input)?;
    for v in reader {
        let Value::Record(fields) = v? else {
            anyhow::bail!("not a record");
        };
        let mut r = OriginalRecord {
            id: String::new(),
            ingest_date: 0,
            provider: String::new(),
            document: String::new(),
            mimetype: SYMBOLS[0],
        };
        for (name, value) in fields {
            match (name.as_str(), value) {
                ("id", Value::String(s)) => r.id = s,
                ("ingestDate", Value::Long(n)) => r.ingest_date = n,
                ("provider", Value::String(s)) => r.provider = s,
                ("document", Value::String(s)) => r.document = s,
                ("mimetype", Value::Enum(i, _)) => {
                    r.mimetype = SYMBOLS
                        .get(i as usize)
                        .ok_or_else(|| anyhow::anyhow!("MimeType symbol {i}"))?
                }
                (n, v) => anyhow::bail!("unexpected field {n}: {v:?}"),
            }
        }
        f(r)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_map_to_the_enum_or_are_refused() {
        assert_eq!(
            mime_symbol("text/xml; charset=utf-8"),
            Some("application_xml")
        );
        assert_eq!(mime_symbol("application/ld+json"), Some("application_json"));
        assert_eq!(mime_symbol("application/rdf+xml"), Some("application_xml"));
        assert_eq!(mime_symbol("text/turtle"), Some("text_turtle"));
        assert_eq!(mime_symbol("application/pdf"), None);
        assert_eq!(mime_symbol("text/plain"), None);
    }

    #[test]
    fn records_round_trip_through_a_snappy_file_with_the_seed_schema() {
        let schema = schema();
        let mut w = PartWriter::new(&schema, Vec::new()).unwrap();
        let recs: Vec<OriginalRecord> = (0..1000)
            .map(|i| OriginalRecord {
                id: format!("http://example.org/r/{i}"),
                ingest_date: 1_700_000_000,
                provider: "cdl".into(),
                document: format!("<record n=\"{i}\"/>"),
                mimetype: if i % 2 == 0 {
                    "application_xml"
                } else {
                    "text_turtle"
                },
            })
            .collect();
        for r in &recs {
            w.append(r).unwrap();
        }
        let bytes = w.finish().unwrap();
        let reader = apache_avro::Reader::new(&bytes[..]).unwrap();
        let parsed: serde_json::Value =
            serde_json::from_str(&reader.writer_schema().canonical_form()).unwrap();
        assert_eq!(parsed["name"], "dpla.avro.v1.OriginalRecord");
        let names: Vec<&str> = parsed["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["id", "ingestDate", "provider", "document", "mimetype"]
        );
        assert_eq!(read_all(&bytes[..]).unwrap(), recs);
        assert!(
            bytes.windows(6).any(|w| w == b"snappy"),
            "the codec is recorded in the header"
        );
    }
}
