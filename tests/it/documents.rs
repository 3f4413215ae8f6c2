//! Every document type: structure a destination relies on, schema validity, HTTP caching.

use std::collections::BTreeSet;

use reqwest::header;
use resourcesync_hub::model::DescribedBy;

use crate::support::*;

/// A set with files on disk, links, a url location, updates and deletes, and lists small
/// enough (3 entries) that both indexes exist.
async fn populated_app() -> (TestApp, tempfile::TempDir) {
    let (mut c, dir) = test_config();
    let root = dir.path().join("files");
    std::fs::create_dir_all(&root).unwrap();
    add_file_set(&mut c, "papers", &root, Some(3));
    c.sets.get_mut("papers").unwrap().describedby = vec![DescribedBy {
        href: "http://example.org/about-papers".into(),
        mime: Some("text/html".into()),
    }];
    c.source.describedby = "http://example.org/about-hub".into();
    let app = TestApp::start_with(c).await;
    let mut lines = Vec::new();
    for i in 0..7 {
        let body = format!("paper {i}\n");
        std::fs::write(root.join(format!("p{i}.txt")), &body).unwrap();
        lines.push(format!(
            r#"{{"change":"created","location":{{"type":"abs_path","value":"{}/p{i}.txt"}},"length":{},"md5":"{}","mime":"text/plain; charset=utf-8","lastmod":"2024-01-0{}T10:00:00+0000","ln":[{{"rel":"describedby","href":{{"type":"rel_path","value":"meta/p{i}.xml"}},"mime":"application/xml"}}]}}"#,
            root.display(),
            body.len(),
            md5_hex(body.as_bytes()),
            i + 1
        ));
    }
    lines.push(r#"{"change":"created","location":{"type":"url","value":"http://mirror.example.org/x?a=1&b=2"},"mime":"application/pdf"}"#.into());
    app.ingest_ok("papers", &lines.join("\n")).await;
    app.ingest_ok(
        "papers",
        &change_line("updated", "p1.txt", &md5_hex(b"paper 1\n"), 8),
    )
    .await;
    app.ingest_ok("papers", &change_line("deleted", "p2.txt", "", 0))
        .await;
    (app, dir)
}

#[tokio::test]
async fn every_document_validates_and_links_up_and_to_its_index() {
    let (app, _dir) = populated_app().await;
    let mut docs: Vec<(String, String)> = Vec::new();

    let (sd_body, sd) = app.get_doc("/.well-known/resourcesync").await;
    assert_eq!(sd.md["capability"], "description");
    assert_eq!(sd.link("describedby"), Some("http://example.org/about-hub"));
    assert_eq!(sd.entries.len(), 1);
    let cap_url = sd.entries[0].loc.clone();
    assert_eq!(sd.entries[0].md["capability"], "capabilitylist");
    assert_eq!(
        sd.entries[0].links[0]["href"],
        "http://example.org/about-papers"
    );
    docs.push(("sd".into(), sd_body));

    let (cap_body, cap) = app.get_doc("/sets/papers/capabilitylist.xml").await;
    assert_eq!(cap.md["capability"], "capabilitylist");
    assert_eq!(
        cap.link("up"),
        Some(app.config.base_url() + "/.well-known/resourcesync").as_deref()
    );
    assert_eq!(
        cap.link("describedby"),
        Some("http://example.org/about-papers")
    );
    let caps: Vec<_> = cap
        .entries
        .iter()
        .map(|e| e.md["capability"].as_str())
        .collect();
    assert_eq!(
        caps,
        [
            "resourcelist",
            "changelist",
            "change-notification",
            "framework-notification"
        ]
    );
    for (e, topic) in cap.entries[2..].iter().zip([
        app.config.change_topic("papers"),
        app.config.framework_topic("papers"),
    ]) {
        assert_eq!(e.loc, topic, "the channel's topic is the <loc>");
        assert_eq!(e.links[0]["rel"], "hub");
        assert_eq!(e.links[0]["href"], app.config.hub_url());
    }
    docs.push(("cap".into(), cap_body));

    // Resource List Index: 8 created, 1 deleted -> 7 resources over parts of at most 3.
    let (rli_body, rli) = app.get_doc("/sets/papers/resourcelist.xml").await;
    assert!(rli.is_index);
    assert_eq!(rli.md["capability"], "resourcelist");
    assert!(rli.md.contains_key("at"));
    assert_eq!(rli.link("up"), Some(cap_url.as_str()));
    docs.push(("rli".into(), rli_body));
    let mut locs = Vec::new();
    for part in &rli.entries {
        let (body, doc) = app.get_doc(&app.path_of(&part.loc)).await;
        assert!(!doc.is_index);
        assert_eq!(doc.md["capability"], "resourcelist");
        assert!(
            doc.md.contains_key("at") && doc.md.contains_key("completed"),
            "{body}"
        );
        assert_eq!(doc.link("up"), Some(cap_url.as_str()));
        assert_eq!(
            doc.link("index"),
            Some((app.config.base_url() + "/sets/papers/resourcelist.xml").as_str())
        );
        assert!(doc.entries.len() <= 3);
        for e in &doc.entries {
            locs.push(e.loc.clone());
            if e.loc.ends_with(".txt") {
                assert!(e.md["hash"].starts_with("md5:"), "{e:?}");
                assert_eq!(e.md["type"], "text/plain", "parameters stripped");
                assert!(e.lastmod.is_some());
                if e.loc.ends_with("/p0.txt") {
                    assert_eq!(e.links[0]["rel"], "describedby");
                    assert_eq!(
                        e.links[0]["href"],
                        app.config.base_url() + "/files/papers/meta/p0.xml"
                    );
                    assert_eq!(e.links[0]["type"], "application/xml");
                }
            }
        }
        docs.push((part.loc.clone(), body));
    }
    let unique: BTreeSet<_> = locs.iter().cloned().collect();
    assert_eq!(locs.len(), 7);
    assert_eq!(unique.len(), 7);
    assert!(
        !locs.iter().any(|l| l.ends_with("p2.txt")),
        "deleted resource listed"
    );
    assert!(locs.contains(&"http://mirror.example.org/x?a=1&b=2".to_string()));

    // Change List Index over 10 changes with 3 per list: 3 closed lists and an open one.
    let (cli_body, cli) = app.get_doc("/sets/papers/changelist.xml").await;
    assert!(cli.is_index);
    assert_eq!(cli.md["capability"], "changelist");
    assert_eq!(cli.link("up"), Some(cap_url.as_str()));
    docs.push(("cli".into(), cli_body));
    assert_eq!(cli.entries.len(), 4);
    let mut all = Vec::new();
    let mut prev_until: Option<String> = None;
    for (i, l) in cli.entries.iter().enumerate() {
        let closed = i < 3;
        assert_eq!(l.md.contains_key("until"), closed, "{l:?}");
        if let Some(u) = &prev_until {
            assert_eq!(&l.md["from"], u, "consecutive intervals");
        }
        prev_until = l.md.get("until").cloned();
        let (body, doc) = app.get_doc(&app.path_of(&l.loc)).await;
        assert_eq!(doc.md["capability"], "changelist");
        assert_eq!(doc.md["from"], l.md["from"]);
        assert_eq!(doc.md.get("until"), l.md.get("until"));
        assert_eq!(
            doc.link("index"),
            Some((app.config.base_url() + "/sets/papers/changelist.xml").as_str())
        );
        assert_eq!(doc.link("up"), Some(cap_url.as_str()));
        for e in &doc.entries {
            let dt = &e.md["datetime"];
            assert!(dt >= &doc.md["from"], "{dt} before from");
            if let Some(u) = doc.md.get("until") {
                assert!(dt < u, "{dt} not before until {u}");
            }
            assert_eq!(
                e.lastmod.is_some(),
                e.md["change"] != "deleted",
                "lastmod on created/updated only: {e:?}"
            );
            all.push((dt.clone(), e.md["change"].clone(), e.loc.clone()));
        }
        docs.push((l.loc.clone(), body));
    }
    assert_eq!(all.len(), 10);
    let mut sorted = all.clone();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(all, sorted, "forward chronological order");
    assert_eq!(all[8].1, "updated");
    assert_eq!(all[9].1, "deleted");

    let refs: Vec<(&str, &str)> = docs.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    assert_valid(&refs);

    // A served resource is the bytes its entry describes.
    let f = app
        .client
        .get(app.url("/files/papers/p1.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(f.status(), 200);
    assert_eq!(f.text().await.unwrap(), "paper 1\n");
    app.stop().await;
}

#[tokio::test]
async fn single_lists_are_plain_urlsets_and_empty_sets_validate() {
    let app = TestApp::start().await;
    app.ingest_ok("fresh", &change_line("created", "a.txt", &md5_hex(b"a"), 1))
        .await;
    let (rl_body, rl) = app.get_doc("/sets/fresh/resourcelist.xml").await;
    assert!(!rl.is_index);
    assert_eq!(rl.link("index"), None);
    let (cl_body, cl) = app.get_doc("/sets/fresh/changelist.xml").await;
    assert!(!cl.is_index);
    assert!(!cl.md.contains_key("until"), "the only list is open");
    assert_eq!(cl.entries.len(), 1);
    let (sd_body, sd) = app.get_doc("/.well-known/resourcesync").await;
    assert_eq!(
        sd.entries.len(),
        1,
        "the set was created by its first change"
    );
    // A set with everything deleted still serves valid (empty) lists.
    app.ingest_ok("fresh", &change_line("deleted", "a.txt", "", 0))
        .await;
    let (empty_rl, doc) = app.get_doc("/sets/fresh/resourcelist.xml").await;
    assert!(doc.entries.is_empty());
    assert_valid(&[
        ("rl", &rl_body),
        ("cl", &cl_body),
        ("sd", &sd_body),
        ("empty", &empty_rl),
    ]);
    app.stop().await;
}

#[tokio::test]
async fn conditional_get_gzip_and_not_found() {
    let (app, _dir) = populated_app().await;
    let plain = reqwest::Client::builder()
        .no_proxy()
        .no_gzip()
        .build()
        .unwrap();
    let url = app.url("/sets/papers/changelist/1.xml");
    let r = plain.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()[header::CONTENT_TYPE], "application/xml");
    let etag = r.headers()[header::ETAG].to_str().unwrap().to_string();
    let lm = r.headers()[header::LAST_MODIFIED]
        .to_str()
        .unwrap()
        .to_string();
    let r = plain
        .get(&url)
        .header(header::IF_NONE_MATCH, &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 304);
    assert!(r.bytes().await.unwrap().is_empty());
    let r = plain
        .get(&url)
        .header(header::IF_MODIFIED_SINCE, &lm)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 304);
    let r = plain
        .get(&url)
        .header(header::IF_NONE_MATCH, "\"other\"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // The open list changes when a change arrives: the old ETag no longer matches.
    let open = app.url("/sets/papers/changelist/4.xml");
    let etag = plain.get(&open).send().await.unwrap().headers()[header::ETAG]
        .to_str()
        .unwrap()
        .to_string();
    app.ingest_ok(
        "papers",
        &change_line("updated", "p3.txt", &md5_hex(b"x"), 1),
    )
    .await;
    let r = plain
        .get(&open)
        .header(header::IF_NONE_MATCH, &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // gzip is another representation, with its own ETag; both revalidate on their own.
    let identity = plain.get(&url).send().await.unwrap();
    let (id_etag, id_body) = (
        identity.headers()[header::ETAG]
            .to_str()
            .unwrap()
            .to_string(),
        identity.bytes().await.unwrap(),
    );
    let r = plain
        .get(&url)
        .header(header::ACCEPT_ENCODING, "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()[header::CONTENT_ENCODING], "gzip");
    assert_eq!(r.headers()[header::VARY], "accept-encoding");
    let gz_etag = r.headers()[header::ETAG].to_str().unwrap().to_string();
    assert_ne!(gz_etag, id_etag, "gzip and identity carry different ETags");
    let mut unzipped = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(&r.bytes().await.unwrap()[..]),
        &mut unzipped,
    )
    .unwrap();
    assert_eq!(unzipped, id_body);
    let cond = |etag: &str, enc: &str| {
        plain
            .get(&url)
            .header(header::IF_NONE_MATCH, etag.to_string())
            .header(header::ACCEPT_ENCODING, enc.to_string())
            .send()
    };
    assert_eq!(cond(&gz_etag, "gzip").await.unwrap().status(), 304);
    assert_eq!(
        cond(&gz_etag, "identity").await.unwrap().status(),
        200,
        "the gzip tag does not validate identity"
    );
    assert_eq!(cond(&id_etag, "gzip, deflate").await.unwrap().status(), 200);
    assert_eq!(cond(&id_etag, "gzip;q=0").await.unwrap().status(), 304);

    for path in [
        "/sets/nope/resourcelist.xml",
        "/sets/papers/resourcelist/99.xml",
        "/sets/papers/changelist/x.xml",
        "/nothing",
    ] {
        let r = plain.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_change_regenerates_only_the_part_under_it() {
    let (app, _dir) = populated_app().await;
    let get = |p: &'static str| {
        let app = &app;
        async move {
            let r = app.client.get(app.url(p)).send().await.unwrap();
            let etag = r.headers()[header::ETAG].to_str().unwrap().to_string();
            (etag, r.text().await.unwrap())
        }
    };
    let (e1, b1) = get("/sets/papers/resourcelist/1.xml").await;
    let (e2, b2) = get("/sets/papers/resourcelist/2.xml").await;
    // p1.txt lives in part 1 (insertion order); update it.
    app.ingest_ok(
        "papers",
        &change_line("updated", "p1.txt", &md5_hex(b"new"), 3),
    )
    .await;
    let (e1b, b1b) = get("/sets/papers/resourcelist/1.xml").await;
    let (e2b, b2b) = get("/sets/papers/resourcelist/2.xml").await;
    assert_ne!(e1, e1b);
    assert_ne!(b1, b1b);
    assert!(b1b.contains(&md5_hex(b"new")));
    assert_eq!(e2, e2b, "part 2 was not regenerated");
    assert_eq!(b2, b2b, "part 2 is byte-identical, `at` included");
    app.stop().await;
}

#[tokio::test]
async fn an_idle_open_change_list_closes_when_its_period_is_over() {
    let (mut c, _dir) = test_config();
    c.set_defaults.changelist_rollover_secs = 1;
    c.source.rollover_check_secs = 1;
    let app = TestApp::start_with(c).await;
    app.ingest_ok("s", &change_line("created", "a.txt", &md5_hex(b"a"), 1))
        .await;
    let mut closed = false;
    // A second's period, checked every second: closed within about 2 s, waited for 30.
    for _ in 0..300 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let (_, doc) = app.get_doc("/sets/s/changelist.xml").await;
        if doc.is_index {
            assert_eq!(doc.entries.len(), 2);
            assert!(doc.entries[0].md.contains_key("until"));
            closed = true;
            break;
        }
    }
    assert!(closed, "the list was not closed within 4 s of a 1 s period");
    // An empty open list is not closed again: once its own period is over (it opened at the
    // closed one's `until`), the rollover check itself, asked directly, leaves it open.
    use resourcesync_hub::model::{SetName, Timestamp};
    let (_, doc) = app.get_doc("/sets/s/changelist.xml").await;
    let opened = Timestamp::parse(&doc.entries[0].md["until"]).unwrap();
    wait_until("the open list's period to be over", || async {
        Timestamp::now().micros() > opened.micros() + 1_100_000
    })
    .await;
    let store = resourcesync_hub::app::open_store(&app.config)
        .await
        .unwrap();
    let set = SetName::parse("s").unwrap();
    let policy = resourcesync_hub::context::list_policy(&app.config, &set);
    assert_eq!(
        store
            .rollover_if_due(&set, policy, Timestamp::now())
            .await
            .unwrap(),
        None,
        "an empty open list is not closed"
    );
    let (_, doc) = app.get_doc("/sets/s/changelist.xml").await;
    assert_eq!(doc.entries.len(), 2);
    app.stop().await;
}

/// Every error of the public API has one JSON shape with a plain reason, whatever produced
/// it (our handlers, the framework's 405 and 413, the file server), and no Rust type names.
#[tokio::test]
async fn every_error_is_json_with_a_plain_reason() {
    let (mut c, dir) = test_config();
    c.ingest.max_body_bytes = 1000;
    add_file_set(&mut c, "papers", &dir.path().join("root"), None);
    let app = TestApp::start_with(c).await;
    app.ingest_ok(
        "papers",
        &change_line("created", "p1.txt", &md5_hex(b"x"), 1),
    )
    .await;
    let ingest = app.url("/api/v1/resource-sets/papers/changes");
    let cl = &app.client;
    let cases = [
        (
            cl.get(app.url("/sets/nope/resourcelist.xml")),
            404,
            "\"nope\"",
        ),
        (cl.get(app.url("/nothing")), 404, "see / for the URL map"),
        (
            cl.get(app.url("/files/papers/missing.txt")),
            404,
            "not found",
        ),
        (
            cl.delete(app.url("/sets/papers/resourcelist.xml")),
            405,
            "DELETE is not allowed",
        ),
        (cl.get(ingest.clone()), 405, "GET is not allowed"),
        (
            cl.post(ingest.clone())
                .header("content-type", "application/x-ndjson")
                .body("x".repeat(5000)),
            413,
            "1000 bytes (ingest.max_body_bytes)",
        ),
        (
            cl.post(ingest.clone())
                .header("content-type", "text/xml")
                .body("<x/>"),
            415,
            "application/x-ndjson",
        ),
        (
            cl.post(ingest.clone())
                .header("content-type", "application/x-ndjson")
                .body(""),
            400,
            "empty",
        ),
        (
            cl.post(app.url("/api/v1/resource-sets/bad%20name/changes"))
                .body("{}"),
            400,
            "resource set name",
        ),
    ];
    for (req, status, reason) in cases {
        let r = req.send().await.unwrap();
        let url = r.url().to_string();
        assert_eq!(r.status(), status, "{url}");
        if status == 405 {
            assert!(r.headers().contains_key(header::ALLOW), "{url}");
        }
        assert!(
            r.headers()[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("application/json"),
            "{url}"
        );
        let body: serde_json::Value = r.json().await.unwrap();
        let e = body["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{url}: {body}"));
        assert!(e.contains(reason), "{url}: {e:?} should say {reason:?}");
        assert!(
            !e.contains("SetName(") && !e.contains("Some("),
            "{url}: {e}"
        );
    }
    app.stop().await;
}

/// `rshub_pages_built_total{kind}` from /metrics.
async fn pages_built(app: &TestApp, kind: &str) -> u64 {
    let m = app.get_text("/metrics").await;
    let want = format!("rshub_pages_built_total{{kind=\"{kind}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&want))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// A set of `n` URL resources in parts of `per_part`.
async fn big_set(
    n: usize,
    per_part: u32,
    tweak: impl FnOnce(&mut resourcesync_hub::config::Config),
) -> (TestApp, tempfile::TempDir) {
    let (mut c, dir) = test_config();
    c.sets.insert(
        "big".into(),
        resourcesync_hub::config::SetOverrides {
            max_items_in_list: Some(per_part),
            ..Default::default()
        },
    );
    tweak(&mut c);
    let app = TestApp::start_with(c).await;
    for chunk in (0..n).collect::<Vec<_>>().chunks(5000) {
        let lines: Vec<String> = chunk
            .iter()
            .map(|i| format!(r#"{{"change":"created","location":{{"type":"url","value":"http://example.org/r/{i}"}},"md5":"{}","length":1}}"#, md5_hex(i.to_string().as_bytes())))
            .collect();
        app.ingest_ok("big", &lines.join("\n")).await;
    }
    (app, dir)
}

/// The entries of the three parts of set `big`, the same in both forms.
async fn part_entries(app: &TestApp) -> Vec<String> {
    let entries = |page: &str| page[page.find("<url>").expect("entries")..].to_string();
    let mut out = Vec::new();
    for no in 1..=3 {
        let p = format!("/sets/big/resourcelist/{no}.xml");
        let plain = app.get_text(&p).await;
        let r = reqwest::Client::builder()
            .no_proxy()
            .no_gzip()
            .build()
            .unwrap()
            .get(app.url(&p))
            .header("accept-encoding", "gzip")
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["content-encoding"], "gzip", "{p}");
        let mut unzipped = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(&r.bytes().await.unwrap()[..]),
            &mut unzipped,
        )
        .unwrap();
        assert_eq!(entries(&unzipped), entries(&plain), "{p}: both forms");
        out.push(entries(&plain));
    }
    out
}

/// `rshub_pages_brought_up_to_date_total` from /metrics.
async fn brought_up_to_date(app: &TestApp) -> u64 {
    let m = app.get_text("/metrics").await;
    m.lines()
        .find_map(|l| l.strip_prefix("rshub_pages_brought_up_to_date_total "))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// A part rebuilt from its last build and the changes since (updates, deletions, links,
/// a resource deleted and made again) has the entries a build from scratch has, in both
/// forms; when the last build's file is gone, the part is built whole, as correct.
#[tokio::test]
async fn a_part_brought_up_to_date_has_the_entries_of_one_built_whole() {
    let (app, dir) = big_set(2500, 1000, |c| {
        // A fixed base URL: the documents stay the same whichever port the server gets.
        c.server.base_url = "http://rs.example.org".into();
    })
    .await;
    let url = |i: u32| format!("http://example.org/r/{i}");
    let line = |change: &str, i: u32, extra: &str| {
        format!(
            r#"{{"change":"{change}","location":{{"type":"url","value":"{}"}}{extra}}}"#,
            url(i)
        )
    };
    let first = part_entries(&app).await;
    assert_eq!(brought_up_to_date(&app).await, 0, "first builds are whole");
    let changes = [
        line(
            "updated",
            0,
            r#","md5":"00000000000000000000000000000000","length":7"#,
        ),
        line(
            "updated",
            500,
            r#","md5":"11111111111111111111111111111111","length":8,"mime":"text/plain","lastmod":"2024-05-01T10:00:00.5+0000""#,
        ),
        line(
            "updated",
            999,
            r#","md5":"22222222222222222222222222222222","length":9,"ln":[{"rel":"alternate","href":{"type":"url","value":"http://example.org/alt/999"},"mime":"text/html"}]"#,
        ),
        line("deleted", 1, ""),
        line("deleted", 1500, ""),
        line("deleted", 1999, ""),
        line("deleted", 2000, ""),
        line(
            "created",
            2000,
            r#","md5":"33333333333333333333333333333333","length":1"#,
        ),
        line(
            "created",
            9000,
            r#","md5":"44444444444444444444444444444444","length":1"#,
        ),
    ];
    app.ingest_ok("big", &changes.join("\n")).await;
    let second = part_entries(&app).await;
    assert_ne!(second, first);
    assert!(
        second[0].contains("11111111111111111111111111111111")
            && !second[0].contains(&format!("<loc>{}</loc>", url(1)))
    );
    assert!(second[2].contains(&url(9000)) && second[2].contains(&url(2000)));
    assert_eq!(
        brought_up_to_date(&app).await,
        3,
        "each part brought up to date from its last build"
    );
    // Then only updates in the first two parts (their resources stay, their positions are
    // not read again), and in the last one a deletion and a creation (as many resources as
    // before, not the same ones).
    let changes = [
        line(
            "updated",
            3,
            r#","md5":"66666666666666666666666666666666","length":6"#,
        ),
        line(
            "updated",
            1200,
            r#","md5":"77777777777777777777777777777777","length":7"#,
        ),
        line("deleted", 2001, ""),
        line(
            "created",
            9001,
            r#","md5":"88888888888888888888888888888888","length":8"#,
        ),
    ];
    app.ingest_ok("big", &changes.join("\n")).await;
    let third = part_entries(&app).await;
    assert!(third[0].contains("66666666666666666666666666666666"));
    assert!(third[1].contains("77777777777777777777777777777777"));
    assert!(
        third[2].contains(&url(9001)) && !third[2].contains(&format!("<loc>{}</loc>", url(2001)))
    );
    assert_eq!(brought_up_to_date(&app).await, 6);

    // The same store, built from scratch by a server that never built these pages.
    let config = app.config.clone();
    app.stop().await;
    std::fs::remove_dir_all(config.page_cache_dir()).unwrap();
    let app = TestApp::start_with(config.clone()).await;
    assert_eq!(
        part_entries(&app).await,
        third,
        "the entries a whole build has"
    );
    assert_eq!(brought_up_to_date(&app).await, 0);

    // The last builds' files gone, the cache folder with them (as an operator clearing the
    // cache would; it is made again): built whole, and as current.
    std::fs::remove_dir_all(config.page_cache_dir()).unwrap();
    app.ingest_ok(
        "big",
        &line(
            "updated",
            2,
            r#","md5":"55555555555555555555555555555555","length":1"#,
        ),
    )
    .await;
    let fourth = part_entries(&app).await;
    assert!(fourth[0].contains("55555555555555555555555555555555"));
    assert_eq!(fourth[1..], third[1..]);
    assert_eq!(brought_up_to_date(&app).await, 0, "nothing to start from");
    app.stop().await;
    drop(dir);
}

/// 50 concurrent requests for one page nobody has asked for yet: one build, one body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_for_one_page_cause_one_build() {
    let (app, _d) = big_set(4000, 2000, |_| {}).await;
    let before = pages_built(&app, "resource_list_part").await;
    let reqs = (0..50).map(|_| {
        let (c, url) = (app.client.clone(), app.url("/sets/big/resourcelist/2.xml"));
        tokio::spawn(async move { c.get(url).send().await.unwrap().text().await.unwrap() })
    });
    let mut bodies = std::collections::HashSet::new();
    for r in reqs.collect::<Vec<_>>() {
        bodies.insert(r.await.unwrap());
    }
    assert_eq!(bodies.len(), 1, "every request got the same document");
    assert_eq!(
        pages_built(&app, "resource_list_part").await - before,
        1,
        "exactly one build"
    );
    app.stop().await;
}

/// With one build slot and a queue of two, a burst for 20 distinct pages is answered 503 with
/// Retry-After beyond the queue, never by piling up builds: the server (the real binary, so
/// its memory can be read) peaks no higher during the burst than a few pages' worth (measured:
/// +17 MB; with 20 build slots instead of one, +67 MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_beyond_the_build_queue_gets_503_with_retry_after() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.toml");
    std::fs::write(
        &config,
        "[source]\nmax_concurrent_builds = 1\nmax_queued_builds = 2\n\n[sets.big]\nmax_items_in_list = 5000\n",
    )
    .unwrap();
    let server = ChildServer::serve(
        &[
            "--config",
            config.to_str().unwrap(),
            "--data-dir",
            tmp.path().join("data").to_str().unwrap(),
        ],
        &[],
    );
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    for start in (0..100_000).step_by(10_000) {
        let lines: Vec<String> = (start..start + 10_000)
            .map(|i| format!(r#"{{"change":"created","location":{{"type":"url","value":"http://example.org/records/{i:08}"}},"md5":"{}","length":{i},"mime":"application/xml"}}"#, md5_hex(i.to_string().as_bytes())))
            .collect();
        let r = client
            .post(server.url("/api/v1/resource-sets/big/changes"))
            .header("content-type", "application/x-ndjson")
            .body(lines.join("\n"))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    }
    let pid = server.child.id();
    let rss_before = proc_mb(pid, "VmRSS");
    // Resets the peak (VmHWM) to the current RSS.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let reqs: Vec<_> = (1..=20)
        .map(|n| {
            let (c, url) = (
                client.clone(),
                server.url(&format!("/sets/big/resourcelist/{n}.xml")),
            );
            tokio::spawn(async move {
                let r = c.get(url).send().await.unwrap();
                let status = r.status().as_u16();
                let retry = r
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_string());
                let body = r.bytes().await.unwrap();
                assert!(status != 200 || body.len() > 100_000, "a whole part");
                (status, retry)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for r in reqs {
        answers.push(r.await.unwrap());
    }
    let peak = proc_mb(pid, "VmHWM");
    let shed: Vec<_> = answers.iter().filter(|(s, _)| *s == 503).collect();
    let served = answers.iter().filter(|(s, _)| *s == 200).count();
    assert!(
        !shed.is_empty() && served >= 3,
        "some built, the rest shed: {answers:?}"
    );
    assert!(
        shed.iter().all(|(_, ra)| ra.as_deref() == Some("1")),
        "{answers:?}"
    );
    assert_eq!(served + shed.len(), 20, "{answers:?}");
    assert!(
        peak - rss_before < 40.0,
        "the burst raised the server's memory from {rss_before:.1} MB to a peak of {peak:.1} MB"
    );
    let metrics = client
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // Load shedding is not a store failure.
    assert!(metrics.contains("rshub_store_errors_total 0"), "{metrics}");
    eprintln!("burst: RSS {rss_before:.1} MB before, peak {peak:.1} MB during");
}

/// Every document the server advertises, walked down from the Source Description.
async fn every_path(app: &TestApp) -> Vec<String> {
    let base = app.config.base_url();
    let mut paths = vec!["/.well-known/resourcesync".to_string()];
    let mut i = 0;
    while i < paths.len() {
        let (_, doc) = app.get_doc(&paths[i].clone()).await;
        let cap = doc.md.get("capability").cloned().unwrap_or_default();
        // Entries are documents in the description, capability lists and indexes only.
        if doc.is_index || cap == "description" || cap == "capabilitylist" {
            for e in &doc.entries {
                if e.loc.starts_with(&base) && e.loc.ends_with(".xml") {
                    let p = app.path_of(&e.loc);
                    if !paths.contains(&p) {
                        paths.push(p);
                    }
                }
            }
        }
        i += 1;
    }
    paths
}

/// Both forms of every document: path -> (identity, gzip) bodies.
async fn fetch_all(app: &TestApp, paths: &[String]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let plain = reqwest::Client::builder()
        .no_proxy()
        .no_gzip()
        .build()
        .unwrap();
    let mut out = Vec::new();
    for p in paths {
        let id = plain.get(app.url(p)).send().await.unwrap();
        assert_eq!(id.status(), 200, "{p}");
        let id = id.bytes().await.unwrap().to_vec();
        let gz = plain
            .get(app.url(p))
            .header(header::ACCEPT_ENCODING, "gzip")
            .send()
            .await
            .unwrap();
        assert_eq!(gz.headers()[header::CONTENT_ENCODING], "gzip", "{p}");
        out.push((id, gz.bytes().await.unwrap().to_vec()));
    }
    out
}

/// Every `rshub_pages_built_total` counter, by kind.
async fn builds(app: &TestApp) -> std::collections::BTreeMap<String, u64> {
    app.get_text("/metrics")
        .await
        .lines()
        .filter_map(|l| l.strip_prefix("rshub_pages_built_total{kind=\""))
        .filter_map(|l| l.split_once("\"} "))
        .map(|(k, v)| (k.to_string(), v.trim().parse().unwrap()))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// Pages live on disk: a restarted server serves every document without building it, a
/// change rebuilds exactly the part holding the resource and the open Change List, and a
/// closed Change List is built once over the whole run.
#[tokio::test]
async fn pages_survive_a_restart_and_a_change_rebuilds_only_what_it_touched() {
    let (app, dir) = {
        // A fixed base URL: the documents stay the same whichever port the server gets.
        let (app, dir) = populated_app().await;
        let mut c = app.config.clone();
        c.server.base_url = "http://rs.example.org".into();
        c.server.listen = "127.0.0.1:0".into();
        app.stop().await;
        std::fs::remove_dir_all(c.page_cache_dir()).unwrap();
        (TestApp::start_with(c).await, dir)
    };
    let paths = every_path(&app).await;
    let lists = paths.iter().filter(|p| p.contains("/changelist/")).count();
    assert!(
        lists >= 3 && paths.iter().any(|p| p.contains("/resourcelist/")),
        "{paths:?}"
    );
    let before = fetch_all(&app, &paths).await;
    assert_eq!(fetch_all(&app, &paths).await, before);
    let first = builds(&app).await;
    assert_eq!(
        first.get("change_list_no").copied(),
        Some(lists as u64),
        "each Change List built once: {first:?}"
    );
    let config = app.config.clone();
    app.stop().await;

    let app = TestApp::start_with(config.clone()).await;
    assert_eq!(every_path(&app).await, paths);
    assert_eq!(fetch_all(&app, &paths).await, before, "the same bytes");
    assert_eq!(
        builds(&app).await,
        Default::default(),
        "nothing rebuilt after the restart"
    );
    let metrics = app.get_text("/metrics").await;
    assert!(
        metrics.contains("rshub_page_cache_hits_total{tier=\"disk\"}")
            && metrics.contains("rshub_page_cache_bytes{tier=\"disk\"}"),
        "{metrics}"
    );

    app.ingest_ok(
        "papers",
        &change_line("updated", "p4.txt", &md5_hex(b"changed"), 7),
    )
    .await;
    assert_eq!(
        every_path(&app).await,
        paths,
        "no list was opened or closed"
    );
    let after = fetch_all(&app, &paths).await;
    let changed: Vec<&String> = paths
        .iter()
        .zip(before.iter().zip(&after))
        .filter(|(_, (b, a))| b != a)
        .map(|(p, _)| p)
        .collect();
    assert_eq!(changed.len(), 2, "one part and the open list: {changed:?}");
    assert!(changed[0].contains("/resourcelist/"), "{changed:?}");
    assert_eq!(
        changed[1],
        paths.iter().rfind(|p| p.contains("/changelist/")).unwrap()
    );
    assert_eq!(
        builds(&app).await,
        [
            ("change_list_no".to_string(), 1),
            ("resource_list_part".to_string(), 1)
        ]
        .into(),
        "exactly those two were built"
    );
    app.stop().await;
    drop(dir);
}

/// `Range` on a part: the bytes asked for with 206, of the form negotiated; `If-Range` with an
/// old validator gives the whole new document; a range past the end gives 416.
#[tokio::test]
async fn byte_ranges_of_both_forms() {
    let (app, _dir) = populated_app().await;
    let plain = reqwest::Client::builder()
        .no_proxy()
        .no_gzip()
        .build()
        .unwrap();
    let url = app.url("/sets/papers/resourcelist/1.xml");
    for enc in ["identity", "gzip"] {
        let whole = plain
            .get(&url)
            .header(header::ACCEPT_ENCODING, enc)
            .send()
            .await
            .unwrap();
        assert_eq!(whole.headers()[header::ACCEPT_RANGES], "bytes");
        let etag = whole.headers()[header::ETAG].to_str().unwrap().to_string();
        let whole = whole.bytes().await.unwrap();
        assert!(whole.len() > 200, "{enc}: {} bytes", whole.len());
        let r = plain
            .get(&url)
            .header(header::ACCEPT_ENCODING, enc)
            .header(header::RANGE, "bytes=100-199")
            .header(header::IF_RANGE, &etag)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 206, "{enc}");
        assert_eq!(
            r.headers()[header::CONTENT_RANGE],
            format!("bytes 100-199/{}", whole.len()).as_str()
        );
        assert_eq!(r.headers()[header::ETAG], etag.as_str());
        assert_eq!(r.bytes().await.unwrap(), whole.slice(100..200), "{enc}");
        let tail = plain
            .get(&url)
            .header(header::ACCEPT_ENCODING, enc)
            .header(header::RANGE, "bytes=150-")
            .send()
            .await
            .unwrap();
        assert_eq!(tail.status(), 206);
        assert_eq!(tail.bytes().await.unwrap(), whole.slice(150..), "{enc}");
        let stale = plain
            .get(&url)
            .header(header::ACCEPT_ENCODING, enc)
            .header(header::RANGE, "bytes=100-199")
            .header(header::IF_RANGE, "\"an-older-version\"")
            .send()
            .await
            .unwrap();
        assert_eq!(stale.status(), 200, "a changed document is sent whole");
        assert_eq!(stale.bytes().await.unwrap(), whole);
        let past = plain
            .get(&url)
            .header(header::ACCEPT_ENCODING, enc)
            .header(header::RANGE, format!("bytes={}-", whole.len() + 10))
            .send()
            .await
            .unwrap();
        assert_eq!(past.status(), 416);
        assert_eq!(
            past.headers()[header::CONTENT_RANGE],
            format!("bytes */{}", whole.len()).as_str()
        );
    }
    app.stop().await;
}

/// With `source.rebuild_interval_ms`, a page whose data keeps changing is rebuilt at most once
/// per interval: readers in between get the last build at once (its validators unchanged), and
/// after the interval the next reader gets the changes.
#[tokio::test]
async fn a_page_under_steady_changes_is_rebuilt_at_most_once_per_interval() {
    let (mut c, _dir) = test_config();
    c.source.rebuild_interval_ms = 1500;
    let app = TestApp::start_with(c).await;
    app.ingest_ok("s", &change_line("created", "a.txt", &md5_hex(b"a"), 1))
        .await;
    let part = || async {
        let r = app
            .client
            .get(app.url("/sets/s/resourcelist.xml"))
            .send()
            .await
            .unwrap();
        let etag = r.headers()[header::ETAG].to_str().unwrap().to_string();
        (etag, r.text().await.unwrap())
    };
    let (etag, body) = part().await;
    let built = pages_built(&app, "resource_list").await;
    let started = std::time::Instant::now();
    for i in 0..5 {
        app.ingest_ok(
            "s",
            &change_line("created", &format!("b{i}.txt"), &md5_hex(b"b"), 1),
        )
        .await;
        let (e, b) = part().await;
        if started.elapsed() < std::time::Duration::from_millis(1200) {
            assert_eq!((&e, &b), (&etag, &body), "served from the last build");
        }
    }
    wait_until("the changes reach the Resource List", || async {
        part().await.1.contains("/b4.txt")
    })
    .await;
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(1400),
        "not before the interval"
    );
    let rebuilt = pages_built(&app, "resource_list").await - built;
    assert!(
        rebuilt <= 2,
        "{rebuilt} builds for five changes in one interval"
    );
    app.stop().await;
}

/// With `source.rebuild_interval_ms`, a page found current is not looked at again for the
/// interval (readers are not each a read of the store's bookkeeping): a change just after that
/// check reaches readers once the interval has run, never later.
#[tokio::test]
async fn a_page_found_current_is_checked_again_after_the_interval() {
    let (mut c, _dir) = test_config();
    c.source.rebuild_interval_ms = 1000;
    let app = TestApp::start_with(c).await;
    app.ingest_ok("s", &change_line("created", "a.txt", &md5_hex(b"a"), 1))
        .await;
    let list = || async { app.get_text("/sets/s/resourcelist.xml").await };
    assert!(list().await.contains("/a.txt"));
    // Once the build is older than the interval, a reader has the store checked: still current.
    let built = std::time::Instant::now();
    wait_until("the build to be older than the interval", || async {
        built.elapsed() > std::time::Duration::from_millis(1100)
    })
    .await;
    let before = list().await;
    let checked = std::time::Instant::now();
    app.ingest_ok("s", &change_line("created", "b.txt", &md5_hex(b"b"), 1))
        .await;
    let just_after = list().await;
    if checked.elapsed() < std::time::Duration::from_millis(800) {
        assert_eq!(just_after, before, "served as checked, within the interval");
    }
    wait_until("the change reaches the Resource List", || async {
        list().await.contains("/b.txt")
    })
    .await;
    let took = checked.elapsed();
    assert!(
        took >= std::time::Duration::from_millis(900),
        "not before the interval: {took:?}"
    );
    assert!(
        took < std::time::Duration::from_millis(3000),
        "not long after it: {took:?}"
    );
    app.stop().await;
}

/// One raw request line, as a client that does not normalise paths sends it: the status and
/// the body.
async fn raw_get(addr: &str, target: &str) -> (u16, String) {
    use tokio::io::AsyncReadExt;
    let mut s = raw_request(addr, target, None).await;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// Resource files: a small one answered from one read, a large one streamed, both with
/// validators, 304, HEAD and ranges; nothing outside the set's folder can be reached,
/// however the path is spelled.
#[tokio::test]
async fn resource_files_small_and_large_with_validators_and_no_way_out() {
    let (mut c, dir) = test_config();
    let root = dir.path().join("files");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(dir.path().join("secret.txt"), "the secret\n").unwrap();
    std::fs::write(root.join("small.txt"), "a small file\n").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(root.join("sub/big.bin"), &big).unwrap();
    add_file_set(&mut c, "papers", &root, None);
    let app = TestApp::start_with(c).await;
    let plain = reqwest::Client::builder()
        .no_proxy()
        .no_gzip()
        .build()
        .unwrap();

    let small = plain
        .get(app.url("/files/papers/small.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(small.status(), 200);
    assert_eq!(small.headers()[header::CONTENT_TYPE], "text/plain");
    assert_eq!(small.headers()[header::CONTENT_LENGTH], "13");
    let etag = small.headers()[header::ETAG].to_str().unwrap().to_string();
    assert!(small.headers().contains_key(header::LAST_MODIFIED));
    assert_eq!(small.text().await.unwrap(), "a small file\n");
    let again = plain
        .get(app.url("/files/papers/small.txt"))
        .header(header::IF_NONE_MATCH, &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 304);
    let head = plain
        .head(app.url("/files/papers/small.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 200);
    assert_eq!(head.headers()[header::CONTENT_LENGTH], "13");
    assert!(head.bytes().await.unwrap().is_empty());

    let whole = plain
        .get(app.url("/files/papers/sub/big.bin"))
        .send()
        .await
        .unwrap();
    assert_eq!(whole.status(), 200);
    assert_eq!(whole.bytes().await.unwrap(), big);
    let part = plain
        .get(app.url("/files/papers/sub/big.bin"))
        .header(header::RANGE, "bytes=200000-200099")
        .send()
        .await
        .unwrap();
    assert_eq!(part.status(), 206);
    assert_eq!(part.bytes().await.unwrap(), &big[200_000..200_100]);
    let post = plain
        .post(app.url("/files/papers/small.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), 405);

    for target in [
        "/files/papers/../secret.txt",
        "/files/papers/%2e%2e/secret.txt",
        "/files/papers/%2E%2E%2Fsecret.txt",
        "/files/papers/sub/..%2f..%2fsecret.txt",
        "/files/papers/sub%5c..%5c..%5csecret.txt",
        "/files/papers/sub",
        "/files/papers/",
        "/files/papers/small.txt%00.png",
    ] {
        let (status, text) = raw_get(&app.addr, target).await;
        assert_eq!(status, 404, "{target}: {text}");
        assert!(!text.contains("the secret"), "{target}: {text}");
    }
    app.stop().await;
}

/// The server's side of each connection from one of `clients` (local ports) to `server_port`
/// that is still established, per /proc/net/tcp.
fn established_from(server_port: u16, clients: &[u16]) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port = |field: &str| u16::from_str_radix(field.rsplit(':').next().unwrap(), 16).unwrap();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            f[3] == "01" && port(f[1]) == server_port && clients.contains(&port(f[2]))
        })
        .count()
}

/// A raw connection that has sent `GET target` (as written: nothing normalises it), with a
/// receive buffer of `rcvbuf` bytes when given (a small one makes the server wait for the
/// client as soon as the kernel's buffers are full).
async fn raw_request(addr: &str, target: &str, rcvbuf: Option<u32>) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    if let Some(size) = rcvbuf {
        socket.set_recv_buffer_size(size).unwrap();
    }
    let mut s = socket.connect(addr.parse().unwrap()).await.unwrap();
    s.write_all(
        format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    s
}

/// Clients that stop reading a large response are let go after `server.idle_timeout_secs`
/// (their connections and the chunks queued for them are not held for ever), while a client
/// that pauses shorter than that between reads gets the whole file however long it takes.
#[tokio::test]
async fn clients_that_stop_reading_are_let_go_and_slow_ones_are_not() {
    use tokio::io::AsyncReadExt;
    let (mut c, dir) = test_config();
    c.server.idle_timeout_secs = 1;
    let root = dir.path().join("files");
    std::fs::create_dir_all(&root).unwrap();
    let big: Vec<u8> = (0..8_000_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(root.join("big.bin"), &big).unwrap();
    add_file_set(&mut c, "papers", &root, None);
    let app = TestApp::start_with(c).await;
    let server_port: u16 = app.addr.rsplit(':').next().unwrap().parse().unwrap();

    let mut stalled = Vec::new();
    for _ in 0..10 {
        let mut s = raw_request(&app.addr, "/files/papers/big.bin", Some(4096)).await;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200", "the response started");
        stalled.push(s);
    }
    let ports: Vec<u16> = stalled
        .iter()
        .map(|s| s.local_addr().unwrap().port())
        .collect();
    assert_eq!(established_from(server_port, &ports), 10);

    // One that reads a megabyte, then pauses for a quarter of the limit, again and again:
    // about 2 s in all, twice the limit. (What the limit watches is the server's writes: the
    // kernel takes more only once about half its send buffer, up to 4 MB, has drained, so a
    // reader is cut off only if that takes it longer than the limit.)
    let mut slow = raw_request(&app.addr, "/files/papers/big.bin", Some(65536)).await;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let started = std::time::Instant::now();
    loop {
        let mut n = 0;
        while n < buf.len() {
            match slow.read(&mut buf[n..]).await.unwrap() {
                0 => break,
                k => n += k,
            }
        }
        got.extend_from_slice(&buf[..n]);
        if n < buf.len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let body_at = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert!(
        started.elapsed() > std::time::Duration::from_millis(1500),
        "the reader was slower than the limit in all ({:?}, {} bytes)",
        started.elapsed(),
        got.len()
    );
    assert_eq!(
        got.len() - body_at,
        big.len(),
        "the slow reader got the whole file"
    );
    assert!(got[body_at..] == big[..]);

    wait_until(
        "the stalled connections are closed by the server",
        || async { established_from(server_port, &ports) == 0 },
    )
    .await;
    // What the client could still read is what the kernel had buffered, not the file.
    let mut rest = Vec::new();
    let _ = stalled[0].read_to_end(&mut rest).await;
    assert!(
        rest.len() < big.len(),
        "a stalled client was cut off ({} of {} bytes)",
        rest.len(),
        big.len()
    );
    // The server still answers.
    assert_eq!(
        app.client
            .get(app.url("/files/papers/big.bin"))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .len(),
        big.len()
    );
    app.stop().await;
}

/// Past `server.max_connections` the server stops accepting: a further client waits in the
/// kernel's queue (it is not refused, and the process does not run out of descriptors), is
/// served as soon as a connection closes, and `rshub_open_connections` says how many are open.
#[tokio::test]
async fn connections_past_the_cap_wait_and_are_served_when_one_closes() {
    use tokio::io::AsyncReadExt;
    let (mut c, _dir) = test_config();
    c.server.max_connections = 3;
    let app = TestApp::start_with(c).await;
    // Two connections that say nothing, and the test's client (kept alive) make three.
    let mut quiet = Vec::new();
    for _ in 0..2 {
        quiet.push(tokio::net::TcpStream::connect(&app.addr).await.unwrap());
    }
    wait_until("three connections are counted open", || async {
        app.get_text("/metrics")
            .await
            .lines()
            .any(|l| l == "rshub_open_connections 3")
    })
    .await;
    // A fourth client is queued, not answered (nor refused) while three are open.
    let mut fourth = raw_request(&app.addr, "/healthz", None).await;
    let mut first = [0u8; 12];
    let waited = tokio::time::timeout(
        std::time::Duration::from_millis(700),
        fourth.read_exact(&mut first),
    )
    .await;
    assert!(
        waited.is_err(),
        "the fourth connection was served past the cap: {waited:?}"
    );
    // One closes: the fourth is served.
    drop(quiet.pop());
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        fourth.read_exact(&mut first),
    )
    .await
    .expect("the fourth connection is served once one closed")
    .unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    app.stop().await;
}
