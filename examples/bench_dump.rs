//! Benchmark: Resource Dumps, built and used, beside the reference tools in one run.
//!
//! ```text
//! cargo run --release --example bench_dump -- [--files 100000] [--size 10240]
//!     [--stored] [--dir /tmp/rshub-dump]
//! ```
//!
//! 1. Writes `--files` files of `--size` bytes (XML-like records: metadata compresses about
//!    3:1) and ingests them into a set of our server.
//! 2. Starts the server with dumps on and times the build of the set's Resource Dump (start
//!    to `resourcedump.xml` served): MB/s of bitstreams packed, and the process's peak RSS
//!    during the build (reset before it with /proc/self/clear_refs).
//! 3. `resync-build --write-resourcedump` (PyPI `resync`: the tests' Python environment under
//!    target/ when present, else on PATH) on the same folder: MB/s and its peak RSS; the ratio.
//! 4. Baselines the set with our destination twice, over loopback: from the Resource Dump
//!    and from the Resource List (one GET per file), each into its own folder: wall times and
//!    the ratio.

mod common;
use common::arg;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use resourcesync_hub::config::{Config, DumpCompression};
use resourcesync_hub::destination::{self, config::BaselineFrom, config::HarvestConfig};

fn resync_build() -> PathBuf {
    common::py_tool("resync-build")
}

fn status_mb(path: &str, field: &str) -> f64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// A file of about `size` bytes: XML-like records with a pseudo-random token per line.
fn record(i: usize, size: usize) -> String {
    let mut s = String::with_capacity(size + 128);
    s.push_str("<record>\n");
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut n = 0;
    while s.len() < size.saturating_sub(10) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(&format!(
            "  <field n=\"{n}\">record {i} value {:016x} {}</field>\n",
            x,
            ["title", "creator", "subject", "date"][n % 4]
        ));
        n += 1;
    }
    s.push_str("</record>\n");
    s
}

fn source_config(tmp: &Path, root: &Path, dumps: bool, stored: bool) -> Config {
    let mut c = Config::defaults();
    c.server.data_dir = tmp.join("data");
    c.hub.allow_networks = vec!["127.0.0.0/8".parse().expect("a network")];
    c.notify.enabled = false;
    c.dumps.enabled = dumps;
    c.dumps.check_interval_secs = 1;
    if stored {
        c.dumps.compression = DumpCompression::Stored;
    }
    c.sets.insert(
        "bench".into(),
        resourcesync_hub::config::SetOverrides {
            resource_root_dir: Some(root.to_path_buf()),
            ..Default::default()
        },
    );
    c
}

struct Server {
    base: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn serve(c: Config) -> anyhow::Result<Server> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(resourcesync_hub::app::run(c, listener, async move {
        let _ = rx.await;
    }));
    Ok(Server { base, stop, task })
}

