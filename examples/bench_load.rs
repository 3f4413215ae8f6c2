//! Benchmark: the source under load, next to nginx serving the same documents as static files.
//!
//! ```text
//! cargo run --release --example bench_load -- [--resources 200000] [--part 50000]
//!     [--lists 10] [--secs 60] [--readers 200] [--rate 500] [--subscribers 100]
//!     [--dir /tmp/rshub-load] [--nginx-copy] [--behind-nginx] [--same-load]
//!     [--rebuild-ms 1000] [--slice-secs 10] [--bare-upstream]
//! ```
//!
//! 1. Fills an embedded store (once; kept in `--dir`/seed, copied for each run) with `--resources` URL resources in
//!    Resource List parts of `--part`, created in `--lists` batches an hour apart, so each batch
//!    is its own closed Change List.
//! 2. Starts the real server as a child process (this program again), and a receiver here with
//!    `--subscribers` callbacks subscribed to the set's change notifications.
//! 3. For `--secs`: `--readers` keep-alive readers fetch every document in turn (identity and
//!    gzip alternately, bodies read to the end), while `--rate` updates a second are ingested.
//!    Prints documents/s, MB/s, latency p50/p99, 503s, ingest achieved, notification lag p99
//!    (ingest answered → notification received), and the server's RSS before, peak and after.
//! 4. The same readers, for the same time, against nginx (Debian package `nginx`) started here
//!    on loopback with a configuration written here, serving the documents as static files:
//!    our own responses from step 2's warm-up, with `gzip_static` for the gzip forms. Prints
//!    nginx's figures and the ratios.
//!
//! With `--behind-nginx`, step 3's readers and ingest go through nginx in front of our server
//! (`server.accel_redirect = "/_rshub/"` and `docker/nginx-rshub.conf`): the server decides
//! each answer (which file, ETag, encoding, 304), nginx sends the files' bytes.
//!
//! With `--same-load`, step 4 runs while step 3's ingest and deliveries go on (the server
//! keeps running): both passes then share the two cores with the same background work, and the
//! ratio compares serving alone. The two passes then alternate in slices of `--slice-secs`
//! (10; ours, nginx, nginx, ours, ...), `--secs` each in all, so that a machine whose speed
//! drifts from minute to minute weighs on both alike. With `--bare-upstream` (and
//! `--same-load`), a third contender in the same slices: nginx with the same front
//! configuration in front of an upstream that does no work (nginx itself answering with the
//! headers and the file's name): the ceiling of the arrangement on this machine. Without it, nginx's pass has the machine to itself, and the
//! ratio also counts what ingest, page rebuilds and 100 subscribers' deliveries cost the
//! readers (on two cores the readers themselves are the bottleneck: whatever CPU the server
//! spends is theirs less).
//!
//! 5. With `--nginx-copy`, once more against nginx with `sendfile off` (it then copies each
//!    file through a buffer of its own into the socket, as we do): what serving without
//!    `sendfile` can reach on this machine.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::routing::get;
use axum::Router;
use resourcesync_hub::config::{Config, SetOverrides};
use resourcesync_hub::model::{ChangeType, Location, NewChange, ResourceMeta, SetName, Timestamp};
use resourcesync_hub::store::Store;

const SET: &str = "bench";

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: cannot read {v:?}"))
        })
        .unwrap_or(default)
}

fn config(dir: &Path, part: u32) -> Config {
    let mut c = Config::defaults();
    c.server.data_dir = dir.join("data");
    c.hub.allow_networks = vec!["127.0.0.0/8".parse().expect("a network")];
    c.hub.requests_per_host_per_minute = 100_000;
    c.hub.max_subscriptions_per_host = 100_000;
    c.sets.insert(
        SET.into(),
        SetOverrides {
            max_items_in_list: Some(part),
            changelist_rollover_secs: Some(3600),
            ..Default::default()
        },
    );
    if std::env::args().any(|a| a == "--behind-nginx") {
        c.server.accel_redirect = "/_rshub/".into();
    }
    c.source.rebuild_interval_ms = arg("--rebuild-ms", c.source.rebuild_interval_ms);
    c
}

fn record_url(i: u64) -> String {
    format!("http://records.example.org/r/{i:08}")
}

