//! The OAI-PMH repository at `/oai` against harvesters nobody here wrote: PyPI `oaipmh`
//! (pyoai's client) and `oaipmh-scythe`, plus every answer checked against OAI-PMH.xsd. The
//! set is fed by the collector from an upstream repository, so a change made upstream is seen
//! downstream too.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use crate::collect::{
    change_upstream, collect_config, no_error, now_datestamp, repository, rewrite, Collecting,
    OaiServer,
};
use crate::support::{PyEnv, TestApp};

fn tool(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tools")
        .join(name)
}

fn py_json(args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let out = Command::new(PyEnv::get().python())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// identifier (the repository's OAI identifier, which `/oai` serves) -> its file, for every
/// live resource of `papers`.
async fn expected(c: &Collecting) -> BTreeMap<String, String> {
    let root = c.app.config.collected_dir("papers");
    let prefix = c.app.config.set_config("papers").url_prefix;
    c.resources()
        .await
        .into_keys()
        .map(|url| {
            let rel = percent_encoding::percent_decode_str(url.strip_prefix(&prefix).unwrap())
                .decode_utf8_lossy()
                .to_string();
            let id = resourcesync_hub::model::origin::identifier_of(&rel)
                .unwrap_or_else(|| panic!("{rel} is a collected record's path"));
            (id, root.join(rel).display().to_string())
        })
        .collect()
}

async fn harvest(
    c: &Collecting,
    client: &str,
    state: &Path,
    from: Option<&str>,
) -> serde_json::Value {
    let expect = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        expect.path(),
        serde_json::to_string(&expected(c).await).unwrap(),
    )
    .unwrap();
    let (base, state, client) = (c.app.url("/oai"), state.to_path_buf(), client.to_string());
    let from = from.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        let mut args: Vec<std::ffi::OsString> = vec![
            tool("oai_harvest.py").into(),
            client.into(),
            base.into(),
            state.into(),
            expect.path().into(),
        ];
        if let Some(f) = from {
            args.push("--from".into());
            args.push(f.into());
        }
        py_json(&args.iter().map(|a| a.as_os_str()).collect::<Vec<_>>())
    })
    .await
    .unwrap()
}

fn clean(v: &serde_json::Value) -> bool {
    ["differ", "missing", "extra"]
        .iter()
        .all(|k| v[k].as_array().unwrap().is_empty())
}

/// Both harvesters take the 9,500 live records in full, then with `from` the 300 created,
/// 200 updated and 100 deleted ones, and end with exactly the set's records (equal to its
/// files as canonical XML) and its deletions; every answer is valid against OAI-PMH.xsd and
/// every error case answers the protocol's code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_harvesters_get_exactly_the_sets_records_in_full_and_incrementally() {
    let mut fx = repository(10_000);
    let repo = OaiServer::start(&fx, 500);
    let (cfg, dir) = collect_config(&repo.base);
    let app = TestApp::start_with(cfg).await;
    let c = Collecting { repo, app };
    no_error(&c.wait_ended(None).await);

    let states: Vec<_> = ["pyoai", "scythe"]
        .iter()
        .map(|k| (k.to_string(), dir.path().join(format!("{k}.json"))))
        .collect();
    for (client, state) in &states {
        let v = harvest(&c, client, state, None).await;
        assert!(
            clean(&v) && v["equal"] == 9_500 && v["deleted"] == 0,
            "{client}: {v}"
        );
    }
    let (base, xsd) = (
        c.app.url("/oai"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schemas/OAI-PMH.xsd"),
    );
    let v = tokio::task::spawn_blocking(move || {
        py_json(&[
            tool("oai_validate.py").as_os_str(),
            base.as_ref(),
            xsd.as_os_str(),
        ])
    })
    .await
    .unwrap();
    assert_eq!(v["invalid"], serde_json::json!([]), "{v}");
    assert_eq!(
        (&v["records"], &v["identifiers"]),
        (&9_500.into(), &9_500.into()),
        "{v}"
    );
    let codes = &v["errors"];
    for (case, code) in [
        ("badVerb", "badVerb"),
        ("noVerb", "badVerb"),
        ("badArgument", "badArgument"),
        ("badFrom", "badArgument"),
        ("mixedGranularity", "badArgument"),
        ("missingPrefix", "badArgument"),
        ("exclusiveToken", "badArgument"),
        ("badResumptionToken", "badResumptionToken"),
        ("cannotDisseminateFormat", "cannotDisseminateFormat"),
        ("idDoesNotExist", "idDoesNotExist"),
        ("idDoesNotExistFormats", "idDoesNotExist"),
        ("noRecordsMatch", "noRecordsMatch"),
        ("noRecordsMatchSet", "noRecordsMatch"),
        ("listSetsToken", "badResumptionToken"),
        ("identifyArgument", "badArgument"),
        ("controlIdentifier", "badArgument"),
        ("controlToken", "badArgument"),
        ("controlPrefix", "badArgument"),
        ("escapeSet", "badArgument"),
        ("nonCharacter", "badArgument"),
        ("repeatedVerb", "badVerb"),
    ] {
        assert_eq!(codes[case], code, "{case}: {v}");
    }

    // Upstream changes (re-datestamped unchanged records record nothing here, so are not
    // listed), collected; the harvesters come back with `from`.
    let since = now_datestamp();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    change_upstream(&mut fx, &now_datestamp());
    rewrite(&c.repo, &fx);
    no_error(&c.run_now().await);
    for (client, state) in &states {
        let v = harvest(&c, client, state, Some(&since)).await;
        assert_eq!(
            v["seen"], 600,
            "{client}: only the changed records are listed: {v}"
        );
        assert!(
            clean(&v) && v["equal"] == 9_700 && v["deleted"] == 100,
            "{client}: {v}"
        );
    }
    c.app.stop().await;
}

