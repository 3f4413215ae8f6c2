//! Benchmark: generate every Resource List page of a large set from the embedded store.
//!
//! ```text
//! cargo run --release --example bench_source -- [--resources 1000000] [--data-dir /tmp/rshub-bench]
//! ```
//!
//! Populates the set once (kept in the data directory for later runs), then re-runs itself
//! as a fresh process so the figures are the generator's own: part 20 served cold, then every
//! page (index + parts) with entries/s and the process's peak RSS (VmHWM).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use resourcesync_hub::config::Config;
use resourcesync_hub::model::{ChangeType, Location, NewChange, ResourceMeta, SetName, Timestamp};
use resourcesync_hub::source::{DocKind, Source};
use resourcesync_hub::store::Store;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: u64 = arg("--resources").map_or(1_000_000, |s| s.parse().expect("--resources N"));
    let dir = PathBuf::from(arg("--data-dir").unwrap_or_else(|| "/tmp/rshub-bench".into()));
    let mut config = Config::defaults();
    config.server.data_dir = dir.clone();
    config.server.base_url = "http://bench.example".into();
    // A fresh page cache: every page is built (none read back from an earlier run).
    let cache = tempfile::tempdir()?;
    config.source.cache_dir = cache.path().to_string_lossy().into_owned();
    let config = Arc::new(config);
    let store = Store::open_embedded(&config.database_path())?;
    let set = SetName::parse("bench").map_err(anyhow::Error::msg)?;
    let source = Source::open(Arc::new(resourcesync_hub::context::Context::new(
        config.clone(),
        store.clone(),
        Default::default(),
    )))?;

    if std::env::var_os("RSHUB_BENCH_PHASE").is_none() {
        let have = store.counts(&set).await?.resources;
        if have != n {
            if have != 0 {
                anyhow::bail!(
                    "{} holds {have} resources, not {n}: remove it first",
                    dir.display()
                );
            }
            let t = Instant::now();
            let policy = source.context().list_policy(&set);
            let md5 = "0cc175b9c0f1b6a831c399e269772661".to_string();
            for start in (0..n).step_by(20_000) {
                let batch = (start..(start + 20_000).min(n))
                    .map(|i| {
                        let location =
                            Location::rel_path(format!("collection-{}/paper-{i:08}.pdf", i % 100));
                        NewChange {
                            key: location.key(&source.context().set_config(&set)).unwrap(),
                            location,
                            change: ChangeType::Created,
                            datetime: None,
                            meta: ResourceMeta {
                                length: Some(1000 + i),
                                md5: Some(md5.clone()),
                                mime: Some("application/pdf".into()),
                                lastmod: Some(Timestamp::from_secs(1_600_000_000 + i as i64)),
                                ln: vec![],
                            },
                        }
                    })
                    .collect();
                store.apply(&set, batch, policy, Timestamp::now()).await?;
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "populated {n} resources in {s:.1} s ({:.0} changes/s through the atomic apply)",
                n as f64 / s
            );
        }
        drop(store);
        let status = std::process::Command::new(std::env::current_exe()?)
            .args(std::env::args().skip(1))
            .env("RSHUB_BENCH_PHASE", "generate")
            .status()?;
        std::process::exit(status.code().unwrap_or(1));
    }

    // A fresh process: nothing cached in the page cache, SQLite's cache empty.
    let parts = store.parts(&set).await?;
    let cold_no = parts
        .get(19)
        .map_or(parts.last().map_or(1, |p| p.no), |p| p.no);
    let t = Instant::now();
    let cold = source
        .document(&DocKind::ResourceListPart(set.clone(), cold_no))
        .await?;
    println!(
        "part {cold_no} served cold: {:.1} ms ({} entries, {:.1} MB)",
        t.elapsed().as_secs_f64() * 1e3,
        cold.entries(),
        cold.len(false) as f64 / 1e6
    );

    let t = Instant::now();
    let index = source.document(&DocKind::ResourceList(set.clone())).await?;
    let mut entries = 0usize;
    let mut bytes = index.len(false);
    for p in &parts {
        let doc = source
            .document(&DocKind::ResourceListPart(set.clone(), p.no))
            .await?;
        entries += doc.entries();
        bytes += doc.len(false);
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "every page: index + {} parts, {entries} entries, {:.0} MB of XML in {s:.2} s = {:.0} entries/s",
        parts.len(),
        bytes as f64 / 1e6,
        entries as f64 / s
    );
    println!(
        "peak RSS (VmHWM) of the generating process: {:.1} MB",
        peak_rss_mb()
    );
    let (memory, disk) = source.cache_bytes();
    println!(
        "page cache: {:.1} MB in memory, {:.1} MB on disk",
        memory as f64 / 1e6,
        disk as f64 / 1e6
    );
    Ok(())
}