/// The store, filled once: `lists` batches one hour apart (each its own Change List).
async fn populate(c: &Config, n: u64, lists: u64) -> anyhow::Result<()> {
    std::fs::create_dir_all(&c.server.data_dir)?;
    let store = Store::open_embedded(&c.database_path())?;
    let set = SetName::parse(SET).map_err(anyhow::Error::msg)?;
    let have = store.counts(&set).await?.resources;
    if have == n {
        return Ok(());
    }
    anyhow::ensure!(
        have == 0,
        "{} holds {have} resources, not {n}: remove it first",
        c.server.data_dir.display()
    );
    let t = Instant::now();
    let policy = resourcesync_hub::context::list_policy(c, &set);
    let sc = c.set_config(SET);
    let per = n / lists;
    let start = Timestamp::now().0 - (lists as i64 + 1) * 3_601_000_000;
    for l in 0..lists {
        let at = Timestamp(start + l as i64 * 3_601_000_000);
        let first = l * per;
        let last = if l + 1 == lists { n } else { first + per };
        for chunk in (first..last).step_by(5000) {
            let batch = (chunk..(chunk + 5000).min(last))
                .map(|i| {
                    let location = Location::url(record_url(i));
                    NewChange {
                        key: location.key(&sc).expect("a valid URL"),
                        location,
                        change: ChangeType::Created,
                        datetime: Some(at),
                        meta: ResourceMeta {
                            length: Some(1000 + i),
                            md5: Some(format!("{:032x}", i)),
                            mime: Some("application/xml".into()),
                            lastmod: Some(at),
                            ln: vec![],
                        },
                    }
                })
                .collect();
            store.apply(&set, batch, policy, at).await?;
        }
    }
    println!(
        "filled {}: {n} resources in {lists} Change Lists, {:.0} s",
        c.server.data_dir.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The server phase: serve `--dir` on 127.0.0.1:0, print the address, stop when stdin closes.
async fn serve(dir: PathBuf, part: u32) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let c = config(&dir, part);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    let stop = async {
        let _ = tokio::task::spawn_blocking(|| {
            let mut s = String::new();
            let _ = std::io::stdin().read_line(&mut s);
        })
        .await;
    };
    resourcesync_hub::app::run(c, listener, stop).await
}

#[derive(Default)]
struct Figures {
    docs: AtomicU64,
    bytes: AtomicU64,
    busy: AtomicU64,
    errors: AtomicU64,
    /// What the errors were (status or transport error), counted.
    error_kinds: Mutex<std::collections::BTreeMap<String, u64>>,
    latencies_us: Mutex<Vec<u64>>,
}

impl Figures {
    fn error(&self, kind: String) {
        self.errors.fetch_add(1, Relaxed);
        *self.error_kinds.lock().unwrap().entry(kind).or_default() += 1;
    }
}

impl Figures {
    fn print(&self, name: &str, secs: f64) -> (f64, f64) {
        let mut l = self.latencies_us.lock().unwrap().clone();
        l.sort_unstable();
        let q = |p: f64| l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)));
        let (p50, p99) = (
            q(0.50).copied().unwrap_or(0) as f64 / 1e3,
            q(0.99).copied().unwrap_or(0) as f64 / 1e3,
        );
        let docs = self.docs.load(Relaxed) as f64 / secs;
        println!(
            "{name}: {docs:.0} documents/s, {:.0} MB/s, p50 {p50:.1} ms, p99 {p99:.1} ms, {} answered 503, {} errors",
            self.bytes.load(Relaxed) as f64 / secs / 1e6,
            self.busy.load(Relaxed),
            self.errors.load(Relaxed)
        );
        for (kind, n) in self.error_kinds.lock().unwrap().iter() {
            println!("  {n} × {kind}");
        }
        (docs, p99)
    }
}

