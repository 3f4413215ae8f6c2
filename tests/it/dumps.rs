//! Resource Dumps and Change Dumps: every document valid, every package opened by Python's
//! zipfile and matching its manifest, the union of the packages equal to the Resource List,
//! a Change Dump equal to its closed Change List, resumable downloads across a replacement.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use resourcesync_hub::config::Config;
use resourcesync_hub::sitemap::{self, Document};

use crate::harvest::file_line;
use crate::hub::{hub_config, subscribed};
use crate::notify::docs;
use crate::subscriber::TestSubscriber;
use crate::support::*;

/// A set `papers` of files under `<dir>/root`, dumps on and looked for every second.
fn dump_config(max_items: u32) -> (Config, tempfile::TempDir, PathBuf) {
    let (mut c, dir) = hub_config();
    let root = dir.path().join("root");
    add_file_set(&mut c, "papers", &root, Some(max_items));
    c.dumps.enabled = true;
    c.dumps.check_interval_secs = 1;
    c.dumps.package_max_entries = 8;
    (c, dir, root)
}

async fn get(app: &TestApp, advertised: &str) -> reqwest::Response {
    app.client
        .get(app.url(&app.path_of(advertised)))
        .send()
        .await
        .unwrap()
}

async fn get_doc(app: &TestApp, advertised: &str) -> (String, Document) {
    let r = get(app, advertised).await;
    assert_eq!(r.status(), 200, "GET {advertised}");
    let body = r.text().await.unwrap();
    let doc = sitemap::parse(body.as_bytes()).unwrap_or_else(|e| panic!("{advertised}: {e}"));
    (body, doc)
}

/// Downloads the packages a dump document lists into `dir`; returns their files, and every
/// document read on the way (the dump, the manifest copies) for validation.
async fn download(
    app: &TestApp,
    dump_url: &str,
    dir: &Path,
) -> (Vec<PathBuf>, Vec<(String, String)>) {
    let (body, doc) = get_doc(app, dump_url).await;
    let mut docs = vec![(dump_url.to_string(), body)];
    let mut files = Vec::new();
    for (i, e) in doc.entries.iter().enumerate() {
        let r = get(app, &e.loc).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "application/zip");
        assert_eq!(
            r.headers()["content-length"].to_str().unwrap(),
            e.md["length"],
            "the listed length"
        );
        let p = dir.join(format!("{i:03}.zip"));
        std::fs::write(&p, r.bytes().await.unwrap()).unwrap();
        files.push(p);
        let contents = e
            .links
            .iter()
            .find(|l| l["rel"] == "contents")
            .expect("a contents link to the manifest copy");
        let (m, _) = get_doc(app, &contents["href"]).await;
        docs.push((contents["href"].clone(), m));
    }
    (files, docs)
}

/// What `tests/tools/check_dump.py` finds in the packages (it fails on any mismatch).
fn check(files: &[PathBuf]) -> serde_json::Value {
    let args: Vec<&std::ffi::OsStr> = files.iter().map(|f| f.as_os_str()).collect();
    py_tool_json("check_dump.py", &args)
}

