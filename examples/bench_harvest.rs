//! Benchmark: the destination against the reference client, in one run.
//!
//! ```text
//! cargo run --release --example bench_harvest -- [--resources 50000] [--changes 1000] [--rate 50]
//!     [--concurrency 8] [--dir /dev/shm/bench] [--source ours|nginx]
//! ```
//!
//! With `--source nginx`, the same documents (made by our server, whose base URL is then
//! nginx's) and the same files are served as static files by nginx (Debian package `nginx`),
//! so the clients are measured alone: resources/s and µs of client CPU per resource, ours
//! (in-process, the idle server beside it) and resync-sync's (a child process). The push part
//! is skipped then (nginx is no hub). `--ours-only` leaves resync-sync out (for profiling:
//! a figure for docs/benchmarks.md needs the peer in the same run).
//!
//! Starts our server on loopback with a set of N small files, then baselines it twice: with
//! our destination (`harvest`, in-process) and with `resync-sync --baseline` (PyPI `resync`:
//! the tests' Python environment under target/ when present, else `resync-sync` on PATH),
//! each into its own folder, and prints resources/s for both and the ratio. Then ingests
//! `--changes` updates at `--rate` per second and prints the latency from the source's commit
//! (the ingest answer) to the file written at the destination (the state records it after
//! the rename), p50/p99.

mod common;
use common::{arg, ingest_line as line, percentile};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use resourcesync_hub::destination::{self, config::HarvestConfig, state::State};

fn resync_sync() -> PathBuf {
    common::py_tool("resync-sync")
}

/// User + system CPU seconds of this process (server and harvester both run in it) and of
/// its children that ended (resync-sync).
fn cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (
        (ticks(11) + ticks(12)) / 100.0,
        (ticks(13) + ticks(14)) / 100.0,
    )
}

fn cpu_secs() -> f64 {
    cpu().0
}

