//! The Elasticsearch backend against osmem-server: index creation, mapping checks, scans,
//! concurrency, a clear error when the server cannot be reached at start, and 503 + recovery
//! when it goes away while serving.

use resourcesync_hub::config::Config;
use resourcesync_hub::store::elastic::{self, mapping, Distribution};
use serde_json::json;

use crate::support::*;

fn cfg(url: &str) -> resourcesync_hub::config::ElasticConfig {
    let mut c = Config::defaults().store.elasticsearch;
    c.url = url.into();
    c
}

async fn put(url: &str, path: &str, body: serde_json::Value) -> u16 {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .put(format!("{url}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn get(url: &str, path: &str) -> serde_json::Value {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("{url}{path}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn indices_are_created_with_the_translated_mappings_and_checked_on_the_next_start() {
    let url = Osmem::clone_url().await;
    let es = elastic::open(&cfg(&url)).await.unwrap();
    assert_eq!(
        es.distribution,
        Distribution::OpenSearch,
        "osmem reports OpenSearch: PIT via /_search/point_in_time"
    );
    // Created behind aliases, so that a write can require the index to be ours.
    let m = get(&url, "/omtd-resourcesync-resource/_mapping").await;
    let props = &m["omtd-resourcesync-resource-v1"]["mappings"]["properties"];
    assert_eq!(props["location"]["type"], "nested");
    assert_eq!(props["md5"]["type"], "keyword");
    assert_eq!(props["ln"]["properties"]["href"]["type"], "nested");
    assert_eq!(props["lastmod"]["format"], mapping::DATE_FORMAT);
    let m = get(&url, "/omtd-resourcesync-change/_mapping").await;
    assert_eq!(
        m["omtd-resourcesync-change-v1"]["mappings"]["properties"]["datetime"]["type"],
        "date"
    );
    // Again: nothing to do.
    elastic::open(&cfg(&url)).await.unwrap();
}

#[tokio::test]
async fn a_dit_index_gains_our_fields_and_an_incompatible_one_is_refused_by_name() {
    let url = Osmem::clone_url().await;
    let mut dit = mapping::resource_mapping();
    for f in ["key", "part", "seq"] {
        dit["properties"].as_object_mut().unwrap().remove(f);
    }
    assert_eq!(
        put(
            &url,
            "/omtd-resourcesync-resource",
            json!({"mappings": dit})
        )
        .await,
        200
    );
    elastic::open(&cfg(&url)).await.unwrap();
    let m = get(&url, "/omtd-resourcesync-resource/_mapping").await;
    assert_eq!(
        m["omtd-resourcesync-resource"]["mappings"]["properties"]["part"]["type"],
        "integer"
    );

    let url = Osmem::clone_url().await;
    let mut bad = mapping::change_mapping();
    bad["properties"]["change"] = json!({"type": "text"});
    assert_eq!(
        put(&url, "/omtd-resourcesync-change", json!({"mappings": bad})).await,
        200
    );
    let e = elastic::open(&cfg(&url))
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("index omtd-resourcesync-change: field change is mapped as text, but the server needs keyword"), "{e}");
}

#[tokio::test]
async fn an_unreachable_server_is_a_clear_error() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let e = elastic::open(&cfg(&url))
        .await
        .err()
        .expect("unreachable")
        .to_string();
    assert!(
        e.starts_with("store unavailable") && e.contains(&url),
        "{e}"
    );
}

#[tokio::test]
async fn a_point_in_time_scan_sees_every_document_once_in_order_past_any_depth() {
    let url = Osmem::clone_url().await;
    let es = elastic::open(&cfg(&url)).await.unwrap();
    let index = "omtd-resourcesync-change";
    let mut bulk = String::new();
    // Written out of order, as writers do.
    for seq in (0..30).rev() {
        bulk.push_str(&format!("{{\"index\":{{\"_index\":\"{index}\"}}}}\n"));
        bulk.push_str(&json!({"resource_set": "s", "seq": seq, "change": "created", "datetime": "2024-01-01T00:00:00Z"}).to_string());
        bulk.push('\n');
    }
    let r = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{url}/_bulk?refresh=true"))
        .header("content-type", "application/x-ndjson")
        .body(bulk)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let pit = es.open_pit(index, "1m").await.unwrap();
    let query = json!({"term": {"resource_set": "s"}});
    let sort = json!([{"datetime": "asc"}, {"seq": "asc"}]);
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = es
            .scan(&pit, &query, &sort, after.as_ref(), 7)
            .await
            .unwrap();
        seen.extend(
            page.hits
                .iter()
                .map(|h| h["_source"]["seq"].as_i64().unwrap()),
        );
        match page.after {
            Some(a) => after = Some(a),
            None => break,
        }
    }
    es.close_pit(&pit).await.unwrap();
    assert_eq!(seen, (0..30).collect::<Vec<i64>>());
}