/// A set fed by ingest whose files are `oai_dc` records, served at `/oai`.
fn oai_set_config(c: &mut resourcesync_hub::config::Config, root: &Path) {
    crate::support::add_file_set(c, "papers", root, None);
    c.sets.get_mut("papers").unwrap().oai = Some(resourcesync_hub::config::OaiFormat::oai_dc());
    c.oai.page_size = 100;
}

fn dc(k: usize, version: u32) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<oai_dc:dc xmlns:oai_dc=\"http://www.openarchives.org/OAI/2.0/oai_dc/\" xmlns:dc=\"http://purl.org/dc/elements/1.1/\"><dc:title>Paper {k} v{version}</dc:title></oai_dc:dc>\n"
    )
}

/// Writes record `k`'s file and returns its change line.
fn record_line(root: &Path, change: &str, k: usize, version: u32) -> String {
    let rel = format!("r/{k}.xml");
    if change == "deleted" {
        let _ = std::fs::remove_file(root.join(&rel));
        return crate::support::change_line("deleted", &rel, "", 0);
    }
    crate::harvest::file_line(root, change, &rel, &dc(k, version))
}

/// One page of a list, parsed, with nothing quarantined; and its next token.
async fn list_page(
    app: &TestApp,
    query: &str,
) -> (resourcesync_hub::collect::oai::Page, Option<String>) {
    let body = app
        .client
        .get(app.url(&format!("/oai?{query}")))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let p = resourcesync_hub::collect::oai::parse_list(&body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body)));
    assert!(p.quarantined.is_empty(), "{:?}", p.quarantined);
    let token = p.token.clone().map(|t| t.value).filter(|v| !v.is_empty());
    (p, token)
}

/// One page of a list: (identifiers, deleted flags, next token).
async fn page(app: &TestApp, query: &str) -> (Vec<(String, bool)>, Option<String>) {
    let (p, token) = list_page(app, query).await;
    let items = p
        .records
        .into_iter()
        .map(|r| (r.header.identifier, r.header.deleted))
        .collect();
    (items, token)
}

fn next_query(token: &str) -> String {
    format!(
        "verb=ListRecords&resumptionToken={}",
        url::form_urlencoded::byte_serialize(token.as_bytes()).collect::<String>()
    )
}