/// Copies every document reachable from the Source Description (not the resources) from our
/// server at `ours` into `dir`, at the paths their URLs under `public` name.
async fn mirror_documents(
    client: &reqwest::Client,
    ours: &str,
    public: &str,
    dir: &Path,
) -> anyhow::Result<usize> {
    let mut todo = vec!["/.well-known/resourcesync".to_string()];
    let mut seen = std::collections::HashSet::new();
    while let Some(path) = todo.pop() {
        if !seen.insert(path.clone()) {
            continue;
        }
        let r = client.get(format!("{ours}{path}")).send().await?;
        anyhow::ensure!(r.status().is_success(), "{path}: {}", r.status());
        let body = r.text().await?;
        let file = dir.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(file.parent().expect("a parent"))?;
        std::fs::write(&file, &body)?;
        for loc in body.split("<loc>").skip(1) {
            let url = loc.split("</loc>").next().unwrap_or("");
            if let Some(p) = url.strip_prefix(public) {
                if !p.starts_with("/files/") {
                    todo.push(p.to_string());
                }
            }
        }
    }
    Ok(seen.len())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let n = arg("--resources", 50_000) as usize;
    let changes = arg("--changes", 1000) as usize;
    let rate = arg("--rate", 50);
    // --dir: where the source's files, both mirrors and the states go (default: the system's
    // temporary folder). On a VM's ext4, creating files dominates both clients; /dev/shm
    // (tmpfs) shows the clients themselves.
    let tmp = match std::env::args()
        .position(|a| a == "--dir")
        .and_then(|i| std::env::args().nth(i + 1))
    {
        Some(d) => {
            std::fs::create_dir_all(&d)?;
            tempfile::tempdir_in(d)?
        }
        None => tempfile::tempdir()?,
    };
    let root = tmp.path().join("root");
    let nginx_source = match std::env::args()
        .position(|a| a == "--source")
        .and_then(|i| std::env::args().nth(i + 1))
        .as_deref()
    {
        None | Some("ours") => false,
        Some("nginx") => true,
        Some(other) => anyhow::bail!("--source ours|nginx, not {other:?}"),
    };

    // The source.
    let mut c = common::bench_server_config(&tmp.path().join("data"), &root);
    let nginx_port = common::free_port();
    if nginx_source {
        c.server.base_url = format!("http://127.0.0.1:{nginx_port}");
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(resourcesync_hub::app::run(c, listener, async move {
        let _ = stop_rx.await;
    }));
    let client = reqwest::Client::builder().no_proxy().build()?;
    let ingest = format!("{base}/api/v1/resource-sets/bench/changes");
    let t = Instant::now();
    let mut batch = Vec::new();
    for i in 0..n {
        let rel = format!("d{}/r{i}.txt", i % 100);
        let body = format!("resource {i} {}\n", "x".repeat(i % 200));
        std::fs::create_dir_all(root.join(format!("d{}", i % 100)))?;
        std::fs::write(root.join(&rel), &body)?;
        batch.push(line(&rel, &body, "created"));
        if batch.len() == 5000 || i + 1 == n {
            common::post_ingest(&client, &ingest, batch.join("\n")).await?;
            batch.clear();
        }
    }
    println!(
        "source: {n} files ingested in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let mut nginx = None;
    let served = if nginx_source {
        let public = format!("http://127.0.0.1:{nginx_port}");
        let statics = tmp.path().join("static");
        let docs = mirror_documents(&client, &base, &public, &statics).await?;
        std::fs::create_dir_all(statics.join("files"))?;
        std::os::unix::fs::symlink(&root, statics.join("files/bench"))?;
        nginx = Some(common::nginx(
            &tmp.path().join("nginx"),
            &[(nginx_port, statics)],
        )?);
        let probe = format!("{public}/.well-known/resourcesync");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !client
            .get(&probe)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            anyhow::ensure!(Instant::now() < deadline, "nginx does not answer");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!("nginx serves the files and {docs} documents at {public}");
        public
    } else {
        base.clone()
    };

    // Our destination.
    let mut hc = HarvestConfig::defaults();
    hc.source.url = format!("{served}/.well-known/resourcesync");
    hc.state.dir = tmp.path().join("harvest-state");
    hc.output.dir = tmp.path().join("mirror-ours");
    hc.follow.check_interval_secs = 3600;
    hc.fetch.concurrency = arg("--concurrency", hc.fetch.concurrency as u64) as usize;
    hc.push.listen = "127.0.0.1:0".into();
    let (htx, hrx) = tokio::sync::oneshot::channel::<()>();
    let hl = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let t = Instant::now();
    let cpu0 = cpu_secs();
    let harvester = tokio::spawn(destination::run(hc.clone(), Some(hl), async move {
        let _ = hrx.await;
    }));
    let db = hc.database_path();
    // Watched from a thread of its own, so that the watching never holds up the harvester.
    let watched = db.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        while !watched.exists() {
            std::thread::sleep(Duration::from_millis(20));
        }
        let s = State::open(&watched)?;
        while !s.sets()?.first().is_some_and(|r| r.baseline_done) {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    })
    .await??;
    let ours = t.elapsed().as_secs_f64();
    let cpu_ours = cpu_secs() - cpu0;
    if nginx_source {
        println!(
            "harvest baseline:       {n} resources in {ours:.2} s = {:.0} resources/s (harvester CPU {cpu_ours:.1} s = {:.0} µs per resource)",
            n as f64 / ours,
            cpu_ours * 1e6 / n as f64
        );
    } else {
        println!(
            "harvest baseline:       {n} resources in {ours:.2} s = {:.0} resources/s (server + harvester CPU {cpu_ours:.1} s)",
            n as f64 / ours
        );
    }

    if std::env::args().any(|a| a == "--ours-only") {
        return stop_all(nginx, htx, harvester, stop_tx, server).await;
    }

    // The reference client, same source, same run.
    let dest = tmp.path().join("mirror-resync");
    std::fs::create_dir_all(&dest)?;
    let map = format!("{served}/files/bench/={}", dest.display());
    let cap = format!("{served}/sets/bench/capabilitylist.xml");
    let t = Instant::now();
    let (cpu0, child0) = cpu();
    let out = tokio::task::spawn_blocking({
        let dir = tmp.path().to_path_buf();
        move || {
            std::process::Command::new(resync_sync())
                .current_dir(dir)
                .args(["--baseline", "--capabilitylist", &cap, &map])
                .output()
        }
    })
    .await??;
    let theirs = t.elapsed().as_secs_f64();
    let (cpu1, child1) = cpu();
    let cpu_server = cpu1 - cpu0;
    let text = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        !text.contains("Traceback") && !text.contains("FatalError"),
        "resync-sync failed:\n{text}"
    );
    let copied = walk_count(&dest);
    if nginx_source {
        println!(
            "resync-sync --baseline: {copied} resources in {theirs:.2} s = {:.0} resources/s (its CPU {:.1} s = {:.0} µs per resource)",
            copied as f64 / theirs,
            child1 - child0,
            (child1 - child0) * 1e6 / copied.max(1) as f64
        );
    } else {
        println!(
            "resync-sync --baseline: {copied} resources in {theirs:.2} s = {:.0} resources/s (server CPU {cpu_server:.1} s)",
            copied as f64 / theirs
        );
    }
    println!(
        "ratio (ours / resync):  {:.1}x",
        (n as f64 / ours) / (copied as f64 / theirs)
    );
    if nginx.is_some() {
        return stop_all(nginx, htx, harvester, stop_tx, server).await;
    }

    // Push latency: commit -> file written at the destination.
    let mut commits = Vec::with_capacity(changes);
    let gap = Duration::from_micros(1_000_000 / rate.max(1));
    let mut next = Instant::now();
    for k in 0..changes {
        let i = k % n;
        let rel = format!("d{}/r{i}.txt", i % 100);
        let body = format!("updated {k}\n");
        std::fs::write(root.join(&rel), &body)?;
        tokio::time::sleep_until(next.into()).await;
        next += gap;
        common::post_ingest(&client, &ingest, line(&rel, &body, "updated")).await?;
        commits.push((
            format!("{base}/files/bench/{rel}"),
            resourcesync_hub::model::Timestamp::now(),
        ));
    }
    let watched = db.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let s = State::open(&watched)?;
        let set_id = s.sets()?[0].id;
        while s.applied_count(set_id)? < changes as u64 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    })
    .await??;
    let lat = common::push_latencies(&db, &commits)?;
    println!(
        "push: {changes} updates at {rate}/s: {} applied; commit -> file written p50 {:.1} ms, p99 {:.1} ms",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99)
    );
    stop_all(None, htx, harvester, stop_tx, server).await
}

type Stop = tokio::sync::oneshot::Sender<()>;
type Running = tokio::task::JoinHandle<anyhow::Result<()>>;

/// Stops nginx (when it served), the harvester, then our server.
async fn stop_all(
    nginx: Option<std::process::Child>,
    harvester_stop: Stop,
    harvester: Running,
    server_stop: Stop,
    server: Running,
) -> anyhow::Result<()> {
    if let Some(mut nginx) = nginx {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &nginx.id().to_string()])
            .status();
        let _ = nginx.wait();
    }
    let _ = harvester_stop.send(());
    harvester.await??;
    let _ = server_stop.send(());
    server.await??;
    Ok(())
}

fn walk_count(dir: &Path) -> usize {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .count()
}