#[tokio::test]
async fn sets_are_registered_once_even_by_concurrent_processes() {
    use resourcesync_hub::model::{SetName, Timestamp};
    use resourcesync_hub::store::elastic::ElasticStore;
    use resourcesync_hub::store::SetStore as _;
    let url = Osmem::clone_url().await;
    let (a, b) = (
        ElasticStore::open(&cfg(&url)).await.unwrap(),
        ElasticStore::open(&cfg(&url)).await.unwrap(),
    );
    let set = SetName::parse("papers").unwrap();
    let now = Timestamp::now();
    let (ra, rb) = tokio::join!(a.ensure_set(&set, now), b.ensure_set(&set, now));
    assert_eq!(
        [ra.unwrap(), rb.unwrap()].iter().filter(|c| **c).count(),
        1,
        "exactly one creates it"
    );
    assert!(!a.ensure_set(&set, now).await.unwrap());
    a.ensure_set(&SetName::parse("data").unwrap(), now)
        .await
        .unwrap();
    let names: Vec<String> = b
        .sets()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name.to_string())
        .collect();
    assert_eq!(names, ["data", "papers"]);
    assert_eq!(b.sets().await.unwrap()[1].created_at, now);
}

#[tokio::test]
async fn a_conditional_replace_loses_to_a_writer_that_came_first() {
    let url = Osmem::clone_url().await;
    let es = elastic::open(&cfg(&url)).await.unwrap();
    let idx = "omtd-resourcesync-meta";
    assert!(es
        .put_doc_if(
            idx,
            "counter",
            &json!({"kind": "counter", "state": {"n": 1}}),
            None
        )
        .await
        .unwrap());
    assert!(
        !es.put_doc_if(idx, "counter", &json!({"kind": "counter"}), None)
            .await
            .unwrap(),
        "create twice: 409"
    );
    let v1 = es.get_doc(idx, "counter").await.unwrap().unwrap();
    assert!(es
        .put_doc_if(
            idx,
            "counter",
            &json!({"kind": "counter", "state": {"n": 2}}),
            Some(&v1)
        )
        .await
        .unwrap());
    assert!(
        !es.put_doc_if(
            idx,
            "counter",
            &json!({"kind": "counter", "state": {"n": 3}}),
            Some(&v1)
        )
        .await
        .unwrap(),
        "stale version"
    );
    assert_eq!(
        es.get_doc(idx, "counter").await.unwrap().unwrap().source["state"]["n"],
        2
    );
    assert!(es
        .get_doc(idx, "missing/with space")
        .await
        .unwrap()
        .is_none());
}

