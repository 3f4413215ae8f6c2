//! Collecting from any source by its base URL: discovery, ResourceSync sources followed by the
//! harvest engine (a chained server first, with push), sitemaps and activity streams.

use std::collections::BTreeMap;
use std::time::Duration;

use resourcesync_hub::config::{CollectConfig, Config};
use resourcesync_hub::model::SetName;

use crate::harvest::file_line;
use crate::hub::hub_config;
use crate::support::{add_file_set, admin_call, wait_until, TestApp};

const ADMIN: &str = "collect-any-admin-token-0123456789";

/// A server collecting `url` into the set `NAME` (runs an hour apart: what arrives sooner
/// came by push or was asked for).
pub fn collecting(collectors: &[(&str, &str)]) -> (Config, tempfile::TempDir) {
    let (mut c, dir) = hub_config();
    c.admin.token = ADMIN.into();
    for (name, url) in collectors {
        let mut cc = CollectConfig::new(url);
        cc.interval_secs = 3600;
        cc.retry_base_ms = 20;
        cc.attempts = 2;
        cc.request_timeout_secs = 10;
        c.collect.insert((*name).into(), cc);
    }
    (c, dir)
}

pub async fn collector(app: &TestApp, name: &str) -> serde_json::Value {
    let (s, v) = admin_call(
        app,
        ADMIN,
        reqwest::Method::GET,
        &format!("/admin/v1/collect/{name}"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    v
}

/// What a set holds, by the original's URL (its `via` link, or its own URL when linked):
/// md5 and length.
pub async fn held_by_origin(app: &TestApp, set: &str) -> BTreeMap<String, (String, u64)> {
    let store = resourcesync_hub::app::open_store(&app.config)
        .await
        .unwrap();
    let set = SetName::parse(set).unwrap();
    let sc = app.config.set_config(set.as_str());
    let mut out = BTreeMap::new();
    let mut after = None;
    loop {
        let page = store.resources(&set, None, after, 1000).await.unwrap();
        for r in page.items {
            let origin = r
                .meta
                .ln
                .iter()
                .find(|l| l.rel == "via")
                .map(|l| l.href.value.clone())
                .unwrap_or_else(|| r.key.url(&sc.url_prefix));
            out.insert(
                origin,
                (r.meta.md5.unwrap_or_default(), r.meta.length.unwrap_or(0)),
            );
        }
        match page.next {
            Some(c) => after = Some(c),
            None => return out,
        }
    }
}

/// How many changes a set has recorded.
pub async fn changes(app: &TestApp, set: &str) -> u64 {
    let store = resourcesync_hub::app::open_store(&app.config)
        .await
        .unwrap();
    store
        .counts(&SetName::parse(set).unwrap())
        .await
        .unwrap()
        .changes
}

/// Waits until the collected set equals the source's set (each resource by its original URL,
/// with the same md5 and length); the difference when it never does.
async fn wait_equal(source: &TestApp, src_set: &str, mirror: &TestApp, set: &str, secs: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let want = held_by_origin(source, src_set).await;
        let got = held_by_origin(mirror, set).await;
        if want == got {
            return;
        }
        if std::time::Instant::now() > deadline {
            let missing: Vec<_> = want
                .keys()
                .filter(|k| !got.contains_key(*k))
                .take(5)
                .collect();
            let extra: Vec<_> = got
                .keys()
                .filter(|k| !want.contains_key(*k))
                .take(5)
                .collect();
            let differ: Vec<_> = want
                .iter()
                .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
                .take(5)
                .collect();
            panic!(
                "the collected set never equalled its source: {} vs {} resources; missing {missing:?}, extra {extra:?}, different {differ:?}\n{:#}",
                got.len(),
                want.len(),
                collector(mirror, set).await
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A second resourcesync-hub, given only the first's base URL, discovers its ResourceSync
/// source, baselines the set into its own store (mirrored bytes, `via` links to the origin),
/// subscribes at the first's hub, and applies each later change by push (runs are an hour
/// apart): created, updated and deleted resources arrive, each recorded once, and the chained
/// server notifies its own subscribers in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chained_server_collects_another_by_its_base_url_with_push() {
    let (mut a_cfg, a_dir) = hub_config();
    let root = a_dir.path().join("root");
    add_file_set(&mut a_cfg, "papers", &root, None);
    let a = TestApp::start_with(a_cfg).await;
    let lines: Vec<String> = (0..20)
        .map(|i| {
            file_line(
                &root,
                "created",
                &format!("d/r{i}.txt"),
                &format!("resource {i}\n"),
            )
        })
        .collect();
    a.ingest_ok("papers", &lines.join("\n")).await;

    let (b_cfg, _b_dir) = collecting(&[("mirror", &a.config.base_url())]);
    let b = TestApp::start_with(b_cfg).await;
    wait_equal(&a, "papers", &b, "mirror", 60).await;
    let v = collector(&b, "mirror").await;
    assert_eq!(v["kind"], "resourcesync", "{v:#}");
    let why = v["discovered"]["why"].as_str().unwrap();
    assert!(
        why.contains("/.well-known/resourcesync is a ResourceSync description"),
        "{why}"
    );
    assert_eq!(changes(&b, "mirror").await, 20);
    // The bytes are served by the chained server, as the origin serves them.
    let port = a.addr.rsplit(':').next().unwrap();
    let served = b
        .client
        .get(b.url(&format!(
            "/files/mirror/127.0.0.1_{port}/files/papers/d/r7.txt"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(served.text().await.unwrap(), "resource 7\n");
    // Its subscription at the first server's hub is verified and active.
    wait_until("the chained server's subscription", || async {
        collector(&b, "mirror").await["following"]
            .as_str()
            .is_some_and(|f| f.contains("active"))
    })
    .await;

    // Changes at the origin arrive by push, each recorded once.
    let mut batch = Vec::new();
    for i in 0..3 {
        batch.push(file_line(
            &root,
            "created",
            &format!("d/new{i}.txt"),
            &format!("new {i}\n"),
        ));
    }
    for i in 0..5 {
        batch.push(file_line(
            &root,
            "updated",
            &format!("d/r{i}.txt"),
            &format!("second {i}\n"),
        ));
    }
    for i in 18..20 {
        std::fs::remove_file(root.join(format!("d/r{i}.txt"))).unwrap();
        batch.push(format!(
            r#"{{"change":"deleted","location":{{"type":"rel_path","value":"d/r{i}.txt"}}}}"#
        ));
    }
    a.ingest_ok("papers", &batch.join("\n")).await;
    wait_equal(&a, "papers", &b, "mirror", 30).await;
    assert_eq!(changes(&b, "mirror").await, 30, "each change recorded once");
    let v = collector(&b, "mirror").await;
    assert!(
        v["following"].as_str().unwrap().contains("push"),
        "{:#}",
        v["following"]
    );
    b.stop().await;
    a.stop().await;
}

/// Given a base URL where nothing a collector reads is found, the collector says so in words,
/// naming what it looked at, and records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_url_offering_nothing_is_refused_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("index.html"), "<html><body>hello</body></html>").unwrap();
    let plain = crate::harvest::static_server(site).await;
    let (b_cfg, _b_dir) = collecting(&[("nothing", &plain)]);
    let b = TestApp::start_with(b_cfg).await;
    wait_until("the collector's error", || async {
        collector(&b, "nothing").await["last_error"].is_string()
    })
    .await;
    let v = collector(&b, "nothing").await;
    let e = v["last_error"].as_str().unwrap();
    assert!(e.contains("nothing a collector reads was found"), "{e}");
    assert!(e.contains("robots.txt"), "{e}");
    assert!(v["kind"].is_null(), "{v:#}");
    assert_eq!(changes(&b, "nothing").await, 0);
    b.stop().await;
}
