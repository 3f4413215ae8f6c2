//! IIIF Change Discovery 1.0: a consumer that knows only activity streams keeps a copy of a
//! set by walking its collection from `last` back through `prev`, as the specification's
//! processing algorithm says, and ends with what the set's Resource List lists.

use std::collections::BTreeSet;

use reqwest::header;
use resourcesync_hub::model::Timestamp;
use serde_json::Value;

use crate::support::*;

/// The consumer: what it holds, the newest activity it processed, and how many pages it read.
#[derive(Default)]
struct Consumer {
    present: BTreeSet<String>,
    newest: Option<Timestamp>,
    pages_read: usize,
}

async fn get_json(app: &TestApp, url: &str) -> Value {
    let path = app.path_of(url);
    let r = app.client.get(app.url(&path)).send().await.unwrap();
    assert_eq!(r.status(), 200, "GET {path}");
    let ct = r.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        ct.starts_with("application/ld+json"),
        "{path} is served as {ct}"
    );
    let text = r.text().await.unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}\n{text}"))
}

const CONTEXT: &str = "http://iiif.io/api/discovery/1/context.json";

impl Consumer {
    /// One crawl: from the last page backwards, newest activity first, each object decided by
    /// its newest activity, stopping at activities older than the previous crawl's newest.
    async fn crawl(&mut self, app: &TestApp) {
        let collection = app.url_of_set("activity.json");
        let c = get_json(app, &collection).await;
        assert_eq!(c["@context"], CONTEXT);
        assert_eq!(c["type"], "OrderedCollection");
        assert_eq!(c["id"], collection);
        let mut url = c["last"]["id"].as_str().expect("a last page").to_string();
        assert_eq!(c["last"]["type"], "OrderedCollectionPage");
        let since = self.newest;
        let mut processed = BTreeSet::new();
        'pages: loop {
            let page = get_json(app, &url).await;
            self.pages_read += 1;
            assert_eq!(page["@context"], CONTEXT);
            assert_eq!(page["type"], "OrderedCollectionPage");
            assert_eq!(page["id"], url);
            assert_eq!(page["partOf"]["id"], collection);
            let items = page["orderedItems"].as_array().unwrap();
            assert!(!items.is_empty(), "{url}: a page has at least one activity");
            let times: Vec<Timestamp> = items
                .iter()
                .map(|a| Timestamp::parse(a["endTime"].as_str().unwrap()).unwrap())
                .collect();
            assert!(
                times.windows(2).all(|w| w[0] <= w[1]),
                "{url}: activities oldest first"
            );
            for (a, t) in items.iter().zip(&times).rev() {
                self.newest = self.newest.max(Some(*t));
                if since.is_some_and(|s| *t < s) {
                    break 'pages;
                }
                assert_eq!(a["object"]["type"], "Document");
                let id = a["object"]["id"].as_str().unwrap().to_string();
                if !processed.insert(id.clone()) {
                    continue;
                }
                match a["type"].as_str().unwrap() {
                    "Create" | "Update" => self.present.insert(id),
                    "Delete" => self.present.remove(&id),
                    other => panic!("{url}: unexpected activity type {other}"),
                };
            }
            match page.get("prev") {
                Some(p) => url = p["id"].as_str().unwrap().to_string(),
                None => break,
            }
        }
    }
}

impl TestApp {
    fn url_of_set(&self, doc: &str) -> String {
        format!("{}/sets/papers/{doc}", self.config.base_url())
    }
}

/// The locations the set's Resource List lists (an index's parts included).
async fn resource_list(app: &TestApp) -> BTreeSet<String> {
    let (_, doc) = app.get_doc("/sets/papers/resourcelist.xml").await;
    let mut out = BTreeSet::new();
    if doc.is_index {
        for part in &doc.entries {
            let (_, d) = app.get_doc(&app.path_of(&part.loc)).await;
            out.extend(d.entries.into_iter().map(|e| e.loc));
        }
    } else {
        out.extend(doc.entries.into_iter().map(|e| e.loc));
    }
    out
}

