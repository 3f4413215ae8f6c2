//! Benchmark: Ingestion 3 snapshots from the journal.
//!
//! ```text
//! cargo run --release --example bench_ingestion3 -- [--records 1000000] [--size 1024]
//!     [--changes 10000] [--dir /tmp/rshub-i3]
//! ```
//!
//! Journals `--records` XML records of `--size` bytes through the output (as the harvester
//! does, one `put` per resource), then writes the first complete snapshot from the journal,
//! then journals `--changes` updates and writes the next snapshot (previous snapshot streamed
//! back + the changes). Prints records/s and the process's peak RSS during each snapshot
//! (reset before each with /proc/self/clear_refs).

use std::path::PathBuf;
use std::time::Instant;

use resourcesync_hub::destination::config::{HarvestConfig, OutputKind};
use resourcesync_hub::destination::output::{ingestion3::Ingestion3, Item, Output};

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn peak_rss_mb() -> f64 {
    status_mb("VmHWM:")
}

fn status_mb(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn journal(o: &Ingestion3, from: u64, to: u64, size: usize, version: u64) -> anyhow::Result<()> {
    let filler = "x".repeat(size.saturating_sub(40));
    for i in from..to {
        let uri = format!("http://records.example.org/r/{i:08}");
        let path = o.download_path(&uri)?;
        std::fs::write(&path, format!("<r n=\"{i}\" v=\"{version}\">{filler}</r>"))?;
        let item = Item {
            set: "bench",
            uri: &uri,
            md5: "",
            length: 0,
            mime: Some("application/xml"),
            lastmod: None,
        };
        o.put(&item, &path)?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let records: u64 = arg("--records", 1_000_000);
    let size: usize = arg("--size", 1024);
    let changes: u64 = arg("--changes", 10_000);
    let dir = PathBuf::from(arg("--dir", "/tmp/rshub-i3".to_string()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = HarvestConfig::defaults();
    cfg.state.dir = dir.join("state");
    cfg.output.kind = OutputKind::Ingestion3;
    cfg.output.provider = "bench".into();
    cfg.output.root = dir.join("archive").to_string_lossy().into_owned();
    cfg.validate()?;
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let o = Ingestion3::open(&cfg)?;
        let t = Instant::now();
        journal(&o, 0, records, size, 1)?;
        let s = t.elapsed().as_secs_f64();
        println!(
            "journaled {records} records of {size} B in {s:.1} s ({:.0}/s)",
            records as f64 / s
        );
        let before = status_mb("VmRSS:");
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let t = Instant::now();
        let r = o.snapshot()?;
        let s = t.elapsed().as_secs_f64();
        println!(
            "first snapshot: {} records in {s:.1} s ({:.0} records/s), peak RSS {:.0} MB (RSS before: {before:.0} MB)",
            r.records,
            r.records as f64 / s,
            peak_rss_mb()
        );
        journal(&o, 0, changes.min(records), size, 2)?;
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let t = Instant::now();
        let r = o.snapshot()?;
        let s = t.elapsed().as_secs_f64();
        println!(
            "next snapshot (previous + {} updates): {} records in {s:.1} s ({:.0} records/s), peak RSS {:.0} MB",
            r.updated,
            r.records,
            r.records as f64 / s,
            peak_rss_mb()
        );
        Ok(())
    })
    .await??;
    Ok(())
}
