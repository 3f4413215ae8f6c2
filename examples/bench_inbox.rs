//! Benchmark: from a COAR Notify announcement's POST to a subscriber holding the change
//! notification of the record it names.
//!
//! ```text
//! cargo run --release --example bench_inbox -- [--records 1000] [--announcements 1000] [--rate 100]
//! ```
//!
//! A PyPI `oaipmh` repository (`tests/tools/oai_server.py`, `--records` records) is collected
//! once by the server (in this process, embedded store, its inbox on, the repository declared
//! as a sender); one subscriber holds the set's change notifications. Then the repository
//! changes `--announcements` records, and for each a DSpace-shaped `Offer` +
//! `coar-notify:IngestAction` naming it is posted to the inbox, `--rate` a second. A record's
//! latency runs from its offer's POST to the subscriber reading the notification of its
//! update. Prints p50/p99/max, the repository's `GetRecord` requests, and the server's CPU.
//! DSpace's own inbox drains its queue every 5 minutes; the issue's bound is p99 ≤ 2 s.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::routing::get;
use axum::Router;
use resourcesync_hub::config::{CollectConfig, Config, SenderConfig};

const ORIGIN: &str = "https://repository.example.edu";

#[derive(Default)]
struct Received {
    /// Record number -> when the notification of its update arrived.
    at: HashMap<usize, Instant>,
}

async fn verify(Query(q): Query<HashMap<String, String>>) -> String {
    q.get("hub.challenge").cloned().unwrap_or_default()
}

async fn receive(State(r): State<Arc<Mutex<Received>>>, body: Bytes) -> &'static str {
    let at = Instant::now();
    let text = String::from_utf8_lossy(&body);
    let mut r = r.lock().unwrap();
    for entry in text.split("<url>").skip(1) {
        if !entry.contains("change=\"updated\"") {
            continue;
        }
        if let Some(n) = entry
            .split("oai:bench:")
            .nth(1)
            .and_then(|s| s.split('.').next())
            .and_then(|n| n.parse().ok())
        {
            r.at.entry(n).or_insert(at);
        }
    }
    ""
}

fn fixture(n: usize, changed: usize, stamp: &str) -> serde_json::Value {
    let records: Vec<serde_json::Value> = (0..n)
        .map(|k| {
            let title = if k < changed {
                format!("Record {k}, revised")
            } else {
                format!("Record {k}")
            };
            let datestamp = if k < changed {
                stamp.to_string()
            } else {
                "2026-01-01T00:00:00Z".to_string()
            };
            serde_json::json!({"id": format!("oai:bench:{k}"), "datestamp": datestamp, "sets": [], "deleted": false, "dc": {"title": [title]}})
        })
        .collect();
    serde_json::json!({"granularity": "YYYY-MM-DDThh:mm:ssZ", "deletedRecord": "persistent", "sets": [], "records": records})
}

