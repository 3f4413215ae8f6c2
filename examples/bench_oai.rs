//! bench_oai: the OAI-PMH repository at `/oai`, beside the Resource List of the same set.
//!
//! A set of `--records` (default 100,000) `oai_dc` records of about 2 KB, ingested into the
//! real server running as a child process (so its CPU and memory are its own). Then:
//! 1. one client walks `ListRecords` through its tokens (pages of 500), twice: the first walk
//!    makes every page, the second is sent the pages the first kept; records/s, MB/s and
//!    server CPU per record; the same client fetches the set's Resource List (index and parts):
//!    MB/s; the ratio of the second walk's to it. The client takes from a page what it needs to
//!    go on (its identifiers and token, searched for) as it takes the Resource List's parts
//!    without parsing them; an untimed walk then parses every page as our collector does;
//! 2. `--harvesters` (50) clients walk `ListRecords` at once while 500 changes a second are
//!    ingested: records/s, p99 page time, the server's peak RSS, and records a walk got twice
//!    or not at all (every record exists throughout: there should be none).
//!
//! `--no-kept-lists` runs the server with `oai.list_cache_max_bytes = 0` (every page made).
//!
//!     cargo run --release --example bench_oai [-- --records N --harvesters N --no-kept-lists]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{arg, percentile};

fn dc(k: usize, version: u32) -> String {
    let words = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua. ";
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<oai_dc:dc xmlns:oai_dc=\"http://www.openarchives.org/OAI/2.0/oai_dc/\" xmlns:dc=\"http://purl.org/dc/elements/1.1/\">\
         <dc:title>Record {k} v{version}</dc:title><dc:creator>Author, A.</dc:creator><dc:date>2026-11-01</dc:date>\
         <dc:description>{}</dc:description></oai_dc:dc>\n",
        words.repeat(16)
    )
}

fn config(dir: &Path, keep_lists: bool) -> resourcesync_hub::config::Config {
    let mut c = common::bench_server_config(&dir.join("data"), &dir.join("root"));
    if !keep_lists {
        c.oai.list_cache_max_bytes = 0;
    }
    c.sets.get_mut("bench").expect("the bench set").oai =
        Some(resourcesync_hub::config::OaiFormat::oai_dc());
    c.notify.enabled = false;
    c
}

fn write_record(root: &Path, k: usize, version: u32) -> anyhow::Result<String> {
    let rel = format!("r{:02x}/{k}.xml", k % 256);
    let body = dc(k, version);
    let p = root.join(&rel);
    std::fs::create_dir_all(p.parent().expect("a folder"))?;
    // Replaced whole (a reader never sees half a record), as a feeder must.
    let tmp = p.with_extension("part");
    std::fs::write(&tmp, &body)?;
    std::fs::rename(&tmp, &p)?;
    Ok(common::ingest_line(
        &rel,
        &body,
        if version == 1 { "created" } else { "updated" },
    )
    .replace("text/plain", "application/xml"))
}

/// What a walk got.
struct Walked {
    records: usize,
    /// Records whose identifier came again.
    repeated: usize,
    bytes: usize,
    /// Page times (ms).
    times: Vec<f64>,
}

/// A page's header identifiers and its resumption token, found by searching its text, as a
/// client fetching it (like the Resource List's, whose parts are not parsed) needs them.
fn scan(body: &[u8]) -> anyhow::Result<(Vec<&[u8]>, Option<String>)> {
    let mut ids = Vec::new();
    for at in memchr::memmem::find_iter(body, b"<identifier>") {
        let from = at + b"<identifier>".len();
        let len =
            memchr::memchr(b'<', &body[from..]).ok_or_else(|| anyhow::anyhow!("cut short"))?;
        ids.push(&body[from..from + len]);
    }
    let token = match memchr::memmem::rfind(body, b"<resumptionToken") {
        None => None,
        Some(at) => {
            let end =
                memchr::memchr(b'>', &body[at..]).ok_or_else(|| anyhow::anyhow!("cut short"))? + at;
            if body[end - 1] == b'/' {
                None
            } else {
                let len = memchr::memchr(b'<', &body[end..])
                    .ok_or_else(|| anyhow::anyhow!("cut short"))?;
                Some(String::from_utf8(body[end + 1..end + len].to_vec())?)
                    .filter(|t| !t.is_empty())
            }
        }
    };
    Ok((ids, token))
}

