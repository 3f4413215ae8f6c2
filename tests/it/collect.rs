//! The collector against a real OAI-PMH repository nobody here wrote: PyPI `oaipmh`'s
//! BatchingServer (`tests/tools/oai_server.py`) serving a JSON fixture.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use resourcesync_hub::collect::oai::{self, DeletedRecord, Granularity, OaiError};

use resourcesync_hub::config::{CollectConfig, Config};
use resourcesync_hub::store::SetStore as _;

use crate::support::{admin_call, md5_hex, test_config, PyEnv, TestApp};

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

pub const ADMIN: &str = "collect-admin-token";

/// A server collecting the fixture repository into the set `papers`.
pub struct Collecting {
    pub repo: OaiServer,
    pub app: TestApp,
}

/// A configuration collecting `base` into `papers` (one run an hour: the tests ask for runs).
pub fn collect_config(base: &str) -> (Config, tempfile::TempDir) {
    let (mut c, dir) = test_config();
    c.admin.token = ADMIN.into();
    let mut cc = CollectConfig::new(base);
    cc.retry_base_ms = 20;
    cc.attempts = 3;
    c.collect.insert("papers".into(), cc);
    (c, dir)
}

impl Collecting {
    pub async fn start(fixture: &serde_json::Value, batch: usize) -> (Collecting, tempfile::TempDir) {
        let repo = OaiServer::start(fixture, batch);
        let (c, dir) = collect_config(&repo.base);
        let app = TestApp::start_with(c).await;
        (Collecting { repo, app }, dir)
    }

    pub async fn status(&self) -> serde_json::Value {
        let (s, v) = admin_call(&self.app, ADMIN, reqwest::Method::GET, "/admin/v1/collect/papers", None).await;
        assert_eq!(s, 200, "{v}");
        v
    }

    /// Waits for the run under way (or the first) to end; its status.
    pub async fn wait_ended(&self, after: Option<&str>) -> serde_json::Value {
        let mut last = serde_json::Value::Null;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let v = self.status().await;
            let ended = v["last_ended"].as_str();
            if ended.is_some() && ended != after && v["state"] != "running" {
                return v;
            }
            assert!(std::time::Instant::now() < deadline, "no run ended: {v:#}");
            last = v;
            let _ = &last;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Asks for a run now and waits for it to end.
    pub async fn run_now(&self) -> serde_json::Value {
        let before = self.status().await["last_ended"].as_str().map(str::to_string);
        let (s, v) = admin_call(&self.app, ADMIN, reqwest::Method::POST, "/admin/v1/collect/papers/run", None).await;
        assert_eq!(s, 202, "{v}");
        self.wait_ended(before.as_deref()).await
    }

    /// Every resource of the set: location value -> (md5, length).
    pub async fn resources(&self) -> std::collections::BTreeMap<String, serde_json::Value> {
        let sc = self.app.config.set_config("papers");
        let store = resourcesync_hub::store::Store::open_embedded(&self.app.config.database_path()).unwrap();
        let mut out = std::collections::BTreeMap::new();
        let mut after = None;
        loop {
            let set = resourcesync_hub::model::SetName::parse("papers").unwrap();
            let page = store.resources(&set, None, after, 1000).await.unwrap();
            for r in page.items {
                out.insert(
                    r.key.url(&sc.url_prefix),
                    serde_json::json!({"md5": r.meta.md5, "length": r.meta.length, "ln": r.meta.ln.iter().map(|l| (l.rel.clone(), l.href.value.clone())).collect::<Vec<_>>()}),
                );
            }
            match page.next {
                Some(c) => after = Some(c),
                None => return out,
            }
        }
    }
}

/// The record `k`'s metadata as the fixture repository writes it (`oai_dc`).
fn record_title(k: usize) -> String {
    format!("Record {k} &amp; co")
}

/// A repository becomes a resource set: one resource per live record, its file the record's
/// metadata as a standalone document served by this server, a `via` link to its GetRecord
/// URL, its OAI sets as `collection` links; deleted records are never created.
#[tokio::test]
async fn a_repository_becomes_a_resource_set() {
    let (c, _dir) = Collecting::start(&fixture(25), 10).await;
    let v = c.wait_ended(None).await;
    assert_eq!(v["last_error"], serde_json::Value::Null, "{v:#}");
    assert_eq!(v["last"]["created"], 22, "{v:#}");
    assert_eq!(v["last"]["unchanged"], 3, "{v:#}");
    let res = c.resources().await;
    assert_eq!(res.len(), 22);
    for k in (0..25).filter(|k| k % 7 != 6) {
        let id = format!("oai:test:{k}");
        let rel = resourcesync_hub::collect::path::record_path(&id);
        let url = res
            .keys()
            .find(|u| u.ends_with(&rel.replace('%', "%25")))
            .unwrap_or_else(|| panic!("{rel} not in {:?}", res.keys().take(3).collect::<Vec<_>>()))
            .clone();
        let body = c.app.client.get(c.app.url(&c.app.path_of(&url))).send().await.unwrap();
        assert_eq!(body.status(), 200, "{url}");
        let text = body.text().await.unwrap();
        assert!(text.contains(&record_title(k)), "{text}");
        assert!(text.starts_with("<oai_dc:dc") || text.starts_with("<?xml"), "{text}");
        assert_eq!(res[&url]["md5"], md5_hex(text.as_bytes()));
        let ln = res[&url]["ln"].as_array().unwrap();
        assert!(ln.iter().any(|l| l[0] == "via" && l[1].as_str().unwrap().contains("verb=GetRecord")), "{ln:?}");
        let set = if k % 2 == 0 { "even" } else { "odd" };
        assert!(ln.iter().any(|l| l[0] == "collection" && l[1].as_str().unwrap().ends_with(&format!("set={set}"))), "{ln:?}");
    }
    c.app.stop().await;
}
