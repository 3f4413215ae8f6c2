//! Benchmark: fan-out of signed deliveries on loopback.
//!
//! ```text
//! cargo run --release --example bench_hub -- [--subscribers 100,500,1000] [--notifications 20]
//!     [--hung N] [--failing N] [--limited PER_SEC] [--request-timeout-secs 10]
//! cargo run --release --example bench_hub -- --compare-signatures PAIRS
//!     [--subscribers 100] [--notifications 300] [--control] [--count-allocations]
//! ```
//!
//! With `--compare-signatures PAIRS`, what the signatures cost in one run: two hubs in this
//! process (both signatures; `hub.standard_webhooks = false`) and unsigned subscribers, rounds
//! of each in turn, paired ratios of deliveries/s and of the process's CPU a delivery with a
//! bootstrap interval of their medians (see `compare_signatures`); `--control` makes the second
//! hub sign both ways as well, to see what the comparison finds where there is nothing;
//! `--count-allocations` adds each one's allocations a delivery (see [`Counting`]).
//!
//! With `--hung N` / `--failing N`, each round runs twice: as above, then with N more callbacks
//! on the same topic that never answer (or answer 500), printing the healthy subscribers'
//! figures both times, and the process's peak RSS at the end. With `--limited PER_SEC`, the
//! second run has one more subscriber whose deliveries are limited to that many a second
//! (`PATCH /admin/v1/subscriptions/{id}`), to see whether its neighbours slow down.
//!
//! With `--elasticsearch URL [--processes 1,2,3] [--subscribers 60] [--notifications 200]
//! [--lease-secs 10]`, delivery is shared: for each count N, N server processes (this program
//! run again as a child) on one fresh index of that store (osmem-server or Elasticsearch),
//! subscribers spread through all of them and fat pings published through all of them.
//! Prints deliveries/s, latency and the share each process delivered; with N >= 2 it then
//! SIGKILLs one halfway through a second batch and prints how long until its partitions
//! deliver again and the repeats per subscriber.
//!
//! Otherwise it runs the real server (embedded store in a temporary directory) and one
//! receiver in this process, subscribes N callbacks with secrets (so every delivery is HMAC-signed), then
//! publishes the notifications back to back as fat pings. Prints, per N: deliveries/s from
//! the first publish to the last receipt, and publish-to-receipt latency p50/p99/max (from
//! sending the publish request to the receiver reading the delivery).

mod common;

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

/// With `--count-allocations`, counts the process's allocations: how many, their bytes, and
/// how many are over 1,032 bytes (past glibc's per-thread cache, so they take an arena's lock).
/// Figures per delivery that the machine's noise does not move; the counting itself (shared
/// counters on every allocation) slows the run, so its times are not for comparing with others.
struct Counting;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
static COUNT: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static ALLOCATED: AtomicU64 = AtomicU64::new(0);
static LARGE: AtomicU64 = AtomicU64::new(0);

fn count(size: usize) {
    if COUNT.load(Relaxed) {
        ALLOCATIONS.fetch_add(1, Relaxed);
        ALLOCATED.fetch_add(size as u64, Relaxed);
        if size > 1032 {
            LARGE.fetch_add(1, Relaxed);
        }
    }
}

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size());
        std::alloc::System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        std::alloc::System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        count(size);
        std::alloc::System.realloc(ptr, layout, size)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// (allocations, bytes, over 1,032 bytes) so far.