fn offer(k: usize) -> String {
    serde_json::json!({
        "@context": ["https://www.w3.org/ns/activitystreams", "https://coar-notify.net"],
        "id": format!("urn:uuid:00000000-0000-4000-8000-{k:012x}"),
        "type": ["Offer", "coar-notify:IngestAction"],
        "actor": {"id": ORIGIN, "type": "Service"},
        "origin": {"id": ORIGIN, "inbox": format!("{ORIGIN}/ldn/inbox"), "type": "Service"},
        "target": {"id": "https://aggregator.example.org", "inbox": "https://aggregator.example.org/inbox", "type": "Service"},
        "object": {"id": format!("oai:bench:{k}"), "ietf:cite-as": format!("https://hdl.handle.net/123/{k}"), "type": ["Page", "sorg:AboutPage"]}
    })
    .to_string()
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let records = common::arg("--records", 1000) as usize;
    let announcements = (common::arg("--announcements", 1000) as usize).min(records);
    let rate = common::arg("--rate", 100).max(1);
    // RUST_LOG=warn (for instance) shows the server's log on stderr.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }

    let tmp = tempfile::tempdir()?;
    let fixture_path = tmp.path().join("repo.json");
    std::fs::write(&fixture_path, fixture(records, 0, "").to_string())?;
    let mut repo = std::process::Command::new(common::py_tool("python"))
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/oai_server.py"))
        .arg(&fixture_path)
        .args(["--batch", "500"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let port = {
        use std::io::BufRead as _;
        let mut line = String::new();
        std::io::BufReader::new(repo.stdout.take().expect("piped")).read_line(&mut line)?;
        serde_json::from_str::<serde_json::Value>(&line)?["port"].clone()
    };
    let base = format!("http://127.0.0.1:{port}/oai");

    let mut config = Config::defaults();
    config.server.listen = "127.0.0.1:0".into();
    config.server.data_dir = tmp.path().join("data");
    config.hub.allow_networks = vec!["127.0.0.0/8".parse()?];
    config.admin.token = "bench-admin-token-0123456789".into();
    let mut cc = CollectConfig::new(&base);
    cc.interval_secs = 86_400;
    config.collect.insert("bench".into(), cc);
    config.inbox.enabled = true;
    config.inbox.per_sender_per_minute = (rate * 120) as u32;
    config.inbox.senders.insert(
        "repo".into(),
        SenderConfig {
            id: ORIGIN.into(),
            inbox: std::env::var("BENCH_SENDER_INBOX")
                .unwrap_or_else(|_| format!("{ORIGIN}/ldn/inbox")),
            collect: "bench".into(),
            networks: vec!["127.0.0.0/8".parse()?],
            token_env: String::new(),
        },
    );
    // The sender's inbox is not reachable from here: its answers fail fast and are given up.
    config.inbox.reply_attempts = 1;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    resourcesync_hub::app::resolve_base_url(&mut config, addr);
    let topic = config.change_topic("bench");
    let token = config.admin.token.expose().to_string();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(resourcesync_hub::app::run(config, listener, async move {
        let _ = stop_rx.await;
    }));
    let client = reqwest::Client::builder().no_proxy().build()?;
    common::wait_healthz(&client, addr).await;

    // The first run: every record collected.
    let t = Instant::now();
    loop {
        let v: serde_json::Value = client
            .get(format!("http://{addr}/admin/v1/collect/bench"))
            .bearer_auth(&token)
            .send()
            .await?
            .json()
            .await?;
        if v["last_ended"].is_string() && v["state"] != "running" {
            println!(
                "first run: {} records in {:.1} s",
                v["last"]["created"],
                t.elapsed().as_secs_f64()
            );
            break;
        }
        anyhow::ensure!(t.elapsed() < Duration::from_secs(600), "no run ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let received = Arc::new(Mutex::new(Received::default()));
    let app = Router::new()
        .route("/cb", get(verify).post(receive))
        .with_state(received.clone());
    let recv = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let callback = format!("http://{}/cb", recv.local_addr()?);
    tokio::spawn(async move { axum::serve(recv, app).await });
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
    tokio::time::sleep(Duration::from_secs(2)).await;

    let stamp = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let next = fixture_path.with_extension("new");
    std::fs::write(&next, fixture(records, announcements, &stamp).to_string())?;
    std::fs::rename(&next, &fixture_path)?;

    let cpu0 = common::proc_cpu_secs("self");
    let every = Duration::from_secs_f64(1.0 / rate as f64);
    let start = Instant::now();
    let mut posted: HashMap<usize, Instant> = HashMap::new();
    for k in 0..announcements {
        let due = start + every * k as u32;
        tokio::time::sleep_until(due.into()).await;
        let at = Instant::now();
        let r = client
            .post(format!("http://{addr}/inbox"))
            .header("content-type", "application/ld+json")
            .body(offer(k))
            .send()
            .await?;
        anyhow::ensure!(r.status() == 201, "offer {k} answered {}", r.status());
        posted.insert(k, at);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.lock().unwrap().at.len() < announcements {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {announcements} announced records notified",
            received.lock().unwrap().at.len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cpu = common::proc_cpu_secs("self") - cpu0;
    let at = received.lock().unwrap().at.clone();
    let mut lat: Vec<Duration> = posted
        .iter()
        .map(|(k, p)| at[k].saturating_duration_since(*p))
        .collect();
    lat.sort();
    let mut slowest: Vec<(Duration, usize, Duration)> = posted
        .iter()
        .map(|(k, p)| {
            (
                at[k].saturating_duration_since(*p),
                *k,
                p.duration_since(start),
            )
        })
        .collect();
    slowest.sort();
    for (l, k, offset) in slowest.iter().rev().take(5) {
        println!(
            "slow: record {k}, posted at +{:.2} s, notified after {:.0} ms",
            offset.as_secs_f64(),
            l.as_secs_f64() * 1e3
        );
    }
    let asked: serde_json::Value = client
        .get(format!("http://127.0.0.1:{port}/_requests"))
        .send()
        .await?
        .json()
        .await?;
    let get_records = asked
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|q| q["query"].as_str().is_some_and(|q| q.contains("GetRecord")))
                .count()
        })
        .unwrap_or(0);
    println!(
        "{announcements} offers at {rate}/s: POST -> subscriber p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; {get_records} GetRecord requests; CPU of this process (server, receiver, sender) {:.2} s, {:.0} µs an announcement",
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        pct(&lat, 1.0),
        cpu,
        cpu / announcements as f64 * 1e6
    );
    let _ = stop_tx.send(());
    let _ = server.await;
    drop(repo.stdin.take());
    let _ = repo.kill();
    Ok(())
}