/// A writer that died mid-batch: before its commit its change documents stay invisible and are
/// overwritten; after it, the next writer replays them onto the resources.
#[tokio::test]
async fn a_writer_that_died_mid_batch_neither_shows_half_a_batch_nor_loses_a_committed_one() {
    use resourcesync_hub::model::{
        ChangeType, Location, NewChange, ResourceKey, ResourceMeta, SetName, Timestamp,
    };
    use resourcesync_hub::store::elastic::ElasticStore;
    use resourcesync_hub::store::{ListPolicy, Store};
    let url = Osmem::clone_url().await;
    let c = cfg(&url);
    let es = ElasticStore::open(&c).await.unwrap();
    let raw = es.es.clone();
    let store = Store::new(es);
    let set = SetName::parse("papers").unwrap();
    let policy = ListPolicy {
        max_items: 100,
        max_bytes: 50 << 20,
        rollover_secs: 0,
        max_future_skew_secs: 60,
    };
    let created = |u: &str, len: u64| NewChange {
        key: ResourceKey(format!("url:{u}")),
        location: Location::url(u),
        change: ChangeType::Created,
        datetime: None,
        meta: ResourceMeta {
            length: Some(len),
            ..Default::default()
        },
    };
    store
        .apply(
            &set,
            vec![created("http://x/1", 1)],
            policy,
            Timestamp::now(),
        )
        .await
        .unwrap();
    let set_doc = |raw: elastic::Es| async move {
        raw.get_doc(&c.meta_index(), "set:papers")
            .await
            .unwrap()
            .unwrap()
    };
    let v = set_doc(raw.clone()).await;
    assert_eq!(v.source["state"]["next_seq"], 2);

    // Died before its commit: a change document at seq 2, state untouched.
    let orphan = json!({"resource_set": "papers", "location": {"type": "url", "value": "http://x/ghost"}, "change": "created",
        "datetime": Timestamp::now().to_string(), "datetime_us": Timestamp::now().micros(), "key": "url:http://x/ghost", "seq": 2});
    assert!(raw
        .put_doc_if("omtd-resourcesync-change", "papers:2", &orphan, None)
        .await
        .unwrap());
    assert_eq!(
        store.counts(&set).await.unwrap().changes,
        1,
        "an uncommitted change is not there"
    );
    assert_eq!(
        store
            .latest_change(&set)
            .await
            .unwrap()
            .unwrap()
            .location
            .value,
        "http://x/1"
    );

    // Died after its commit: seq 2 is an update of x/1 recorded in the bookkeeping, the
    // resource was not written, and the claim has lapsed.
    let update = json!({"resource_set": "papers", "location": {"type": "url", "value": "http://x/1"}, "change": "updated",
        "datetime": Timestamp::now().to_string(), "datetime_us": Timestamp::now().micros(), "key": "url:http://x/1", "length": 99, "seq": 2, "part": 1});
    let cur = raw
        .get_doc("omtd-resourcesync-change", "papers:2")
        .await
        .unwrap()
        .unwrap();
    assert!(raw
        .put_doc_if("omtd-resourcesync-change", "papers:2", &update, Some(&cur))
        .await
        .unwrap());
    let mut doc = v.source.clone();
    doc["state"]["next_seq"] = json!(4);
    // ... and seq 3 created x/3, whose resource was never written.
    let create = json!({"resource_set": "papers", "location": {"type": "url", "value": "http://x/3"}, "change": "created",
        "datetime": Timestamp::now().to_string(), "datetime_us": Timestamp::now().micros(), "key": "url:http://x/3", "length": 3, "seq": 3, "part": 1});
    assert!(raw
        .put_doc_if("omtd-resourcesync-change", "papers:3", &create, None)
        .await
        .unwrap());
    doc["state"]["claimed_until"] = json!(Timestamp::now().micros() - 1);
    assert!(raw
        .put_doc_if(&cfg(&url).meta_index(), "set:papers", &doc, Some(&v))
        .await
        .unwrap());
    let out = store
        .apply(
            &set,
            vec![created("http://x/2", 2)],
            policy,
            Timestamp::now(),
        )
        .await
        .unwrap();
    assert_eq!(out.applied[0].1, 4, "seqs are never reused");
    let r1 = store
        .resource(&set, &ResourceKey("url:http://x/1".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        r1.meta.length,
        Some(99),
        "the committed update was replayed onto the resource"
    );
    let r3 = store
        .resource(&set, &ResourceKey("url:http://x/3".into()))
        .await
        .unwrap()
        .expect("recreated");
    assert_eq!(r3.meta.length, Some(3));
    let page = store.resources(&set, Some(1), None, 10).await.unwrap();
    assert_eq!(
        page.items.len(),
        3,
        "x/1, x/2 and the replayed x/3 in part 1"
    );
    assert_eq!(store.counts(&set).await.unwrap().changes, 4);
}

/// A TCP relay to the search server that can be cut (existing connections dropped, new ones
/// refused) and restored: Elasticsearch going away and coming back.
struct Relay {
    addr: std::net::SocketAddr,
    down: tokio::sync::watch::Sender<bool>,
}

impl Relay {
    async fn start(upstream: &str) -> Relay {
        let upstream = url::Url::parse(upstream).unwrap();
        let target = format!(
            "{}:{}",
            upstream.host_str().unwrap(),
            upstream.port().unwrap()
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (down, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if *watch.borrow() {
                    continue; // dropped: connection closed at once
                }
                let (target, mut watch) = (target.clone(), watch.clone());
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = watch.wait_for(|d| *d) => {}
                    }
                });
            }
        });
        Relay { addr, down }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn set_down(&self, d: bool) {
        self.down.send_replace(d);
    }
}