/// A `ListRecords` walk while 2,000 changes are ingested into the set: every record that
/// existed throughout appears exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_walk_during_ingest_lists_every_lasting_record_once() {
    let (mut c, dir) = crate::support::test_config();
    let root = dir.path().join("root");
    oai_set_config(&mut c, &root);
    let app = TestApp::start_with(c).await;
    let lines: Vec<String> = (0..3_000)
        .map(|k| record_line(&root, "created", k, 1))
        .collect();
    for chunk in lines.chunks(1_000) {
        app.ingest_ok("papers", &chunk.join("\n")).await;
    }
    let prefix = app.config.set_config("papers").url_prefix;
    let id = |k: usize| format!("{prefix}r/{k}.xml");
    let mut seen: std::collections::HashMap<String, usize> = Default::default();
    let (items, mut token) = page(&app, "verb=ListRecords&metadataPrefix=oai_dc").await;
    for (i, _) in items {
        *seen.entry(i).or_default() += 1;
    }
    // 2,000 changes while walking: 100 per page, updates all over the set (so that some
    // records change before the walk reaches them and some after), creates, and deletes of
    // records 2,900.. (which do not last).
    let mut k = 0;
    while let Some(t) = token {
        if k < 2_000 {
            let mut batch = Vec::new();
            for j in k..k + 100 {
                batch.push(match j % 4 {
                    0 | 1 => record_line(&root, "updated", (j * 7) % 2_900, 2),
                    2 => record_line(&root, "created", 10_000 + j, 1),
                    _ => record_line(&root, "deleted", 2_900 + (j / 4) % 100, 0),
                });
            }
            k += 100;
            app.ingest_ok("papers", &batch.join("\n")).await;
        }
        let (items, next) = page(&app, &next_query(&t)).await;
        for (i, _) in items {
            *seen.entry(i).or_default() += 1;
        }
        token = next;
    }
    assert_eq!(k, 2_000, "the walk lasted while all 2,000 changes came");
    for k in 0..2_900 {
        assert_eq!(seen.get(&id(k)), Some(&1), "record {k}");
    }
    assert!(seen.values().all(|n| *n == 1), "no item twice");
    app.stop().await;
}

/// A walk goes on after a restart of the server with the token it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_outlives_a_restart() {
    let (mut c, dir) = crate::support::test_config();
    let root = dir.path().join("root");
    oai_set_config(&mut c, &root);
    let app = TestApp::start_with(c.clone()).await;
    let lines: Vec<String> = (0..450)
        .map(|k| record_line(&root, "created", k, 1))
        .collect();
    app.ingest_ok("papers", &lines.join("\n")).await;
    let (first, token) = page(&app, "verb=ListRecords&metadataPrefix=oai_dc").await;
    app.stop().await;
    let app = TestApp::start_with(c).await;
    let mut all: Vec<String> = first.into_iter().map(|(i, _)| i).collect();
    let mut token = token;
    while let Some(t) = token {
        let (items, next) = page(&app, &next_query(&t)).await;
        all.extend(items.into_iter().map(|(i, _)| i));
        token = next;
    }
    let unique: std::collections::HashSet<_> = all.iter().collect();
    assert_eq!((all.len(), unique.len()), (450, 450));
    let tampered = format!("{}A", token_of(&app).await);
    let (s, body) = get(&app, &next_query(&tampered)).await;
    assert!(
        s == 200 && body.contains("code=\"badResumptionToken\""),
        "{body}"
    );
    app.stop().await;
}

