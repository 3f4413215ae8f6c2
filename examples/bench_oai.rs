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
//!
//! `--depth` measures instead what a page costs by how deep in its list it lies: a set of
//! `--identifiers` (10,000,000) resources walked with `ListIdentifiers`, one of `--records`
//! (1,000,000) `oai_dc` files walked with `ListRecords`, every Resource List part and closed
//! Change List of the large set fetched once (each made then), in order. Each list's first
//! and last pages (median of 10 each, 5 for parts and Change Lists) and their ratio. The sets
//! are made once in `--data-dir` (default `/tmp/rshub-depth`) through the store's own apply,
//! and kept for later runs.
//!
//!     cargo run --release --example bench_oai -- --depth [--identifiers N --records N]

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
    if args.iter().any(|a| a == "--depth") {
        return depth::run(&args).await;
    }
    let records = arg("--records", 100_000) as usize;
    let harvesters = arg("--harvesters", 50) as usize;
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join("root");
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg("--child")
        .arg(tmp.path())
        .args(args.iter().filter(|a| *a == "--no-kept-lists"))
        .env("RUST_LOG", "warn");
    let (mut server, addr) = common::spawn_child(cmd)?;
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

/// `--depth`: the cost of a page by its depth in its list.
mod depth {
    use std::path::{Path, PathBuf};
    use std::time::Instant;

    use resourcesync_hub::model::{
        ChangeType, Location, NewChange, ResourceMeta, SetName, Timestamp,
    };

    use super::common;

    const LARGE: &str = "bench";
    const FILES: &str = "records";

    fn config(dir: &Path) -> resourcesync_hub::config::Config {
        let mut c = common::bench_server_config(&dir.join("data"), &dir.join("large"));
        c.sets.insert(
            FILES.into(),
            resourcesync_hub::config::SetOverrides {
                resource_root_dir: Some(dir.join("files")),
                ..Default::default()
            },
        );
        for s in [LARGE, FILES] {
            c.sets.get_mut(s).expect("a set").oai =
                Some(resourcesync_hub::config::OaiFormat::oai_dc());
        }
        c.notify.enabled = false;
        c.dumps.enabled = false;
        // Each page made when asked (none kept from an earlier walk or run).
        c.oai.list_cache_max_bytes = 0;
        c.source.cache_dir = dir.join("page-cache").to_string_lossy().into_owned();
        c
    }