fn allocations() -> [u64; 3] {
    [
        ALLOCATIONS.load(Relaxed),
        ALLOCATED.load(Relaxed),
        LARGE.load(Relaxed),
    ]
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
    signed: bool,
) -> anyhow::Result<()> {
    for (i, cb) in callbacks.iter().enumerate() {
        let secret = format!("secret-{}", offset + i);
        let mut form = vec![
            ("hub.mode", "subscribe"),
            ("hub.topic", topic),
            ("hub.callback", cb.as_str()),
        ];
        if signed {
            form.push(("hub.secret", &secret));
        }
        let r = client.post(hub_url).form(&form).send().await?;
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

/// From receipts (notification number, when) of notifications sent at `sent[number]`: the
/// last receipt (`start` when none) and the publish-to-receipt latencies, sorted.
fn latencies(
    got: &[(usize, Instant)],
    sent: &[Instant],
    start: Instant,
) -> (Instant, Vec<Duration>) {
    let last = got.iter().map(|(_, at)| *at).max().unwrap_or(start);
    let mut lat: Vec<Duration> = got
        .iter()
        .map(|(k, at)| at.duration_since(sent[*k]))
        .collect();
    lat.sort();
    (last, lat)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The hub under test: the real server on the embedded store in a temporary directory.
struct HubUnderTest {
    addr: std::net::SocketAddr,
    store: Store,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    tmp: std::path::PathBuf,
}

impl HubUnderTest {
    async fn start(tag: &str, standard_webhooks: bool) -> anyhow::Result<HubUnderTest> {
        let tmp = std::env::temp_dir().join(format!("rshub-bench-hub-{}{tag}", std::process::id()));
        let mut config = Config::defaults();
        config.server.listen = "127.0.0.1:0".into();
        config.server.data_dir = tmp.clone();
        config.hub.allow_networks = vec!["127.0.0.0/8".parse().unwrap()];
        config.hub.publisher_token = "bench".into();
        config.hub.requests_per_callback_per_minute = 1000;
        config.hub.requests_per_host_per_minute = 1_000_000;
        config.hub.max_subscriptions_per_host = 1_000_000;
        config.hub.standard_webhooks = standard_webhooks;
        config.hub.request_timeout_secs = arg("--request-timeout-secs")
            .map_or(10, |s| s.parse().expect("--request-timeout-secs N"));
        config.admin.token = "bench-admin-token".into();
        let db = config.database_path();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(resourcesync_hub::app::run(config, listener, async move {
            let _ = stop_rx.await;
        }));
        let client = reqwest::Client::builder().no_proxy().build()?;
        common::wait_healthz(&client, addr).await;
        let store = Store::open_embedded(&db)?;
        Ok(HubUnderTest {
            addr,
            store,
            stop,
            task,
            tmp,
        })
    }

    fn url(&self) -> String {
        format!("http://{}/hub", self.addr)
    }

    /// Subscribes `callbacks` to a new topic `name` and waits until all are verified; the
    /// first delivery to them is made before this returns (connections established).
    async fn topic(
        &self,
        client: &reqwest::Client,
        receipts: &Receipts,
        name: &str,
        callbacks: &[String],
        signed: bool,
    ) -> anyhow::Result<String> {
        let topic = format!("http://{}/topics/{name}", self.addr);
        subscribe_all(client, &self.url(), &topic, callbacks, 0, signed).await?;
        let t =
            resourcesync_hub::model::websub::Topic::parse(&topic).map_err(anyhow::Error::msg)?;
        wait_subscribers(&self.store, &t, callbacks.len()).await?;
        receipts.lock().unwrap().clear();
        publish(client, &self.url(), &topic, usize::MAX - 1).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while receipts.lock().unwrap().len() < callbacks.len() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(topic)
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// What one round of publishes gave.
struct Round {
    deliveries: usize,
    secs: f64,
    /// Publish-to-receipt latencies, sorted.
    lat: Vec<Duration>,
    published: Duration,
    /// CPU of this whole process (hub, receivers, publisher) during the round.
    cpu_secs: f64,
    /// Allocations of this whole process during the round (`--count-allocations`).
    allocs: [u64; 3],
}

/// Publishes `notifications` fat pings to `topic` back to back and waits until each of its
/// `subscribers` has received every one.
async fn round(
    client: &reqwest::Client,
    hub_url: &str,
    topic: &str,
    subscribers: usize,
    notifications: usize,
    receipts: &Receipts,
) -> anyhow::Result<Round> {
    receipts.lock().unwrap().clear();
    let cpu0 = common::proc_cpu_secs("self");
    let allocs0 = allocations();
    let mut sent = Vec::with_capacity(notifications);
    let start = Instant::now();
    for k in 0..notifications {
        sent.push(Instant::now());
        publish(client, hub_url, topic, k).await?;
    }
    let published = start.elapsed();
    let want = subscribers * notifications;
    let deadline = Instant::now() + Duration::from_secs(120);
    while receipts.lock().unwrap().len() < want {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {want} deliveries arrived",
            receipts.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let cpu_secs = common::proc_cpu_secs("self") - cpu0;
    let allocs1 = allocations();
    let got = receipts.lock().unwrap().clone();
    let (last, lat) = latencies(&got, &sent, start);
    Ok(Round {
        deliveries: want,
        secs: last.duration_since(start).as_secs_f64(),
        lat,
        published,
        cpu_secs,
        allocs: [0, 1, 2].map(|i| allocs1[i] - allocs0[i]),
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if let Some(es) = arg("--child") {
        return child(&es).await;
    }
    if let Some(es) = arg("--elasticsearch") {
        return sharded(&es).await;
    }
    let compare = arg("--compare-signatures");
    let rounds: Vec<usize> = arg("--subscribers")
        .unwrap_or_else(|| {
            if compare.is_some() {
                "100"
            } else {
                "100,500,1000"
            }
            .into()
        })
        .split(',')
        .map(|s| s.trim().parse().expect("--subscribers N[,N...]"))
        .collect();
    let notifications: usize =
        arg("--notifications").map_or(20, |s| s.parse().expect("--notifications N"));
    let hung: usize = arg("--hung").map_or(0, |s| s.parse().expect("--hung N"));
    let failing: usize = arg("--failing").map_or(0, |s| s.parse().expect("--failing N"));
    // One more subscriber limited to this many deliveries a second (admin API): do its
    // neighbours slow down?
    let limited: Option<f64> = arg("--limited").map(|s| s.parse().expect("--limited N"));

    let receipts: Receipts = Arc::new(Mutex::new(Vec::new()));
    let recv_app = Router::new()
        .route("/cb/{id}", get(verify).post(receive))
        .route("/hang/{id}", get(verify).post(hang))
        .route("/fail/{id}", get(verify).post(fail))
        .route("/slow/{id}", get(verify).post(|| async { "" }))
        .with_state(receipts.clone());
    let recv_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let recv_addr = recv_listener.local_addr()?;
    tokio::spawn(async move { axum::serve(recv_listener, recv_app).await });
    let client = reqwest::Client::builder().no_proxy().build()?;
    if let Some(pairs) = compare {
        let pairs = pairs.parse().expect("--compare-signatures PAIRS");
        return compare_signatures(
            &client,
            &receipts,
            recv_addr,
            rounds[0],
            arg("--notifications").map_or(300, |s| s.parse().expect("--notifications N")),
            pairs,
        )
        .await;
    }

    let hub = HubUnderTest::start("", true).await?;
    let hub_url = hub.url();
    println!(
        "signed fan-out on loopback, {notifications} notifications per round, sha256 signatures"
    );
    println!(
        "{:>11} {:>11} {:>13} {:>9} {:>9} {:>9} {:>14}",
        "subscribers", "deliveries", "deliveries/s", "p50 ms", "p99 ms", "max ms", "publishing ms"
    );
    let mut base = 0usize;
    // (hung, failing, limited) beside the healthy subscribers.
    let variants: Vec<(usize, usize, Option<f64>)> = if hung + failing > 0 || limited.is_some() {
        vec![(0, 0, None), (hung, failing, limited)]
    } else {
        vec![(0, 0, None)]
    };
    for n in rounds {
        for (round_no, &(extra_hung, extra_failing, extra_limited)) in variants.iter().enumerate() {
            let mut callbacks: Vec<String> = (0..n)
                .map(|i| format!("http://{recv_addr}/cb/{}", base + i))
                .collect();
            callbacks
                .extend((0..extra_hung).map(|i| format!("http://{recv_addr}/hang/{}", base + i)));
            callbacks.extend(
                (0..extra_failing).map(|i| format!("http://{recv_addr}/fail/{}", base + i)),
            );
            if extra_limited.is_some() {
                callbacks.push(format!("http://{recv_addr}/slow/{base}"));
            }
            // The healthy subscribers first, established by one delivery (as they would be
            // when someone starts registering bad callbacks), then the bad ones.
            let (healthy, bad) = callbacks.split_at(n);
            let topic = hub
                .topic(
                    &client,
                    &receipts,
                    &format!("bench-{n}-{round_no}"),
                    healthy,
                    true,
                )
                .await?;
            subscribe_all(&client, &hub_url, &topic, bad, n, true).await?;
            let t = resourcesync_hub::model::websub::Topic::parse(&topic)
                .map_err(anyhow::Error::msg)?;
            wait_subscribers(&hub.store, &t, callbacks.len()).await?;
            base += callbacks.len();
            if extra_hung + extra_failing > 0 {
                println!(
                    "  with {extra_hung} hung and {extra_failing} failing callbacks beside them:"
                );
            }
            if let Some(per_sec) = extra_limited {
                limit(
                    &client,
                    &hub.addr,
                    bad.last().expect("the limited one"),
                    per_sec,
                )
                .await?;
                println!("  with one more subscriber limited to {per_sec} a second beside them:");
            }
            let r = round(&client, &hub_url, &topic, n, notifications, &receipts).await?;
            println!(
                "{:>11} {:>11} {:>13.0} {:>9.1} {:>9.1} {:>9.1} {:>14.1}",
                n,
                r.deliveries,
                r.deliveries as f64 / r.secs,
                percentile(&r.lat, 0.50).as_secs_f64() * 1e3,
                percentile(&r.lat, 0.99).as_secs_f64() * 1e3,
                r.lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
                r.published.as_secs_f64() * 1e3
            );
        }
    }
    println!(
        "peak RSS of the process (hub and receivers): {:.0} MB",
        peak_rss_mb()
    );
    hub.stop().await;
    Ok(())
}

/// `--compare-signatures PAIRS`: what the signatures cost, measured in one run. Two hubs in
/// this process, one signing both ways (the default) and one with `hub.standard_webhooks =
/// false` (`X-Hub-Signature` only), plus a topic on the second whose subscribers gave no
/// secret (nothing signed). Each of the three gets `n` subscribers of its own; rounds of
/// `notifications` publishes run in turn (order reversed every other time, so a drift of the
/// machine falls on all three alike) and each round's deliveries/s and process CPU a delivery
/// are paired with the others of its turn.
async fn compare_signatures(
    client: &reqwest::Client,
    receipts: &Receipts,
    recv_addr: std::net::SocketAddr,
    n: usize,
    notifications: usize,
    pairs: usize,
) -> anyhow::Result<()> {
    // `--control`: the second hub signs both ways too, so its figures show what the
    // comparison itself is worth (it should find nothing).
    let control = std::env::args().any(|a| a == "--control");
    if control {
        println!("control run: the second hub signs both ways too");
    }
    if std::env::args().any(|a| a == "--count-allocations") {
        COUNT.store(true, Relaxed);
        println!("allocations counted (on shared counters, so these times are slower)");
    }
    let both = HubUnderTest::start("-both", true).await?;
    let websub = HubUnderTest::start("-websub", control).await?;
    let second = if control {
        "both, second hub"
    } else {
        "X-Hub-Signature only"
    };
    let callbacks = |from: usize| -> Vec<String> {
        (from..from + n)
            .map(|i| format!("http://{recv_addr}/cb/{i}"))
            .collect()
    };
    let variants = [
        ("both signatures", &both, true),
        (second, &websub, true),
        ("unsigned", &websub, false),
    ];
    let mut topics = Vec::new();
    for (i, (_, hub, signed)) in variants.iter().enumerate() {
        topics.push(
            hub.topic(
                client,
                receipts,
                &format!("cmp-{i}"),
                &callbacks(i * n),
                *signed,
            )
            .await?,
        );
    }
    println!(
        "signature cost in one run: {n} subscribers each, {notifications} publishes a round, \
         {pairs} turns of the three (after one unmeasured turn)"
    );
    // [variant][turn]: (deliveries/s, CPU µs a delivery)
    let mut got: [Vec<(f64, f64)>; 3] = Default::default();
    // [variant]: deliveries, and allocations, bytes and large ones over all measured rounds
    let mut allocs = [(0u64, [0u64; 3]); 3];
    for turn in 0..=pairs {
        let order: [usize; 3] = if turn % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        for v in order {
            let (_, hub, _) = variants[v];
            let r = round(client, &hub.url(), &topics[v], n, notifications, receipts).await?;
            if turn > 0 {
                got[v].push((
                    r.deliveries as f64 / r.secs,
                    r.cpu_secs * 1e6 / r.deliveries as f64,
                ));
                allocs[v].0 += r.deliveries as u64;
                for i in 0..3 {
                    allocs[v].1[i] += r.allocs[i];
                }
            }
        }
    }
    let counted = COUNT.load(Relaxed);
    println!(
        "{:<22} {:>28} {:>26}{}",
        "",
        "deliveries/s (median, range)",
        "CPU µs a delivery (median)",
        if counted {
            "   allocations a delivery (bytes; over 1,032 bytes)"
        } else {
            ""
        }
    );
    for (v, (name, _, _)) in variants.iter().enumerate() {
        let mut rate: Vec<f64> = got[v].iter().map(|g| g.0).collect();
        let mut cpu: Vec<f64> = got[v].iter().map(|g| g.1).collect();
        let (deliveries, [count, bytes, large]) = allocs[v];
        let per = |x: u64| x as f64 / deliveries.max(1) as f64;
        let allocated = if counted {
            format!(
                "   {:>6.1} ({:>6.0}; {:.1})",
                per(count),
                per(bytes),
                per(large)
            )
        } else {
            String::new()
        };
        println!(
            "{name:<22} {:>12.0} ({:>6.0}–{:<6.0}) {:>26.1}{allocated}",
            median(&mut rate),
            rate.first().unwrap_or(&0.0),
            rate.last().unwrap_or(&0.0),
            median(&mut cpu),
        );
    }
    for (against, label) in [(1, second), (2, "unsigned")] {
        let rate: Vec<f64> = (0..pairs)
            .map(|t| got[0][t].0 / got[against][t].0)
            .collect();
        let cpu: Vec<f64> = (0..pairs)
            .map(|t| got[0][t].1 / got[against][t].1)
            .collect();
        let (r, rlo, rhi) = median_interval(&rate);
        let (c, clo, chi) = median_interval(&cpu);
        println!(
            "both signatures against {label}: deliveries/s ×{r:.3} (95% interval of the median \
             {rlo:.3}–{rhi:.3}), so {:.1}% lost; CPU a delivery ×{c:.3} ({clo:.3}–{chi:.3})",
            (1.0 - r) * 100.0
        );
    }
    both.stop().await;
    websub.stop().await;
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median of `v` and a bootstrap 95% interval of it (2,000 resamples, fixed seed).
fn median_interval(v: &[f64]) -> (f64, f64, f64) {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut medians: Vec<f64> = (0..2000)
        .map(|_| {
            let mut s: Vec<f64> = (0..v.len())
                .map(|_| v[(next() % v.len() as u64) as usize])
                .collect();
            median(&mut s)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    let mut all = v.to_vec();
    (median(&mut all), medians[50], medians[1949])
}

/// Sets the rate limit of the subscription of `callback` through the admin API.
async fn limit(
    client: &reqwest::Client,
    hub: &std::net::SocketAddr,
    callback: &str,
    per_sec: f64,
) -> anyhow::Result<()> {
    let page: serde_json::Value = client
        .get(format!("http://{hub}/admin/v1/subscriptions"))
        .query(&[("callback", callback)])
        .bearer_auth("bench")
        .send()
        .await?
        .json()
        .await?;
    let id = page["items"][0]["id"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("no subscription of {callback}: {page}"))?;
    let r = client
        .patch(format!("http://{hub}/admin/v1/subscriptions/{id}"))
        .bearer_auth("bench")
        .json(&serde_json::json!({ "max_per_sec": per_sec }))
        .send()
        .await?;
    anyhow::ensure!(r.status() == 200, "the limit was refused: {}", r.status());
    Ok(())
}

/// Per subscriber: (notification number, when).
type ByCallback = Arc<Mutex<std::collections::HashMap<usize, Vec<(usize, Instant)>>>>;

async fn receive_at(
    State(r): State<ByCallback>,
    axum::extract::Path(id): axum::extract::Path<usize>,
    body: Bytes,
) -> &'static str {
    let at = Instant::now();
    let n = std::str::from_utf8(&body)
        .unwrap_or("")
        .split('"')
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX);
    r.lock().unwrap().entry(id).or_default().push((n, at));
    ""
}

/// A server process of the sharded benchmark: `--child ES --index I --lease-secs L`; prints
/// its address, runs until its stdin closes (the parent ended) or it is killed.
async fn child(es: &str) -> anyhow::Result<()> {
    let mut config = Config::defaults();
    config.server.data_dir =
        std::env::temp_dir().join(format!("rshub-bench-hub-child-{}", std::process::id()));
    config.server.base_url = "http://hub.bench".into();
    config.store.backend = resourcesync_hub::config::Backend::Elasticsearch;
    config.store.elasticsearch.url = es.into();
    config.store.elasticsearch.index = arg("--index").expect("--index");
    config.hub.allow_networks = vec!["127.0.0.0/8".parse().unwrap()];
    config.hub.publisher_token = "bench".into();
    config.hub.requests_per_callback_per_minute = 1000;
    config.hub.requests_per_host_per_minute = 1_000_000;
    config.hub.max_subscriptions_per_host = 1_000_000;
    config.hub.partition_lease_secs =
        arg("--lease-secs").map_or(10, |s| s.parse().expect("--lease-secs N"));
    config.admin.token = "bench-admin-token".into();
    let data = config.server.data_dir.clone();
    common::run_child_server(config).await?;
    let _ = std::fs::remove_dir_all(data);
    Ok(())
}

struct Child {
    proc: std::process::Child,
    addr: String,
}

fn spawn_child(es: &str, index: &str, lease: &str) -> anyhow::Result<Child> {
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["--child", es, "--index", index, "--lease-secs", lease])
        .env(
            "RUST_LOG",
            std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        );
    let (proc, addr) = common::spawn_child(cmd)?;
    Ok(Child { proc, addr })
}

async fn metric(client: &reqwest::Client, c: &Child, name: &str) -> f64 {
    let Ok(r) = client
        .get(format!("http://{}/metrics", c.addr))
        .send()
        .await
    else {
        return 0.0;
    };
    r.text()
        .await
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

async fn wait_for(
    what: &str,
    secs: u64,
    mut cond: impl AsyncFnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond().await {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn distinct_all(r: &ByCallback, subs: usize, upto: usize) -> bool {
    let m = r.lock().unwrap();
    m.len() == subs
        && m.values().all(|v| {
            let mut u: Vec<usize> = v.iter().map(|(n, _)| *n).filter(|n| *n < upto).collect();
            u.sort();
            u.dedup();
            u.len() == upto
        })
}

/// Publishes notifications `ks` through the processes in turn.
async fn publish_through(
    client: &reqwest::Client,
    procs: &[Child],
    topic: &str,
    ks: std::ops::Range<usize>,
) -> anyhow::Result<()> {
    for k in ks {
        let hub = format!("http://{}/hub", procs[k % procs.len()].addr);
        publish(client, &hub, topic, k).await?;
    }
    Ok(())
}

async fn sharded(es: &str) -> anyhow::Result<()> {
    let counts: Vec<usize> = arg("--processes")
        .unwrap_or_else(|| "1,2,3".into())
        .split(',')
        .map(|s| s.trim().parse().expect("--processes N[,N...]"))
        .collect();
    let subs: usize = arg("--subscribers").map_or(60, |s| s.parse().expect("--subscribers N"));
    let m: usize = arg("--notifications").map_or(200, |s| s.parse().expect("--notifications N"));
    let lease = arg("--lease-secs").unwrap_or_else(|| "10".into());
    let receipts: ByCallback = Arc::new(Mutex::new(Default::default()));
    let recv_app = Router::new()
        .route("/s/{id}", get(verify).post(receive_at))
        .with_state(receipts.clone());
    let recv_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let recv_addr = recv_listener.local_addr()?;
    tokio::spawn(async move { axum::serve(recv_listener, recv_app).await });
    let client = reqwest::Client::builder().no_proxy().build()?;
    let topic = "http://hub.bench/topics/shared";
    println!("shared delivery on {es}: {subs} subscribers, {m} fat pings published through every process, partition lease {lease} s");
    println!(
        "{:>9} {:>11} {:>13} {:>8} {:>8}  {:<22} {:>11} {:>13}",
        "processes",
        "deliveries",
        "deliveries/s",
        "p50 ms",
        "p99 ms",
        "share per process %",
        "takeover s",
        "repeats/sub"
    );
    for n in counts {
        let index = format!("bench-hub-{}-{n}", std::process::id());
        let mut procs: Vec<Child> = (0..n)
            .map(|_| spawn_child(es, &index, &lease))
            .collect::<anyhow::Result<_>>()?;
        wait_for(
            "the partitions spread over the processes",
            120,
            async || {
                let mut sum = 0.0;
                for c in &procs {
                    let h = metric(&client, c, "rshub_partitions_held").await;
                    if h == 0.0 {
                        return false;
                    }
                    sum += h;
                }
                sum == 64.0
            },
        )
        .await?;
        receipts.lock().unwrap().clear();
        for i in 0..subs {
            let r = client
                .post(format!("http://{}/hub", procs[i % n].addr))
                .form(&[
                    ("hub.mode", "subscribe"),
                    ("hub.topic", topic),
                    ("hub.callback", &format!("http://{recv_addr}/s/{i}")),
                    ("hub.secret", &format!("secret-{i}")),
                ])
                .send()
                .await?;
            anyhow::ensure!(r.status() == 202, "subscribe answered {}", r.status());
        }
        wait_for("every subscription verified", 120, async || {
            metric(&client, &procs[0], "rshub_subscriptions{state=\"active\"}").await == subs as f64
        })
        .await?;
        // The partitions' owners pick the new subscriptions up from the store.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before: Vec<f64> = {
            let mut v = Vec::new();
            for c in &procs {
                v.push(metric(&client, c, "rshub_deliveries_total{outcome=\"delivered\"}").await);
            }
            v
        };
        let mut sent = Vec::with_capacity(m);
        let start = Instant::now();
        for k in 0..m {
            sent.push(Instant::now());
            publish(
                &client,
                &format!("http://{}/hub", procs[k % n].addr),
                topic,
                k,
            )
            .await?;
        }
        let rc = receipts.clone();
        wait_for("every delivery", 600, async || distinct_all(&rc, subs, m)).await?;
        let got: Vec<(usize, Instant)> = receipts
            .lock()
            .unwrap()
            .values()
            .flatten()
            .copied()
            .collect();
        let (last, lat) = latencies(&got, &sent, start);
        let mut shares = Vec::new();
        for (c, b) in procs.iter().zip(&before) {
            shares.push(
                metric(&client, c, "rshub_deliveries_total{outcome=\"delivered\"}").await - b,
            );
        }
        let total: f64 = shares.iter().sum();
        let shares: Vec<String> = shares
            .iter()
            .map(|s| format!("{:.0}", 100.0 * s / total.max(1.0)))
            .collect();
        let (mut takeover, mut repeats) = (String::from("-"), String::from("-"));
        if n >= 2 {
            // A second batch; one process SIGKILLed halfway through it.
            receipts.lock().unwrap().clear();
            let victim = procs.pop().expect("a process");
            publish_through(&client, &procs, topic, 0..m / 2).await?;
            let rc = receipts.clone();
            wait_for("a quarter of the second batch", 300, async || {
                rc.lock().unwrap().values().map(Vec::len).sum::<usize>() >= subs * m / 4
            })
            .await?;
            let mut victim = victim;
            victim.proc.kill()?;
            let killed = Instant::now();
            let _ = victim.proc.wait();
            publish_through(&client, &procs, topic, m / 2..m).await?;
            let rc = receipts.clone();
            wait_for("every delivery after the kill", 600, async || {
                distinct_all(&rc, subs, m)
            })
            .await?;
            let r = receipts.lock().unwrap();
            let gap = r
                .values()
                .filter_map(|v| v.iter().map(|(_, at)| *at).filter(|at| *at >= killed).min())
                .map(|at| at.duration_since(killed))
                .max()
                .unwrap_or_default();
            let reps: Vec<usize> = r
                .values()
                .map(|v| {
                    let mut u: Vec<usize> = v.iter().map(|(n, _)| *n).collect();
                    u.sort();
                    u.dedup();
                    v.len() - u.len()
                })
                .collect();
            takeover = format!("{:.1}", gap.as_secs_f64());
            repeats = format!(
                "max {} (total {})",
                reps.iter().max().unwrap_or(&0),
                reps.iter().sum::<usize>()
            );
        }
        println!(
            "{:>9} {:>11} {:>13.0} {:>8.1} {:>8.1}  {:<22} {:>11} {:>13}",
            n,
            subs * m,
            (subs * m) as f64 / last.duration_since(start).as_secs_f64(),
            percentile(&lat, 0.50).as_secs_f64() * 1e3,
            percentile(&lat, 0.99).as_secs_f64() * 1e3,
            shares.join(" / "),
            takeover,
            repeats
        );
        for mut c in procs {
            drop(c.proc.stdin.take());
            let _ = c.proc.wait();
        }
    }
    Ok(())
}