async fn get(app: &TestApp, query: &str) -> (u16, String) {
    let r = app
        .client
        .get(app.url(&format!("/oai?{query}")))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn token_of(app: &TestApp) -> String {
    page(app, "verb=ListIdentifiers&metadataPrefix=oai_dc")
        .await
        .1
        .expect("a token")
}

/// On Elasticsearch (osmem-server), a walk started on one process goes on on another: the
/// tokens are signed with a key both find in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_one_process_is_taken_by_another_on_a_shared_store() {
    let (mut c, dir) = crate::support::test_config();
    let root = dir.path().join("root");
    oai_set_config(&mut c, &root);
    crate::support::use_elasticsearch(&mut c).await;
    // Both processes serve one public base URL (as behind a load balancer).
    c.server.base_url = "http://repository.test".into();
    let a = TestApp::start_with(c.clone()).await;
    let mut c2 = c.clone();
    c2.server.data_dir = dir.path().join("b");
    let b = TestApp::start_with(c2).await;
    let lines: Vec<String> = (0..250)
        .map(|k| record_line(&root, "created", k, 1))
        .collect();
    a.ingest_ok("papers", &lines.join("\n")).await;
    let (first, mut token) = page(&a, "verb=ListRecords&metadataPrefix=oai_dc").await;
    let mut all: Vec<String> = first.into_iter().map(|(i, _)| i).collect();
    let mut on_b = true;
    while let Some(t) = token {
        let (items, next) = page(if on_b { &b } else { &a }, &next_query(&t)).await;
        all.extend(items.into_iter().map(|(i, _)| i));
        token = next;
        on_b = !on_b;
    }
    let unique: std::collections::HashSet<_> = all.iter().collect();
    assert_eq!((all.len(), unique.len()), (250, 250));
    assert!(
        all.iter()
            .all(|i| i.starts_with("http://repository.test/files/papers/r/")),
        "{all:?}"
    );
    a.stop().await;
    b.stop().await;
}

/// A harvester asking again gets a 304 while nothing it could see changed, and the new
/// answer once something did; answers are gzipped for those who take it.
#[tokio::test]
async fn a_repeated_request_is_not_modified_until_the_set_changes() {
    let (mut c, dir) = crate::support::test_config();
    let root = dir.path().join("root");
    oai_set_config(&mut c, &root);
    let app = TestApp::start_with(c).await;
    let lines: Vec<String> = (0..150)
        .map(|k| record_line(&root, "created", k, 1))
        .collect();
    app.ingest_ok("papers", &lines.join("\n")).await;
    let list = app.url("/oai?verb=ListRecords&metadataPrefix=oai_dc");
    let r = app.client.get(&list).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let etag = r.headers()[reqwest::header::ETAG].clone();
    assert!(etag.to_str().unwrap().starts_with("W/\""), "{etag:?}");
    let again = |tag: reqwest::header::HeaderValue| {
        app.client
            .get(&list)
            .header(reqwest::header::IF_NONE_MATCH, tag)
            .send()
    };
    assert_eq!(again(etag.clone()).await.unwrap().status(), 304);
    // The same request with its arguments in another order is the same answer.
    let r = app
        .client
        .get(app.url("/oai?metadataPrefix=oai_dc&verb=ListRecords"))
        .header(reqwest::header::IF_NONE_MATCH, etag.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 304);
    app.ingest_ok("papers", &record_line(&root, "updated", 7, 2))
        .await;
    let r = again(etag.clone()).await.unwrap();
    assert_eq!(r.status(), 200, "a changed set answers anew");
    assert_ne!(r.headers()[reqwest::header::ETAG], etag);

    // gzip, taken by a client that asks for it (one that does not undo it on the way in).
    let raw = reqwest::Client::builder()
        .no_proxy()
        .no_gzip()
        .build()
        .unwrap();
    let r = raw
        .get(&list)
        .header(reqwest::header::ACCEPT_ENCODING, "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()
            .get(reqwest::header::CONTENT_ENCODING)
            .map(|v| v.to_str().unwrap()),
        Some("gzip"),
        "{:?}",
        r.headers()
    );
    let gz = r.bytes().await.unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz[..]), &mut text).unwrap();
    assert!(
        text.contains("Paper 0 v1") && text.trim_end().ends_with("</OAI-PMH>"),
        "{text}"
    );
    app.stop().await;
}

