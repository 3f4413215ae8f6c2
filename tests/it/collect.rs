//! The collector against a real OAI-PMH repository nobody here wrote: PyPI `oaipmh`'s
//! BatchingServer (`tests/tools/oai_server.py`) serving a JSON fixture.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use resourcesync_hub::collect::oai::{self, DeletedRecord, Granularity, OaiError};

use crate::support::PyEnv;

/// The fixture repository, running until dropped.
pub struct OaiServer {
    child: Child,
    pub base: String,
    _fixture: tempfile::NamedTempFile,
}

impl OaiServer {
    pub fn start(fixture: &serde_json::Value, batch: usize) -> OaiServer {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), fixture.to_string()).unwrap();
        let mut child = Command::new(PyEnv::get().python())
            .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/oai_server.py"))
            .arg(file.path())
            .args(["--batch", &batch.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = serde_json::from_str::<serde_json::Value>(&line)
            .unwrap_or_else(|e| panic!("oai_server.py did not start: {e}: {line:?}"))["port"]
            .clone();
        OaiServer {
            child,
            base: format!("http://127.0.0.1:{port}/oai"),
            _fixture: file,
        }
    }
}

impl Drop for OaiServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `n` records `oai:test:K`, one second apart; every seventh deleted; sets `even`/`odd`.
pub fn fixture(n: usize) -> serde_json::Value {
    let records: Vec<serde_json::Value> = (0..n)
        .map(|k| {
            serde_json::json!({
                "id": format!("oai:test:{k}"),
                "datestamp": format!("2026-11-01T00:{:02}:{:02}Z", k / 60, k % 60),
                "sets": [if k % 2 == 0 { "even" } else { "odd" }],
                "deleted": k % 7 == 6,
                "dc": {"title": [format!("Record {k} & co")], "creator": ["A. Author"]},
            })
        })
        .collect();
    serde_json::json!({
        "granularity": "YYYY-MM-DDThh:mm:ssZ",
        "deletedRecord": "persistent",
        "sets": [["even", "Even"], ["odd", "Odd"]],
        "records": records,
    })
}

/// Our reading of the peer's answers: Identify, every page of ListRecords followed by its
/// tokens (and ListIdentifiers), deletions, sets, the metadata as a standalone document, and
/// the protocol's errors.
#[tokio::test]
async fn the_reader_follows_a_real_repository_through_its_pages() {
    let repo = OaiServer::start(&fixture(25), 10);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let get = |q: String| {
        let (client, base) = (&client, &repo.base);
        async move {
            client
                .get(format!("{base}?{q}"))
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap()
        }
    };
    let id = oai::parse_identify(&get("verb=Identify".into()).await).unwrap();
    assert_eq!(
        (id.granularity, id.deleted_record),
        (Granularity::Seconds, DeletedRecord::Persistent)
    );

    let mut records = Vec::new();
    let mut q = "verb=ListRecords&metadataPrefix=oai_dc".to_string();
    let mut pages = 0;
    loop {
        let page = oai::parse_list(&get(q).await).unwrap();
        pages += 1;
        assert!(page.quarantined.is_empty(), "{:?}", page.quarantined);
        records.extend(page.records);
        match page.token {
            Some(t) if !t.value.is_empty() => {
                q = format!(
                    "verb=ListRecords&resumptionToken={}",
                    url::form_urlencoded::byte_serialize(t.value.as_bytes()).collect::<String>()
                )
            }
            _ => break,
        }
    }
    assert_eq!(pages, 3, "25 records in pages of 10");
    let ids: Vec<String> = records
        .iter()
        .map(|r| r.header.identifier.clone())
        .collect();
    assert_eq!(
        ids,
        (0..25).map(|k| format!("oai:test:{k}")).collect::<Vec<_>>()
    );
    for (k, r) in records.iter().enumerate() {
        assert_eq!(r.header.deleted, k % 7 == 6, "{k}");
        assert_eq!(r.header.sets, [if k % 2 == 0 { "even" } else { "odd" }]);
        assert_eq!(
            r.header.datestamp,
            format!("2026-11-01T00:{:02}:{:02}Z", k / 60, k % 60)
        );
        match &r.metadata {
            None => assert!(r.header.deleted),
            Some(m) => {
                assert!(m.contains(&format!("Record {k} &amp; co")), "{m}");
                assert!(
                    m.contains("xmlns:dc=\"http://purl.org/dc/elements/1.1/\""),
                    "{m}"
                );
            }
        }
    }

    let ids =
        oai::parse_list(&get("verb=ListIdentifiers&metadataPrefix=oai_dc&set=odd".into()).await)
            .unwrap();
    assert_eq!(ids.records.len(), 10);
    assert!(ids
        .records
        .iter()
        .all(|r| r.metadata.is_none() && r.header.sets == ["odd"]));

    let none = oai::parse_list(
        &get("verb=ListRecords&metadataPrefix=oai_dc&from=2030-01-01T00:00:00Z".into()).await,
    );
    assert!(
        matches!(&none, Err(OaiError::Protocol { code, .. }) if code == "noRecordsMatch"),
        "{none:?}"
    );
    let bad = oai::parse_list(&get("verb=ListRecords&resumptionToken=nonsense".into()).await);
    assert!(matches!(&bad, Err(OaiError::Protocol { .. })), "{bad:?}");
}
