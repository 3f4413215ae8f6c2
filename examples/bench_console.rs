//! Benchmark: the console's pages with many subscriptions.
//!
//! ```text
//! cargo run --release --example bench_console -- [--subscriptions 10000] [--requests 200]
//! ```
//!
//! Runs the real server (embedded store in a temporary directory) with N verified
//! subscriptions recorded in its store (a tenth of them on a second topic), signs in to the
//! console, and times, one request at a time on loopback, the subscriptions list's first page
//! (failing first, then 50 in id order), the list filtered by topic, a subscription's page and
//! the overview; beside them, the admin API's first page of 50 (`GET /admin/v1/subscriptions`),
//! the JSON the same calls make. Prints p50/p99/max per page.

mod common;

use std::time::Instant;

use resourcesync_hub::model::websub::{
    Callback, Intent, IntentMode, Resolution, SignatureAlg, Topic,
};
use resourcesync_hub::model::Timestamp;

const TOKEN: &str = "bench-console-token";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n = common::arg("--subscriptions", 10_000) as usize;
    let requests = common::arg("--requests", 200) as usize;
    let dir = tempfile::tempdir()?;
    let mut c = resourcesync_hub::config::Config::defaults();
    c.server.data_dir = dir.path().join("data");
    c.admin.token = TOKEN.into();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    resourcesync_hub::app::resolve_base_url(&mut c, addr);
    let base = format!("http://{addr}");
    {
        let store = resourcesync_hub::app::open_store(&c).await?;
        let started = Instant::now();
        for i in 0..n {
            let topic = if i % 10 == 0 { "other" } else { "papers" };
            let intent = Intent {
                id: 0,
                mode: IntentMode::Subscribe,
                topic: Topic::parse(&format!("{base}/topics/{topic}"))
                    .map_err(anyhow::Error::msg)?,
                callback: Callback::parse(&format!(
                    "http://receiver-{}.example.org/cb/{i}",
                    i % 97
                ))
                .map_err(anyhow::Error::msg)?,
                lease_secs: 86_400,
                secret: None,
                alg: SignatureAlg::Sha256,
                reason: None,
                requested_at: Timestamp::now(),
                verify_token: None,
            };
            let mut i = intent.clone();
            i.id = store.hub_add_intent(intent).await?;
            store
                .hub_resolve(
                    i,
                    Resolution::Subscribed {
                        verified_at: Timestamp::now(),
                        keep_old_secret_until: Timestamp::now(),
                    },
                )
                .await?;
        }
        println!(
            "{n} subscriptions recorded in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(resourcesync_hub::app::run(c, listener, async move {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let login = loop {
        match client
            .post(format!("{base}/console/login"))
            .form(&[("token", TOKEN)])
            .send()
            .await
        {
            Ok(r) => break r,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    };
    let cookie = login.headers()["set-cookie"]
        .to_str()?
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    let topic = url::form_urlencoded::byte_serialize(format!("{base}/topics/other").as_bytes())
        .collect::<String>();
    let pages = [
        (
            "console: subscriptions, first page".to_string(),
            "/console/subscriptions".to_string(),
            true,
        ),
        (
            "console: subscriptions of one topic".into(),
            format!("/console/subscriptions?topic={topic}"),
            true,
        ),
        (
            "console: a subscription".into(),
            format!("/console/subscriptions/{}", n / 2),
            true,
        ),
        ("console: overview".into(), "/console/".into(), true),
        (
            "admin API: subscriptions, limit 50".into(),
            "/admin/v1/subscriptions?limit=50".into(),
            false,
        ),
    ];
    println!("{requests} requests each, one at a time (ms):");
    println!("{:<40} {:>8} {:>8} {:>8}", "page", "p50", "p99", "max");
    for (name, path, console) in pages {
        let mut took = Vec::with_capacity(requests);
        for _ in 0..requests {
            let rb = client.get(format!("{base}{path}"));
            let rb = if console {
                rb.header("cookie", &cookie)
            } else {
                rb.bearer_auth(TOKEN)
            };
            let t = Instant::now();
            let r = rb.send().await?;
            let status = r.status();
            let body = r.bytes().await?;
            took.push(t.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(
                status == 200,
                "{path}: {status} {}",
                String::from_utf8_lossy(&body)
            );
        }
        took.sort_by(f64::total_cmp);
        println!(
            "{name:<40} {:>8.1} {:>8.1} {:>8.1}",
            common::percentile(&took, 0.5),
            common::percentile(&took, 0.99),
            took.last().copied().unwrap_or(f64::NAN)
        );
    }
    let _ = stop.send(());
    server.await??;
    Ok(())
}