/// `rshub_oai_list_pages_kept_total` from /metrics.
async fn kept(app: &TestApp) -> u64 {
    let m = app.get_text("/metrics").await;
    m.lines()
        .find_map(|l| l.strip_prefix("rshub_oai_list_pages_kept_total "))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// A `ListRecords` walk continued from `query` to its end: each record's identifier, whether
/// it is deleted, and its metadata.
async fn walk_from(app: &TestApp, query: &str) -> Vec<(String, bool, Option<String>)> {
    let mut out = Vec::new();
    let mut query = query.to_string();
    loop {
        let (p, token) = list_page(app, &query).await;
        out.extend(
            p.records
                .into_iter()
                .map(|r| (r.header.identifier, r.header.deleted, r.metadata)),
        );
        match token {
            Some(t) => query = next_query(&t),
            None => return out,
        }
    }
}

/// Pages of `ListRecords` are kept and sent again while none of their records changed: a walk
/// again is sent them all; after updates, deletions and a creation, only the untouched pages
/// are, and the walk has every record once, as it is now; a walk begun before those changes
/// and continued after them has every record of its start once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_list_pages_are_sent_again_only_while_their_records_are_unchanged() {
    let (mut c, dir) = crate::support::test_config();
    let root = dir.path().join("root");
    oai_set_config(&mut c, &root);
    let app = TestApp::start_with(c).await;
    let lines: Vec<String> = (0..1_000)
        .map(|k| record_line(&root, "created", k, 1))
        .collect();
    for chunk in lines.chunks(500) {
        app.ingest_ok("papers", &chunk.join("\n")).await;
    }
    let start = "verb=ListRecords&metadataPrefix=oai_dc";
    let first = walk_from(&app, start).await;
    assert_eq!(first.len(), 1_000);
    // The second walk keeps what the first could not (its stretch had not settled yet), the
    // third is sent all ten pages as kept.
    assert_eq!(walk_from(&app, start).await, first);
    let before = kept(&app).await;
    assert_eq!(walk_from(&app, start).await, first);
    assert_eq!(
        kept(&app).await - before,
        10,
        "every page of the third walk was kept"
    );

    // A walk begun now, continued after the changes.
    let (old, old_token) = list_page(&app, start).await;
    let old_token = old_token.expect("a token");

    // Pages 1, 3, 4 and 8 change (records 5, 250 and 777 updated, 300 and 301 deleted), and
    // a record is created.
    let changes = [
        record_line(&root, "updated", 5, 2),
        record_line(&root, "updated", 250, 2),
        record_line(&root, "updated", 777, 2),
        record_line(&root, "deleted", 300, 0),
        record_line(&root, "deleted", 301, 0),
        record_line(&root, "created", 2_000, 1),
    ];
    app.ingest_ok("papers", &changes.join("\n")).await;
    let before = kept(&app).await;
    let now = walk_from(&app, start).await;
    assert_eq!(
        kept(&app).await - before,
        6,
        "the six untouched pages were kept"
    );
    let prefix = app.config.set_config("papers").url_prefix;
    let id = |k: usize| format!("{prefix}r/{k}.xml");
    let by_id: BTreeMap<&str, (bool, Option<&str>)> = now
        .iter()
        .map(|(i, d, m)| (i.as_str(), (*d, m.as_deref())))
        .collect();
    assert_eq!(by_id.len(), now.len(), "no record twice");
    assert_eq!(now.len(), 1_001);
    for k in (0..1_000).chain([2_000]) {
        let (deleted, metadata) = by_id[id(k).as_str()];
        assert_eq!(deleted, k == 300 || k == 301, "record {k}");
        if !deleted {
            let v = if [5, 250, 777].contains(&k) { 2 } else { 1 };
            assert!(
                metadata.unwrap().contains(&format!("Paper {k} v{v}<")),
                "record {k}: {metadata:?}"
            );
        }
    }
    // Walked again: the same, the pages made anew kept too.
    let before = kept(&app).await;
    assert_eq!(walk_from(&app, start).await, now);
    assert!(kept(&app).await - before >= 10);

    // The walk begun before the changes: its first page's records and the rest, each once.
    let mut all: Vec<String> = old
        .records
        .into_iter()
        .map(|r| r.header.identifier)
        .collect();
    all.extend(
        walk_from(&app, &next_query(&old_token))
            .await
            .into_iter()
            .map(|(i, _, _)| i),
    );
    let unique: std::collections::BTreeSet<&String> = all.iter().collect();
    assert_eq!((all.len(), unique.len()), (1_000, 1_000));
    assert!(!unique.contains(&id(2_000)), "created after the walk began");
    app.stop().await;
}