    fn record(k: u64) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<oai_dc:dc xmlns:oai_dc=\"http://www.openarchives.org/OAI/2.0/oai_dc/\" xmlns:dc=\"http://purl.org/dc/elements/1.1/\">\
             <dc:title>Record {k}</dc:title><dc:creator>Author, A.</dc:creator><dc:date>2026-11-01</dc:date>\
             <dc:description>Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua.</dc:description></oai_dc:dc>\n"
        )
    }

    /// Makes the two sets through the store's apply (20,000 changes a batch, as a large
    /// ingest would), unless the data directory has them already.
    async fn populate(dir: &Path, identifiers: u64, records: u64) -> anyhow::Result<()> {
        let config = std::sync::Arc::new(config(dir));
        let store = resourcesync_hub::store::Store::open_embedded(&config.database_path())?;
        for (name, n, files) in [(LARGE, identifiers, false), (FILES, records, true)] {
            let set = SetName::parse(name).map_err(anyhow::Error::msg)?;
            let have = store.counts(&set).await?.resources;
            if have == n {
                continue;
            }
            anyhow::ensure!(
                have == 0,
                "{} holds {have} resources in set {name}, not {n}: remove it first",
                dir.display()
            );
            let sc = config.set_config(name);
            let policy = resourcesync_hub::context::list_policy(&config, &set);
            let t = Instant::now();
            for start in (0..n).step_by(20_000) {
                let mut batch = Vec::with_capacity(20_000);
                for i in start..(start + 20_000).min(n) {
                    let rel = format!("r{:03}/{i:08}.xml", i % 1000);
                    let (length, md5) = if files {
                        let body = record(i);
                        let p = dir.join("files").join(&rel);
                        std::fs::create_dir_all(p.parent().expect("a folder"))?;
                        std::fs::write(&p, &body)?;
                        use md5::Digest as _;
                        (
                            body.len() as u64,
                            resourcesync_hub::digest::hex_digest(md5::Md5::digest(body.as_bytes())),
                        )
                    } else {
                        (
                            1000 + i % 1000,
                            "0cc175b9c0f1b6a831c399e269772661".to_string(),
                        )
                    };
                    let location = Location::rel_path(rel);
                    batch.push(NewChange {
                        key: location.key(&sc).map_err(anyhow::Error::msg)?,
                        location,
                        change: ChangeType::Created,
                        datetime: None,
                        meta: ResourceMeta {
                            length: Some(length),
                            md5: Some(md5),
                            mime: Some("application/xml".into()),
                            lastmod: Some(Timestamp::from_secs(1_600_000_000 + i as i64)),
                            ln: vec![],
                        },
                    });
                }
                store.apply(&set, batch, policy, Timestamp::now()).await?;
                if (start / 20_000) % 50 == 49 {
                    eprintln!("  {name}: {} of {n}", start + 20_000);
                }
            }
            println!(
                "set {name}: {n} resources made in {:.0} s",
                t.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }

    fn median(s: &[f64]) -> f64 {
        let mut v = s.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    }

    /// The first and last `n` pages (fewer for a short list), the median of each and the
    /// last's ratio to the first, and the median of each tenth of the list.
    fn report(what: &str, unit: &str, times: &[f64], n: usize) {
        let n = n.min(times.len() / 2).max(1);
        let (head, tail) = (&times[..n], &times[times.len() - n..]);
        let (first, last) = (median(head), median(tail));
        let ratio = last / first;
        // The curve in between: the median of each tenth of the list.
        let tenths: Vec<String> = (0..10)
            .map(|d| {
                let (a, b) = (
                    times.len() * d / 10,
                    (times.len() * (d + 1) / 10).max(times.len() * d / 10 + 1),
                );
                format!("{:.1}", median(&times[a..b.min(times.len())]))
            })
            .collect();
        let each = |s: &[f64]| {
            s.iter()
                .map(|t| format!("{t:.1}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "{what}: {} {unit}; first {n}: median {first:.1} ms, last {n}: {last:.1} ms, last/first {ratio:.2}; median of each tenth: {} ms\n    first: {} ms; last: {} ms",
            times.len(),
            tenths.join(" "),
            each(head),
            each(tail)
        );
    }

    /// Walks a list through its tokens, each page timed from request to its last byte.
    async fn walk(
        client: &reqwest::Client,
        base: &str,
        query: &str,
    ) -> anyhow::Result<(usize, Vec<f64>)> {
        let mut url = format!("{base}/oai?{query}");
        let (mut items, mut times) = (0, Vec::new());
        loop {
            let t = Instant::now();
            let r = client.get(&url).send().await?;
            anyhow::ensure!(r.status() == 200, "{url}: {}", r.status());
            let body = r.bytes().await?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            let (ids, token) = super::scan(&body)?;
            items += ids.len();
            match token {
                Some(t) => {
                    url = format!(
                        "{base}/oai?verb={}&resumptionToken={}",
                        if query.contains("ListRecords") {
                            "ListRecords"
                        } else {
                            "ListIdentifiers"
                        },
                        url::form_urlencoded::byte_serialize(t.as_bytes()).collect::<String>()
                    )
                }
                None => return Ok((items, times)),
            }
        }
    }

    /// Fetches each of `urls` once, in order, timed.
    async fn fetch_each(
        client: &reqwest::Client,
        base: &str,
        urls: &[String],
    ) -> anyhow::Result<Vec<f64>> {
        let mut times = Vec::new();
        for u in urls {
            let path = url::Url::parse(u)?.path().to_string();
            let t = Instant::now();
            let r = client.get(format!("{base}{path}")).send().await?;
            anyhow::ensure!(r.status() == 200, "{path}: {}", r.status());
            r.bytes().await?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        Ok(times)
    }

    /// The `<loc>`s of an index document.
    /// The documents of a list: an index's `<loc>`s, or the list itself when it is small
    /// enough to need none.
    async fn locs(client: &reqwest::Client, url: &str) -> anyhow::Result<Vec<String>> {
        let body = client.get(url).send().await?.bytes().await?;
        let doc = resourcesync_hub::sitemap::parse(&body).map_err(|e| anyhow::anyhow!("{e}"))?;
        if !doc.is_index {
            return Ok(vec![url.to_string()]);
        }
        Ok(doc.entries.into_iter().map(|e| e.loc).collect())
    }

    pub async fn run(args: &[String]) -> anyhow::Result<()> {
        let num = |name: &str, default: u64| super::arg(name, default);
        let identifiers = num("--identifiers", 10_000_000);
        let records = num("--records", 1_000_000);
        let dir = PathBuf::from(
            args.iter()
                .position(|a| a == "--data-dir")
                .and_then(|i| args.get(i + 1).cloned())
                .unwrap_or_else(|| "/tmp/rshub-depth".into()),
        );
        if args.iter().any(|a| a == "--depth-child") {
            return common::run_child_server(config(&dir)).await;
        }
        populate(&dir, identifiers, records).await?;
        let _ = std::fs::remove_dir_all(dir.join("page-cache"));
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        cmd.args(["--depth", "--depth-child", "--data-dir"])
            .arg(&dir)
            .env("RUST_LOG", "warn");
        let (mut server, addr) = common::spawn_child(cmd)?;
        let base = format!("http://{addr}");
        let client = reqwest::Client::builder().no_proxy().build()?;

        let t = Instant::now();
        let (n, times) = walk(
            &client,
            &base,
            &format!("verb=ListIdentifiers&metadataPrefix=oai_dc&set={LARGE}"),
        )
        .await?;
        anyhow::ensure!(
            n as u64 == identifiers,
            "ListIdentifiers listed {n} of {identifiers}"
        );
        println!(
            "ListIdentifiers, {n} headers walked in {:.0} s",
            t.elapsed().as_secs_f64()
        );
        report("  pages", "pages", &times, 10);

        let t = Instant::now();
        let (n, times) = walk(
            &client,
            &base,
            &format!("verb=ListRecords&metadataPrefix=oai_dc&set={FILES}"),
        )
        .await?;
        anyhow::ensure!(n as u64 == records, "ListRecords listed {n} of {records}");
        println!(
            "ListRecords, {n} records walked in {:.0} s",
            t.elapsed().as_secs_f64()
        );
        report("  pages", "pages", &times, 10);

        let parts = locs(&client, &format!("{base}/sets/{LARGE}/resourcelist.xml")).await?;
        let times = fetch_each(&client, &base, &parts).await?;
        report(
            &format!("Resource List parts of {LARGE} (each made when fetched)"),
            "parts",
            &times,
            5,
        );

        let lists = locs(&client, &format!("{base}/sets/{LARGE}/changelist.xml")).await?;
        let times = fetch_each(&client, &base, &lists).await?;
        report(
            &format!("Change Lists of {LARGE} (each made when fetched)"),
            "lists",
            &times,
            5,
        );

        drop(server.stdin.take());
        let _ = server.wait();
        Ok(())
    }
}