/// (loc, md5, length) of every bitstream in the checked packages.
fn packed(v: &serde_json::Value) -> BTreeSet<(String, String, u64)> {
    v["packages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["entries"].as_array().unwrap().iter())
        .map(|e| {
            (
                e["loc"].as_str().unwrap().to_string(),
                e["md5"].as_str().unwrap().to_string(),
                e["length"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// (loc, md5, length) of every entry of the Resource List (through its index).
async fn resource_list(app: &TestApp) -> BTreeSet<(String, String, u64)> {
    let (_, top) = app.get_doc("/sets/papers/resourcelist.xml").await;
    let mut docs = Vec::new();
    if top.is_index {
        for e in &top.entries {
            docs.push(get_doc(app, &e.loc).await.1);
        }
    } else {
        docs.push(top);
    }
    docs.iter()
        .flat_map(|d| d.entries.iter())
        .map(|e| {
            (
                e.loc.clone(),
                e.md["hash"].trim_start_matches("md5:").to_string(),
                e.md["length"].parse().unwrap(),
            )
        })
        .collect()
}

async fn status(app: &TestApp, path: &str) -> u16 {
    app.client
        .get(app.url(path))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn body(i: usize, version: u32) -> String {
    format!("resource {i} version {version}\n").repeat(40)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dumps_validate_unpack_and_match_their_lists_and_resume_across_a_replacement() {
    let (c, dir, root) = dump_config(20);
    let app = TestApp::start_with(c).await;
    let sub = TestSubscriber::start().await;
    let framework = app.config.framework_topic("papers");
    subscribed(&app, &sub, &framework, "/fw", &[]).await;
    let base = app.config.base_url();

    // 21 creates: Change List 1 holds 20 and closes.
    let lines: Vec<String> = (0..21)
        .map(|i| file_line(&root, "created", &format!("r/{i:03}.txt"), &body(i, 1)))
        .collect();
    app.ingest_ok("papers", &lines.join("\n")).await;
    wait_until("the Change Dump of list 1", || async {
        status(&app, "/sets/papers/changedump/1.xml").await == 200
    })
    .await;
    // 5 updates, 5 deletes, 10 creates: list 2 (1 + 19) closes, the last opens list 3.
    let mut lines: Vec<String> = (0..5)
        .map(|i| file_line(&root, "updated", &format!("r/{i:03}.txt"), &body(i, 2)))
        .collect();
    for i in 5..10 {
        std::fs::remove_file(root.join(format!("r/{i:03}.txt"))).unwrap();
        lines.push(change_line("deleted", &format!("r/{i:03}.txt"), "", 0));
    }
    lines.extend(
        (100..110).map(|i| file_line(&root, "created", &format!("r/{i:03}.txt"), &body(i, 1))),
    );
    app.ingest_ok("papers", &lines.join("\n")).await;
    wait_until("the Change Dump of list 2", || async {
        status(&app, "/sets/papers/changedump/2.xml").await == 200
    })
    .await;

    // The Resource Dump catches up with the set (20 of 26 changed: past change_fraction).
    let want = resource_list(&app).await;
    assert_eq!(want.len(), 26);
    let work = tempfile::tempdir().unwrap();
    let rd_url = format!("{base}/sets/papers/resourcedump.xml");
    let mut got = None;
    for _ in 0..200 {
        let (files, docs) = download(&app, &rd_url, work.path()).await;
        let v = check(&files);
        if packed(&v) == want {
            got = Some((files, docs, v));
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (files, mut all_docs, v) = got.expect("a Resource Dump equal to the Resource List");
    assert!(
        files.len() >= 4,
        "cut at 8 entries per package: {}",
        files.len()
    );
    for p in v["packages"].as_array().unwrap() {
        assert_eq!(p["members"][0], "manifest.xml");
        let copy = all_docs
            .iter()
            .find(|(_, d)| d == p["manifest"].as_str().unwrap());
        assert!(
            copy.is_some(),
            "the manifest copy equals the manifest in the package"
        );
        all_docs.push((
            "in-package manifest".into(),
            p["manifest"].as_str().unwrap().into(),
        ));
    }
    let (rd_body, rd) = get_doc(&app, &rd_url).await;
    assert_eq!(rd.md["capability"], "resourcedump");
    assert!(rd.md.contains_key("at") && rd.md.contains_key("completed"));
    assert_eq!(
        rd.link("up"),
        Some(format!("{base}/sets/papers/capabilitylist.xml").as_str())
    );
    let manifest = sitemap::parse(all_docs[1].1.as_bytes()).unwrap();
    assert_eq!(manifest.md["capability"], "resourcedump-manifest");
    assert!(manifest.md.contains_key("at"));
    assert_eq!(manifest.link("up"), rd.link("up"));
    assert!(manifest
        .entries
        .iter()
        .all(|e| e.md["path"].starts_with("/resources/")));

    // The Capability List offers both dumps.
    let (cap_body, cap) = app.get_doc("/sets/papers/capabilitylist.xml").await;
    let offered: Vec<(&str, &str)> = cap
        .entries
        .iter()
        .map(|e| (e.md["capability"].as_str(), e.loc.as_str()))
        .collect();
    assert!(
        offered.contains(&("resourcedump", rd_url.as_str())),
        "{cap_body}"
    );
    let cd_url = format!("{base}/sets/papers/changedump.xml");
    assert!(
        offered.contains(&("changedump", cd_url.as_str())),
        "{cap_body}"
    );

    // Each Change Dump lists exactly its Change List's changes, `path` on created and
    // updated entries only.
    let (cdi_body, cdi) = get_doc(&app, &cd_url).await;
    assert!(cdi.is_index);
    assert_eq!(cdi.entries.len(), 2);
    let mut cd_docs = vec![
        ("changedump.xml".to_string(), cdi_body),
        ("resourcedump.xml".into(), rd_body),
        ("capabilitylist".into(), cap_body),
    ];
    for (n, e) in cdi.entries.iter().enumerate() {
        let no = n + 1;
        let (_, list) = app
            .get_doc(&format!("/sets/papers/changelist/{no}.xml"))
            .await;
        assert_eq!(e.md["from"], list.md["from"]);
        assert_eq!(e.md["until"], list.md["until"]);
        let d = tempfile::tempdir().unwrap();
        let (files, docs) = download(&app, &e.loc, d.path()).await;
        let cd = sitemap::parse(docs[0].1.as_bytes()).unwrap();
        assert_eq!(cd.md["capability"], "changedump");
        assert_eq!(
            (&cd.md["from"], &cd.md["until"]),
            (&list.md["from"], &list.md["until"])
        );
        let v = check(&files);
        let entries: Vec<&serde_json::Value> = v["packages"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| p["entries"].as_array().unwrap().iter())
            .collect();
        let dumped: Vec<(String, String, String)> = entries
            .iter()
            .map(|e| {
                (
                    e["loc"].as_str().unwrap().to_string(),
                    e["change"].as_str().unwrap().to_string(),
                    e["datetime"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let listed: Vec<(String, String, String)> = list
            .entries
            .iter()
            .map(|e| {
                (
                    e.loc.clone(),
                    e.md["change"].clone(),
                    e.md["datetime"].clone(),
                )
            })
            .collect();
        assert_eq!(
            dumped, listed,
            "Change Dump {no} holds exactly Change List {no}"
        );
        for e in &entries {
            assert_eq!(
                e["path"].is_string(),
                e["change"] != "deleted",
                "path only on created and updated entries: {e}"
            );
        }
        if no == 1 {
            // Built before the next changes: the very bitstreams of list 1.
            for (e, l) in entries.iter().zip(&list.entries) {
                assert_eq!(
                    Some(format!("md5:{}", e["md5"].as_str().unwrap())).as_ref(),
                    l.md.get("hash")
                );
            }
        }
        assert!(entries.iter().any(|e| e["change"] == "deleted") == (no == 2));
        for p in v["packages"].as_array().unwrap() {
            cd_docs.push((
                "change dump manifest".into(),
                p["manifest"].as_str().unwrap().into(),
            ));
        }
        cd_docs.extend(docs);
    }
    let named: Vec<(&str, &str)> = all_docs
        .iter()
        .chain(&cd_docs)
        .map(|(n, b)| (n.as_str(), b.as_str()))
        .collect();
    assert_valid(&named);

    // Framework notifications: both dumps created, the Capability List updated.
    sub.wait_until("dump framework notifications", |s| {
        let all: Vec<(String, String)> = docs(s, "/fw")
            .iter()
            .flat_map(|(_, d)| {
                d.entries
                    .iter()
                    .map(|e| (e.md["capability"].clone(), e.md["change"].clone()))
            })
            .collect();
        all.contains(&("resourcedump".into(), "created".into()))
            && all
                .iter()
                .filter(|e| *e == &("changedump".to_string(), "created".to_string()))
                .count()
                == 2
            && all.contains(&("capabilitylist".into(), "updated".into()))
    })
    .await;
    let fw: Vec<(String, Document)> = docs(&sub, "/fw");
    let fw: Vec<(&str, &str)> = fw
        .iter()
        .map(|(t, _)| ("framework notification", t.as_str()))
        .collect();
    assert_valid(&fw);

    // A download interrupted half-way resumes (Range + If-Range) on the same bytes, even
    // after a newer dump replaced the one it started on.
    let pkg = rd.entries[0].loc.clone();
    let whole = get(&app, &pkg).await.bytes().await.unwrap();
    let half = whole.len() / 2;
    let first = app
        .client
        .get(app.url(&app.path_of(&pkg)))
        .header("range", format!("bytes=0-{}", half - 1))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 206);
    let etag = first.headers()["etag"].to_str().unwrap().to_string();
    let first = first.bytes().await.unwrap();
    let lines: Vec<String> = (100..110)
        .map(|i| file_line(&root, "updated", &format!("r/{i:03}.txt"), &body(i, 3)))
        .collect();
    app.ingest_ok("papers", &lines.join("\n")).await;
    wait_until("a newer Resource Dump", || async {
        let (_, d) = get_doc(&app, &rd_url).await;
        d.entries[0].loc != pkg
    })
    .await;
    let rest = app
        .client
        .get(app.url(&app.path_of(&pkg)))
        .header("range", format!("bytes={half}-"))
        .header("if-range", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status(), 206);
    let mut resumed = first.to_vec();
    resumed.extend_from_slice(&rest.bytes().await.unwrap());
    assert_eq!(
        resumed,
        whole.to_vec(),
        "resumed bytes equal an uninterrupted download"
    );
    // A validator that no longer matches gets the whole package; a range past the end, 416.
    let r = app
        .client
        .get(app.url(&app.path_of(&pkg)))
        .header("range", format!("bytes={half}-"))
        .header("if-range", "\"other\"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = app
        .client
        .get(app.url(&app.path_of(&pkg)))
        .header("range", format!("bytes={}-", whole.len() + 10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 416);
    // Careless requests get a 404 saying why, never a file outside the dumps.
    for bad in [
        "/sets/papers/resourcedump/..%2F..%2Fetc/passwd",
        "/sets/papers/resourcedump/1/info.json",
        "/sets/papers/changedump/1/.hidden",
        "/sets/papers/changedump/x.xml",
        "/sets/nope/resourcedump.xml",
    ] {
        assert_eq!(status(&app, bad).await, 404, "{bad}");
    }
    drop(dir);
    app.stop().await;
}

/// With `keep_replaced_secs = 0` a replaced dump is removed at once; a download that was
/// under way still receives the whole package it started on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_under_way_survives_its_dump_being_replaced_and_removed() {
    let (mut c, dir, root) = dump_config(50_000);
    c.dumps.keep_replaced_secs = 0;
    c.dumps.package_max_entries = 1000;
    c.dumps.compression = resourcesync_hub::config::DumpCompression::Stored;
    let app = TestApp::start_with(c).await;
    // 40 files of 256 KB that do not compress: one 10 MB package.
    let lines: Vec<String> = (0..40)
        .map(|i| {
            let mut s = String::new();
            let mut x: u64 = 0x9e3779b97f4a7c15 ^ i as u64;
            while s.len() < 256 * 1024 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                s.push_str(&format!("{x:016x}"));
            }
            file_line(&root, "created", &format!("big/{i}.txt"), &s)
        })
        .collect();
    app.ingest_ok("papers", &lines.join("\n")).await;
    let rd_url = format!("{}/sets/papers/resourcedump.xml", app.config.base_url());
    wait_until("the first Resource Dump", || async {
        status(&app, "/sets/papers/resourcedump.xml").await == 200
    })
    .await;
    let (_, rd) = get_doc(&app, &rd_url).await;
    let pkg = rd.entries[0].loc.clone();
    let len: usize = rd.entries[0].md["length"].parse().unwrap();
    let generation_dir = app
        .config
        .dumps_dir()
        .join("papers/rd")
        .join(pkg.rsplit('/').nth(1).unwrap());
    let mut resp = get(&app, &pkg).await;
    let mut got = resp.chunk().await.unwrap().unwrap().to_vec();
    assert!(got.len() < len);
    // Half the set changes: a new dump, and the old one removed from disk.
    let lines: Vec<String> = (0..20)
        .map(|i| {
            file_line(
                &root,
                "updated",
                &format!("big/{i}.txt"),
                &format!("small now {i}\n"),
            )
        })
        .collect();
    app.ingest_ok("papers", &lines.join("\n")).await;
    wait_until("the replaced dump to be removed", || async {
        !generation_dir.exists()
    })
    .await;
    while let Some(c) = resp.chunk().await.unwrap() {
        got.extend_from_slice(&c);
    }
    assert_eq!(got.len(), len, "the whole package");
    let work = tempfile::tempdir().unwrap();
    let f = work.path().join("old.zip");
    std::fs::write(&f, &got).unwrap();
    let v = check(&[f]);
    assert_eq!(
        packed(&v).len(),
        40,
        "every bitstream of the dump it started on"
    );
    assert_eq!(status(&app, &app.path_of(&pkg)).await, 404);
    drop(dir);
    app.stop().await;
}

/// `source.baseline = "dump"`: the destination baselines from the Resource Dump (the source's
/// files are removed after the dump was built, so no resource could be fetched on its own),
/// then follows the changes made after the dump, and its audit says IN SYNC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_baselines_from_the_dump_and_ends_in_sync() {
    use crate::harvest::{applied, harvest_config, set_done, wait_state, TestHarvester};
    let (mut c, dir, root) = dump_config(50_000);
    // One dump: the test removes files behind it, which a new one would leave out.
    c.dumps.change_fraction = 100.0;
    let app = TestApp::start_with(c).await;
    let lines: Vec<String> = (0..60)
        .map(|i| file_line(&root, "created", &format!("d/{i:03}.txt"), &body(i, 1)))
        .collect();
    app.ingest_ok("papers", &lines.join("\n")).await;
    wait_until("the Resource Dump", || async {
        status(&app, "/sets/papers/resourcedump.xml").await == 200
    })
    .await;
    for i in 0..60 {
        std::fs::remove_file(root.join(format!("d/{i:03}.txt"))).unwrap();
    }
    // After the dump: 5 creates (new files) for the Change Lists to bring.
    let lines: Vec<String> = (60..65)
        .map(|i| file_line(&root, "created", &format!("d/{i:03}.txt"), &body(i, 1)))
        .collect();
    app.ingest_ok("papers", &lines.join("\n")).await;

    let mut hc = harvest_config(dir.path(), &app.url("/.well-known/resourcesync"));
    hc.source.baseline = resourcesync_hub::destination::config::BaselineFrom::Dump;
    let h = TestHarvester::start(hc.clone()).await;
    wait_state(
        &h,
        "the baseline from the dump and the 5 later creates",
        60,
        |s| set_done(s, 65) && applied(s) >= 5,
    )
    .await;
    let (report, ok) = resourcesync_hub::destination::audit(&hc).await.unwrap();
    assert!(
        ok && report.contains("65 listed, 0 missing, 0 different"),
        "{report}"
    );
    h.stop().await;
    app.stop().await;
}

/// A set of resources at other URLs offers no dump without `dumps.fetch_remote`; with it, its
/// resources are fetched through the guarded client, and more packages than a document holds
/// make the Resource Dump an index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_resources_are_dumped_only_with_fetch_remote_and_many_packages_get_an_index() {
    let (mut c, dir, root) = dump_config(50_000);
    // "aremote" sorts first: the builder has tried it once "papers" has a dump.
    c.sets.insert(
        "aremote".into(),
        resourcesync_hub::config::SetOverrides {
            max_items_in_list: Some(2),
            ..Default::default()
        },
    );
    c.dumps.package_max_entries = 1;
    let app = TestApp::start_with(c.clone()).await;
    // The remote resources: the same files, served by another server.
    let (mut fc, _files_dir) = test_config();
    add_file_set(&mut fc, "papers", &root, None);
    let file_server = TestApp::start_with(fc).await;
    let remote_base = file_server.config.base_url();
    let lines: Vec<String> = (0..5)
        .map(|i| file_line(&root, "created", &format!("r/{i}.txt"), &body(i, 1)))
        .collect();
    app.ingest_ok("papers", &lines.join("\n")).await;
    let remote: Vec<String> = (0..5)
        .map(|i| {
            let b = body(i, 1);
            format!(
                r#"{{"change":"created","location":{{"type":"url","value":"{remote_base}/files/papers/r/{i}.txt"}},"length":{},"md5":"{}","mime":"text/plain"}}"#,
                b.len(),
                md5_hex(b.as_bytes())
            )
        })
        .collect();
    app.ingest_ok("aremote", &remote.join("\n")).await;
    wait_until("the dump of papers", || async {
        status(&app, "/sets/papers/resourcedump.xml").await == 200
    })
    .await;
    assert_eq!(status(&app, "/sets/aremote/resourcedump.xml").await, 404);
    let (cap, _) = app.get_doc("/sets/aremote/capabilitylist.xml").await;
    assert!(!cap.contains("resourcedump"), "{cap}");
    let data = app.stop().await;

    c.dumps.fetch_remote = true;
    let app = TestApp::start_with(c).await;
    wait_until("the dump of aremote", || async {
        status(&app, "/sets/aremote/resourcedump.xml").await == 200
    })
    .await;
    let base = app.config.base_url();
    let (index_body, index) = app.get_doc("/sets/aremote/resourcedump.xml").await;
    assert!(index.is_index, "5 packages, 2 per document: an index");
    assert_eq!(index.md["capability"], "resourcedump");
    assert_eq!(index.entries.len(), 3);
    let work = tempfile::tempdir().unwrap();
    let (mut files, mut docs) = (Vec::new(), vec![("index".to_string(), index_body)]);
    for (i, part) in index.entries.iter().enumerate() {
        let d = work.path().join(i.to_string());
        std::fs::create_dir_all(&d).unwrap();
        let (f, more) = download(&app, &part.loc, &d).await;
        let doc = sitemap::parse(more[0].1.as_bytes()).unwrap();
        assert_eq!(
            doc.link("index"),
            Some(format!("{base}/sets/aremote/resourcedump.xml").as_str())
        );
        files.extend(f);
        docs.extend(more);
    }
    let want: BTreeSet<(String, String, u64)> = (0..5)
        .map(|i| {
            let b = body(i, 1);
            (
                format!("{remote_base}/files/papers/r/{i}.txt"),
                md5_hex(b.as_bytes()),
                b.len() as u64,
            )
        })
        .collect();
    assert_eq!(packed(&check(&files)), want);
    let named: Vec<(&str, &str)> = docs.iter().map(|(n, b)| (n.as_str(), b.as_str())).collect();
    assert_valid(&named);
    drop((dir, data));
    app.stop().await;
    file_server.stop().await;
}

/// The dump takes the store's md5 for a file not modified since the store recorded it, and
/// measures one modified since (same length, other bytes, as a careless harvester leaves it):
/// every manifest describes the bytes packed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_changed_behind_the_store_is_hashed_again_for_the_dump() {
    let (c, _dir, root) = dump_config(50_000);
    let app = TestApp::start_with(c).await;
    let lines: Vec<String> = (0..6)
        .map(|i| file_line(&root, "created", &format!("m/{i}.txt"), &body(i, 1)))
        .collect();
    // Rewritten after its md5 was taken, and dated after the ingest below.
    let changed = root.join("m/0.txt");
    let v2 = body(0, 1).replace("version 1", "version X");
    std::fs::write(&changed, &v2).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&changed)
        .unwrap()
        .set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(3600))
        .unwrap();
    app.ingest_ok("papers", &lines.join("\n")).await;
    wait_until("the Resource Dump", || async {
        status(&app, "/sets/papers/resourcedump.xml").await == 200
    })
    .await;
    let work = tempfile::tempdir().unwrap();
    let base = app.config.base_url();
    let (files, _) = download(
        &app,
        &format!("{base}/sets/papers/resourcedump.xml"),
        work.path(),
    )
    .await;
    // check_dump.py fails on a member whose bytes do not match the manifest.
    let got = packed(&check(&files));
    let listed = resource_list(&app).await;
    assert_eq!(got.len(), 6);
    let url0 = format!("{base}/files/papers/m/0.txt");
    for e in &got {
        if e.0 == url0 {
            assert_eq!(e.1, md5_hex(v2.as_bytes()), "measured again");
        } else {
            assert!(
                listed.contains(e),
                "the store's md5 for the unchanged: {e:?}"
            );
        }
    }
    app.stop().await;
}