/// A kept `ListRecords` page goes stale when a writer dates a change into the stretch it
/// covers (the rules accept it: after the set's last notification, inside the open Change
/// List), however late it is recorded: 1,200 records walked twice (pages kept), then `r/5`
/// updated and `r/5000` created dated just after the first batch's newest change. The next
/// walk has 1,201 records, `r/5` once and as it is now (it listed 1,202, `r/5` twice, one
/// of them with its old title).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_dated_into_a_kept_page_is_listed_once_and_as_it_is() {
    let (mut c, dir) = crate::support::test_config();
    let root = dir.path().join("root");
    oai_set_config(&mut c, &root);
    c.notify.enabled = false;
    let app = TestApp::start_with(c).await;
    let lines: Vec<String> = (0..1_200)
        .map(|k| record_line(&root, "created", k, 1))
        .collect();
    app.ingest_ok("papers", &lines.join("\n")).await;
    let store = resourcesync_hub::app::open_store(&app.config)
        .await
        .unwrap();
    let set = resourcesync_hub::model::SetName::parse("papers").unwrap();
    let newest = store.latest_change(&set).await.unwrap().unwrap().datetime;
    let start = "verb=ListRecords&metadataPrefix=oai_dc";
    let first = walk_from(&app, start).await;
    assert_eq!(first.len(), 1_200);
    assert_eq!(walk_from(&app, start).await, first);
    let before = kept(&app).await;
    assert_eq!(walk_from(&app, start).await, first);
    assert!(kept(&app).await - before >= 10, "the pages are kept");

    let dated = |line: String, micros: i64| {
        format!(
            "{},\"datetime\":\"{}\"}}",
            line.trim_end_matches('}'),
            resourcesync_hub::model::Timestamp(newest.0 + micros)
        )
    };
    let changes = [
        dated(record_line(&root, "updated", 5, 2), 1),
        dated(record_line(&root, "created", 5_000, 1), 2),
    ];
    app.ingest_ok("papers", &changes.join("\n")).await;
    let now = walk_from(&app, start).await;
    let prefix = app.config.set_config("papers").url_prefix;
    let r5 = format!("{prefix}r/5.xml");
    let fives: Vec<&Option<String>> = now
        .iter()
        .filter(|(i, _, _)| *i == r5)
        .map(|(_, _, m)| m)
        .collect();
    assert_eq!(fives.len(), 1, "r/5 listed {} times", fives.len());
    assert!(
        fives[0].as_deref().unwrap().contains("Paper 5 v2<"),
        "{:?}",
        fives[0]
    );
    let unique: std::collections::BTreeSet<&String> = now.iter().map(|(i, _, _)| i).collect();
    assert_eq!((now.len(), unique.len()), (1_201, 1_201));
    assert!(unique.contains(&format!("{prefix}r/5000.xml")));
    app.stop().await;
}

