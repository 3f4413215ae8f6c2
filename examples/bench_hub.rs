//! Benchmark: fan-out of signed deliveries on loopback.
//!
//! ```text
//! cargo run --release --example bench_hub -- [--subscribers 100,500,1000] [--notifications 20]
//!     [--hung N] [--failing N] [--request-timeout-secs 10]
//! ```
//!
//! With `--hung N` / `--failing N`, each round runs twice: as above, then with N more callbacks
//! on the same topic that never answer (or answer 500), printing the healthy subscribers'
//! figures both times, and the process's peak RSS at the end.
//!
//! Runs the real server (embedded store in a temporary directory) and one receiver in this
//! process, subscribes N callbacks with secrets (so every delivery is HMAC-signed), then
//! publishes the notifications back to back as fat pings. Prints, per N: deliveries/s from
//! the first publish to the last receipt, and publish-to-receipt latency p50/p99/max (from
//! sending the publish request to the receiver reading the delivery).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::routing::get;
use axum::Router;
use resourcesync_hub::config::Config;
use resourcesync_hub::store::Store;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Receipts: (notification number, when).
type Receipts = Arc<Mutex<Vec<(usize, Instant)>>>;

async fn verify(Query(q): Query<std::collections::HashMap<String, String>>) -> String {
    q.get("hub.challenge").cloned().unwrap_or_default()
}

/// A callback that never answers (until the hub gives up on it).
async fn hang() -> &'static str {
    tokio::time::sleep(Duration::from_secs(3600)).await;
    ""
}

async fn fail() -> axum::http::StatusCode {
    axum::http::StatusCode::INTERNAL_SERVER_ERROR
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

async fn receive(State(r): State<Receipts>, body: Bytes) -> &'static str {
    let at = Instant::now();
    // Body: <n i="K" .../>
    let s = std::str::from_utf8(&body).unwrap_or("");
    let n = s
        .split('"')
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX);
    r.lock().unwrap().push((n, at));
    ""
}

async fn subscribe_all(
    client: &reqwest::Client,
    hub_url: &str,
    topic: &str,
    callbacks: &[String],
    offset: usize,
) -> anyhow::Result<()> {
    for (i, cb) in callbacks.iter().enumerate() {
        let r = client
            .post(hub_url)
            .form(&[
                ("hub.mode", "subscribe"),
                ("hub.topic", topic),
                ("hub.callback", cb.as_str()),
                ("hub.secret", &format!("secret-{}", offset + i)),
            ])
            .send()
            .await?;
        anyhow::ensure!(r.status() == 202, "subscribe answered {}", r.status());
    }
    Ok(())
}