/// Walks a whole `ListRecords` (a page answered 503 is asked again after its Retry-After and
/// timed from the answer that had it); `parse`: each page parsed as our collector does,
/// otherwise searched for its identifiers and token.
async fn walk(client: &reqwest::Client, base: &str, parse: bool) -> anyhow::Result<Walked> {
    let mut url = format!("{base}/oai?verb=ListRecords&metadataPrefix=oai_dc");
    let (mut records, mut bytes, mut times) = (0, 0, Vec::new());
    let state = std::collections::hash_map::RandomState::new();
    let mut seen = std::collections::HashSet::new();
    let mut repeated = 0;
    loop {
        let t = Instant::now();
        let r = client.get(&url).send().await?;
        if r.status() == 503 {
            // Every build slot taken: come back when told, as a harvester does.
            let wait = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .unwrap_or(1);
            tokio::time::sleep(Duration::from_secs(wait)).await;
            continue;
        }
        let body = r.bytes().await?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        bytes += body.len();
        let token = if parse {
            let page = resourcesync_hub::collect::oai::parse_list(&body)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            anyhow::ensure!(page.quarantined.is_empty(), "{:?}", page.quarantined);
            records += page.records.len();
            for r in &page.records {
                use std::hash::BuildHasher as _;
                if !seen.insert(state.hash_one(r.header.identifier.as_bytes())) {
                    repeated += 1;
                }
            }
            page.token.map(|t| t.value).filter(|v| !v.is_empty())
        } else {
            let (ids, token) = scan(&body)?;
            records += ids.len();
            for id in ids {
                use std::hash::BuildHasher as _;
                if !seen.insert(state.hash_one(id)) {
                    repeated += 1;
                }
            }
            token
        };
        match token {
            Some(t) => {
                url = format!(
                    "{base}/oai?verb=ListRecords&resumptionToken={}",
                    url::form_urlencoded::byte_serialize(t.as_bytes()).collect::<String>()
                )
            }
            None => {
                return Ok(Walked {
                    records,
                    repeated,
                    bytes,
                    times,
                })
            }
        }
    }
}

