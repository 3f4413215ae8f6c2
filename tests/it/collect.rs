//! The collector against a real OAI-PMH repository nobody here wrote: PyPI `oaipmh`'s
//! BatchingServer (`tests/tools/oai_server.py`) serving a JSON fixture.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use resourcesync_hub::collect::oai::{self, DeletedRecord, Granularity, OaiError};

use resourcesync_hub::config::{CollectConfig, Config};

use crate::support::{admin_call, assert_valid, md5_hex, test_config, PyEnv, TestApp};

/// The fixture repository, running until dropped.
pub struct OaiServer {
    child: Child,
    pub base: String,
    fixture: tempfile::NamedTempFile,
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
            fixture: file,
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
    pub async fn start(
        fixture: &serde_json::Value,
        batch: usize,
    ) -> (Collecting, tempfile::TempDir) {
        let repo = OaiServer::start(fixture, batch);
        let (c, dir) = collect_config(&repo.base);
        let app = TestApp::start_with(c).await;
        (Collecting { repo, app }, dir)
    }

    pub async fn status(&self) -> serde_json::Value {
        let (s, v) = admin_call(
            &self.app,
            ADMIN,
            reqwest::Method::GET,
            "/admin/v1/collect/papers",
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        v
    }

    /// Waits for the run under way (or the first) to end; its status.
    pub async fn wait_ended(&self, after: Option<&str>) -> serde_json::Value {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let v = self.status().await;
            let ended = v["last_ended"].as_str();
            if ended.is_some() && ended != after && v["state"] != "running" {
                return v;
            }
            assert!(std::time::Instant::now() < deadline, "no run ended: {v:#}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Asks for a run now and waits for it to end.
    pub async fn run_now(&self) -> serde_json::Value {
        let before = self.status().await["last_ended"]
            .as_str()
            .map(str::to_string);
        let (s, v) = admin_call(
            &self.app,
            ADMIN,
            reqwest::Method::POST,
            "/admin/v1/collect/papers/run",
            None,
        )
        .await;
        assert_eq!(s, 202, "{v}");
        self.wait_ended(before.as_deref()).await
    }

    /// How many changes the set has recorded.
    pub async fn app_counts(&self) -> u64 {
        let store = resourcesync_hub::app::open_store(&self.app.config)
            .await
            .unwrap();
        let set = resourcesync_hub::model::SetName::parse("papers").unwrap();
        store.counts(&set).await.unwrap().changes
    }

    /// Every resource of the set: location value -> (md5, length).
    pub async fn resources(&self) -> std::collections::BTreeMap<String, serde_json::Value> {
        let sc = self.app.config.set_config("papers");
        let store = resourcesync_hub::app::open_store(&self.app.config)
            .await
            .unwrap();
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
    let (c, dir) = Collecting::start(&fixture(25), 10).await;
    let v = c.wait_ended(None).await;
    assert_eq!(v["last_error"], serde_json::Value::Null, "{v:#}");
    assert_eq!(v["last"]["created"], 22, "{v:#}");
    assert_eq!(v["last"]["unchanged"], 3, "{v:#}");
    let res = c.resources().await;
    assert_eq!(res.len(), 22);
    for k in (0..25).filter(|k| k % 7 != 6) {
        let id = format!("oai:test:{k}");
        let rel = resourcesync_hub::model::origin::record_path(&id);
        let url = res
            .keys()
            .find(|u| u.ends_with(&rel))
            .unwrap_or_else(|| panic!("{rel} not in {:?}", res.keys().take(3).collect::<Vec<_>>()))
            .clone();
        assert!(
            !url.contains('%') && url.ends_with(&format!("/{id}.xml")),
            "the URL reads like the identifier: {url}"
        );
        let body = c
            .app
            .client
            .get(c.app.url(&c.app.path_of(&url)))
            .send()
            .await
            .unwrap();
        assert_eq!(body.status(), 200, "{url}");
        let text = body.text().await.unwrap();
        assert!(text.contains(&record_title(k)), "{text}");
        assert!(
            text.starts_with("<oai_dc:dc") || text.starts_with("<?xml"),
            "{text}"
        );
        assert_eq!(res[&url]["md5"], md5_hex(text.as_bytes()));
        let ln = res[&url]["ln"].as_array().unwrap();
        assert!(
            ln.iter()
                .any(|l| l[0] == "via" && l[1].as_str().unwrap().contains("verb=GetRecord")),
            "{ln:?}"
        );
        let set = if k % 2 == 0 { "even" } else { "odd" };
        assert!(
            ln.iter()
                .any(|l| l[0] == "collection"
                    && l[1].as_str().unwrap().ends_with(&format!("set={set}"))),
            "{ln:?}"
        );
    }
    // The Python reference client mirrors exactly those records.
    let dest = dir.path().join("resync-mirror");
    std::fs::create_dir_all(&dest).unwrap();
    let cap = format!("{}/sets/papers/capabilitylist.xml", c.app.config.base_url());
    let mapping = format!(
        "{}/files/papers/={}",
        c.app.config.base_url(),
        dest.display()
    );
    let cwd = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(PyEnv::get().bin("resync-sync"))
            .current_dir(cwd)
            .args([
                "--baseline",
                "--capabilitylist",
                &cap,
                "--verbose",
                &mapping,
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = crate::support::output_text(&out);
    let mirrored: Vec<_> = walkdir::WalkDir::new(&dest)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .collect();
    assert_eq!(mirrored.len(), 22, "{text}");
    c.app.stop().await;
}

/// `n` records `oai:big:K`, a second apart from 2026-11-01, in three sets `s0`..`s2`; every
/// twentieth deleted (500 of 10,000).
pub fn repository(n: usize) -> serde_json::Value {
    let start = chrono::DateTime::parse_from_rfc3339("2026-11-01T00:00:00Z").unwrap();
    let records: Vec<serde_json::Value> = (0..n)
        .map(|k| {
            let d = start + chrono::Duration::seconds(k as i64);
            serde_json::json!({
                "id": format!("oai:big:{k}"),
                "datestamp": d.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
                "sets": [format!("s{}", k % 3)],
                "deleted": k % 20 == 19,
                "dc": {"title": [format!("Record {k} & co")], "creator": ["A. Author"], "subject": ["ü ∑ 𝄞"]},
            })
        })
        .collect();
    serde_json::json!({
        "granularity": "YYYY-MM-DDThh:mm:ssZ",
        "deletedRecord": "persistent",
        "sets": [["s0", "Zero"], ["s1", "One"], ["s2", "Two"]],
        "records": records,
    })
}

/// Changes [`repository`]'s fixture as the acceptance says, all datestamped `now`: 200 live
/// records updated, 100 deleted, 50 re-datestamped but unchanged, 300 created.
pub fn change_upstream(fx: &mut serde_json::Value, now: &str) {
    let recs = fx["records"].as_array_mut().unwrap();
    let live: Vec<usize> = (0..10_000).filter(|k| k % 20 != 19).collect();
    for &k in &live[..200] {
        recs[k]["dc"]["title"] = serde_json::json!([format!("Record {k}, second version")]);
        recs[k]["datestamp"] = now.into();
    }
    for &k in &live[1000..1100] {
        recs[k]["deleted"] = true.into();
        recs[k]["datestamp"] = now.into();
    }
    for &k in &live[2000..2050] {
        recs[k]["datestamp"] = now.into();
    }
    for k in 10_000..10_300 {
        recs.push(serde_json::json!({
            "id": format!("oai:big:{k}"), "datestamp": now, "sets": ["s1"],
            "dc": {"title": [format!("New record {k}")]},
        }));
    }
}

/// Rewrites the repository's fixture (the server reads it again on its next request).
pub fn rewrite(repo: &OaiServer, fixture: &serde_json::Value) {
    let tmp = repo.fixture.path().with_extension("new");
    std::fs::write(&tmp, fixture.to_string()).unwrap();
    std::fs::rename(&tmp, repo.fixture.path()).unwrap();
}

pub fn now_datestamp() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Compares the set's files with the repository's records as canonical XML (lxml).
pub fn c14n_compare(c: &Collecting, fixture: &serde_json::Value) -> serde_json::Value {
    let root = c.app.config.collected_dir("papers");
    let map: serde_json::Map<String, serde_json::Value> = fixture["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| {
            let id = r["id"].as_str().unwrap();
            let p = root.join(resourcesync_hub::model::origin::record_path(id));
            p.exists()
                .then(|| (id.to_string(), p.display().to_string().into()))
        })
        .collect();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), serde_json::Value::Object(map).to_string()).unwrap();
    let tool =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/oai_c14n_compare.py");
    let out = Command::new(PyEnv::get().python())
        .arg(tool)
        .arg(&c.repo.base)
        .arg(file.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The acceptance's main path: a baseline of 10,000 records (500 deleted, 3 sets) gives
/// exactly the 9,500 live records, each file equal to its record as canonical XML, documents
/// valid against the schemas, and a mirror made by `harvest` holding exactly those; then
/// 300 created, 200 updated, 100 deleted and 50 re-datestamped but unchanged records give
/// exactly 600 changes, each pushed to the subscribed `harvest` destination.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baseline_then_incremental_runs_record_each_change_once_and_push_it() {
    let mut fx = repository(10_000);
    let repo = OaiServer::start(&fx, 500);
    let (mut cfg, dir) = collect_config(&repo.base);
    let (hc, _) = crate::hub::hub_config();
    cfg.hub = hc.hub;
    let app = TestApp::start_with(cfg).await;
    let c = Collecting { repo, app };
    let v = c.wait_ended(None).await;
    assert_eq!(v["last_error"], serde_json::Value::Null, "{v:#}");
    assert_eq!(v["last"]["created"], 9_500, "{v:#}");
    assert_eq!(v["last"]["seen"], 10_000, "{v:#}");
    assert_eq!(c.resources().await.len(), 9_500);
    let cmp = c14n_compare(&c, &fx);
    assert_eq!(cmp["equal"], 9_500, "{cmp}");
    assert_eq!(
        cmp["differ"].as_array().unwrap().len()
            + cmp["missing"].as_array().unwrap().len()
            + cmp["extra"].as_array().unwrap().len(),
        0,
        "{cmp}"
    );
    let docs = [
        "/sets/papers/capabilitylist.xml",
        "/sets/papers/resourcelist.xml",
        "/sets/papers/changelist.xml",
    ];
    let mut bodies = Vec::new();
    for d in docs {
        bodies.push((d, c.app.get_text(d).await));
    }
    assert_valid(
        &bodies
            .iter()
            .map(|(d, b)| (*d, b.as_str()))
            .collect::<Vec<_>>(),
    );

    // A destination baselines from this server and subscribes.
    let mut hcfg =
        crate::harvest::harvest_config(dir.path(), &c.app.url("/.well-known/resourcesync"));
    hcfg.follow.check_interval_secs = 3600;
    let h = crate::harvest::TestHarvester::start(hcfg.clone()).await;
    crate::harvest::wait_state(&h, "the baseline", 180, |s| {
        crate::harvest::set_done(s, 9_500)
    })
    .await;
    crate::harvest::wait_state(&h, "an active subscription", 30, |s| {
        s.sets()
            .unwrap()
            .first()
            .and_then(|r| s.subscription(r.id).unwrap())
            .is_some_and(|sub| sub.state == resourcesync_hub::destination::state::SubState::Active)
    })
    .await;
    let held = h
        .state()
        .held(
            1,
            &format!(
                "{}/files/papers/{}",
                c.app.config.base_url(),
                resourcesync_hub::model::origin::record_path("oai:big:7")
            ),
        )
        .unwrap()
        .expect("record 7 mirrored");
    assert_eq!(
        std::path::Path::new(&held.path).file_name().unwrap(),
        "oai:big:7.xml",
        "the mirror's file name reads like the identifier"
    );
    let mirrored = std::fs::read_to_string(&held.path).unwrap();
    assert!(mirrored.contains("Record 7 &amp; co"), "{mirrored}");

    // The repository changes.
    let changes_before = c.app_counts().await;
    change_upstream(&mut fx, &now_datestamp());
    rewrite(&c.repo, &fx);
    let v = c.run_now().await;
    assert_eq!(v["last_error"], serde_json::Value::Null, "{v:#}");
    assert_eq!(
        (
            &v["last"]["created"],
            &v["last"]["updated"],
            &v["last"]["deleted"]
        ),
        (&300.into(), &200.into(), &100.into()),
        "{v:#}"
    );
    assert!(v["last"]["unchanged"].as_u64().unwrap() >= 50, "{v:#}");
    assert_eq!(
        c.app_counts().await - changes_before,
        600,
        "exactly 600 changes recorded"
    );
    // A second run over an overlapping window records nothing.
    let again = c.run_now().await;
    assert_eq!(
        again["last"]["created"].as_u64().unwrap()
            + again["last"]["updated"].as_u64().unwrap()
            + again["last"]["deleted"].as_u64().unwrap(),
        0,
        "{again:#}"
    );
    assert_eq!(c.app_counts().await - changes_before, 600);

    crate::harvest::wait_state(&h, "600 changes applied by push", 120, |s| {
        crate::harvest::applied(s) == 600 && crate::harvest::pending(s) == 0
    })
    .await;
    let row = h.state().sets().unwrap()[0].clone();
    assert!(row.last_push_at.is_some(), "applied by push");
    assert_eq!(h.state().count_held(row.id).unwrap(), 9_500 + 300 - 100);
    let cmp = c14n_compare(&c, &fx);
    assert_eq!(cmp["equal"], 9_700, "{cmp}");
    h.stop().await;
    c.app.stop().await;
}

impl OaiServer {
    /// Every request the repository answered: (unix time, query).
    pub async fn requests(&self) -> Vec<(f64, String)> {
        let url = self.base.replace("/oai", "/_requests");
        let v: serde_json::Value = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["t"].as_f64().unwrap(),
                    r["query"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }
}

/// The fixture with its faults set to `faults`.
pub fn with_faults(mut fx: serde_json::Value, faults: serde_json::Value) -> serde_json::Value {
    fx["faults"] = faults;
    fx
}

pub fn no_error(v: &serde_json::Value) {
    assert_eq!(v["last_error"], serde_json::Value::Null, "{v:#}");
    assert!(
        v["last_outcome"].as_str().unwrap().contains("records read"),
        "{v:#}"
    );
}

/// An expired resumption token starts the window again from the saved `from`: every record
/// is still taken, none twice.
#[tokio::test]
async fn an_expired_token_starts_the_window_again() {
    let fx = with_faults(fixture(50), serde_json::json!({"expire_tokens": 1}));
    let (c, _dir) = Collecting::start(&fx, 10).await;
    let v = c.wait_ended(None).await;
    no_error(&v);
    assert_eq!(v["last"]["created"], 43, "{v:#}");
    let reqs = c.repo.requests().await;
    let firsts = reqs
        .iter()
        .filter(|(_, q)| q.contains("verb=ListRecords") && !q.contains("resumptionToken"))
        .count();
    assert_eq!(firsts, 2, "the list was started again once: {reqs:#?}");
    assert_eq!(c.resources().await.len(), 43);
    c.app.stop().await;
}

/// A 503 with `Retry-After` is waited out exactly: no request before it is due (seen at the
/// repository), in seconds and as an HTTP date.
#[tokio::test]
async fn a_busy_repository_is_asked_again_only_when_its_retry_after_is_due() {
    let fx = with_faults(
        fixture(20),
        serde_json::json!({"busy": {"count": 1, "retry_after": "2"}}),
    );
    let (c, _dir) = Collecting::start(&fx, 10).await;
    no_error(&c.wait_ended(None).await);
    let reqs = c.repo.requests().await;
    assert!(reqs.len() >= 2);
    let gap = reqs[1].0 - reqs[0].0;
    assert!(
        (2.0..3.0).contains(&gap),
        "the second request came {gap:.2}s after the 503"
    );

    let at = chrono::Utc::now() + chrono::Duration::seconds(3);
    let date = at.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
    rewrite(
        &c.repo,
        &with_faults(
            fixture(20),
            serde_json::json!({"busy": {"count": 1, "retry_after": date}}),
        ),
    );
    let seen = c.repo.requests().await.len();
    no_error(&c.run_now().await);
    let reqs = c.repo.requests().await;
    let due = at.timestamp() as f64;
    assert!(
        reqs[seen + 1].0 >= due - 0.01,
        "asked again {:.2}s before the date",
        due - reqs[seen + 1].0
    );
    assert!(reqs[seen + 1].0 < due + 1.0);
    c.app.stop().await;
}

/// A repository that ignores `from` sends everything again: nothing is recorded twice and the
/// run ends.
#[tokio::test]
async fn a_repository_that_ignores_from_records_nothing_twice() {
    let (c, _dir) = Collecting::start(&fixture(30), 10).await;
    no_error(&c.wait_ended(None).await);
    rewrite(
        &c.repo,
        &with_faults(fixture(30), serde_json::json!({"ignore_from": true})),
    );
    let v = c.run_now().await;
    no_error(&v);
    assert_eq!(v["last"]["seen"], 30, "{v:#}");
    assert_eq!(
        v["last"]["created"].as_u64().unwrap() + v["last"]["updated"].as_u64().unwrap(),
        0,
        "{v:#}"
    );
    let froms: Vec<String> = c
        .repo
        .requests()
        .await
        .into_iter()
        .map(|(_, q)| q)
        .filter(|q| q.contains("from="))
        .collect();
    assert_eq!(
        froms.len(),
        1,
        "the second run asked from its window: {froms:?}"
    );
    assert_eq!(c.app_counts().await, 26);
    c.app.stop().await;
}

/// A day-granularity repository: `from` is a day (the one before the last run's start), and
/// a record's lastmod is its day's midnight.
#[tokio::test]
async fn a_day_granularity_repository_is_asked_by_day() {
    let mut fx = fixture(12);
    fx["granularity"] = "YYYY-MM-DD".into();
    let (c, _dir) = Collecting::start(&fx, 10).await;
    no_error(&c.wait_ended(None).await);
    no_error(&c.run_now().await);
    let from = c
        .repo
        .requests()
        .await
        .into_iter()
        .map(|(_, q)| q)
        .find(|q| q.contains("from="))
        .expect("a from");
    let yesterday = (chrono::Utc::now() - chrono::Duration::days(1))
        .format("%Y-%m-%d")
        .to_string();
    assert!(
        from.contains(&format!("from={yesterday}")) && !from.contains("T"),
        "{from}"
    );
    let (_, rl) = c.app.get_doc("/sets/papers/resourcelist.xml").await;
    let text = c.app.get_text("/sets/papers/resourcelist.xml").await;
    assert!(
        text.contains("<lastmod>2026-11-01T00:00:00Z</lastmod>"),
        "{text}"
    );
    assert_eq!(rl.entries.len(), 11);
    c.app.stop().await;
}

/// A record holding a character XML 1.0 cannot carry is quarantined with its reason and
/// shown; the rest of its page is applied.
#[tokio::test]
async fn a_record_with_a_control_character_costs_only_that_record() {
    let fx = with_faults(
        fixture(20),
        serde_json::json!({"replace": [["Record 5 &amp; co", "Record 5 \u{1} co"]]}),
    );
    let (c, _dir) = Collecting::start(&fx, 10).await;
    let v = c.wait_ended(None).await;
    no_error(&v);
    assert_eq!(v["last"]["quarantined"], 1, "{v:#}");
    assert_eq!(v["last"]["created"], 17, "{v:#}");
    assert_eq!(v["quarantine"][0]["identifier"], "oai:test:5", "{v:#}");
    assert!(
        v["quarantine"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("U+0001"),
        "{v:#}"
    );
    c.app.stop().await;
}

/// An HTML error page is retried; one that keeps coming ends the run with the reason in
/// words, and the next run goes on.
#[tokio::test]
async fn an_html_error_page_is_retried_then_reported() {
    let fx = with_faults(fixture(20), serde_json::json!({"html": 1}));
    let (c, _dir) = Collecting::start(&fx, 10).await;
    no_error(&c.wait_ended(None).await);
    rewrite(
        &c.repo,
        &with_faults(fixture(20), serde_json::json!({"html": 10})),
    );
    let v = c.run_now().await;
    let err = v["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("not an OAI-PMH response") && err.contains("after 3 attempts"),
        "{v:#}"
    );
    rewrite(&c.repo, &fixture(20));
    no_error(&c.run_now().await);
    c.app.stop().await;
}

/// A repository that forgets deletions (`deletedRecord=no`): records that vanish are marked
/// deleted by the reconcile pass, exactly those.
#[tokio::test]
async fn reconcile_marks_exactly_the_records_a_forgetful_repository_dropped() {
    let mut fx = fixture(300);
    fx["deletedRecord"] = "no".into();
    for r in fx["records"].as_array_mut().unwrap() {
        r["deleted"] = false.into();
    }
    let (c, _dir) = Collecting::start(&fx, 50).await;
    no_error(&c.wait_ended(None).await);
    assert_eq!(c.resources().await.len(), 300);
    let gone: Vec<String> = (0..100).map(|k| format!("oai:test:{}", k * 3)).collect();
    fx["records"]
        .as_array_mut()
        .unwrap()
        .retain(|r| !gone.contains(&r["id"].as_str().unwrap().to_string()));
    rewrite(&c.repo, &fx);
    let before = c.status().await["last_reconcile"].clone();
    let (s, _) = admin_call(
        &c.app,
        ADMIN,
        reqwest::Method::POST,
        "/admin/v1/collect/papers/reconcile",
        None,
    )
    .await;
    assert_eq!(s, 202);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let v = loop {
        let v = c.status().await;
        if v["last_reconcile"] != before {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "{v:#}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(v["last_reconcile_deleted"], 100, "{v:#}");
    let left = c.resources().await;
    assert_eq!(left.len(), 200);
    for id in &gone {
        let rel = resourcesync_hub::model::origin::record_path(id);
        assert!(!left.keys().any(|u| u.ends_with(&rel)), "{id} still held");
        assert!(!c
            .app
            .config
            .collected_dir("papers")
            .join(resourcesync_hub::model::origin::record_path(id))
            .exists());
    }
    c.app.stop().await;
}

/// 401/403 stop the collector and say so; resumed, it runs again.
#[tokio::test]
async fn a_refusing_repository_stops_its_collector_until_resumed() {
    let fx = with_faults(fixture(10), serde_json::json!({"refuse": 403}));
    let (c, _dir) = Collecting::start(&fx, 10).await;
    let v = c.wait_ended(None).await;
    assert_eq!(v["state"], "stopped", "{v:#}");
    assert!(v["stopped"].as_str().unwrap().contains("403"), "{v:#}");
    let asked = c.repo.requests().await.len();
    assert_eq!(asked, 1, "a refusal is not retried");
    rewrite(&c.repo, &fixture(10));
    let before = v["last_ended"].as_str().map(str::to_string);
    let (s, _) = admin_call(
        &c.app,
        ADMIN,
        reqwest::Method::POST,
        "/admin/v1/collect/papers/resume",
        None,
    )
    .await;
    assert_eq!(s, 202);
    let v = c.wait_ended(before.as_deref()).await;
    no_error(&v);
    assert_eq!(v["state"], "idle", "{v:#}");
    c.app.stop().await;
}

/// A configuration file collecting `base` into `papers` with its data in `dir/data`.
fn config_file(dir: &std::path::Path, base: &str) -> std::path::PathBuf {
    let p = dir.join("rshub.toml");
    std::fs::write(
        &p,
        format!(
            "[server]\ndata_dir = {:?}\n[admin]\ntoken = \"{ADMIN}\"\n[collect.papers]\nurl = \"{base}\"\nretry_base_ms = 20\n",
            dir.join("data")
        ),
    )
    .unwrap();
    p
}

/// A child server's view of the collector `papers` (admin API).
async fn child_status(
    client: &reqwest::Client,
    server: &crate::support::ChildServer,
) -> serde_json::Value {
    client
        .get(server.url("/admin/v1/collect/papers"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap()
}

/// Waits until the repository was asked for `n` pages by token.
async fn wait_pages(repo: &OaiServer, n: usize) {
    crate::support::wait_until(&format!("{n} pages asked for"), || async {
        repo.requests()
            .await
            .iter()
            .filter(|(_, q)| q.contains("resumptionToken"))
            .count()
            >= n
    })
    .await;
}

/// The repository's log shows one list of `pages` pages, continued after an interruption:
/// its first page asked once, at most one page asked again (twice), nothing else.
async fn assert_list_continued(repo: &OaiServer, pages: usize) {
    let reqs = repo.requests().await;
    let lists: Vec<&String> = reqs
        .iter()
        .map(|(_, q)| q)
        .filter(|q| q.contains("ListRecords"))
        .collect();
    assert_eq!(
        lists
            .iter()
            .filter(|q| !q.contains("resumptionToken"))
            .count(),
        1,
        "the list was not started again"
    );
    let mut seen = std::collections::HashMap::new();
    for q in &lists {
        *seen.entry(q.as_str()).or_insert(0) += 1;
    }
    let again: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        again.len() <= 1 && again.iter().all(|(_, n)| **n == 2),
        "pages fetched again: {again:?}"
    );
    assert_eq!(lists.len(), pages + again.len());
}

/// Killed (SIGKILL) in the middle of a run and started again: the run goes on from its
/// checkpointed token, no page but the one in flight is fetched again, and no change is
/// recorded twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_run_it_goes_on_from_its_token_and_records_nothing_twice() {
    let fx = with_faults(repository(2_000), serde_json::json!({"delay_ms": 150}));
    let repo = OaiServer::start(&fx, 100);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), &repo.base);
    let server = crate::support::ChildServer::serve(&["--config", cfg.to_str().unwrap()], &[]);
    wait_pages(&repo, 6).await;
    server.signal("KILL");
    let server = crate::support::ChildServer::serve(&["--config", cfg.to_str().unwrap()], &[]);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    crate::support::wait_until("the run to end", || async {
        child_status(&client, &server).await["last_ended"].is_string()
    })
    .await;
    no_error(&child_status(&client, &server).await);
    assert!(
        server.log().contains("continuing the run under way"),
        "{}",
        server.log()
    );
    assert_list_continued(&repo, 20).await;
    drop(server);
    let store =
        resourcesync_hub::store::Store::open_embedded(&dir.path().join("data/rshub.sqlite"))
            .unwrap();
    let set = resourcesync_hub::model::SetName::parse("papers").unwrap();
    let counts = store.counts(&set).await.unwrap();
    assert_eq!(
        (counts.resources, counts.changes),
        (1_900, 1_900),
        "one change per live record"
    );
}

/// `collect --once` runs each collector once and exits, saying what it did; a second run
/// finds nothing new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_once_runs_and_exits() {
    let repo = OaiServer::start(&fixture(25), 10);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), &repo.base);
    let c2 = cfg.clone();
    let run = move || {
        let out = Command::new(crate::support::ChildServer::BIN)
            .args(["collect", "--once", "--config", c2.to_str().unwrap()])
            .output()
            .unwrap();
        (out.status.success(), crate::support::output_text(&out))
    };
    let (ok, text) = tokio::task::spawn_blocking(run.clone()).await.unwrap();
    assert!(
        ok && text.contains("papers: 25 records read: 22 created"),
        "{text}"
    );
    let (ok, text) = tokio::task::spawn_blocking(run).await.unwrap();
    assert!(
        ok && text.contains("0 created, 0 updated, 0 deleted"),
        "{text}"
    );
    let bad = Command::new(crate::support::ChildServer::BIN)
        .args([
            "collect",
            "--once",
            "nope",
            "--config",
            cfg.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(crate::support::output_text(&bad)
        .contains("no collector \"nope\"; the configuration has papers"));
}

pub fn identify_xml() -> String {
    r#"<?xml version="1.0" encoding="UTF-8"?>
<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/"><responseDate>2026-11-26T10:00:00Z</responseDate><request verb="Identify">http://x/oai</request>
<Identify><repositoryName>Hostile</repositoryName><baseURL>http://x/oai</baseURL><protocolVersion>2.0</protocolVersion><adminEmail>a@example.org</adminEmail><earliestDatestamp>2001-01-01T00:00:00Z</earliestDatestamp><deletedRecord>persistent</deletedRecord><granularity>YYYY-MM-DDThh:mm:ssZ</granularity></Identify></OAI-PMH>"#.into()
}

/// A ListRecords page with `n` records (named after `tag`) and the token `next` ("" ends).
fn page_xml(tag: &str, n: usize, next: Option<&str>) -> String {
    let records: String = (0..n)
        .map(|k| format!(r#"<record><header><identifier>oai:{tag}:{k}</identifier><datestamp>2026-11-01T00:00:00Z</datestamp></header><metadata><oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>{tag} {k}</dc:title></oai_dc:dc></metadata></record>"#))
        .collect();
    let token = next
        .map(|t| format!("<resumptionToken>{t}</resumptionToken>"))
        .unwrap_or_default();
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/"><responseDate>2026-11-26T10:00:00Z</responseDate><request verb="ListRecords">http://x/oai</request><ListRecords>{records}{token}</ListRecords></OAI-PMH>"#
    )
}

/// Repositories that misbehave on purpose (the real binary collecting from each): an endless
/// answer, one that trickles, one that redirects to another port (the canary), a token that
/// repeats, pages that come empty for ever, a truncated page. Each run ends with its reason
/// in words; nothing reaches the canary; memory stays bounded and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_repositories_cost_a_run_never_the_server() {
    use crate::hostile::{endless, trickle, Canary, Hostile};
    let src = Hostile::start().await;
    let canary = Canary::start().await;
    let first = "verb=ListRecords&metadataPrefix=oai_dc";
    for name in ["big", "slow", "away", "loop", "empty", "cut"] {
        if name != "away" {
            src.xml(&format!("/{name}/oai?verb=Identify"), identify_xml());
        }
    }
    src.on(&format!("/big/oai?{first}"), |_| endless());
    src.on(&format!("/slow/oai?{first}"), |_| {
        trickle(b"<?xml version=\"1.0\"?><OAI-PMH xmlns=\"http://www.openarchives.org/OAI/2.0/\">                ", std::time::Duration::from_millis(200))
    });
    let to = canary.url("/oai?verb=Identify");
    src.on("/away/oai?verb=Identify", move |_| {
        axum::response::Response::builder()
            .status(302)
            .header("location", to.clone())
            .body(axum::body::Body::empty())
            .unwrap()
    });
    src.xml(
        &format!("/loop/oai?{first}"),
        page_xml("loop", 1, Some("same")),
    );
    src.xml(
        "/loop/oai?verb=ListRecords&resumptionToken=same",
        page_xml("loop", 1, Some("same")),
    );
    src.xml(
        &format!("/empty/oai?{first}"),
        page_xml("empty", 0, Some("t0")),
    );
    for k in 0..30 {
        src.xml(
            &format!("/empty/oai?verb=ListRecords&resumptionToken=t{k}"),
            page_xml("empty", 0, Some(&format!("t{}", k + 1))),
        );
    }
    let cut = page_xml("cut", 5, None);
    let cut = cut[..cut.len() / 2].to_string();
    src.xml(&format!("/cut/oai?{first}"), cut);

    let dir = tempfile::tempdir().unwrap();
    let mut toml = format!(
        "[server]\ndata_dir = {:?}\n[admin]\ntoken = \"{ADMIN}\"\n",
        dir.path().join("data")
    );
    for name in ["big", "slow", "away", "loop", "empty", "cut"] {
        toml.push_str(&format!(
            "[collect.{name}]\nurl = \"{}\"\nkind = \"oai-pmh\"\nretry_base_ms = 20\nattempts = 2\nrequest_timeout_secs = 2\nmax_response_bytes = 262144\n",
            src.url(&format!("/{name}/oai"))
        ));
    }
    let cfg = dir.path().join("rshub.toml");
    std::fs::write(&cfg, toml).unwrap();
    let server = crate::support::ChildServer::serve(&["--config", cfg.to_str().unwrap()], &[]);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let list = || async {
        client
            .get(server.url("/admin/v1/collect"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .json::<serde_json::Value>()
            .await
            .unwrap()
    };
    crate::support::wait_until("every run to end", || async {
        list().await["collectors"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["last_ended"].is_string())
    })
    .await;
    let v = list().await;
    let by: std::collections::HashMap<String, serde_json::Value> = v["collectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap().to_string(), c.clone()))
        .collect();
    let words = |n: &str| {
        format!(
            "{} | {}",
            by[n]["last_outcome"].as_str().unwrap_or(""),
            by[n]["last_error"].as_str().unwrap_or("")
        )
    };
    assert!(
        words("big").contains("larger than collect max_response_bytes (262144)"),
        "{}",
        words("big")
    );
    assert!(
        words("slow").contains("after 2 attempts") && words("slow").contains("timed out"),
        "{}",
        words("slow")
    );
    assert!(
        words("away").contains("leaves the repository's origin"),
        "{}",
        words("away")
    );
    assert!(
        words("loop").contains("resumption token \"same\" twice"),
        "{}",
        words("loop")
    );
    assert!(
        words("empty").contains("pages in a row came without a record"),
        "{}",
        words("empty")
    );
    assert!(
        words("cut").contains("not an OAI-PMH response"),
        "{}",
        words("cut")
    );
    assert_eq!(canary.connections(), 0, "nothing reached another port");
    assert!(
        src.hits("/empty/oai?verb=ListRecords&resumptionToken=t20") == 0,
        "the empty pages were not followed for ever"
    );
    // The one record of the looping repository is all that was written.
    let files: Vec<_> = walkdir::WalkDir::new(dir.path().join("data/collected"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| e.path().display().to_string())
        .collect();
    assert!(files.len() == 1 && files[0].contains("/loop/"), "{files:?}");
    let peak = (crate::support::proc_mb(server.child.id(), "VmHWM") * 1024.0) as u64;
    assert!(peak < 100 * 1024, "peak memory {peak} kB");
}

/// A repository answering in ISO-8859-1 (as its XML declaration says): records are stored as
/// UTF-8 and mean the same.
#[tokio::test]
async fn a_latin1_repository_is_decoded() {
    let mut fx = fixture(3);
    fx["records"][0]["dc"]["title"] = serde_json::json!(["Café Müller"]);
    let fx = with_faults(fx, serde_json::json!({"encoding": "ISO-8859-1"}));
    let (c, _dir) = Collecting::start(&fx, 10).await;
    no_error(&c.wait_ended(None).await);
    let file = c
        .app
        .config
        .collected_dir("papers")
        .join(resourcesync_hub::model::origin::record_path("oai:test:0"));
    let text = std::fs::read_to_string(file).expect("a UTF-8 file");
    assert!(text.contains("Café Müller"), "{text}");
    c.app.stop().await;
}

/// On a shared store (osmem-server) two processes run the same collector: one collects at a
/// time; killed mid-run (SIGKILL), the other takes the collector over once the lease lapses
/// and goes on from the checkpointed token, and every change is recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_shared_store_a_killed_collector_is_taken_over() {
    let fx = with_faults(repository(2_000), serde_json::json!({"delay_ms": 150}));
    let repo = OaiServer::start(&fx, 100);
    let tmp = tempfile::tempdir().unwrap();
    let es = crate::support::Osmem::clone_url().await;
    let cfg = tmp.path().join("rshub.toml");
    std::fs::write(
        &cfg,
        format!(
            "[store]\nbackend = \"elasticsearch\"\n[store.elasticsearch]\nurl = \"{es}\"\n\
             [hub]\npartition_lease_secs = 3\n[admin]\ntoken = \"{ADMIN}\"\n\
             [sets.papers]\nresource_root_dir = {:?}\n\
             [collect.papers]\nurl = \"{}\"\nretry_base_ms = 20\n",
            tmp.path().join("files"),
            repo.base
        ),
    )
    .unwrap();
    let procs = [
        crate::support::ChildServer::serve_one_of(tmp.path(), "a", &cfg),
        crate::support::ChildServer::serve_one_of(tmp.path(), "b", &cfg),
    ];
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    wait_pages(&repo, 6).await;
    let held = [
        child_status(&client, &procs[0]).await["live"]["held_here"] == true,
        child_status(&client, &procs[1]).await["live"]["held_here"] == true,
    ];
    assert_eq!(
        held.iter().filter(|h| **h).count(),
        1,
        "exactly one process holds the collector: {held:?}"
    );
    let [a, b] = procs;
    let (killed, other) = if held[0] { (a, b) } else { (b, a) };
    killed.signal("KILL");
    crate::support::wait_until("the other process to end the run", || async {
        let v = child_status(&client, &other).await;
        v["last_ended"].is_string() && v["state"] != "running"
    })
    .await;
    no_error(&child_status(&client, &other).await);
    assert!(
        other.log().contains("this process now holds the collector"),
        "{}",
        other.log()
    );
    assert!(
        other.log().contains("continuing the run under way"),
        "{}",
        other.log()
    );
    assert_list_continued(&repo, 20).await;
    let store = crate::support::elastic_store(&es).await;
    let set = resourcesync_hub::model::SetName::parse("papers").unwrap();
    let counts = store.counts(&set).await.unwrap();
    assert_eq!(
        (counts.resources, counts.changes),
        (1_900, 1_900),
        "one change per live record"
    );
    assert_eq!(
        walkdir::WalkDir::new(tmp.path().join("files"))
            .into_iter()
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_file())
            .count(),
        1_900
    );
}

/// The same on Elasticsearch (osmem-server): a baseline, then created, updated, deleted and
/// re-datestamped records give exactly their changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_elasticsearch_runs_record_each_change_once() {
    let mut fx = fixture(60);
    let repo = OaiServer::start(&fx, 20);
    let (mut cfg, _dir) = collect_config(&repo.base);
    crate::support::use_elasticsearch(&mut cfg).await;
    let app = TestApp::start_with(cfg).await;
    let c = Collecting { repo, app };
    no_error(&c.wait_ended(None).await);
    let live = (0..60).filter(|k| k % 7 != 6).count() as u64;
    assert_eq!(c.resources().await.len() as u64, live);
    assert_eq!(c.app_counts().await, live);
    let now = now_datestamp();
    let recs = fx["records"].as_array_mut().unwrap();
    recs[0]["dc"]["title"] = serde_json::json!(["changed"]);
    recs[1]["deleted"] = true.into();
    recs[2]["datestamp"] = now.clone().into();
    for k in [0, 1] {
        recs[k]["datestamp"] = now.clone().into();
    }
    recs.push(
        serde_json::json!({"id": "oai:test:new", "datestamp": now, "dc": {"title": ["new"]}}),
    );
    rewrite(&c.repo, &fx);
    let v = c.run_now().await;
    no_error(&v);
    assert_eq!(
        (
            &v["last"]["created"],
            &v["last"]["updated"],
            &v["last"]["deleted"]
        ),
        (&1.into(), &1.into(), &1.into()),
        "{v:#}"
    );
    assert_eq!(c.app_counts().await, live + 3);
    assert_eq!(c.resources().await.len() as u64, live);
    c.app.stop().await;
}

/// The path an older version gave a record's file: `%XX` for every byte but letters, digits,
/// `-` and `_` (what the migration below starts from).
fn old_record_path(identifier: &str) -> String {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(identifier.as_bytes());
    let name: String = identifier
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!("{:02x}/{name}.xml", hash[0])
}

/// A set collected by an older version (files at `%XX`-escaped paths) is collected again
/// under paths that read like the identifiers and then reconciled: each record is held once,
/// at its new path, and the old paths are recorded deleted (subscribers hear both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_collected_under_the_old_paths_moves_to_the_new_ones() {
    use resourcesync_hub::model::{
        ChangeType, Location, NewChange, ResourceKey, ResourceMeta, SetName, Timestamp,
    };
    let fx = fixture(10);
    let repo = OaiServer::start(&fx, 10);
    let (cfg, _dir) = collect_config(&repo.base);
    let app = TestApp::start_with(cfg.clone()).await;
    let c = Collecting { repo, app };
    no_error(&c.wait_ended(None).await);
    let live: Vec<String> = (0..10)
        .filter(|k| k % 7 != 6)
        .map(|k| format!("oai:test:{k}"))
        .collect();
    let Collecting { repo, app } = c;
    app.stop().await;

    // What an older version left: the same records at the old paths, and its saved state.
    let store = resourcesync_hub::app::open_store(&cfg).await.unwrap();
    let set = SetName::parse("papers").unwrap();
    let root = cfg.collected_dir("papers");
    let mut changes = Vec::new();
    for id in &live {
        let (new, old) = (
            resourcesync_hub::model::origin::record_path(id),
            old_record_path(id),
        );
        let bytes = std::fs::read(root.join(&new)).unwrap();
        std::fs::remove_file(root.join(&new)).unwrap();
        std::fs::create_dir_all(root.join(&old).parent().unwrap()).unwrap();
        std::fs::write(root.join(&old), &bytes).unwrap();
        for (rel, change) in [(new, ChangeType::Deleted), (old, ChangeType::Created)] {
            changes.push(NewChange {
                key: ResourceKey(format!("path:{rel}")),
                location: Location::rel_path(rel),
                change,
                datetime: None,
                meta: ResourceMeta {
                    length: (change == ChangeType::Created).then_some(bytes.len() as u64),
                    md5: (change == ChangeType::Created).then(|| md5_hex(&bytes)),
                    ..ResourceMeta::default()
                },
            });
        }
    }
    store
        .apply(
            &set,
            changes,
            resourcesync_hub::context::list_policy(&cfg, &set),
            Timestamp::now(),
        )
        .await
        .unwrap();
    let (json, v) = store.state("collect:papers").await.unwrap().unwrap();
    let mut saved: serde_json::Value = serde_json::from_str(&json).unwrap();
    saved.as_object_mut().unwrap().remove("layout");
    store
        .save_state("collect:papers", &saved.to_string(), Some(v))
        .await
        .unwrap();
    drop(store);

    let app = TestApp::start_with(cfg).await;
    let c = Collecting { repo, app };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let v = loop {
        let v = c.status().await;
        if v["last_reconcile"].is_string() {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "no reconcile: {v:#}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(v["last_reconcile_deleted"], live.len(), "{v:#}");
    let held = c.resources().await;
    let prefix = c.app.config.set_config("papers").url_prefix;
    let mut ids: Vec<String> = held
        .keys()
        .map(|u| {
            resourcesync_hub::model::origin::identifier_of(u.strip_prefix(&prefix).unwrap())
                .unwrap_or_else(|| panic!("{u} is at a new path"))
        })
        .collect();
    ids.sort();
    let mut want = live.clone();
    want.sort();
    assert_eq!(ids, want);
    c.app.stop().await;
}

/// Two collectors whose repositories serve the same OAI identifier: `/oai` names one item
/// by one identifier, so the first to hold a record keeps it and the other quarantines it,
/// saying which collector has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_collector_of_the_same_identifiers_is_refused_them() {
    let repo = OaiServer::start(&fixture(10), 10);
    let (mut cfg, _dir) = collect_config(&repo.base);
    let first = cfg.collect["papers"].clone();
    cfg.collect.insert("copy".into(), first);
    let app = TestApp::start_with(cfg).await;
    let c = Collecting { repo, app };
    no_error(&c.wait_ended(None).await);
    // Both ran at once: the check and the recording are one step among this process's
    // collectors.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let copy = loop {
        let (s, v) = admin_call(
            &c.app,
            ADMIN,
            reqwest::Method::GET,
            "/admin/v1/collect/copy",
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        if v["last_ended"].is_string() && v["state"] != "running" {
            break v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "copy never ran: {v:#}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let papers = c.status().await;
    let created = |v: &serde_json::Value| v["last"]["created"].as_u64().unwrap();
    let refused = |v: &serde_json::Value| v["last"]["quarantined"].as_u64().unwrap();
    assert_eq!(created(&papers) + created(&copy), 9, "{papers:#} {copy:#}");
    assert_eq!(refused(&papers) + refused(&copy), 9, "{papers:#} {copy:#}");
    let loser = if refused(&copy) > 0 { &copy } else { &papers };
    let reason = loser["quarantine"][0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("serves this OAI identifier already"),
        "{reason}"
    );
    let one = c
        .app
        .get_text("/oai?verb=ListIdentifiers&metadataPrefix=oai_dc")
        .await;
    assert_eq!(
        one.matches("<identifier>oai:test:0</identifier>").count(),
        1,
        "{one}"
    );
    c.app.stop().await;
}
