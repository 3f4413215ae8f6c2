//! The ingest API: all-or-nothing batches, reasons for every bad line, auth, and the invariant
//! that a resource document never exists without its change document or the reverse.

use std::collections::HashMap;

use resourcesync_hub::model::{ChangeType, SetName};
use resourcesync_hub::store::Store;

use crate::support::*;

#[tokio::test]
async fn a_bad_line_refuses_the_whole_batch_with_every_reason() {
    let (mut c, dir) = test_config();
    let root = dir.path().join("root");
    add_file_set(&mut c, "s", &root, None);
    let app = TestApp::start_with(c).await;
    app.ingest_ok("s", &change_line("created", "keep.txt", &md5_hex(b"k"), 1))
        .await;
    let before_rl = app.get_text("/sets/s/resourcelist.xml").await;
    let before_cl = app.get_text("/sets/s/changelist.xml").await;

    let batch = [
        change_line("created", "ok.txt", &md5_hex(b"o"), 1),
        "{not json".into(),
        r#"{"change":"created","location":{"type":"rel_path","value":"../../etc/passwd"}}"#.into(),
        r#"{"change":"created","location":{"type":"abs_path","value":"/etc/passwd"}}"#.to_string(),
        r#"{"change":"created","location":{"type":"rel_path","value":"x"},"md5":"nothex"}"#.into(),
        r#"{"change":"created","location":{"type":"rel_path","value":"x"},"ln":[{"rel":"described by","href":{"type":"url","value":"http://x/"}}]}"#.into(),
    ]
    .join("\n");
    let r = app.ingest("s", &batch).await;
    assert_eq!(r.status(), 422);
    let body: serde_json::Value = r.json().await.unwrap();
    let lines: Vec<u64> = body["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["line"].as_u64().unwrap())
        .collect();
    assert_eq!(
        lines,
        [2],
        "syntax errors are reported before semantic checks: {body}"
    );
    // Without the syntax error, every semantic error is reported at once.
    let batch = batch.replace("{not json\n", "");
    let r = app.ingest("s", &batch).await;
    assert_eq!(r.status(), 422);
    let body: serde_json::Value = r.json().await.unwrap();
    let reasons: HashMap<u64, String> = body["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["line"].as_u64().unwrap(),
                l["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(reasons.len(), 4, "{body}");
    assert!(reasons[&2].contains("climbs out"), "{body}");
    assert!(
        reasons[&3].contains("outside the set's resource_root_dir"),
        "{body}"
    );
    assert!(reasons[&4].contains("md5"), "{body}");
    assert!(reasons[&5].contains("described by"), "{body}");
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("nothing was applied"));

    assert_eq!(
        app.get_text("/sets/s/resourcelist.xml").await,
        before_rl,
        "nothing applied"
    );
    assert_eq!(
        app.get_text("/sets/s/changelist.xml").await,
        before_cl,
        "nothing applied"
    );
    app.stop().await;
}

#[tokio::test]
async fn framing_size_and_datetime_checks() {
    let (mut c, _dir) = test_config();
    c.ingest.max_body_bytes = 4096;
    c.ingest.max_future_skew_secs = 60;
    let app = TestApp::start_with(c).await;
    let url = app.url("/api/v1/resource-sets/s/changes");
    let one = r#"{"change":"created","location":{"type":"url","value":"http://x.org/a"}}"#;

    let r = app
        .client
        .post(&url)
        .header("content-type", "application/json")
        .body(format!("[{one},{one}]"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let report: serde_json::Value = r.json().await.unwrap();
    assert_eq!(report["applied"], 2);
    assert_eq!(report["set_created"], true);

    let r = app
        .client
        .post(&url)
        .header("content-type", "text/xml")
        .body(one)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    assert!(r.text().await.unwrap().contains("application/x-ndjson"));
    let r = app
        .client
        .post(&url)
        .header("content-type", "application/json")
        .body("")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = app
        .client
        .post(&url)
        .body(vec![b'x'; 10_000])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let r = app
        .client
        .post(app.url("/api/v1/resource-sets/..bad/changes"))
        .body(one)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    // A datetime without a zone could mean any of 26 instants: refused, naming the field.
    let zoneless = r#"{"change":"created","location":{"type":"url","value":"http://x.org/z"},"lastmod":"2024-01-01T00:00:00"}"#;
    let r = app.ingest("s", zoneless).await;
    assert_eq!(r.status(), 422);
    let text = r.text().await.unwrap();
    assert!(
        text.contains(r#"lastmod \"2024-01-01T00:00:00\" has no time zone"#),
        "{text}"
    );
    let future = r#"{"change":"created","location":{"type":"url","value":"http://x.org/f"},"datetime":"2999-01-01T00:00:00Z"}"#;
    let r = app.ingest("s", future).await;
    assert_eq!(r.status(), 422);
    assert!(r.text().await.unwrap().contains("in the future"));
    let past = r#"{"change":"created","location":{"type":"url","value":"http://x.org/p"},"datetime":"2001-01-01T00:00:00Z"}"#;
    let r = app.ingest("s", past).await;
    assert_eq!(r.status(), 422);
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("closed Change Lists never change"));

    // Deleting what is not there records nothing and says so.
    let r = app
        .ingest_ok(
            "s",
            r#"{"change":"deleted","location":{"type":"url","value":"http://x.org/none"}}"#,
        )
        .await;
    assert_eq!(r["applied"], 0);
    assert!(r["ignored"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("no such resource"));
    app.stop().await;
}

#[tokio::test]
async fn the_token_guards_ingest() {
    let (mut c, _dir) = test_config();
    c.ingest.token = "s3cret".into();
    let app = TestApp::start_with(c).await;
    let url = app.url("/api/v1/resource-sets/s/changes");
    let one = r#"{"change":"created","location":{"type":"url","value":"http://x.org/a"}}"#;
    let r = app.client.post(&url).body(one).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let r = app
        .client
        .post(&url)
        .bearer_auth("wrong")
        .body(one)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = app
        .client
        .post(&url)
        .bearer_auth("s3cret")
        .body(one)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    app.stop().await;
}

/// Random batches, many refused: by validation, or mid-way by the store (a `datetime` before
/// the open Change List is refused only while applying, after earlier lines of the batch were
/// written inside the transaction). The store must hold exactly what the accepted batches say,
/// line by line, and nothing of a refused one; and every resource document matches the last
/// change recorded for it.
#[tokio::test]
async fn no_request_splits_a_resource_from_its_change() {
    let (c, _dir) = test_config();
    let db = c.database_path();
    let app = TestApp::start_with(c).await;
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    // name -> (md5, length) of what the accepted batches leave.
    let mut expected: HashMap<String, (String, u64)> = HashMap::new();
    let mut applied_changes = 0usize;
    app.ingest_ok(
        "s",
        &change_line("created", "first.txt", &md5_hex(b"first"), 5),
    )
    .await;
    expected.insert("first.txt".into(), (md5_hex(b"first"), 5));
    applied_changes += 1;
    let (mut ok_batches, mut refused_mid_way) = (0, 0);
    for _ in 0..80 {
        let mut lines = Vec::new();
        let mut effect: Vec<(String, Option<(String, u64)>)> = Vec::new();
        let mut late_line = false;
        for _ in 0..(1 + rnd(8)) {
            let name = format!("r{}.txt", rnd(12));
            let (md5, len) = (md5_hex(format!("{name}{}", rnd(1000)).as_bytes()), rnd(100));
            let line = match rnd(12) {
                0 => "{\"change\":\"created\"".to_string(),
                1 => r#"{"change":"created","location":{"type":"rel_path","value":"../x"}}"#
                    .to_string(),
                2 => {
                    // Valid in itself, refused by the store while applying.
                    late_line = true;
                    change_line("created", &name, &md5, len)
                        .replace('}', r#","datetime":"2001-01-01T00:00:00Z"}"#)
                }
                3 | 4 => {
                    effect.push((name.clone(), None));
                    change_line("deleted", &name, "", 0)
                }
                5 => {
                    effect.push((name.clone(), Some((md5.clone(), len))));
                    change_line("updated", &name, &md5, len)
                }
                _ => {
                    effect.push((name.clone(), Some((md5.clone(), len))));
                    change_line("created", &name, &md5, len)
                }
            };
            lines.push(line);
        }
        // The late line last, so the earlier lines are written before it fails.
        lines.sort_by_key(|l| l.contains("2001-01-01"));
        let r = app.ingest("s", &lines.join("\n")).await;
        let status = r.status();
        let body: serde_json::Value = r.json().await.unwrap();
        assert!(status == 200 || status == 422, "{status}: {body}");
        if status == 200 {
            ok_batches += 1;
            applied_changes += body["applied"].as_u64().unwrap() as usize;
            for (name, state) in effect {
                match state {
                    Some(s) => {
                        expected.insert(name, s);
                    }
                    None => {
                        expected.remove(&name);
                    }
                }
            }
        } else if late_line
            && body["lines"][0]["reason"]
                .as_str()
                .unwrap()
                .contains("precedes the open Change List")
        {
            refused_mid_way += 1;
        }
    }
    assert!(
        ok_batches > 5,
        "the test should apply some batches ({ok_batches})"
    );
    assert!(
        refused_mid_way > 5,
        "the test should refuse some batches while applying ({refused_mid_way})"
    );
    app.stop().await;

    let store = Store::open_embedded(&db).unwrap();
    let set = SetName::parse("s").unwrap();
    let mut last_change = HashMap::new();
    let mut changes = 0;
    let mut cursor = None;
    loop {
        let page = store
            .changes(&set, resourcesync_hub::model::Timestamp(0), None, cursor, 7)
            .await
            .unwrap();
        changes += page.items.len();
        for c in page.items {
            last_change.insert(c.key.clone(), c);
        }
        match page.next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(
        changes, applied_changes,
        "exactly the changes of the accepted batches are recorded"
    );
    let resources = store
        .resources(&set, None, None, 10_000)
        .await
        .unwrap()
        .items;
    let held: HashMap<String, (String, u64)> = resources
        .iter()
        .map(|r| {
            let name = r.key.0.strip_prefix("path:").unwrap().to_string();
            (name, (r.meta.md5.clone().unwrap(), r.meta.length.unwrap()))
        })
        .collect();
    assert_eq!(
        held, expected,
        "the store holds what the accepted batches say, nothing of a refused one"
    );
    for r in &resources {
        let c = &last_change[&r.key];
        assert_ne!(c.change, ChangeType::Deleted);
        assert_eq!(c.meta, r.meta, "{:?}", r.key);
    }
    let counts = store.counts(&set).await.unwrap();
    assert_eq!(counts.resources as usize, resources.len());
    assert_eq!(counts.changes as usize, changes);
}

/// The source guide's ingest example (docs/source.md), run as written next to `serve --demo`: its shell lines in the
/// folder the server was started from, its curl line as curl sends it. The new paper is listed
/// and served as the event says (a harvester gets it, in sync).
#[test]
fn the_readme_ingest_example_works_as_written() {
    let script = doc_sh_block("docs/source.md", "## Feeding it");
    let curl = script
        .lines()
        .find(|l| l.starts_with("curl ") && l.contains("@change.json"))
        .expect("a curl line");
    assert!(curl.contains("Content-Type: application/json"), "{curl}");
    let path = &curl[curl.find("http://127.0.0.1:8080").unwrap() + "http://127.0.0.1:8080".len()..];
    let tmp = tempfile::tempdir().unwrap();
    let server = ChildServer::demo(tmp.path());
    let shell: String = script
        .lines()
        .filter(|l| l != &curl)
        .map(|l| format!("{l}\n"))
        .collect();
    let out = std::process::Command::new("sh")
        .current_dir(tmp.path())
        .args(["-e", "-c", &shell])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = reqwest::Client::builder().no_proxy().build().unwrap();
        let (status, body) = post_json(
            &c,
            &server.url(path.trim()),
            std::fs::read(tmp.path().join("change.json")).unwrap(),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["applied"], 1, "{body}");
        let rl = get_text(&c, &server.url("/sets/demo/resourcelist.xml")).await;
        assert!(rl.contains("papers/paper-013.txt"), "{rl}");
        let file = c
            .get(server.url("/files/demo/papers/paper-013.txt"))
            .send()
            .await
            .unwrap();
        assert_eq!(file.status(), 200);
        let bytes = file.bytes().await.unwrap();
        let listed: serde_json::Value =
            serde_json::from_slice(&std::fs::read(tmp.path().join("change.json")).unwrap())
                .unwrap();
        assert_eq!(
            md5_hex(&bytes),
            listed["md5"].as_str().unwrap(),
            "served as listed"
        );
        assert_eq!(bytes.len() as u64, listed["length"].as_u64().unwrap());
    });
}

/// A backlog loaded into a new set keeps its historical datetimes: its first Change List
/// starts at the backlog's first change; later changes still may not precede the open list.
#[tokio::test]
async fn a_backlog_keeps_its_datetimes() {
    let json = r#"{"change": "created", "location": {"type": "rel_path", "value": "papers/p1.pdf"},
 "length": 4385, "md5": "1584abdf8ebdc9802ac0c6a7402c8753", "mime": "application/pdf",
 "lastmod": "2024-01-31T12:00:00Z", "datetime": "2024-01-31T12:00:05Z"}"#;
    let app = TestApp::start().await;
    let url = app.url("/api/v1/resource-sets/papers/changes");
    let (status, body) = post_json(&app.client, &url, json.into()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["set_created"], true);
    let (_, cl) = app.get_doc("/sets/papers/changelist.xml").await;
    assert_eq!(cl.entries[0].md["datetime"], "2024-01-31T12:00:05Z");
    assert_eq!(
        cl.md["from"], "2024-01-31T12:00:05Z",
        "the first Change List starts at the backlog's first change"
    );
    let early = json.replace("2024-01-31T12:00:05Z", "2024-01-31T12:00:04Z");
    assert_eq!(post_json(&app.client, &url, early.into()).await.0, 422);
    app.stop().await;
}