/// `readers` tasks fetching `paths` in turn (identity, then gzip) until `secs` pass, counted
/// into `figures`.
async fn read_load(
    base: &str,
    paths: &[String],
    readers: usize,
    secs: u64,
    figures: Arc<Figures>,
) -> Arc<Figures> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .no_gzip()
        .pool_max_idle_per_host(readers)
        .build()
        .expect("a client");
    let next = Arc::new(AtomicUsize::new(0));
    let urls: Arc<Vec<String>> = Arc::new(paths.iter().map(|p| format!("{base}{p}")).collect());
    let end = Instant::now() + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..readers)
        .map(|_| {
            let (client, figures, next, urls) =
                (client.clone(), figures.clone(), next.clone(), urls.clone());
            tokio::spawn(async move {
                while Instant::now() < end {
                    let i = next.fetch_add(1, Relaxed);
                    let url = &urls[(i / 2) % urls.len()];
                    let enc = if i % 2 == 0 { "identity" } else { "gzip" };
                    let t = Instant::now();
                    let r = client.get(url).header("accept-encoding", enc).send().await;
                    let mut resp = match r {
                        Ok(r) => r,
                        Err(e) => {
                            figures.error(format!(
                                "no answer: {}",
                                resourcesync_hub::cause::chain(&e)
                            ));
                            continue;
                        }
                    };
                    if resp.status() == 503 {
                        figures.busy.fetch_add(1, Relaxed);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                    let mut n = 0u64;
                    let mut bad =
                        (resp.status() != 200).then(|| format!("status {}", resp.status()));
                    loop {
                        match resp.chunk().await {
                            Ok(Some(c)) => n += c.len() as u64,
                            Ok(None) => break,
                            Err(e) => {
                                bad = Some(format!(
                                    "body cut: {}",
                                    resourcesync_hub::cause::chain(&e)
                                ));
                                break;
                            }
                        }
                    }
                    if let Some(kind) = bad {
                        figures.error(kind);
                        continue;
                    }
                    figures.docs.fetch_add(1, Relaxed);
                    figures.bytes.fetch_add(n, Relaxed);
                    figures
                        .latencies_us
                        .lock()
                        .unwrap()
                        .push(t.elapsed().as_micros() as u64);
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    figures
}

/// Every document, walked down from the Source Description (paths, not URLs).
async fn every_path(client: &reqwest::Client, base: &str) -> anyhow::Result<Vec<String>> {
    let mut paths = vec!["/.well-known/resourcesync".to_string()];
    let mut i = 0;
    while i < paths.len() {
        let body = client
            .get(format!("{base}{}", paths[i]))
            .send()
            .await?
            .bytes()
            .await?;
        let doc = resourcesync_hub::sitemap::parse(&body).map_err(|e| anyhow::anyhow!("{e}"))?;
        let cap = doc.md.get("capability").cloned().unwrap_or_default();
        if doc.is_index || cap == "description" || cap == "capabilitylist" {
            for e in &doc.entries {
                if let Some(p) = e.loc.strip_prefix(base) {
                    if p.ends_with(".xml") && !paths.iter().any(|x| x == p) {
                        paths.push(p.to_string());
                    }
                }
            }
        }
        i += 1;
    }
    Ok(paths)
}

/// Notification receipts: each notified record → lag from the ingest answer for its update.
struct Sink {
    sent: Mutex<std::collections::HashMap<u64, Instant>>,
    lags_us: Mutex<Vec<u64>>,
    verified: AtomicUsize,
}

async fn verify(
    State(s): State<Arc<Sink>>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> String {
    s.verified.fetch_add(1, Relaxed);
    q.get("hub.challenge").cloned().unwrap_or_default()
}

async fn receive(State(s): State<Arc<Sink>>, body: axum::body::Bytes) -> &'static str {
    let now = Instant::now();
    let text = String::from_utf8_lossy(&body);
    let sent = s.sent.lock().unwrap();
    let mut lags = Vec::new();
    for part in text.split("<loc>").skip(1) {
        let loc = part.split("</loc>").next().unwrap_or("");
        if let Some(i) = loc
            .strip_prefix("http://records.example.org/r/")
            .and_then(|i| i.parse::<u64>().ok())
        {
            if let Some(t) = sent.get(&i) {
                lags.push(now.duration_since(*t).as_micros() as u64);
            }
        }
    }
    drop(sent);
    s.lags_us.lock().unwrap().extend(lags);
    ""
}

/// nginx serving `www` on a port of its own (configuration and logs in `dir`), answering:
/// the process and its base URL.
async fn static_nginx(
    dir: &Path,
    www: &Path,
    sendfile: bool,
    probe: &str,
) -> anyhow::Result<(std::process::Child, String)> {
    let port = common::free_port();
    let nginx = common::nginx_with(dir, &[(port, www.to_path_buf())], sendfile)?;
    let base = format!("http://127.0.0.1:{port}");
    nginx_answer(dir, &base, probe).await?;
    Ok((nginx, base))
}

/// The first answer of an nginx just started in `dir` to a GET of `probe` (up to 5 s).
async fn nginx_answer(dir: &Path, base: &str, probe: &str) -> anyhow::Result<reqwest::Response> {
    let client = reqwest::Client::builder().no_proxy().no_gzip().build()?;
    for _ in 0..100 {
        if let Ok(r) = client.get(format!("{base}{probe}")).send().await {
            return Ok(r);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("nginx did not start: see {}/nginx-error.log", dir.display())
}

/// nginx in front of an upstream that does no work at all: a second server in the same nginx
/// answers every GET at once with the headers ours sends (`X-Accel-Redirect` to the warm-up's
/// file of the asked form, ETag, Last-Modified, Content-Type, Content-Encoding, Vary, Accept-Ranges)
/// and no body, and the front is `docker/nginx-rshub.conf` as for ours. What the arrangement
/// itself (nginx asking an upstream, then sending the file) costs the readers: the most any
/// application behind nginx can reach on this machine. Its base URL.
async fn bare_front(
    dir: &Path,
    www: &Path,
    probe: &str,
) -> anyhow::Result<(std::process::Child, String)> {
    let (front, upstream) = (common::free_port(), common::free_port());
    let extra = format!(
        "map $http_accept_encoding $bare_gz {{ ~gzip .gz; default \"\"; }}\n\
         map $http_accept_encoding $bare_ce {{ ~gzip gzip; default \"\"; }}\n\
         server {{\n  listen 127.0.0.1:{upstream};\n  default_type application/xml;\n  location / {{\n\
             add_header X-Accel-Redirect /_rshub{www}$uri$bare_gz;\n\
             add_header ETag '\"$uri$bare_gz-0000000000000000\"';\n\
             add_header Last-Modified 'Thu, 26 Nov 2026 00:00:00 GMT';\n\
             add_header Content-Encoding $bare_ce;\n    add_header Vary accept-encoding;\n\
             add_header Accept-Ranges bytes;\n    return 200 '';\n  }}\n}}\n",
        www = www.display()
    );
    let nginx = common::nginx_front(dir, front, &format!("127.0.0.1:{upstream}"), &extra)?;
    let base = format!("http://127.0.0.1:{front}");
    let r = nginx_answer(dir, &base, probe).await?;
    anyhow::ensure!(
        r.status() == 200 && !r.bytes().await?.is_empty(),
        "nginx in front of the bare upstream does not send {probe}: see {}/nginx-error.log",
        dir.display()
    );
    Ok((nginx, base))
}

/// SIGTERM (not kill(), whose SIGKILL would orphan the workers): nginx stops its workers.
fn stop_nginx(mut nginx: std::process::Child) {
    let _ = std::process::Command::new("kill")
        .arg(nginx.id().to_string())
        .status();
    let _ = nginx.wait();
}

/// nginx serving `www`, readers run against it for `secs`, and their figures printed as
/// `label`'s: (documents/s, p99).
async fn nginx_pass(
    dir: &Path,
    www: &Path,
    sendfile: bool,
    label: &str,
    paths: &[String],
    (readers, secs): (usize, u64),
) -> anyhow::Result<(f64, f64)> {
    let (nginx, base) = static_nginx(dir, www, sendfile, &paths[1]).await?;
    let t = Instant::now();
    let theirs = read_load(&base, paths, readers, secs, Default::default()).await;
    let figures = theirs.print(label, t.elapsed().as_secs_f64());
    stop_nginx(nginx);
    Ok(figures)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = PathBuf::from(arg("--dir", "/tmp/rshub-load".to_string()));
    let part: u32 = arg("--part", 50_000);
    if std::env::var_os("RSHUB_BENCH_PHASE").is_some() {
        return serve(dir, part).await;
    }
    let n: u64 = arg("--resources", 200_000);
    let lists: u64 = arg("--lists", 10);
    let secs: u64 = arg("--secs", 60);
    let readers: usize = arg("--readers", 200);
    let rate: u64 = arg("--rate", 500);
    let subscribers: usize = arg("--subscribers", 100);
    // The set is made once in `seed/`; every run starts from a copy (no subscriptions, pages
    // or notifications left by an earlier run).
    let seed = config(&dir.join("seed"), part);
    populate(&seed, n, lists).await?;
    let c = config(&dir, part);
    let _ = std::fs::remove_dir_all(&c.server.data_dir);
    std::fs::create_dir_all(&c.server.data_dir)?;
    for e in std::fs::read_dir(&seed.server.data_dir)? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with("rshub.sqlite") {
            std::fs::copy(e.path(), c.server.data_dir.join(e.file_name()))?;
        }
    }

    // The server, as a child process: its memory is its own.
    let mut server = std::process::Command::new(std::env::current_exe()?)
        .args(std::env::args().skip(1))
        .env("RSHUB_BENCH_PHASE", "serve")
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let addr = {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(server.stdout.take().expect("piped")).read_line(&mut line)?;
        line.trim().to_string()
    };
    let base = format!("http://{addr}");
    let pid = server.id();
    // Direct requests to a server with accel_redirect ask for the bytes themselves (what
    // nginx's fallback location asks), so the warm-up reads the documents.
    let mut direct = reqwest::header::HeaderMap::new();
    direct.insert(
        "x-rshub-no-accel",
        reqwest::header::HeaderValue::from_static("1"),
    );
    let client = reqwest::Client::builder()
        .no_proxy()
        .no_gzip()
        .default_headers(direct)
        .build()?;

    // Subscribers.
    let sink = Arc::new(Sink {
        sent: Mutex::new(Default::default()),
        lags_us: Mutex::new(Vec::new()),
        verified: AtomicUsize::new(0),
    });
    let recv = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let recv_addr = recv.local_addr()?;
    let app = Router::new()
        .route("/cb/{id}", get(verify).post(receive))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(sink.clone());
    tokio::spawn(async move { axum::serve(recv, app).await });
    let mut sc = c.clone();
    sc.server.base_url = base.clone();
    let topic = sc.change_topic(SET);
    for i in 0..subscribers {
        let r = client
            .post(format!("{base}/hub"))
            .form(&[
                ("hub.mode", "subscribe"),
                ("hub.topic", topic.as_str()),
                ("hub.callback", &format!("http://{recv_addr}/cb/{i}")),
            ])
            .send()
            .await?;
        anyhow::ensure!(r.status() == 202, "subscribe: {}", r.text().await?);
    }
    let t = Instant::now();
    while sink.verified.load(Relaxed) < subscribers {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(60),
            "only {} of {subscribers} subscriptions verified in 60 s",
            sink.verified.load(Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Warm-up: every document once in both forms; these bytes are what nginx will serve.
    let paths = every_path(&client, &base).await?;
    let www = dir.join("nginx").join("www");
    let _ = std::fs::remove_dir_all(&www);
    let t = Instant::now();
    let mut total = 0u64;
    for p in &paths {
        for gzip in [false, true] {
            let r = client
                .get(format!("{base}{p}"))
                .header("accept-encoding", if gzip { "gzip" } else { "identity" })
                .send()
                .await?;
            anyhow::ensure!(r.status() == 200, "{p}: {}", r.status());
            let body = r.bytes().await?;
            total += body.len() as u64;
            let file = www.join(p.trim_start_matches('/'));
            std::fs::create_dir_all(file.parent().expect("a folder"))?;
            let file = if gzip {
                PathBuf::from(format!("{}.gz", file.display()))
            } else {
                file
            };
            std::fs::write(file, &body)?;
        }
    }
    println!(
        "{} documents ({} Resource List parts, {} Change Lists), {:.0} MB in both forms, built in {:.1} s",
        paths.len(),
        paths.iter().filter(|p| p.contains("/resourcelist/")).count(),
        paths.iter().filter(|p| p.contains("/changelist/")).count(),
        total as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    // nginx serves the Source Description at this path as a file.
    let rss_start = common::proc_status_mb(&pid.to_string(), "VmRSS:");
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;

    // Behind nginx: readers and ingest go through it (the subscriptions were made directly;
    // deliveries go from the server to the receiver either way).
    let mut front = None;
    let read_base = if std::env::args().any(|a| a == "--behind-nginx") {
        let port = common::free_port();
        let fdir = dir.join("nginx-front");
        front = Some(common::nginx_front(&fdir, port, &addr, "")?);
        let fb = format!("http://127.0.0.1:{port}");
        let t = Instant::now();
        while client
            .get(format!("{fb}{}", paths[1]))
            .send()
            .await
            .is_err()
        {
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(10),
                "nginx in front did not start: see {}/nginx-error.log",
                fdir.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let r = client.get(format!("{fb}{}", paths[1])).send().await?;
        anyhow::ensure!(
            r.status() == 200,
            "through nginx: {} answers {}",
            paths[1],
            r.status()
        );
        fb
    } else {
        base.clone()
    };
    // Ingest: `rate` updates a second, in batches every 100 ms.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ingested = Arc::new(AtomicU64::new(0));
    let ingest = {
        let (client, base, sink, stop, ingested) = (
            client.clone(),
            read_base.clone(),
            sink.clone(),
            stop.clone(),
            ingested.clone(),
        );
        tokio::spawn(async move {
            let per = (rate / 10).max(1);
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut b = 0u64;
            while !stop.load(Relaxed) {
                tick.tick().await;
                // Updates of existing records, spread over every part.
                let records: Vec<u64> = (0..per).map(|j| ((b * per + j) * 7919) % n).collect();
                let lines: Vec<String> = records
                    .iter()
                    .map(|i| {
                        format!(
                            r#"{{"change":"updated","location":{{"type":"url","value":"{}"}},"md5":"{:032x}","length":{b},"mime":"application/xml"}}"#,
                            record_url(*i),
                            b * 1000 + i
                        )
                    })
                    .collect();
                let body = lines.join("\n");
                let r = client
                    .post(format!("{base}/api/v1/resource-sets/{SET}/changes"))
                    .header("content-type", "application/x-ndjson")
                    .body(body)
                    .send()
                    .await;
                if r.is_ok_and(|r| r.status().is_success()) {
                    let now = Instant::now();
                    let mut sent = sink.sent.lock().unwrap();
                    for i in records {
                        sent.insert(i, now);
                    }
                    ingested.fetch_add(per, Relaxed);
                }
                b += 1;
            }
        })
    };
    let same_load = std::env::args().any(|a| a == "--same-load");
    let label = match front {
        Some(_) => "resourcesync-hub behind nginx (accel_redirect)",
        None => "resourcesync-hub",
    };
    let load = (readers, secs);
    let mut bare_pass = None;
    let mut server_cpu = None;
    let (ours, elapsed, theirs_same_load) = if same_load {
        // Both under the same background load, in alternating slices (ours, nginx, nginx,
        // ours, ...): a machine whose speed drifts over minutes weighs on both alike.
        let slice = arg("--slice-secs", 10u64).clamp(1, secs.max(1));
        let (nginx, nginx_base) = static_nginx(&dir.join("nginx"), &www, true, &paths[1]).await?;
        let bare = match std::env::args().any(|a| a == "--bare-upstream") {
            true => Some(bare_front(&dir.join("nginx-bare"), &www, &paths[1]).await?),
            false => None,
        };
        let (ours, theirs, bare_figures) = (
            Arc::new(Figures::default()),
            Arc::new(Figures::default()),
            Arc::new(Figures::default()),
        );
        let mut took = [0.0f64; 3];
        // The server's CPU during each contender's slices.
        let mut cpu = [0.0f64; 3];
        for i in 0..(secs / slice).max(1) {
            // ours, nginx[, bare], then the other way round.
            let mut order = vec![0, 1];
            if bare.is_some() {
                order.push(2);
            }
            if i % 2 == 1 {
                order.reverse();
            }
            for who in order {
                let t = Instant::now();
                let cpu0 = common::proc_cpu_secs(&pid.to_string());
                let (base, figures) = match who {
                    0 => (&read_base, &ours),
                    1 => (&nginx_base, &theirs),
                    _ => (&bare.as_ref().expect("started").1, &bare_figures),
                };
                read_load(base, &paths, readers, slice, figures.clone()).await;
                took[who] += t.elapsed().as_secs_f64();
                cpu[who] += common::proc_cpu_secs(&pid.to_string()) - cpu0;
            }
        }
        server_cpu = Some((cpu, took));
        let (ours_secs, theirs_secs) = (took[0], took[1]);
        stop_nginx(nginx);
        if let Some((b, _)) = bare {
            stop_nginx(b);
            bare_pass = Some((bare_figures, took[2]));
        }
        stop.store(true, Relaxed);
        println!(
            "\n{readers} readers for {secs} s each, in alternating slices of {slice} s, over {} documents (identity and gzip), {rate} changes/s ingested, {subscribers} subscribers:",
            paths.len()
        );
        (ours, ours_secs, Some((theirs, theirs_secs)))
    } else {
        let t = Instant::now();
        let ours = read_load(&read_base, &paths, readers, secs, Default::default()).await;
        let elapsed = t.elapsed().as_secs_f64();
        stop.store(true, Relaxed);
        println!(
            "\n{readers} readers for {secs} s over {} documents (identity and gzip), {rate} changes/s ingested, {subscribers} subscribers:",
            paths.len()
        );
        (ours, elapsed, None)
    };
    let ingested_ours = ingested.load(Relaxed);
    let peak = common::proc_status_mb(&pid.to_string(), "VmHWM:");
    let (our_docs, our_p99) = ours.print(label, elapsed);
    let ingest_secs = elapsed
        + theirs_same_load.as_ref().map_or(0.0, |t| t.1)
        + bare_pass.as_ref().map_or(0.0, |b| b.1);
    let theirs_same_load = theirs_same_load
        .map(|(f, secs)| f.print("nginx (static files), same background load", secs));
    let bare = bare_pass.map(|(f, secs)| {
        f.print(
            "nginx in front of an upstream that does no work, same background load",
            secs,
        )
    });
    let _ = ingest.await;
    // Let the last notifications arrive and the server settle.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss_end = common::proc_status_mb(&pid.to_string(), "VmRSS:");
    let mut lags = sink.lags_us.lock().unwrap().clone();
    lags.sort_unstable();
    let lag_p99 = lags
        .get((lags.len() as f64 * 0.99) as usize)
        .copied()
        .unwrap_or(0) as f64
        / 1e3;
    println!(
        "  ingest {:.0} changes/s; notification lag p99 {lag_p99:.0} ms over {} receipts{}; server RSS {rss_start:.0} MB before, peak {peak:.0} MB, {rss_end:.0} MB 10 s after",
        ingested_ours as f64 / ingest_secs,
        lags.len(),
        if same_load { " (both passes)" } else { "" }
    );
    if let Some((cpu, took)) = server_cpu {
        // What serving costs the server itself: its CPU in its own slices beyond what the
        // background load (ingest, deliveries) costs it in nginx's.
        let core = |i: usize| cpu[i] / took[i].max(1e-9);
        println!(
            "  server CPU: {:.2} core in its own slices, {:.2} in nginx's: {:.0} µs a document served",
            core(0),
            core(1),
            (core(0) - core(1)) * 1e6 / our_docs.max(1e-9)
        );
    }
    drop(server.stdin.take());
    let _ = server.wait();
    if let Some(f) = front {
        // SIGTERM: nginx stops its workers.
        let _ = std::process::Command::new("kill")
            .arg(f.id().to_string())
            .status();
    }

    let (their_docs, their_p99) = match theirs_same_load {
        Some(t) => t,
        None => {
            nginx_pass(
                &dir.join("nginx"),
                &www,
                true,
                "nginx (static files)",
                &paths,
                load,
            )
            .await?
        }
    };
    println!(
        "\nratio: documents/s {:.0}% of nginx's; p99 {:.1}× nginx's",
        our_docs / their_docs * 100.0,
        our_p99 / their_p99
    );
    if let Some((docs, p99)) = bare {
        println!(
            "no application behind nginx: documents/s {:.0}% of nginx's; p99 {:.1}× nginx's; ours {:.0}% of it",
            docs / their_docs * 100.0,
            p99 / their_p99,
            our_docs / docs * 100.0
        );
    }
    if std::env::args().any(|a| a == "--nginx-copy") {
        println!();
        let (copy_docs, copy_p99) = nginx_pass(
            &dir.join("nginx-copy"),
            &www,
            false,
            "nginx, sendfile off",
            &paths,
            load,
        )
        .await?;
        println!(
            "nginx copying through a buffer: documents/s {:.0}% of nginx with sendfile; ours {:.0}% of it, p99 {:.1}×",
            copy_docs / their_docs * 100.0,
            our_docs / copy_docs * 100.0,
            our_p99 / copy_p99
        );
    }
    Ok(())
}