/// Fetches the set's Resource List, index and parts; bytes.
async fn resource_list(client: &reqwest::Client, base: &str) -> anyhow::Result<usize> {
    let index = client
        .get(format!("{base}/sets/bench/resourcelist.xml"))
        .send()
        .await?
        .bytes()
        .await?;
    let mut bytes = index.len();
    let doc = resourcesync_hub::sitemap::parse(&index).map_err(|e| anyhow::anyhow!("{e}"))?;
    if doc.is_index {
        for e in doc.entries {
            let path = url::Url::parse(&e.loc)?.path().to_string();
            bytes += client
                .get(format!("{base}{path}"))
                .send()
                .await?
                .bytes()
                .await?
                .len();
        }
    }
    Ok(bytes)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let keep_lists = !args.iter().any(|a| a == "--no-kept-lists");
        return common::run_child_server(config(&PathBuf::from(&args[i + 1]), keep_lists)).await;
    }
    let records = arg("--records", 100_000) as usize;
    let harvesters = arg("--harvesters", 50) as usize;
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join("root");
    let mut server = std::process::Command::new(std::env::current_exe()?)
        .arg("--child")
        .arg(tmp.path())
        .args(
            args.iter()
                .filter(|a| *a == "--no-kept-lists")
                .collect::<Vec<_>>(),
        )
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let addr = {
        use std::io::BufRead;
        let mut out = std::io::BufReader::new(server.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line)?;
        line.strip_prefix("LISTENING ")
            .map(|a| a.trim().to_string())
            .ok_or_else(|| anyhow::anyhow!("our server said {line:?}"))?
    };
    let pid = server.id().to_string();
    let base = format!("http://{addr}");
    let client = reqwest::Client::builder().no_proxy().build()?;
    let ingest = format!("{base}/api/v1/resource-sets/bench/changes");
    let mut lines = Vec::new();
    for k in 0..records {
        lines.push(write_record(&root, k, 1)?);
        if lines.len() == 5_000 {
            common::post_ingest(&client, &ingest, std::mem::take(&mut lines).join("\n")).await?;
        }
    }
    if !lines.is_empty() {
        common::post_ingest(&client, &ingest, lines.join("\n")).await?;
    }
    println!(
        "set: {records} oai_dc records of {} bytes, ingested",
        dc(1, 1).len()
    );

    // 1. One client: a first walk (every page made, the files read into the page cache),
    // then the same list again (its pages kept from the first).
    let mut oai_mbs = 0.0;
    for walk_no in ["first walk (pages made)", "walked again (pages kept)"] {
        let (cpu0, t) = (common::proc_cpu_secs(&pid), Instant::now());
        let Walked {
            records: n,
            repeated,
            bytes,
            times,
        } = walk(&client, &base, false).await?;
        let (secs, cpu) = (
            t.elapsed().as_secs_f64(),
            common::proc_cpu_secs(&pid) - cpu0,
        );
        oai_mbs = bytes as f64 / 1e6 / secs;
        let mut times = times;
        times.sort_by(|a, b| a.total_cmp(b));
        println!(
            "ListRecords, one client, {walk_no}: {n} records ({repeated} repeated) in {secs:.1} s = {:.0} records/s, {oai_mbs:.1} MB/s; server CPU {:.0} µs a record; page p50 {:.0} ms, p99 {:.0} ms",
            n as f64 / secs,
            cpu * 1e6 / n as f64,
            percentile(&times, 0.5),
            percentile(&times, 0.99)
        );
    }
    // Once more, each page parsed as our collector does (untimed): the pages kept are whole.
    let checked = walk(&client, &base, true).await?;
    anyhow::ensure!(
        (checked.records, checked.repeated) == (records, 0),
        "a parsed walk got {} records, {} repeated",
        checked.records,
        checked.repeated
    );
    let _ = resource_list(&client, &base).await?;
    let t = Instant::now();
    let mut rl_bytes = 0;
    let mut rounds = 0;
    while t.elapsed() < Duration::from_secs(3) || rounds == 0 {
        rl_bytes += resource_list(&client, &base).await?;
        rounds += 1;
    }
    let rl_mbs = rl_bytes as f64 / 1e6 / t.elapsed().as_secs_f64();
    println!("Resource List, same client: {rl_mbs:.1} MB/s ({rounds} fetches); ListRecords walked again / Resource List: {:.2}", oai_mbs / rl_mbs);

    // 2. Many harvesters while ingest runs.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (client, ingest, root, stop) =
            (client.clone(), ingest.clone(), root.clone(), stop.clone());
        tokio::spawn(async move {
            let mut k = 0usize;
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                let lines: Vec<String> = (0..50)
                    .map(|i| write_record(&root, (k + i * 97) % records, 2).expect("a file"))
                    .collect();
                k += 50;
                common::post_ingest(&client, &ingest, lines.join("\n")).await?;
            }
            anyhow::Ok(k)
        })
    };
    let rss0 = common::proc_status_mb(&pid, "VmRSS:");
    let t = Instant::now();
    let mut walkers = Vec::new();
    for _ in 0..harvesters {
        let (client, base) = (client.clone(), base.clone());
        walkers.push(tokio::spawn(
            async move { walk(&client, &base, false).await },
        ));
    }
    let mut peak = rss0;
    let mut all_times = Vec::new();
    let (mut total, mut repeated, mut missing) = (0, 0, 0);
    for w in walkers {
        while !w.is_finished() {
            peak = peak.max(common::proc_status_mb(&pid, "VmRSS:"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let walked = w.await??;
        total += walked.records;
        repeated += walked.repeated;
        // Every record exists throughout (the writer only updates): each walk has them all.
        missing += records.saturating_sub(walked.records - walked.repeated);
        all_times.extend(walked.times);
    }
    let secs = t.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let changes = writer.await??;
    all_times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{harvesters} harvesters with 500 changes/s ingested ({changes} changes): {total} records ({repeated} repeated, {missing} missing) in {secs:.1} s = {:.0} records/s; page p50 {:.0} ms, p99 {:.0} ms; server RSS {rss0:.0} MB before, peak {peak:.0} MB (sampled every 100 ms)",
        total as f64 / secs,
        percentile(&all_times, 0.5),
        percentile(&all_times, 0.99)
    );
    drop(server.stdin.take());
    let _ = server.wait();
    Ok(())
}