/// Waits until the clock shows a second after `t` (`YYYY-MM-DDThh:mm:ssZ`), and returns it.
async fn next_second(t: &str) -> String {
    loop {
        let now = crate::collect::now_datestamp();
        if now.as_str() > t {
            return now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The collected fixture of the faithful-bridge acceptance: `oai:example.org:rec-K` in three
/// sets (`s2` records in `s0` too), every sixth deleted, datestamped on days of March 2021.
fn bridge_repository(n: usize) -> serde_json::Value {
    let records: Vec<serde_json::Value> = (0..n)
        .map(|k| {
            let sets = match k % 3 {
                0 => vec!["s0"],
                1 => vec!["s1"],
                _ => vec!["s2", "s0"],
            };
            serde_json::json!({
                "id": format!("oai:example.org:rec-{k:04}"),
                "datestamp": format!("2021-03-{:02}T00:00:00Z", k + 1),
                "sets": sets,
                "deleted": k % 6 == 5,
                "dc": {"title": [format!("Record {k}")], "identifier": [format!("https://example.org/rec/{k}")]},
            })
        })
        .collect();
    // Day granularity; its datestamps sent as days (`2021-03-01`) and, every other one, in
    // the compact form a production endpoint DPLA harvests uses (`20210302`).
    let replace: Vec<serde_json::Value> = (0..n)
        .map(|k| {
            let day = k + 1;
            let to = if k % 2 == 0 {
                format!("<datestamp>2021-03-{day:02}</datestamp>")
            } else {
                format!("<datestamp>202103{day:02}</datestamp>")
            };
            serde_json::json!([
                format!("<datestamp>2021-03-{day:02}T00:00:00Z</datestamp>"),
                to
            ])
        })
        .collect();
    let mut fx = serde_json::json!({
        "granularity": "YYYY-MM-DD",
        "deletedRecord": "persistent",
        "sets": [["s0", "Zero"], ["s1", "One"], ["s2", "Two & more"]],
        "records": records,
        "faults": {"replace": replace},
    });
    // An old Zenodo `oai_datacite` record: its root takes the envelope's namespace, OAI-PMH's.
    fx["records"].as_array_mut().unwrap().push(serde_json::json!({
        "id": "oai:zenodo.org:1", "datestamp": "2021-03-28T00:00:00Z", "sets": ["s1"],
        "raw": "<oai_datacite xmlns=\"http://www.openarchives.org/OAI/2.0/\"><schemaVersion>3</schemaVersion>\
                <payload><resource xmlns=\"http://datacite.org/schema/kernel-3\"><title>Z</title></resource></payload></oai_datacite>",
    }));
    fx
}

/// Each live record's expected header sets at `/oai`, by identifier.
fn bridge_sets(fx: &serde_json::Value) -> BTreeMap<String, Vec<String>> {
    fx["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r.get("raw").is_none() && r["deleted"] != true)
        .map(|r| {
            let mut sets = vec!["papers".to_string()];
            for s in r["sets"].as_array().unwrap() {
                sets.push(format!("papers:{}", s.as_str().unwrap()));
            }
            sets.sort();
            (r["id"].as_str().unwrap().to_string(), sets)
        })
        .collect()
}

async fn validate(c: &Collecting) -> serde_json::Value {
    let base = c.app.url("/oai");
    let schemas = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schemas");
    tokio::task::spawn_blocking(move || {
        py_json(&[
            tool("oai_validate.py").as_os_str(),
            base.as_ref(),
            schemas.join("OAI-PMH.xsd").as_os_str(),
            "--provenance".as_ref(),
            schemas.join("provenance.xsd").as_os_str(),
            "--sets".as_ref(),
        ])
    })
    .await
    .unwrap()
}

/// The faithful bridge, end to end: a repository (PyPI `oaipmh`) with three sets, deleted
/// records and datestamps in the day and compact forms, collected, then harvested from `/oai`
/// by pyoai and oaipmh-scythe: every record under the repository's own identifier, in the
/// repository's sets as `papers:spec` (named as the repository names them), its metadata the
/// repository's, with an XSD-valid provenance `<about>`; a record whose metadata root lies in
/// the OAI-PMH namespace is quarantined and every answer validates. Then 5 updates, 1 creation
/// and 1 deletion upstream reach each harvester coming back with `from` as exactly those 7.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collected_repository_keeps_its_identifiers_sets_and_provenance() {
    let n = 24;
    let mut fx = bridge_repository(n);
    let repo = OaiServer::start(&fx, 7);
    let (cfg, dir) = collect_config(&repo.base);
    let app = TestApp::start_with(cfg).await;
    let c = Collecting { repo, app };
    let v = c.wait_ended(None).await;
    // The second the collection ended in: a harvest `from` a later one must not list it.
    let collected = crate::collect::now_datestamp();
    no_error(&v);
    let live = bridge_sets(&fx);
    assert_eq!(v["last"]["created"], live.len(), "{v:#}");
    assert_eq!(v["last"]["quarantined"], 1, "{v:#}");
    let q = &v["quarantine"][0];
    assert_eq!(q["identifier"], "oai:zenodo.org:1", "{v:#}");
    assert!(
        q["reason"].as_str().unwrap().contains("OAI-PMH namespace"),
        "{v:#}"
    );
    let cmp = crate::collect::c14n_compare(&c, &fx);
    assert_eq!(
        cmp["equal"],
        live.len(),
        "the files are the repository's records: {cmp}"
    );

    // Both harvesters: the repository's identifiers, sets and metadata.
    let states: Vec<_> = ["pyoai", "scythe"]
        .iter()
        .map(|k| (k.to_string(), dir.path().join(format!("{k}.json"))))
        .collect();
    for (client, state) in &states {
        let h = harvest(&c, client, state, None).await;
        assert!(clean(&h) && h["equal"] == live.len(), "{client}: {h}");
        let sets: BTreeMap<String, Vec<String>> =
            serde_json::from_value(h["sets"].clone()).unwrap();
        assert_eq!(sets, live, "{client}: identifiers and set membership");
    }
    let v = validate(&c).await;
    assert_eq!(v["invalid"], serde_json::json!([]), "{v}");
    assert!(
        v["provenance"].as_u64().unwrap() > live.len() as u64,
        "every record has its provenance: {v}"
    );
    let in_set = |s: &str| live.values().filter(|v| v.iter().any(|x| x == s)).count();
    for spec in ["papers", "papers:s0", "papers:s1", "papers:s2"] {
        assert_eq!(v["set_records"][spec], in_set(spec), "{spec}: {v}");
    }
    let sets = c.app.get_text("/oai?verb=ListSets").await;
    assert!(
        sets.contains("<setSpec>papers:s2</setSpec><setName>Two &amp; more</setName>"),
        "{sets}"
    );
    // GetRecord by the repository's identifier; the provenance says where and when, the
    // compact datestamp given as the day it is.
    let rec = c
        .app
        .get_text("/oai?verb=GetRecord&metadataPrefix=oai_dc&identifier=oai:example.org:rec-0001")
        .await;
    for part in [
        "<identifier>oai:example.org:rec-0001</identifier>",
        "<setSpec>papers:s1</setSpec>",
        &format!("<baseURL>{}</baseURL>", c.repo.base),
        "<datestamp>2021-03-02</datestamp>",
        "<metadataNamespace>http://www.openarchives.org/OAI/2.0/oai_dc/</metadataNamespace>",
        "altered=\"false\"",
    ] {
        assert!(rec.contains(part), "{part} in {rec}");
    }

    // Upstream: 5 updates, 1 creation, 1 deletion.
    // `from` is inclusive, to the second: `since` is a second after the collection, and the
    // changes come a second after `since` (the harvests above may all fit in one second).
    let since = next_second(&collected).await;
    let now = next_second(&since).await;
    let recs = fx["records"].as_array_mut().unwrap();
    let mut changed = Vec::new();
    for k in [0, 1, 2, 3, 4] {
        recs[k]["dc"]["title"] = serde_json::json!([format!("Record {k}, second version")]);
        recs[k]["datestamp"] = now.clone().into();
        changed.push(recs[k]["id"].as_str().unwrap().to_string());
    }
    recs[6]["deleted"] = true.into();
    recs[6]["datestamp"] = now.clone().into();
    changed.push(recs[6]["id"].as_str().unwrap().to_string());
    recs.push(serde_json::json!({
        "id": "oai:example.org:new-1", "datestamp": now, "sets": ["s1"],
        "dc": {"title": ["A new record"]},
    }));
    changed.push("oai:example.org:new-1".into());
    changed.sort();
    rewrite(&c.repo, &fx);
    let v = c.run_now().await;
    no_error(&v);
    let live = bridge_sets(&fx);
    for (client, state) in &states {
        let h = harvest(&c, client, state, Some(&since)).await;
        let mut listed: Vec<String> = serde_json::from_value(h["listed"].clone()).unwrap();
        listed.sort();
        assert_eq!(listed, changed, "{client}: exactly the 7 changes: {h}");
        assert!(
            clean(&h) && h["equal"] == live.len() && h["deleted"] == 1,
            "{client}: {h}"
        );
    }
    // The deletion is heard in the sets the record was in.
    let gone = c
        .app
        .get_text(&format!(
            "/oai?verb=ListIdentifiers&metadataPrefix=oai_dc&set=papers:s0&from={since}"
        ))
        .await;
    assert!(
        gone.contains(
            "<header status=\"deleted\"><identifier>oai:example.org:rec-0006</identifier>"
        ),
        "{gone}"
    );
    assert_eq!(validate(&c).await["invalid"], serde_json::json!([]));
    c.app.stop().await;
}
