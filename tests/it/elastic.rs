//! The Elasticsearch backend against osmem-server: index creation, mapping checks, and a
//! clear error when the server cannot be reached. (The store contract on it is next.)

use resourcesync_hub::config::Config;
use resourcesync_hub::store::elastic::{self, mapping, Distribution};
use serde_json::json;

use crate::support::Osmem;

fn cfg(url: &str) -> resourcesync_hub::config::ElasticConfig {
    let mut c = Config::defaults().store.elasticsearch;
    c.url = url.into();
    c
}

async fn put(url: &str, path: &str, body: serde_json::Value) -> u16 {
    reqwest::Client::builder().no_proxy().build().unwrap().put(format!("{url}{path}")).json(&body).send().await.unwrap().status().as_u16()
}

async fn get(url: &str, path: &str) -> serde_json::Value {
    reqwest::Client::builder().no_proxy().build().unwrap().get(format!("{url}{path}")).send().await.unwrap().json().await.unwrap()
}

#[tokio::test]
async fn indices_are_created_with_the_translated_mappings_and_checked_on_the_next_start() {
    let url = Osmem::clone_url().await;
    let es = elastic::open(&cfg(&url)).await.unwrap();
    assert_eq!(es.distribution, Distribution::OpenSearch, "osmem reports OpenSearch: PIT via /_search/point_in_time");
    let m = get(&url, "/omtd-resourcesync-resource/_mapping").await;
    let props = &m["omtd-resourcesync-resource"]["mappings"]["properties"];
    assert_eq!(props["location"]["type"], "nested");
    assert_eq!(props["md5"]["type"], "keyword");
    assert_eq!(props["ln"]["properties"]["href"]["type"], "nested");
    assert_eq!(props["lastmod"]["format"], mapping::DATE_FORMAT);
    let m = get(&url, "/omtd-resourcesync-change/_mapping").await;
    assert_eq!(m["omtd-resourcesync-change"]["mappings"]["properties"]["datetime"]["type"], "date");
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
    assert_eq!(put(&url, "/omtd-resourcesync-resource", json!({"mappings": dit})).await, 200);
    elastic::open(&cfg(&url)).await.unwrap();
    let m = get(&url, "/omtd-resourcesync-resource/_mapping").await;
    assert_eq!(m["omtd-resourcesync-resource"]["mappings"]["properties"]["part"]["type"], "integer");

    let url = Osmem::clone_url().await;
    let mut bad = mapping::change_mapping();
    bad["properties"]["change"] = json!({"type": "text"});
    assert_eq!(put(&url, "/omtd-resourcesync-change", json!({"mappings": bad})).await, 200);
    let e = elastic::open(&cfg(&url)).await.err().expect("refused").to_string();
    assert!(e.contains("index omtd-resourcesync-change: field change is mapped as text, but the server needs keyword"), "{e}");
}

#[tokio::test]
async fn an_unreachable_server_is_a_clear_error() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let e = elastic::open(&cfg(&url)).await.err().expect("unreachable").to_string();
    assert!(e.starts_with("store unavailable") && e.contains(&url), "{e}");
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
        let page = es.scan(&pit, &query, &sort, after.as_ref(), 7).await.unwrap();
        seen.extend(page.hits.iter().map(|h| h["_source"]["seq"].as_i64().unwrap()));
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
    let url = Osmem::clone_url().await;
    let (a, b) = (ElasticStore::open(&cfg(&url)).await.unwrap(), ElasticStore::open(&cfg(&url)).await.unwrap());
    let set = SetName::parse("papers").unwrap();
    let now = Timestamp::now();
    let (ra, rb) = tokio::join!(a.ensure_set(&set, now), b.ensure_set(&set, now));
    assert_eq!([ra.unwrap(), rb.unwrap()].iter().filter(|c| **c).count(), 1, "exactly one creates it");
    assert!(!a.ensure_set(&set, now).await.unwrap());
    a.ensure_set(&SetName::parse("data").unwrap(), now).await.unwrap();
    let names: Vec<String> = b.sets().await.unwrap().into_iter().map(|s| s.name.to_string()).collect();
    assert_eq!(names, ["data", "papers"]);
    assert_eq!(b.sets().await.unwrap()[1].created_at, now);
}

#[tokio::test]
async fn a_conditional_replace_loses_to_a_writer_that_came_first() {
    let url = Osmem::clone_url().await;
    let es = elastic::open(&cfg(&url)).await.unwrap();
    let idx = "omtd-resourcesync-meta";
    assert!(es.put_doc_if(idx, "counter", &json!({"kind": "counter", "state": {"n": 1}}), None).await.unwrap());
    assert!(!es.put_doc_if(idx, "counter", &json!({"kind": "counter"}), None).await.unwrap(), "create twice: 409");
    let v1 = es.get_doc(idx, "counter").await.unwrap().unwrap();
    assert!(es.put_doc_if(idx, "counter", &json!({"kind": "counter", "state": {"n": 2}}), Some(&v1)).await.unwrap());
    assert!(!es.put_doc_if(idx, "counter", &json!({"kind": "counter", "state": {"n": 3}}), Some(&v1)).await.unwrap(), "stale version");
    assert_eq!(es.get_doc(idx, "counter").await.unwrap().unwrap().source["state"]["n"], 2);
    assert!(es.get_doc(idx, "missing/with space").await.unwrap().is_none());
}
