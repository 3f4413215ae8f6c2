//! Collecting from any source by its base URL: discovery, ResourceSync sources followed by the
//! harvest engine (a chained server first, with push), sitemaps and activity streams.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use resourcesync_hub::config::{CollectConfig, Config};
use resourcesync_hub::model::SetName;

use crate::harvest::file_line;
use crate::hub::hub_config;
use crate::support::{admin_call, wait_until, TestApp};

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
    let (a, _a_dir, root) = crate::harvest::small_source(20, |_| {}).await;

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
    // The console says what was found and why.
    let page = crate::support::console_page(&b, ADMIN, "/console/collectors/mirror").await;
    assert!(
        page.contains("resourcesync") && page.contains("is a ResourceSync description"),
        "{page}"
    );
    // The bytes are served by the chained server, as the origin serves them.
    let port = a.addr.rsplit(':').next().unwrap();
    let served = b
        .client
        .get(b.url(&format!(
            "/files/mirror/127.0.0.1_{port}/files/papers/r7.txt"
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
            &format!("new{i}.txt"),
            &format!("new {i}\n"),
        ));
    }
    for i in 0..5 {
        batch.push(file_line(
            &root,
            "updated",
            &format!("r{i}.txt"),
            &format!("second {i}\n"),
        ));
    }
    for i in 18..20 {
        std::fs::remove_file(root.join(format!("r{i}.txt"))).unwrap();
        batch.push(format!(
            r#"{{"change":"deleted","location":{{"type":"rel_path","value":"r{i}.txt"}}}}"#
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

/// A static site's file, written beside and renamed over (as a careful publisher does).
fn put(root: &Path, rel: &str, body: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let tmp = p.with_extension("rshub-test-new");
    std::fs::write(&tmp, body).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
}

fn md5_of(body: &str) -> (String, u64) {
    (
        resourcesync_hub::digest::md5_hex(body.as_bytes()),
        body.len() as u64,
    )
}

/// An IIIF Change Discovery stream of `pages` (each a list of (type, object, endTime)) at
/// `/activity/`, found through the site's API catalog (RFC 9727).
fn write_stream(root: &Path, base: &str, pages: &[Vec<(&str, String, String)>]) {
    let n = pages.len();
    put(
        root,
        ".well-known/api-catalog",
        &serde_json::json!({"linkset": [{"anchor": format!("{base}/.well-known/api-catalog"),
            "item": [{"href": format!("{base}/activity/all-changes.json")}]}]})
        .to_string(),
    );
    put(
        root,
        "activity/all-changes.json",
        &serde_json::json!({
            "@context": "http://iiif.io/api/discovery/1/context.json",
            "id": format!("{base}/activity/all-changes.json"), "type": "OrderedCollection",
            "first": {"id": format!("{base}/activity/page-0.json"), "type": "OrderedCollectionPage"},
            "last": {"id": format!("{base}/activity/page-{}.json", n - 1), "type": "OrderedCollectionPage"},
        })
        .to_string(),
    );
    for (i, items) in pages.iter().enumerate() {
        let mut page = serde_json::json!({
            "@context": "http://iiif.io/api/discovery/1/context.json",
            "id": format!("{base}/activity/page-{i}.json"), "type": "OrderedCollectionPage",
            "orderedItems": items.iter().map(|(t, o, e)| serde_json::json!({
                "type": t, "object": {"id": format!("{base}/objects/{o}.json"), "type": "Manifest"}, "endTime": e,
            })).collect::<Vec<_>>(),
        });
        if i > 0 {
            page["prev"] = serde_json::json!({"id": format!("{base}/activity/page-{}.json", i - 1), "type": "OrderedCollectionPage"});
        }
        put(root, &format!("activity/page-{i}.json"), &page.to_string());
    }
}

/// A sitemap index (named by `robots.txt`) over two sitemaps of `pages` (name, lastmod).
fn write_sitemaps(root: &Path, base: &str, pages: &[(String, String)]) {
    put(
        root,
        "robots.txt",
        &format!("User-agent: *\nDisallow: /private/\nSitemap: {base}/sitemap_index.xml\n"),
    );
    put(
        root,
        "sitemap_index.xml",
        &format!(
            r#"<?xml version="1.0" encoding="UTF-8"?><sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><sitemap><loc>{base}/sm-1.xml</loc></sitemap><sitemap><loc>{base}/sm-2.xml</loc></sitemap></sitemapindex>"#
        ),
    );
    let half = pages.len() / 2;
    for (i, chunk) in [&pages[..half], &pages[half..]].iter().enumerate() {
        let urls: String = chunk
            .iter()
            .map(|(name, lm)| {
                format!("<url><loc>{base}/pages/{name}.html</loc><lastmod>{lm}</lastmod></url>")
            })
            .collect();
        put(
            root,
            &format!("sm-{}.xml", i + 1),
            &format!(
                r#"<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>"#
            ),
        );
    }
}

async fn run_now(app: &TestApp, name: &str) {
    let (s, v) = admin_call(
        app,
        ADMIN,
        reqwest::Method::POST,
        &format!("/admin/v1/collect/{name}/run"),
        None,
    )
    .await;
    assert_eq!(s, 202, "{v}");
}

/// Waits until `set` holds exactly `want` (by the original's URL: md5, length).
async fn wait_holds(app: &TestApp, set: &str, want: &BTreeMap<String, (String, u64)>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let got = held_by_origin(app, set).await;
        if &got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{set} never held what its source lists:\n got {got:?}\nwant {want:?}\n{:#}",
            collector(app, set).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn audit_in_sync(app: &TestApp, name: &str) -> bool {
    let (s, v) = admin_call(
        app,
        ADMIN,
        reqwest::Method::GET,
        &format!("/admin/v1/collect/{name}/audit"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    v["in_sync"].as_bool().unwrap() && v["report"].as_str().unwrap().ends_with("IN SYNC\n")
}

/// One server, given only base URLs: a PyPI `oaipmh` repository, a static ResourceSync source
/// made by PyPI `resync`'s `resync-build` and served by nginx, a second resourcesync-hub (with
/// push), an IIIF Change Discovery stream and a sitemap index over static files (nginx). Each
/// kind is discovered and said; each set equals its source; after changes at every source,
/// equal again (runs asked for; the chained server's by push).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_base_urls_alone_every_kind_of_source_is_collected_and_kept_equal() {
    let dir = tempfile::tempdir().unwrap();
    // The OAI-PMH repository (pyoai).
    let mut oai_fx = crate::collect::fixture(12);
    let repo = crate::collect::OaiServer::start(&oai_fx, 5);
    // Three static sites on nginx.
    let (p_rs, p_as, p_sm) = (
        crate::harvest::free_port(),
        crate::harvest::free_port(),
        crate::harvest::free_port(),
    );
    let (rs_root, as_root, sm_root) = (
        dir.path().join("rs"),
        dir.path().join("as"),
        dir.path().join("sm"),
    );
    let (rs_base, as_base, sm_base) = (
        format!("http://127.0.0.1:{p_rs}"),
        format!("http://127.0.0.1:{p_as}"),
        format!("http://127.0.0.1:{p_sm}"),
    );
    // The resync-build source: files, its Resource List, Change List, Capability List and
    // Source Description at /.well-known/resourcesync.
    let files = rs_root.join("files");
    for i in 0..8 {
        put(&files, &format!("f{i}.txt"), &format!("static file {i}\n"));
    }
    let map = format!("{rs_base}/files/={}", files.display());
    let build = {
        let (rs_root, rs_base, map) = (rs_root.clone(), rs_base.clone(), map.clone());
        move |changes: bool| {
            let rl = rs_root.join("resourcelist.xml");
            if changes {
                let tmp = rs_root.join("changelist.new");
                crate::harvest::resync_build(&[
                    "--write-changelist",
                    "--reference",
                    rl.to_str().unwrap(),
                    "--outfile",
                    tmp.to_str().unwrap(),
                    &map,
                ]);
                std::fs::rename(&tmp, rs_root.join("changelist.xml")).unwrap();
                // The Resource List as the files are now (what an audit compares with).
                let tmp = rs_root.join("resourcelist.new");
                crate::harvest::resync_build(&[
                    "--write-resourcelist",
                    "--outfile",
                    tmp.to_str().unwrap(),
                    &map,
                ]);
                std::fs::rename(&tmp, &rl).unwrap();
                return;
            }
            crate::harvest::resync_build(&[
                "--write-resourcelist",
                "--outfile",
                rl.to_str().unwrap(),
                &map,
            ]);
            let cl = rs_root.join("changelist.xml");
            crate::harvest::resync_build(&[
                "--write-changelist",
                "--empty",
                "--outfile",
                cl.to_str().unwrap(),
            ]);
            let caps = format!(
                "resourcelist={rs_base}/resourcelist.xml,changelist={rs_base}/changelist.xml"
            );
            let cap = rs_root.join("capabilitylist.xml");
            crate::harvest::resync_build(&[
                "--write-capabilitylist",
                &caps,
                "--outfile",
                cap.to_str().unwrap(),
            ]);
            std::fs::create_dir_all(rs_root.join(".well-known")).unwrap();
            let sd = rs_root.join(".well-known/resourcesync");
            crate::harvest::resync_build(&[
                "--write-sourcedescription",
                &format!("{rs_base}/capabilitylist.xml"),
                "--outfile",
                sd.to_str().unwrap(),
            ]);
        }
    };
    tokio::task::spawn_blocking({
        let b = build.clone();
        move || b(false)
    })
    .await
    .unwrap();
    // The activity stream: five objects created, one of them updated.
    for i in 0..5 {
        put(
            &as_root,
            &format!("objects/o{i}.json"),
            &format!("{{\"object\": {i}}}"),
        );
    }
    let mut stream = vec![
        (0..5)
            .map(|i| ("Create", format!("o{i}"), format!("2026-01-01T00:00:0{i}Z")))
            .collect::<Vec<_>>(),
        vec![(
            "Update",
            "o1".to_string(),
            "2026-01-02T00:00:00Z".to_string(),
        )],
    ];
    write_stream(&as_root, &as_base, &stream);
    // The sitemap index over six pages.
    let mut pages: Vec<(String, String)> = (0..6)
        .map(|i| (format!("p{i}"), "2026-01-01".to_string()))
        .collect();
    for (name, _) in &pages {
        put(
            &sm_root,
            &format!("pages/{name}.html"),
            &format!("<p>{name}</p>"),
        );
    }
    write_sitemaps(&sm_root, &sm_base, &pages);
    let _nginx = crate::accel::Nginx::static_sites(
        &dir.path().join("nginx"),
        &[(p_rs, &rs_root), (p_as, &as_root), (p_sm, &sm_root)],
    );
    // The chained resourcesync-hub.
    let (a, _a_dir, a_root) = crate::harvest::small_source(6, |_| {}).await;

    let (b_cfg, _b_dir) = collecting(&[
        ("oai", &repo.base),
        ("rs", &rs_base),
        ("hub", &a.config.base_url()),
        ("stream", &as_base),
        ("site", &format!("{sm_base}/")),
    ]);
    let b = TestApp::start_with(b_cfg).await;

    // Each kind discovered, and said why.
    for (name, kind, how) in [
        ("oai", "oai-pmh", "answers OAI-PMH Identify"),
        (
            "rs",
            "resourcesync",
            "/.well-known/resourcesync is a ResourceSync description",
        ),
        (
            "hub",
            "resourcesync",
            "/.well-known/resourcesync is a ResourceSync description",
        ),
        ("stream", "activity", "is an activity stream"),
        ("site", "sitemap", "is a sitemap index"),
    ] {
        wait_until(&format!("{name} discovered"), || async {
            collector(&b, name).await["kind"] == kind
        })
        .await;
        let v = collector(&b, name).await;
        assert!(
            v["discovered"]["why"].as_str().unwrap().contains(how),
            "{name}: {v:#}"
        );
    }

    // Each set equals its source.
    let live_records = |fx: &serde_json::Value| {
        fx["records"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["deleted"] != true)
            .count()
    };
    let n = live_records(&oai_fx);
    wait_until("the OAI-PMH set", || async {
        held_by_origin(&b, "oai").await.len() == n
    })
    .await;
    wait_until("the resync-build set in sync", || async {
        audit_in_sync(&b, "rs").await
    })
    .await;
    wait_equal(&a, "papers", &b, "hub", 60).await;
    let objects = |live: &[usize]| -> BTreeMap<String, (String, u64)> {
        live.iter()
            .map(|i| {
                let body =
                    std::fs::read_to_string(as_root.join(format!("objects/o{i}.json"))).unwrap();
                (format!("{as_base}/objects/o{i}.json"), md5_of(&body))
            })
            .collect()
    };
    wait_holds(&b, "stream", &objects(&[0, 1, 2, 3, 4])).await;
    let site_pages = |pages: &[(String, String)]| -> BTreeMap<String, (String, u64)> {
        pages
            .iter()
            .map(|(name, _)| {
                let body =
                    std::fs::read_to_string(sm_root.join(format!("pages/{name}.html"))).unwrap();
                (format!("{sm_base}/pages/{name}.html"), md5_of(&body))
            })
            .collect()
    };
    wait_holds(&b, "site", &site_pages(&pages)).await;

    // Changes at every source.
    let now = crate::collect::now_datestamp();
    oai_fx["records"][0]["dc"]["title"] = serde_json::json!(["Record 0, second version"]);
    oai_fx["records"][0]["datestamp"] = now.clone().into();
    oai_fx["records"][1]["deleted"] = true.into();
    oai_fx["records"][1]["datestamp"] = now.into();
    crate::collect::rewrite(&repo, &oai_fx);
    crate::harvest::write_ahead(&files.join("f0.txt"), "static file 0, second version\n");
    std::fs::remove_file(files.join("f7.txt")).unwrap();
    put(&files, "new.txt", "a new static file\n");
    tokio::task::spawn_blocking({
        let b = build.clone();
        move || b(true)
    })
    .await
    .unwrap();
    a.ingest_ok(
        "papers",
        &[
            file_line(&a_root, "updated", "r0.txt", "hub resource 0, second\n"),
            file_line(&a_root, "created", "r9.txt", "hub resource 9\n"),
        ]
        .join("\n"),
    )
    .await;
    put(&as_root, "objects/o2.json", "{\"object\": 2, \"v\": 2}");
    put(&as_root, "objects/o5.json", "{\"object\": 5}");
    stream.push(vec![
        ("Update", "o2".into(), "2026-02-01T00:00:00Z".into()),
        ("Delete", "o3".into(), "2026-02-01T00:00:01Z".into()),
        ("Create", "o5".into(), "2026-02-01T00:00:02Z".into()),
    ]);
    write_stream(&as_root, &as_base, &stream);
    put(&sm_root, "pages/p0.html", "<p>p0, second version</p>");
    pages[0].1 = "2026-02-01".into();
    pages.pop();
    pages.push(("p9".into(), "2026-02-01".into()));
    put(&sm_root, "pages/p9.html", "<p>p9</p>");
    write_sitemaps(&sm_root, &sm_base, &pages);
    for name in ["oai", "rs", "stream", "site"] {
        run_now(&b, name).await;
    }

    // Equal again.
    let n = live_records(&oai_fx);
    wait_until("the OAI-PMH set", || async {
        held_by_origin(&b, "oai").await.len() == n
    })
    .await;
    let oai_files = b.config.collected_dir("oai");
    wait_until("record 0's second version", || async {
        walkdir::WalkDir::new(&oai_files)
            .into_iter()
            .filter_map(Result::ok)
            .any(|e| {
                std::fs::read_to_string(e.path())
                    .is_ok_and(|t| t.contains("Record 0, second version"))
            })
    })
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !(audit_in_sync(&b, "rs").await
        && held_by_origin(&b, "rs")
            .await
            .contains_key(&format!("{rs_base}/files/new.txt")))
    {
        if std::time::Instant::now() > deadline {
            let (_, v) = admin_call(
                &b,
                ADMIN,
                reqwest::Method::GET,
                "/admin/v1/collect/rs/audit",
                None,
            )
            .await;
            panic!(
                "the resync-build set never in sync again:\n{}\n{}\n{}",
                v["report"].as_str().unwrap_or(""),
                collector(&b, "rs").await["following"]
                    .as_str()
                    .unwrap_or(""),
                std::fs::read_to_string(rs_root.join("changelist.xml")).unwrap()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!held_by_origin(&b, "rs")
        .await
        .contains_key(&format!("{rs_base}/files/f7.txt")));
    wait_equal(&a, "papers", &b, "hub", 30).await;
    wait_holds(&b, "stream", &objects(&[0, 1, 2, 4, 5])).await;
    wait_holds(&b, "site", &site_pages(&pages)).await;
    b.stop().await;
    a.stop().await;
}

/// A collector of `url` with small bounds: responses of at most 64 KB, a 2 s timeout, one try.
fn hostile_collector(name: &str, url: &str) -> (Config, tempfile::TempDir) {
    let (mut c, dir) = collecting(&[(name, url)]);
    let cc = c.collect.get_mut(name).unwrap();
    cc.max_response_bytes = 65536;
    cc.request_timeout_secs = 2;
    cc.attempts = 1;
    (c, dir)
}

/// Runs the collector `name` now and waits for that run to end; its status.
async fn run_and_wait(app: &TestApp, name: &str) -> serde_json::Value {
    let before = collector(app, name).await["last_ended"]
        .as_str()
        .map(str::to_string);
    run_now(app, name).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let v = collector(app, name).await;
        let ended = v["last_ended"].as_str().map(str::to_string);
        if ended.is_some() && ended != before && v["state"] != "running" {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "no run ended: {v:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The largest file under `dir` (0 when none).
fn largest_file(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .max()
        .unwrap_or(0)
}

/// A sitemap that misbehaves in every way costs bounded work and reaches nothing else: an
/// index naming itself, a sitemap elsewhere (robots.txt and the index), one that never ends,
/// one that trickles; entries elsewhere, a page that never ends, a `lastmod` in 2099. The
/// pages it lists properly are collected; nothing is fetched from the canary; no file passes
/// the limit; the page dated 2099 is fetched again at each run but records nothing twice; and
/// a page dropped from the sitemap is recorded deleted only after a complete read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_sitemap_costs_bounded_work_and_reaches_nothing_else() {
    use crate::hostile::{endless, trickle, Canary, Hostile};
    let src = Hostile::start().await;
    let canary = Canary::start().await;
    let page = |p: &str, body: &'static str| {
        src.on(p, move |_| {
            ([("content-type", "text/html")], body).into_response()
        });
    };
    use axum::response::IntoResponse;
    page("/p/ok.html", "<p>ok</p>");
    page("/p/future.html", "<p>from the future</p>");
    page("/p/other.html", "<p>other</p>");
    src.on("/p/huge.html", |_| endless());
    let urlset = |entries: &[(String, &str)]| {
        let urls: String = entries
            .iter()
            .map(|(loc, lm)| format!("<url><loc>{loc}</loc><lastmod>{lm}</lastmod></url>"))
            .collect();
        format!(
            r#"<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>"#
        )
    };
    let index = |locs: &[String]| {
        let maps: String = locs
            .iter()
            .map(|l| format!("<sitemap><loc>{l}</loc></sitemap>"))
            .collect();
        format!(
            r#"<?xml version="1.0"?><sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{maps}</sitemapindex>"#
        )
    };
    src.xml(
        "/sm-good.xml",
        urlset(&[
            (src.url("/p/ok.html"), "2026-01-01"),
            (src.url("/p/other.html"), "2026-01-01"),
            (src.url("/p/future.html"), "2099-01-01T00:00:00Z"),
            (canary.url("/p/elsewhere.html"), "2026-01-01"),
            (src.url("/p/huge.html"), "2026-01-01"),
        ]),
    );
    src.xml(
        "/sm-fewer.xml",
        urlset(&[
            (src.url("/p/ok.html"), "2026-01-01"),
            (src.url("/p/future.html"), "2099-01-01T00:00:00Z"),
        ]),
    );
    src.on("/sm-endless.xml", |_| endless());
    src.on("/sm-trickle.xml", |_| trickle(b"<?xml version=\"1.0\"?><urlset xmlns=\"http://www.sitemaps.org/schemas/sitemap/0.9\"></urlset>", Duration::from_millis(700)));
    let robots = format!(
        "Sitemap: {}\nSitemap: {}\n",
        canary.url("/sitemap.xml"),
        src.url("/sitemap_index.xml")
    );
    src.on("/robots.txt", move |_| robots.clone().into_response());
    // An API catalog naming 5,000 URLs elsewhere: none followed, and what is said of them stays
    // short.
    let items: Vec<serde_json::Value> = (0..5000)
        .map(|i| serde_json::json!({"href": canary.url(&format!("/api/{i}"))}))
        .collect();
    let catalog = serde_json::json!({"linkset": [{"anchor": "x", "item": items}]}).to_string();
    src.on("/.well-known/api-catalog", move |_| {
        catalog.clone().into_response()
    });
    let hostile_index = index(&[
        src.url("/sitemap_index.xml"),
        canary.url("/sm.xml"),
        src.url("/sm-endless.xml"),
        src.url("/sm-trickle.xml"),
        src.url("/sm-fewer.xml"),
    ]);
    src.xml("/sitemap_index.xml", index(&[src.url("/sm-good.xml")]));

    let (cfg, _d) = hostile_collector("site", &format!("{}/", src.base));
    let b = TestApp::start_with(cfg).await;
    wait_until("the first run", || async {
        collector(&b, "site").await["last_ended"].is_string()
    })
    .await;
    let v = collector(&b, "site").await;
    assert_eq!(v["kind"], "sitemap", "{v:#}");
    assert!(
        v["discovered"]["looked"]
            .to_string()
            .contains("not followed, it is on another origin"),
        "{v:#}"
    );
    let looked = v["discovered"]["looked"].as_array().unwrap().len();
    assert!(looked < 200, "{looked} pages said looked at");
    let held = held_by_origin(&b, "site").await;
    let want: Vec<String> = ["/p/future.html", "/p/ok.html", "/p/other.html"]
        .iter()
        .map(|p| src.url(p))
        .collect();
    assert_eq!(held.keys().cloned().collect::<Vec<_>>(), want, "{v:#}");
    let quarantine = v["quarantine"].to_string();
    assert!(
        quarantine.contains("outside the source's authority"),
        "{quarantine}"
    );
    assert!(
        quarantine.contains("huge.html") && quarantine.contains("more than"),
        "{quarantine}"
    );
    assert!(
        v["last_outcome"].as_str().unwrap().contains("not complete"),
        "{v:#}"
    );
    assert_eq!(changes(&b, "site").await, 3);
    // The 2099 date is not kept: the page's lastmod is no later than now.
    let store = resourcesync_hub::app::open_store(&b.config).await.unwrap();
    let set = SetName::parse("site").unwrap();
    let page = store.resources(&set, None, None, 10).await.unwrap();
    let now = resourcesync_hub::model::Timestamp::now();
    assert!(page
        .items
        .iter()
        .all(|r| r.meta.lastmod.is_some_and(|l| l <= now)));

    // The hostile index: the page missing from it is not deleted (the read is not complete).
    src.xml("/sitemap_index.xml", hostile_index);
    let v = run_and_wait(&b, "site").await;
    assert!(
        v["last_outcome"]
            .as_str()
            .unwrap()
            .contains("not complete, so nothing is recorded deleted"),
        "{v:#}"
    );
    assert!(held_by_origin(&b, "site")
        .await
        .contains_key(&src.url("/p/other.html")));
    assert_eq!(
        src.hits("/p/ok.html"),
        1,
        "a page whose lastmod says it is held is not fetched again"
    );
    assert_eq!(
        src.hits("/p/future.html"),
        2,
        "a lastmod in the future is not believed"
    );
    assert_eq!(changes(&b, "site").await, 3, "nothing recorded twice");
    // A complete read without it: deleted.
    src.xml("/sitemap_index.xml", index(&[src.url("/sm-fewer.xml")]));
    let v = run_and_wait(&b, "site").await;
    assert!(
        v["last_outcome"]
            .as_str()
            .unwrap()
            .contains("complete: 1 resources no longer listed recorded deleted"),
        "{v:#}"
    );
    assert!(!held_by_origin(&b, "site")
        .await
        .contains_key(&src.url("/p/other.html")));
    assert_eq!(changes(&b, "site").await, 4);
    assert_eq!(canary.connections(), 0, "nothing reached elsewhere");
    assert!(
        largest_file(&b.config.server.data_dir) < 20 * 1024 * 1024,
        "no download past the limit lies around"
    );
    assert!(largest_file(&b.config.collected_dir("site")) <= 65537);
    b.stop().await;
}

/// An activity stream that misbehaves: objects elsewhere, an object that never ends, an
/// activity dated 2099, and then pages whose `prev` links go round. What it lists properly
/// is collected; the canary sees nothing; the loop ends the run in words; the 2099 date does
/// not make the next run skip what comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_activity_stream_costs_bounded_work_and_reaches_nothing_else() {
    use crate::hostile::{endless, Canary, Hostile};
    use axum::response::IntoResponse;
    let src = Hostile::start().await;
    let canary = Canary::start().await;
    src.on("/o/a.json", |_| "{\"a\": 1}".into_response());
    src.on("/o/b.json", |_| "{\"b\": 1}".into_response());
    src.on("/o/huge.json", |_| endless());
    let json = |v: serde_json::Value| {
        let s = v.to_string();
        move |_: &axum::http::HeaderMap| {
            ([("content-type", "application/json")], s.clone()).into_response()
        }
    };
    let act = |t: &str, o: String, e: &str| serde_json::json!({"type": t, "object": {"id": o}, "endTime": e});
    src.on(
        "/as",
        json(serde_json::json!({"type": "OrderedCollection", "id": src.url("/as"), "last": {"id": src.url("/as/1")}})),
    );
    src.on(
        "/as/0",
        json(
            serde_json::json!({"type": "OrderedCollectionPage", "orderedItems": [
                act("Create", src.url("/o/a.json"), "2026-01-01T00:00:00Z"),
                act("Create", canary.url("/o/x.json"), "2026-01-01T00:00:01Z"),
            ]}),
        ),
    );
    src.on(
        "/as/1",
        json(serde_json::json!({"type": "OrderedCollectionPage", "prev": {"id": src.url("/as/0")}, "orderedItems": [
            act("Create", src.url("/o/huge.json"), "2026-01-02T00:00:00Z"),
            act("Update", src.url("/o/a.json"), "2099-01-01T00:00:00Z"),
        ]})),
    );
    let (cfg, _d) = hostile_collector("stream", &src.url("/as"));
    let b = TestApp::start_with(cfg).await;
    wait_until("the first run", || async {
        collector(&b, "stream").await["last_ended"].is_string()
    })
    .await;
    let v = collector(&b, "stream").await;
    assert_eq!(v["kind"], "activity", "{v:#}");
    assert_eq!(
        held_by_origin(&b, "stream")
            .await
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        vec![src.url("/o/a.json")],
        "{v:#}"
    );
    let q = v["quarantine"].to_string();
    assert!(
        q.contains("outside the source's authority") && q.contains("huge.json"),
        "{q}"
    );
    // A later activity is read although one was dated 2099.
    src.on(
        "/as/2",
        json(serde_json::json!({"type": "OrderedCollectionPage", "prev": {"id": src.url("/as/1")}, "orderedItems": [
            act("Create", src.url("/o/b.json"), "2026-02-01T00:00:00Z"),
        ]})),
    );
    src.on(
        "/as",
        json(serde_json::json!({"type": "OrderedCollection", "id": src.url("/as"), "last": {"id": src.url("/as/2")}})),
    );
    run_and_wait(&b, "stream").await;
    assert!(held_by_origin(&b, "stream")
        .await
        .contains_key(&src.url("/o/b.json")));
    // Pages that go round end the run in words.
    src.on(
        "/as/0",
        json(serde_json::json!({"type": "OrderedCollectionPage", "prev": {"id": src.url("/as/2")}, "orderedItems": []})),
    );
    src.on(
        "/as/2",
        json(serde_json::json!({"type": "OrderedCollectionPage", "prev": {"id": src.url("/as/0")}, "orderedItems": [
            act("Update", src.url("/o/b.json"), "2026-03-01T00:00:00Z"),
        ]})),
    );
    // The newest activity is later than the last run's, so the run reads back, into the loop.
    let v = run_and_wait(&b, "stream").await;
    let outcome = v["last_outcome"].as_str().unwrap();
    assert!(
        outcome.starts_with("failed") && outcome.contains("go round"),
        "{v:#}"
    );
    assert_eq!(canary.connections(), 0);
    assert!(largest_file(&b.config.collected_dir("stream")) <= 65537);
    b.stop().await;
}

/// A ResourceSync source found by a base URL that leads elsewhere: its page's `Link` headers
/// and its API catalog name a canary (not followed), its Source Description names a Capability
/// List elsewhere, its Resource List names resources elsewhere, one resource lies about its
/// md5 and one never ends. The set holds exactly the resources served as listed; the canary
/// sees no connection; nothing lies in the set's folder past its listed length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_resourcesync_source_reaches_nothing_else_and_keeps_only_what_checks() {
    use crate::hostile::{described, endless, entry, rl_md, urlset, Canary, Hostile};
    use axum::response::IntoResponse;
    let src = Hostile::start().await;
    let canary = Canary::start().await;
    let (lure, catalog) = (canary.url("/sd.xml"), canary.url("/oai"));
    src.on("/", move |_| {
        (
            [("link", format!("<{lure}>; rel=\"resourcesync\""))],
            "<html><body>a site</body></html>",
        )
            .into_response()
    });
    src.on("/.well-known/api-catalog", move |_| {
        serde_json::json!({"linkset": [{"anchor": "x", "item": [{"href": catalog}]}]})
            .to_string()
            .into_response()
    });
    let good = src.resource("/r/good.txt", "good\n");
    let liar = entry(&src.url("/r/liar.txt"), &described("what the list says\n"));
    src.on("/r/liar.txt", |_| "something else\n".into_response());
    let huge = entry(&src.url("/r/huge.txt"), r#"length="10""#);
    src.on("/r/huge.txt", |_| endless());
    let elsewhere = entry(&canary.url("/r/x.txt"), &described("x"));
    src.xml(
        "/s/resourcelist.xml",
        urlset(&rl_md(), &[good, liar, huge, elsewhere]),
    );
    let cap = src.set(
        "s",
        &[("resourcelist", src.url("/s/resourcelist.xml"))],
        false,
    );
    src.source(&[cap, canary.url("/other/capabilitylist.xml")]);

    let (cfg, _d) = hostile_collector("rs", &format!("{}/", src.base));
    let b = TestApp::start_with(cfg).await;
    wait_until("the good resource", || async {
        held_by_origin(&b, "rs")
            .await
            .contains_key(&src.url("/r/good.txt"))
    })
    .await;
    let v = collector(&b, "rs").await;
    assert_eq!(v["kind"], "resourcesync", "{v:#}");
    let looked = v["discovered"]["looked"].to_string();
    assert!(
        looked.contains("not followed, it is on another origin"),
        "{looked}"
    );
    wait_until("the liar and the endless resource tried", || async {
        src.hits("/r/liar.txt") >= 1 && src.hits("/r/huge.txt") >= 1
    })
    .await;
    let held = held_by_origin(&b, "rs").await;
    assert_eq!(
        held.keys().cloned().collect::<Vec<_>>(),
        vec![src.url("/r/good.txt")]
    );
    let following = collector(&b, "rs").await["following"].to_string();
    assert!(following.contains("refused"), "{following}");
    assert_eq!(canary.connections(), 0, "nothing reached elsewhere");
    assert!(largest_file(&b.config.collected_dir("rs")) <= 1024);
    b.stop().await;
}

/// `bytes = "link"`: the set's resources are the originals' URLs (measured: md5 and length of
/// what was fetched), no file is kept, and a page dropped from the sitemap is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_collector_keeps_the_originals_urls_and_no_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site");
    let mut pages: Vec<(String, String)> = (0..4)
        .map(|i| (format!("p{i}"), "2026-01-01".to_string()))
        .collect();
    for (name, _) in &pages {
        put(
            &site,
            &format!("pages/{name}.html"),
            &format!("<p>{name}</p>"),
        );
    }
    let base = crate::harvest::static_server(site.clone()).await;
    write_sitemaps(&site, &base, &pages);
    let (mut cfg, _d) = collecting(&[("linked", &format!("{base}/"))]);
    cfg.collect.get_mut("linked").unwrap().bytes = resourcesync_hub::config::CollectBytes::Link;
    let b = TestApp::start_with(cfg).await;
    let want = |pages: &[(String, String)]| -> BTreeMap<String, (String, u64)> {
        pages
            .iter()
            .map(|(n, _)| {
                (
                    format!("{base}/pages/{n}.html"),
                    md5_of(&format!("<p>{n}</p>")),
                )
            })
            .collect()
    };
    wait_holds(&b, "linked", &want(&pages)).await;
    let store = resourcesync_hub::app::open_store(&b.config).await.unwrap();
    let set = SetName::parse("linked").unwrap();
    let page = store.resources(&set, None, None, 10).await.unwrap();
    assert!(page
        .items
        .iter()
        .all(|r| r.location.kind == resourcesync_hub::model::LocationType::Url));
    let files: Vec<_> = walkdir::WalkDir::new(b.config.collected_dir("linked"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| e.path().display().to_string())
        // The scratch folder's lock (`.rshub-*` is never served).
        .filter(|p| !p.contains("/.rshub-"))
        .collect();
    assert_eq!(files, Vec::<String>::new(), "no bytes kept");
    pages.pop();
    write_sitemaps(&site, &base, &pages);
    run_and_wait(&b, "linked").await;
    wait_holds(&b, "linked", &want(&pages)).await;
    b.stop().await;
}

/// A sitemap holding a 40 MB `<loc>` and 20,000 entries on another host among normal entries,
/// and an activity stream whose page lists 90,000 items of junk after its activities (39 MB),
/// both streamed without a Content-Length, cost the server (a child process) neither memory
/// nor log: peak memory under 150 MB, the log under 1 MB (the quarantined entries are counted,
/// not logged one by one); the normal entries and activities are collected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_documents_cost_neither_memory_nor_log() {
    use crate::hostile::Hostile;
    use axum::response::IntoResponse;
    let src = Hostile::start().await;
    use axum::body::Bytes;
    let streamed = |head: String, junk: Bytes, times: usize, tail: String| {
        move |_: &axum::http::HeaderMap| {
            let parts: Vec<Bytes> = std::iter::once(Bytes::from(head.clone()))
                .chain(std::iter::repeat_n(junk.clone(), times))
                .chain(std::iter::once(Bytes::from(tail.clone())))
                .collect();
            axum::body::Body::from_stream(futures_util::stream::iter(
                parts.into_iter().map(Ok::<_, std::io::Error>),
            ))
            .into_response()
        }
    };
    for i in 0..3 {
        src.on(&format!("/p/{i}.html"), move |_| {
            format!("<p>{i}</p>").into_response()
        });
    }
    let entry = |i: usize| format!("<url><loc>{}</loc></url>", src.url(&format!("/p/{i}.html")));
    src.on(
        "/sitemap.xml",
        streamed(
            format!(
                r#"<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{}{}{}<url><loc>{}/"#,
                entry(0),
                entry(1),
                (0..20_000)
                    .map(|i| format!("<url><loc>http://elsewhere.invalid/page/{i}</loc></url>"))
                    .collect::<String>(),
                src.base
            ),
            Bytes::from(vec![b'a'; 1 << 20]),
            40,
            format!("</loc></url>{}</urlset>", entry(2)),
        ),
    );
    for i in 0..2 {
        src.on(&format!("/o/{i}.json"), move |_| {
            format!("{{\"o\": {i}}}").into_response()
        });
    }
    let acts: Vec<String> = (0..2)
        .map(|i| {
            format!(
                r#"{{"type":"Create","object":{{"id":"{}"}},"endTime":"2026-01-01T00:00:0{i}Z"}}"#,
                src.url(&format!("/o/{i}.json"))
            )
        })
        .collect();
    let all = src.url("/as/1");
    src.on("/as", move |_| {
        format!(r#"{{"type":"OrderedCollection","last":{{"id":"{all}"}}}}"#).into_response()
    });
    let junk = Bytes::from(r#"{"type":"Like","object":{"id":"x"},"summary":"junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk junk"},"#.repeat(1000));
    src.on(
        "/as/1",
        streamed(
            format!(
                r#"{{"type":"OrderedCollectionPage","orderedItems":[{},"#,
                acts.join(",")
            ),
            junk,
            90,
            r#"{"type":"Like","object":"y"}]}"#.to_string(),
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("rshub.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\ndata_dir = {:?}\n[admin]\ntoken = \"{ADMIN}\"\n\
             [collect.site]\nurl = \"{}\"\nkind = \"sitemap\"\nattempts = 1\n\
             [collect.stream]\nurl = \"{}\"\nkind = \"activity\"\nattempts = 1\n",
            dir.path().join("data"),
            src.url("/sitemap.xml"),
            src.url("/as")
        ),
    )
    .unwrap();
    let server = crate::support::ChildServer::serve(&["--config", cfg.to_str().unwrap()], &[]);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let status = |name: &'static str| {
        let (client, url) = (
            client.clone(),
            server.url(&format!("/admin/v1/collect/{name}")),
        );
        async move {
            client
                .get(url)
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    crate::support::wait_until("both runs ended", || async {
        status("site").await["last_ended"].is_string()
            && status("stream").await["last_ended"].is_string()
    })
    .await;
    let (site, stream) = (status("site").await, status("stream").await);
    assert_eq!(site["last"]["created"], 3, "{site:#}");
    assert!(
        site["quarantine"].to_string().contains("bytes or more"),
        "{site:#}"
    );
    assert_eq!(site["last"]["quarantined"], 20_001, "{site:#}");
    assert_eq!(stream["last"]["created"], 2, "{stream:#}");
    let peak = crate::support::proc_mb(server.child.id(), "VmHWM");
    assert!(peak < 150.0, "peak memory {peak:.0} MB");
    let log = server.log().len();
    assert!(log < 1024 * 1024, "a log of {log} bytes");
}