/// Baselines the set into `dir` from the dump or the Resource List; wall seconds.
async fn baseline(base: &str, dir: &Path, from: BaselineFrom) -> anyhow::Result<f64> {
    let mut hc = HarvestConfig::defaults();
    hc.source.url = format!("{base}/.well-known/resourcesync");
    hc.source.baseline = from;
    hc.state.dir = dir.join("state");
    hc.output.dir = dir.join("mirror");
    hc.follow.check_interval_secs = 3600;
    hc.push.enabled = false;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let t = Instant::now();
    let h = tokio::spawn(destination::run(hc.clone(), None, async move {
        let _ = rx.await;
    }));
    let db = hc.database_path();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        while !db.exists() {
            std::thread::sleep(Duration::from_millis(20));
        }
        let s = destination::state::State::open(&db)?;
        while !s.sets()?.first().is_some_and(|r| r.baseline_done) {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    })
    .await??;
    let secs = t.elapsed().as_secs_f64();
    let _ = tx.send(());
    h.await??;
    Ok(secs)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let n = arg("--files", 100_000) as usize;
    let size = arg("--size", 10_240) as usize;
    let stored = std::env::args().any(|a| a == "--stored");
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

    // 1. The set.
    let server = serve(source_config(tmp.path(), &root, false, stored)).await?;
    let client = reqwest::Client::builder().no_proxy().build()?;
    let ingest = format!("{}/api/v1/resource-sets/bench/changes", server.base);
    let t = Instant::now();
    let mut batch = Vec::new();
    let mut bytes = 0u64;
    for i in 0..n {
        use md5::{Digest, Md5};
        let rel = format!("d{}/r{i}.xml", i % 100);
        let body = record(i, size);
        bytes += body.len() as u64;
        std::fs::create_dir_all(root.join(format!("d{}", i % 100)))?;
        std::fs::write(root.join(&rel), &body)?;
        batch.push(format!(
            r#"{{"change":"created","location":{{"type":"rel_path","value":"{rel}"}},"length":{},"md5":"{}","mime":"application/xml"}}"#,
            body.len(),
            resourcesync_hub::digest::hex_digest(Md5::digest(body.as_bytes()))
        ));
        if batch.len() == 5000 || i + 1 == n {
            let r = client
                .post(&ingest)
                .header("content-type", "application/x-ndjson")
                .body(batch.join("\n"))
                .send()
                .await?;
            anyhow::ensure!(r.status().is_success(), "ingest: {}", r.text().await?);
            batch.clear();
        }
    }
    let _ = server.stop.send(());
    server.task.await??;
    let mb = bytes as f64 / 1e6;
    println!(
        "source: {n} files, {mb:.0} MB, written and ingested in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // 2. Our Resource Dump, built by the server at start.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = status_mb("/proc/self/status", "VmRSS:");
    let t = Instant::now();
    let server = serve(source_config(tmp.path(), &root, true, stored)).await?;
    let rd_url = format!("{}/sets/bench/resourcedump.xml", server.base);
    while client.get(&rd_url).send().await?.status() != 200 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let wall = t.elapsed().as_secs_f64();
    let peak = status_mb("/proc/self/status", "VmHWM:");
    // The build itself: from its start (the generation's name, in µs) to its `completed`.
    let info: serde_json::Value = serde_json::from_slice(&std::fs::read(
        tmp.path().join("data/dumps/bench/rd/current.json"),
    )?)?;
    let started: i64 = info["generation"].as_str().unwrap_or("0").parse()?;
    let completed =
        resourcesync_hub::model::Timestamp::parse(info["completed"].as_str().unwrap_or(""))
            .map_err(anyhow::Error::msg)?;
    let ours = (completed.0 - started) as f64 / 1e6;
    let packed: u64 = walkdir::WalkDir::new(tmp.path().join("data/dumps"))
        .into_iter()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "zip"))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum();
    println!(
        "ours:   Resource Dump of {n} files built in {ours:.2} s = {:.0} MB/s (server start to dump served {wall:.2} s; {} compression, {:.0} MB of packages), peak RSS {peak:.0} MB (RSS before {before:.0} MB)",
        mb / ours,
        if stored { "stored" } else { "deflate level 1" },
        packed as f64 / 1e6
    );

    // 3. The reference tool on the same folder.
    let out_dir = tmp.path().join("resync-dump");
    std::fs::create_dir_all(&out_dir)?;
    let map = format!("{}/files/bench/={}", server.base, root.display());
    let t = Instant::now();
    let mut child = std::process::Command::new(resync_build())
        .current_dir(tmp.path())
        .args(["--write-resourcedump", "--outfile"])
        .arg(out_dir.join("resourcedump.xml"))
        .arg(&map)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let status_path = format!("/proc/{}/status", child.id());
    let mut theirs_peak: f64 = 0.0;
    let status = loop {
        theirs_peak = theirs_peak.max(status_mb(&status_path, "VmHWM:"));
        if let Some(s) = child.try_wait()? {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let theirs = t.elapsed().as_secs_f64();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("piped"), &mut err)?;
    anyhow::ensure!(
        status.success() && !err.contains("Traceback"),
        "resync-build failed:\n{err}"
    );
    println!(
        "resync: resync-build --write-resourcedump in {theirs:.2} s = {:.1} MB/s, peak RSS {theirs_peak:.0} MB",
        mb / theirs
    );
    println!("ratio (ours / resync): {:.1}x", theirs / ours);

    // 4. Baselines over loopback, same server, same run.
    let from_dump = baseline(&server.base, &tmp.path().join("h-dump"), BaselineFrom::Dump).await?;
    let from_list = baseline(
        &server.base,
        &tmp.path().join("h-list"),
        BaselineFrom::ResourceList,
    )
    .await?;
    println!(
        "baseline from the Resource Dump: {from_dump:.2} s; from the Resource List: {from_list:.2} s; ratio {:.1}x",
        from_list / from_dump
    );
    let _ = server.stop.send(());
    server.task.await??;
    Ok(())
}