async fn wait_subscribers(
    store: &Store,
    t: &resourcesync_hub::model::websub::Topic,
    n: usize,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while store.hub_topic(t).await?.map_or(0, |i| i.subscribers) as usize != n {
        anyhow::ensure!(
            Instant::now() < deadline,
            "subscriptions not verified in time"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

async fn publish(
    client: &reqwest::Client,
    hub_url: &str,
    topic: &str,
    k: usize,
) -> anyhow::Result<()> {
    let r = client
        .post(hub_url)
        .header("content-type", "application/xml")
        .header("authorization", "Bearer bench")
        .header("link", format!("<{topic}>; rel=\"self\""))
        .body(format!(
            "<n i=\"{k}\" xmlns=\"http://www.sitemaps.org/schemas/sitemap/0.9\">{}</n>",
            "<url><loc>http://example.org/res</loc></url>".repeat(30)
        ))
        .send()
        .await?;
    anyhow::ensure!(r.status() == 200, "publish answered {}", r.status());
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rounds: Vec<usize> = arg("--subscribers")
        .unwrap_or_else(|| "100,500,1000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("--subscribers N[,N...]"))
        .collect();
    let notifications: usize =
        arg("--notifications").map_or(20, |s| s.parse().expect("--notifications N"));

    let tmp = std::env::temp_dir().join(format!("rshub-bench-hub-{}", std::process::id()));
    let mut config = Config::defaults();
    config.server.listen = "127.0.0.1:0".into();
    config.server.data_dir = tmp.clone();
    config.hub.allow_networks = vec!["127.0.0.0/8".parse().unwrap()];
    config.hub.publisher_token = "bench".into();
    config.hub.requests_per_callback_per_minute = 1000;
    config.hub.requests_per_host_per_minute = 1_000_000;
    config.hub.request_timeout_secs =
        arg("--request-timeout-secs").map_or(10, |s| s.parse().expect("--request-timeout-secs N"));
    let hung: usize = arg("--hung").map_or(0, |s| s.parse().expect("--hung N"));
    let failing: usize = arg("--failing").map_or(0, |s| s.parse().expect("--failing N"));
    let db = config.database_path();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let hub_addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(resourcesync_hub::app::run(config, listener, async move {
        let _ = stop_rx.await;
    }));

    let receipts: Receipts = Arc::new(Mutex::new(Vec::new()));
    let recv_app = Router::new()
        .route("/cb/{id}", get(verify).post(receive))
        .route("/hang/{id}", get(verify).post(hang))
        .route("/fail/{id}", get(verify).post(fail))
        .with_state(receipts.clone());
    let recv_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let recv_addr = recv_listener.local_addr()?;
    tokio::spawn(async move { axum::serve(recv_listener, recv_app).await });

    let client = reqwest::Client::builder().no_proxy().build()?;
    let hub_url = format!("http://{hub_addr}/hub");
    for _ in 0..100 {
        if client
            .get(format!("http://{hub_addr}/healthz"))
            .send()
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let store = Store::open_embedded(&db)?;
    println!(
        "signed fan-out on loopback, {notifications} notifications per round, sha256 signatures"
    );
    println!(
        "{:>11} {:>11} {:>13} {:>9} {:>9} {:>9} {:>14}",
        "subscribers", "deliveries", "deliveries/s", "p50 ms", "p99 ms", "max ms", "publishing ms"
    );
    let mut base = 0usize;
    let variants: Vec<(usize, usize)> = if hung + failing > 0 {
        vec![(0, 0), (hung, failing)]
    } else {
        vec![(0, 0)]
    };
    for n in rounds {
        for (round, &(extra_hung, extra_failing)) in variants.iter().enumerate() {
            let topic = format!("http://{hub_addr}/topics/bench-{n}-{round}");
            let mut callbacks: Vec<String> = (0..n)
                .map(|i| format!("http://{recv_addr}/cb/{}", base + i))
                .collect();
            callbacks
                .extend((0..extra_hung).map(|i| format!("http://{recv_addr}/hang/{}", base + i)));
            callbacks.extend(
                (0..extra_failing).map(|i| format!("http://{recv_addr}/fail/{}", base + i)),
            );
            // The healthy subscribers first, established by one delivery (as they would be
            // when someone starts registering bad callbacks), then the bad ones.
            let (healthy, bad) = callbacks.split_at(n);
            subscribe_all(&client, &hub_url, &topic, healthy, 0).await?;
            let t = resourcesync_hub::model::websub::Topic::parse(&topic)
                .map_err(anyhow::Error::msg)?;
            wait_subscribers(&store, &t, n).await?;
            receipts.lock().unwrap().clear();
            publish(&client, &hub_url, &topic, usize::MAX - 1).await?;
            let deadline = Instant::now() + Duration::from_secs(60);
            while receipts.lock().unwrap().len() < n && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            subscribe_all(&client, &hub_url, &topic, bad, n).await?;
            wait_subscribers(&store, &t, callbacks.len()).await?;
            base += callbacks.len();
            if extra_hung + extra_failing > 0 {
                println!(
                    "  with {extra_hung} hung and {extra_failing} failing callbacks beside them:"
                );
            }
            receipts.lock().unwrap().clear();
            let mut sent = Vec::with_capacity(notifications);
            let start = Instant::now();
            for k in 0..notifications {
                sent.push(Instant::now());
                let payload = format!(
                    "<n i=\"{k}\" xmlns=\"http://www.sitemaps.org/schemas/sitemap/0.9\">{}</n>",
                    "<url><loc>http://example.org/res</loc></url>".repeat(30)
                );
                let r = client
                    .post(&hub_url)
                    .header("content-type", "application/xml")
                    .header("authorization", "Bearer bench")
                    .header("link", format!("<{topic}>; rel=\"self\""))
                    .body(payload)
                    .send()
                    .await?;
                anyhow::ensure!(r.status() == 200, "publish answered {}", r.status());
            }
            let published = start.elapsed();
            let want = n * notifications;
            let deadline = Instant::now() + Duration::from_secs(120);
            while receipts.lock().unwrap().len() < want {
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "only {} of {want} deliveries arrived",
                    receipts.lock().unwrap().len()
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let got = receipts.lock().unwrap().clone();
            let last = got.iter().map(|(_, at)| *at).max().unwrap_or(start);
            let mut lat: Vec<Duration> = got
                .iter()
                .map(|(k, at)| at.duration_since(sent[*k]))
                .collect();
            lat.sort();
            let secs = last.duration_since(start).as_secs_f64();
            println!(
                "{:>11} {:>11} {:>13.0} {:>9.1} {:>9.1} {:>9.1} {:>14.1}",
                n,
                want,
                want as f64 / secs,
                percentile(&lat, 0.50).as_secs_f64() * 1e3,
                percentile(&lat, 0.99).as_secs_f64() * 1e3,
                lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
                published.as_secs_f64() * 1e3
            );
        }
    }
    println!(
        "peak RSS of the process (hub and receivers): {:.0} MB",
        peak_rss_mb()
    );
    let _ = stop_tx.send(());
    let _ = server.await;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}
