//! An external writer following the DIT-ES protocol (seeds 000/002): for every event it writes
//! a *resource* document (created/updated: the resource's current state; deleted: the
//! document removed) and a *change* document (the log) straight into Elasticsearch, with
//! plain HTTP `_bulk` requests and nothing from this crate. The server adopts such documents
//! and serves and notifies them like ingested ones.
//!
//! ```text
//! cargo run --example dit_writer -- --url http://127.0.0.1:9200 [--index omtd-resourcesync]
//!     [--set papers] [--resources 1000] [--updates 0] [--deletes 0] [--first 0] [--bulk 1000]
//!     [--only-changes]
//! ```
//!
//! With `--only-changes` the resources exist already: one `_bulk` (a second after start)
//! updates the first `--updates` and deletes the last `--deletes` of `--first`..`--first +
//! --resources`.
//!
//! Creates resources `--first`..`--first + --resources` (`http://example.org/papers/<n>`),
//! then updates the first `--updates` and deletes the last `--deletes` of them. Dates use the
//! seed's format (`yyyy-MM-dd'T'HH:mm:ssZ`, whole seconds), so the phases are a second apart:
//! changes to one resource within one second would have no defined order. `timestamp` is set
//! by the writer (no ingest pipeline is needed). Prints one JSON line with what it wrote.

use std::time::{Duration, Instant};

use serde_json::json;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn num(name: &str, default: usize) -> usize {
    arg(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} takes a number, not {v:?}"))
    })
}

/// Now in the seed's date format.
fn seed_now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%z").to_string()
}

struct Writer {
    client: reqwest::Client,
    url: String,
    index: String,
    set: String,
    ops: String,
    pending: usize,
    bulk: usize,
    written: usize,
}

impl Writer {
    fn resource_id(&self, n: usize) -> String {
        format!("{}-{n}", self.set)
    }

    fn push(&mut self, action: serde_json::Value, doc: Option<serde_json::Value>) {
        self.ops.push_str(&action.to_string());
        self.ops.push('\n');
        if let Some(d) = doc {
            self.ops.push_str(&d.to_string());
            self.ops.push('\n');
        }
    }

    /// One event: the resource document, then the change document.
    async fn event(&mut self, n: usize, change: &str) -> anyhow::Result<()> {
        let now = seed_now();
        let location = json!({"type": "url", "value": format!("http://example.org/papers/{n}")});
        let id = self.resource_id(n);
        let md5 = format!("{:032x}", (n as u128) * 7919 + change.len() as u128);
        let length = 1000 + n;
        if change == "deleted" {
            self.push(
                json!({"delete": {"_index": format!("{}-resource", self.index), "_id": id}}),
                None,
            );
        } else {
            let doc = json!({"resource_set": self.set, "location": location, "length": length, "md5": md5,
                             "mime": "application/pdf", "lastmod": now, "timestamp": now});
            self.push(
                json!({"index": {"_index": format!("{}-resource", self.index), "_id": id}}),
                Some(doc),
            );
        }
        let mut doc = json!({"resource_set": self.set, "location": location, "change": change, "datetime": now, "timestamp": now});
        if change != "deleted" {
            (doc["lastmod"], doc["length"], doc["md5"], doc["mime"]) = (
                json!(now),
                json!(length),
                json!(md5),
                json!("application/pdf"),
            );
        }
        self.push(
            json!({"index": {"_index": format!("{}-change", self.index)}}),
            Some(doc),
        );
        self.pending += 1;
        if self.pending >= self.bulk {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        if self.ops.is_empty() {
            return Ok(());
        }
        let body = std::mem::take(&mut self.ops);
        let r = self
            .client
            .post(format!("{}/_bulk", self.url))
            .header("content-type", "application/x-ndjson")
            .body(body)
            .send()
            .await?;
        let status = r.status();
        let v: serde_json::Value = r.json().await?;
        if !status.is_success() || v["errors"] == json!(true) {
            anyhow::bail!(
                "bulk write failed ({status}): {}",
                v.to_string().chars().take(500).collect::<String>()
            );
        }
        self.written += self.pending;
        self.pending = 0;
        Ok(())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let url = arg("--url").ok_or_else(|| anyhow::anyhow!("--url http://host:9200 is required"))?;
    let (resources, updates, deletes, first) = (
        num("--resources", 1000),
        num("--updates", 0),
        num("--deletes", 0),
        num("--first", 0),
    );
    anyhow::ensure!(
        updates <= resources && deletes <= resources,
        "--updates and --deletes cannot exceed --resources"
    );
    let mut w = Writer {
        client: reqwest::Client::builder().no_proxy().build()?,
        url: url.trim_end_matches('/').to_string(),
        index: arg("--index").unwrap_or_else(|| "omtd-resourcesync".into()),
        set: arg("--set").unwrap_or_else(|| "papers".into()),
        ops: String::new(),
        pending: 0,
        bulk: num("--bulk", 1000).max(1),
        written: 0,
    };
    let started = Instant::now();
    if std::env::args().any(|a| a == "--only-changes") {
        anyhow::ensure!(
            updates + deletes <= resources,
            "with --only-changes, --updates and --deletes together cannot exceed --resources"
        );
        tokio::time::sleep(Duration::from_millis(1100)).await;
        w.bulk = usize::MAX;
        for n in first..first + updates {
            w.event(n, "updated").await?;
        }
        for n in first + resources - deletes..first + resources {
            w.event(n, "deleted").await?;
        }
        w.flush().await?;
        println!(
            "{}",
            json!({"events": w.written, "updated": updates, "deleted": deletes,
                   "seconds": started.elapsed().as_secs_f64()})
        );
        return Ok(());
    }
    for n in first..first + resources {
        w.event(n, "created").await?;
    }
    w.flush().await?;
    for (range, change) in [
        (first..first + updates, "updated"),
        (first + resources - deletes..first + resources, "deleted"),
    ] {
        if range.is_empty() {
            continue;
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
        for n in range {
            w.event(n, change).await?;
        }
        w.flush().await?;
    }
    println!(
        "{}",
        json!({"events": w.written, "created": resources, "updated": updates, "deleted": deletes,
               "seconds": started.elapsed().as_secs_f64()})
    );
    Ok(())
}