fn lines(change: &str, range: std::ops::Range<usize>) -> String {
    range
        .map(|i| {
            let body = format!("paper {i} {change}\n");
            change_line(
                change,
                &format!("p{i}.txt"),
                &md5_hex(body.as_bytes()),
                body.len() as u64,
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn a_consumer_walking_last_to_prev_ends_with_the_resource_list() {
    let (mut c, dir) = test_config();
    let root = dir.path().join("files");
    std::fs::create_dir_all(&root).unwrap();
    // Change Lists (and so pages) of 25 activities.
    add_file_set(&mut c, "papers", &root, Some(25));
    let app = TestApp::start_with(c).await;
    let empty = get_json(&app, &app.url_of_set("activity.json")).await;
    assert_eq!(empty["totalItems"], 0);
    assert!(empty.get("last").is_none(), "no page before any change");

    for batch in 0..3 {
        app.ingest_ok("papers", &lines("created", batch * 20..batch * 20 + 20))
            .await;
    }
    let mut consumer = Consumer::default();
    consumer.crawl(&app).await;
    assert_eq!(consumer.pages_read, 3, "60 activities in pages of 25");
    assert_eq!(consumer.present, resource_list(&app).await);
    assert_eq!(consumer.present.len(), 60);

    // A full page is final: validators, and a 304 for a consumer that has it.
    let first = app.url("/sets/papers/activity/1.json");
    let r = app.client.get(&first).send().await.unwrap();
    let etag = r.headers()[header::ETAG].clone();
    let before = r.text().await.unwrap();

    app.ingest_ok("papers", &lines("updated", 5..15)).await;
    app.ingest_ok("papers", &lines("deleted", 40..48)).await;
    app.ingest_ok("papers", &lines("created", 60..75)).await;
    app.ingest_ok("papers", &lines("created", 40..42)).await;
    consumer.pages_read = 0;
    consumer.crawl(&app).await;
    assert_eq!(
        consumer.present,
        resource_list(&app).await,
        "after updates, deletes and creates"
    );
    assert_eq!(consumer.present.len(), 60 - 8 + 15 + 2);
    assert!(
        consumer.pages_read <= 2,
        "the second crawl stops where the first ended, read {} pages",
        consumer.pages_read
    );

    let r = app
        .client
        .get(&first)
        .header(header::IF_NONE_MATCH, etag.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 304, "a full page does not change");
    let r = app.client.get(&first).send().await.unwrap();
    assert_eq!(r.headers()[header::ETAG], etag);
    assert_eq!(r.text().await.unwrap(), before);

    // The pages tile the collection: startIndex and totalItems agree.
    let c = get_json(&app, &app.url_of_set("activity.json")).await;
    let total = 60 + 10 + 8 + 15 + 2;
    assert_eq!(c["totalItems"], total);
    let mut url = c["first"]["id"].as_str().unwrap().to_string();
    let mut seen = 0u64;
    loop {
        let p = get_json(&app, &url).await;
        assert_eq!(p["startIndex"], seen, "{url}");
        seen += p["orderedItems"].as_array().unwrap().len() as u64;
        match p.get("next") {
            Some(n) => url = n["id"].as_str().unwrap().to_string(),
            None => break,
        }
    }
    assert_eq!(seen, total);
    assert_eq!(url, c["last"]["id"].as_str().unwrap());

    // Where a consumer finds it, and what a wrong page is.
    let (_, cl) = app.get_doc("/sets/papers/capabilitylist.xml").await;
    assert!(
        cl.links
            .iter()
            .any(|(rel, href)| rel == "alternate" && *href == app.url_of_set("activity.json")),
        "the Capability List links the activity stream: {:?}",
        cl.links
    );
    for (path, why) in [
        ("/sets/papers/activity/99.json", "no activity page 99"),
        ("/sets/papers/activity/x.json", "not a page name"),
        ("/sets/nope/activity.json", "no resource set"),
    ] {
        let r = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
        let body = r.text().await.unwrap();
        assert!(body.contains(why), "{path}: {body}");
    }
    app.stop().await;
}
