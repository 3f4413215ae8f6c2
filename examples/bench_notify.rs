//! Benchmark: latency from ingest commit to a change notification's receipt at a subscriber,
//! on the embedded store.
//!
//! ```text
//! cargo run --release --example bench_notify -- [--changes 500] [--interval-ms 10] [--batch 1]
//! ```
//!
//! Runs the server (temporary data directory) and one subscriber in this process, subscribes
//! to a set's change-notification topic, then ingests `--changes` changes in batches of
//! `--batch`, one batch every `--interval-ms`. A change's latency runs from the moment its
//! ingest request was answered (committed) to the moment the subscriber read the notification
//! that carries it. Prints p50/p99/max and the number of notifications.
//!
//! With `--elasticsearch URL` the server runs on the Elasticsearch backend and the changes are
//! written straight into the indices by an external writer (DIT-ES protocol, plain `_bulk`):
//! a change's latency runs from the writer's bulk request being answered to receipt, and
//! includes adoption and the poll interval (`--poll-ms`, default the configured 1000).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::routing::get;
use axum::Router;
use resourcesync_hub::config::{Config, SetOverrides};
use resourcesync_hub::model::websub::{Callback, Topic};
use resourcesync_hub::store::Store;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Per change number, when its notification arrived; and how many notifications.
#[derive(Default)]
struct Received {
    at: HashMap<usize, Instant>,
    notifications: usize,
}

async fn verify(Query(q): Query<HashMap<String, String>>) -> String {
    q.get("hub.challenge").cloned().unwrap_or_default()
}

async fn receive(State(r): State<Arc<Mutex<Received>>>, body: Bytes) -> &'static str {
    let at = Instant::now();
    let text = String::from_utf8_lossy(&body);
    let mut r = r.lock().unwrap();
    r.notifications += 1;
    for part in text.split("<loc>http://example.org/r/").skip(1) {
        if let Some(n) = part.split('<').next().and_then(|n| n.parse().ok()) {
            r.at.entry(n).or_insert(at);
        }
    }
    ""
}

/// A DIT-ES writer's `_bulk` body: a resource document and a change document per resource.
fn dit_bulk(range: std::ops::Range<usize>) -> String {
    let mut out = String::new();
    for i in range {
        let now = resourcesync_hub::model::Timestamp::now().to_string();
        let loc = serde_json::json!({"type": "url", "value": format!("http://example.org/r/{i}")});
        let res = serde_json::json!({"resource_set": "bench", "location": loc, "length": i, "timestamp": now, "lastmod": now});
        let chg = serde_json::json!({"resource_set": "bench", "location": loc, "length": i, "change": "created", "datetime": now, "timestamp": now, "lastmod": now});
        out.push_str(&format!("{{\"index\":{{\"_index\":\"omtd-resourcesync-resource\",\"_id\":\"bench-{i}\"}}}}\n{res}\n"));
        out.push_str(&format!(
            "{{\"index\":{{\"_index\":\"omtd-resourcesync-change\"}}}}\n{chg}\n"
        ));
    }
    out
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let changes: usize = arg("--changes").map_or(500, |s| s.parse().expect("--changes N"));
    let interval = Duration::from_millis(
        arg("--interval-ms").map_or(10, |s| s.parse().expect("--interval-ms N")),
    );
    let batch: usize = arg("--batch").map_or(1, |s| s.parse().expect("--batch N"));
    let es = arg("--elasticsearch");

    let tmp = std::env::temp_dir().join(format!("rshub-bench-notify-{}", std::process::id()));
    let mut config = Config::defaults();
    config.server.listen = "127.0.0.1:0".into();
    config.server.data_dir = tmp.clone();
    config.hub.allow_networks = vec!["127.0.0.0/8".parse().unwrap()];
    config.sets.insert("bench".into(), SetOverrides::default());
    if let Some(url) = &es {
        config.store.backend = resourcesync_hub::config::Backend::Elasticsearch;
        config.store.elasticsearch.url = url.clone();
    }
    if let Some(ms) = arg("--poll-ms") {
        config.notify.poll_interval_ms = ms.parse().expect("--poll-ms N");
    }
    let poll_ms = config.notify.poll_interval_ms;
    let store_config = config.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    resourcesync_hub::app::resolve_base_url(&mut config, addr);
    let topic = config.change_topic("bench");
    let (max_delay, hold) = (config.notify.max_delay_ms, config.notify.hold_back_secs);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(resourcesync_hub::app::run(config, listener, async move {
        let _ = stop_rx.await;
    }));

    let received = Arc::new(Mutex::new(Received::default()));
    let app = Router::new()
        .route("/cb", get(verify).post(receive))
        .with_state(received.clone());
    let recv = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let callback = format!("http://{}/cb", recv.local_addr()?);
    tokio::spawn(async move { axum::serve(recv, app).await });

    let client = reqwest::Client::builder().no_proxy().build()?;
    common::wait_healthz(&client, addr).await;
    let r = client
        .post(format!("http://{addr}/hub"))
        .form(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", topic.as_str()),
            ("hub.callback", callback.as_str()),
        ])
        .send()
        .await?;
    anyhow::ensure!(r.status() == 202, "subscribe answered {}", r.status());
    let store: Store = resourcesync_hub::app::open_store(&store_config).await?;
    let (t, cb) = (
        Topic::parse(&topic).map_err(anyhow::Error::msg)?,
        Callback::parse(&callback).map_err(anyhow::Error::msg)?,
    );
    while store.hub_subscription(&t, &cb).await?.is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let mut committed: HashMap<usize, Instant> = HashMap::new();
    let mut n = 0;
    while n < changes {
        let lines: Vec<String> = (n..(n + batch).min(changes))
            .map(|i| format!(r#"{{"change":"created","location":{{"type":"url","value":"http://example.org/r/{i}"}},"length":{i}}}"#))
            .collect();
        let r = match &es {
            None => {
                client
                    .post(format!("http://{addr}/api/v1/resource-sets/bench/changes"))
                    .header("content-type", "application/x-ndjson")
                    .body(lines.join("\n"))
                    .send()
                    .await?
            }
            Some(url) => {
                client
                    .post(format!("{url}/_bulk"))
                    .header("content-type", "application/x-ndjson")
                    .body(dit_bulk(n..(n + batch).min(changes)))
                    .send()
                    .await?
            }
        };
        anyhow::ensure!(r.status() == 200, "ingest answered {}", r.status());
        let at = Instant::now();
        for i in n..(n + batch).min(changes) {
            committed.insert(i, at);
        }
        n += batch;
        tokio::time::sleep(interval).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.lock().unwrap().at.len() < changes {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {changes} changes notified",
            received.lock().unwrap().at.len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (at, notifications) = {
        let r = received.lock().unwrap();
        (r.at.clone(), r.notifications)
    };
    let mut lat: Vec<Duration> = committed
        .iter()
        .map(|(i, c)| at[i].saturating_duration_since(*c))
        .collect();
    lat.sort();
    let backend = if es.is_some() {
        format!("elasticsearch (external writer, poll_interval_ms = {poll_ms})")
    } else {
        "embedded store".into()
    };
    println!(
        "{backend}: {changes} changes in batches of {batch} every {} ms; notify.max_delay_ms = {max_delay}, hold_back_secs = {hold}",
        interval.as_millis()
    );
    println!(
        "ingest commit -> receipt: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {} notifications",
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        lat.last().unwrap().as_secs_f64() * 1e3,
        notifications
    );
    let _ = stop_tx.send(());
    let _ = server.await;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}