#[tokio::test]
async fn elasticsearch_going_away_is_a_503_with_retry_after_and_service_resumes_by_itself() {
    let relay = Relay::start(&Osmem::clone_url().await).await;
    let (mut c, _d) = crate::hub::hub_config();
    c.store.backend = resourcesync_hub::config::Backend::Elasticsearch;
    c.store.elasticsearch.url = relay.url();
    c.sets.insert("papers".into(), Default::default());
    let app = crate::support::TestApp::start_with(c).await;
    let lines: Vec<String> = (0..5)
        .map(|n| crate::notify::url_line("created", n, None))
        .collect();
    app.ingest_ok("papers", &lines.join("\n")).await;
    let get = |path: &'static str| {
        let (client, url) = (app.client.clone(), app.url(path));
        async move { client.get(url).send().await.unwrap() }
    };
    assert_eq!(get("/sets/papers/resourcelist.xml").await.status(), 200);

    relay.set_down(true);
    for path in [
        "/sets/papers/resourcelist.xml",
        "/sets/papers/changelist.xml",
        "/.well-known/resourcesync",
        "/readyz",
    ] {
        let r = get(path).await;
        assert_eq!(r.status(), 503, "{path}");
        assert!(
            r.headers().get("retry-after").is_some(),
            "{path}: Retry-After"
        );
        let text = r.text().await.unwrap();
        assert!(text.contains("unavailable"), "{path}: says why: {text}");
    }
    assert_eq!(
        app.ingest("papers", &crate::notify::url_line("created", 9, None))
            .await
            .status(),
        503,
        "ingest refused, not lost silently"
    );

    relay.set_down(false);
    let mut back = false;
    for _ in 0..100 {
        if get("/sets/papers/resourcelist.xml").await.status() == 200 {
            back = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(back, "service resumed without a restart");
    let (_, rl) = app.get_doc("/sets/papers/resourcelist.xml").await;
    assert_eq!(rl.entries.len(), 5, "nothing lost, nothing half-written");
    app.stop().await;
}

#[test]
fn serve_exits_with_a_clear_message_when_elasticsearch_cannot_be_reached_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = std::process::Command::new(crate::support::ChildServer::BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            tmp.path().to_str().unwrap(),
        ])
        .env("RSHUB_STORE__BACKEND", "elasticsearch")
        .env(
            "RSHUB_STORE__ELASTICSEARCH__URL",
            format!("http://127.0.0.1:{port}"),
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "cannot open the Elasticsearch store at http://127.0.0.1:{port}"
        )),
        "{err}"
    );
}

/// A cluster that loses our indices while we serve (rebuilt empty, indices deleted): the next
/// write is refused rather than creating indices with guessed mappings, the indices come back
/// with ours, /readyz reports the loss once, and service goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_indices_are_detected_reported_and_recreated_with_their_mappings() {
    let (mut c, _dir) = test_config();
    use_elasticsearch(&mut c).await;
    let es = c.store.elasticsearch.url.clone();
    let app = TestApp::start_with(c).await;
    app.ingest_ok("s", &change_line("created", "a.txt", &md5_hex(b"a"), 1))
        .await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for kind in ["resource", "change", "meta", "hub"] {
        let r = http
            .delete(format!("{es}/omtd-resourcesync-{kind}-v1"))
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success(),
            "{kind}: {}",
            r.text().await.unwrap()
        );
    }
    // A write into a new set: refused (503, retry) when it is the first to meet the loss (a
    // background worker may meet it first and recreate them), never into an engine-made index.
    let line = change_line("created", "b.txt", &md5_hex(b"b"), 1);
    let r = app.ingest("fresh", &line).await;
    assert!(
        matches!(r.status().as_u16(), 503 | 200),
        "{}: {}",
        r.status(),
        r.text().await.unwrap()
    );
    let m = get(&es, "/omtd-resourcesync-resource/_mapping").await;
    assert_eq!(
        m["omtd-resourcesync-resource-v1"]["mappings"]["properties"]["location"]["type"], "nested",
        "recreated with our mappings: {m}"
    );
    // Retried, it goes through; /readyz reports the loss once, whoever met it.
    app.ingest_ok("fresh", &line).await;
    assert_readyz_reports_once(&app, "omtd-resourcesync-resource").await;

    // Lost again, this time with no write: /readyz (or a worker before it) notices, and
    // /readyz reports it once, then is ready.
    let r = http
        .delete(format!("{es}/omtd-resourcesync-change-v1"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    assert_readyz_reports_once(&app, "omtd-resourcesync-change").await;
    let m = get(&es, "/omtd-resourcesync-change/_mapping").await;
    assert_eq!(
        m["omtd-resourcesync-change-v1"]["mappings"]["properties"]["datetime"]["type"],
        "date"
    );
    app.stop().await;
}

/// `/readyz` answers 503 naming `index` once, then 200.
async fn assert_readyz_reports_once(app: &TestApp, index: &str) {
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains(index), "{body}");
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}
