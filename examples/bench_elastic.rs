//! Benchmark: the server's own cost per Resource List page on the Elasticsearch backend, next
//! to the embedded store, on the same resources.
//!
//! ```text
//! cargo run --release --example bench_elastic -- [--resources 50000] [--part-size 10000] [--url http://127.0.0.1:9200] [--rounds 3]
//! ```
//!
//! Without `--url` it starts osmem-server (`pip install osmem-server`) on 127.0.0.1:0. It
//! ingests `--resources` resources into both stores through the store contract, then serves
//! every Resource List part `--rounds` times with a fresh source each time (no page cache) and
//! prints, per page: wall time, this process's CPU time (user + system, from /proc), the
//! search server's CPU time when it is a child of this process, and the requests sent to it.
//! The search server's own time is the wall time minus ours, roughly: osmem-server is slow, a
//! real Elasticsearch is faster, so the figures that describe the server are its CPU time and
//! its round trips.

use std::io::BufRead;
use std::sync::Arc;
use std::time::Instant;

use resourcesync_hub::config::{Config, SetOverrides};
use resourcesync_hub::model::{ChangeType, Location, NewChange, ResourceMeta, SetName, Timestamp};
use resourcesync_hub::source::{DocKind, Source};
use resourcesync_hub::store::{elastic, Store};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// User + system CPU seconds of a process, from /proc/<pid>/stat (clock ticks of 1/100 s).
fn cpu_secs(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// The tests' Python environment (`cargo test` creates it under target/) when it exists,
/// else the `python3` on PATH.
fn python() -> std::path::PathBuf {
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp/pyenv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

fn start_osmem() -> anyhow::Result<(String, std::process::Child)> {
    let out = std::process::Command::new(python())
        .args([
            "-c",
            "import osmem_server;print(osmem_server.resolve_binary())",
        ])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "osmem-server is not installed: run `cargo test` once (it installs the tests' Python tools under target/), or pass --url"
    );
    let bin = String::from_utf8(out.stdout)?.trim().to_string();
    let mut child = std::process::Command::new(bin)
        .args(["-addr", "127.0.0.1:0"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let v: serde_json::Value = serde_json::from_str(&line)?;
    Ok((v["url"].as_str().unwrap_or_default().to_string(), child))
}

async fn populate(config: &Config, store: &Store, set: &SetName, n: u64) -> anyhow::Result<f64> {
    if store.counts(set).await?.resources == n {
        return Ok(0.0);
    }
    let t = Instant::now();
    let policy = resourcesync_hub::context::list_policy(config, set);
    let sc = config.set_config(set.as_str());
    for start in (0..n).step_by(5000) {
        let batch = (start..(start + 5000).min(n))
            .map(|i| {
                let location =
                    Location::rel_path(format!("collection-{}/paper-{i:08}.pdf", i % 100));
                NewChange {
                    key: location.key(&sc).expect("a valid path"),
                    location,
                    change: ChangeType::Created,
                    datetime: None,
                    meta: ResourceMeta {
                        length: Some(1000 + i),
                        md5: Some("0cc175b9c0f1b6a831c399e269772661".into()),
                        mime: Some("application/pdf".into()),
                        lastmod: Some(Timestamp::from_secs(1_600_000_000 + i as i64)),
                        ln: vec![],
                    },
                }
            })
            .collect();
        store.apply(set, batch, policy, Timestamp::now()).await?;
    }
    Ok(t.elapsed().as_secs_f64())
}

async fn measure(
    name: &str,
    config: &Arc<Config>,
    store: Store,
    set: &SetName,
    rounds: usize,
    server_pid: Option<&str>,
) -> anyhow::Result<()> {
    let parts = store.parts(set).await?;
    let me = std::process::id().to_string();
    let (mut wall, mut cpu, mut server_cpu, mut requests, mut pages, mut entries) =
        (0.0, 0.0, 0.0, 0u64, 0usize, 0usize);
    for _ in 0..rounds {
        for p in &parts {
            // A fresh page cache each time: every page is built, none read back.
            let cache = tempfile::tempdir()?;
            let mut c = (**config).clone();
            c.source.cache_dir = cache.path().to_string_lossy().into_owned();
            let source = Source::open(Arc::new(resourcesync_hub::context::Context::new(
                Arc::new(c),
                store.clone(),
                Default::default(),
            )))?;
            let (c0, s0, r0, t) = (
                cpu_secs(&me),
                server_pid.map_or(0.0, cpu_secs),
                elastic::requests_sent(),
                Instant::now(),
            );
            let doc = source
                .document(&DocKind::ResourceListPart(set.clone(), p.no))
                .await?;
            wall += t.elapsed().as_secs_f64();
            cpu += cpu_secs(&me) - c0;
            server_cpu += server_pid.map_or(0.0, cpu_secs) - s0;
            requests += elastic::requests_sent() - r0;
            pages += 1;
            entries += doc.entries();
        }
    }
    let per = |x: f64| x / pages as f64 * 1e3;
    println!(
        "{name}: {pages} Resource List pages ({} entries each on average): per page wall {:.1} ms, our CPU {:.1} ms, \
         search server CPU {}, {:.1} requests to the search server",
        entries / pages.max(1),
        per(wall),
        per(cpu),
        server_pid.map_or("n/a".to_string(), |_| format!("{:.1} ms", per(server_cpu))),
        requests as f64 / pages as f64
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: u64 = arg("--resources").map_or(50_000, |s| s.parse().expect("--resources N"));
    let part: u32 = arg("--part-size").map_or(10_000, |s| s.parse().expect("--part-size N"));
    let rounds: usize = arg("--rounds").map_or(3, |s| s.parse().expect("--rounds N"));
    let (url, child) = match arg("--url") {
        Some(u) => (u, None),
        None => {
            let (u, c) = start_osmem()?;
            (u, Some(c))
        }
    };
    let server_pid = child.as_ref().map(|c| c.id().to_string());
    let tmp = tempfile_dir()?;
    let mut config = Config::defaults();
    config.server.data_dir = tmp.clone();
    config.server.base_url = "http://bench.example".into();
    config.sets.insert(
        "bench".into(),
        SetOverrides {
            max_items_in_list: Some(part),
            ..Default::default()
        },
    );
    config.store.elasticsearch.url = url.clone();
    let config = Arc::new(config);
    let set = SetName::parse("bench").map_err(anyhow::Error::msg)?;

    let embedded = Store::open_embedded(&config.database_path())?;
    let (es, _version) = Store::open_elasticsearch(&config.store.elasticsearch).await?;
    for (name, store) in [("embedded", &embedded), ("elasticsearch", &es)] {
        let s = populate(&config, store, &set, n).await?;
        if s > 0.0 {
            println!(
                "{name}: ingested {n} resources in {s:.1} s ({:.0} changes/s)",
                n as f64 / s
            );
        }
    }
    measure("embedded", &config, embedded, &set, rounds, None).await?;
    measure(
        &format!("elasticsearch at {url}"),
        &config,
        es,
        &set,
        rounds,
        server_pid.as_deref(),
    )
    .await?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("rshub-bench-elastic-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
