//! bench_collect: the OAI-PMH collector against PyPI `oaipmh-scythe` (the maintained Sickle),
//! in the same run, on the same repository.
//!
//! The repository is `--records` (default 100,000) records of about 2 KB, `--page` (500) to a
//! page, pre-rendered as ListRecords pages on disk and served by a child process of this
//! benchmark (a file read per request: the repository is never the bottleneck). Ours is one
//! `collect --once`-style run in this process, writing the records' files and recording their
//! changes in an embedded store; theirs writes the same records to files. Printed: records/s,
//! harvester CPU per record and peak memory, for each, and the ratio.
//!
//! Then the push path: a server running the collector over `--latency-records` (5,000)
//! records, a `harvest` destination baselined from it and subscribed, and `--changes` (1,000)
//! records changed at the repository; an admin "run now" follows each change (as a
//! repository's own push, or an operator's cron, would): printed is change at the repository
//! → file at the destination, p50/p99.
//!
//!     cargo run --release --example bench_collect [-- --records N --changes N --dir D --ours-only]
//!
//! With `--kind resourcesync|activity|sitemap`, a collector of that kind instead (see
//! `kinds.rs`):
//!
//!     cargo run --release --example bench_collect -- --kind resourcesync [--resources N --push-sources 100 --changes 500]

#[path = "../common/mod.rs"]
mod common;
mod kinds;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{arg, percentile};
use resourcesync_hub::config::{CollectConfig, Config};
use resourcesync_hub::destination::{self, config::HarvestConfig, state::State};
use resourcesync_hub::model::{SetName, Timestamp};

const LOREM: &str = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat. ";

/// Resets the peak resident size (VmHWM) to the current one.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn oai(body: &str, verb: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<OAI-PMH xmlns=\"http://www.openarchives.org/OAI/2.0/\" xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:schemaLocation=\"http://www.openarchives.org/OAI/2.0/ http://www.openarchives.org/OAI/2.0/OAI-PMH.xsd\"><responseDate>{}</responseDate><request verb=\"{verb}\">http://127.0.0.1/oai</request>{body}</OAI-PMH>\n",
        chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ")
    )
}

fn record(k: usize, version: &str, datestamp: &str) -> String {
    let words = &LOREM[..(k * 7) % 150];
    format!(
        "<record><header><identifier>oai:bench:{k}</identifier><datestamp>{datestamp}</datestamp><setSpec>s{}</setSpec></header>\
         <metadata><oai_dc:dc xmlns:oai_dc=\"http://www.openarchives.org/OAI/2.0/oai_dc/\" xmlns:dc=\"http://purl.org/dc/elements/1.1/\" \
         xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:schemaLocation=\"http://www.openarchives.org/OAI/2.0/oai_dc/ http://www.openarchives.org/OAI/2.0/oai_dc.xsd\">\
         <dc:title>Record {k} {version}</dc:title><dc:creator>Author, A.</dc:creator><dc:creator>Author, B.</dc:creator><dc:date>2026-11-01</dc:date>\
         <dc:identifier>https://repository.example.org/record/{k}</dc:identifier><dc:description>{words}{LOREM}{LOREM}{LOREM}{LOREM}{LOREM}{LOREM}{LOREM}</dc:description></oai_dc:dc></metadata></record>",
        k % 3
    )
}

/// Writes the list pages `{prefix}{n}.xml` of these records (the last without a token).
fn write_pages(
    dir: &Path,
    prefix: &str,
    ks: &[usize],
    page: usize,
    version: &str,
    datestamp: &str,
) -> anyhow::Result<()> {
    let chunks: Vec<&[usize]> = ks.chunks(page).collect();
    for (n, chunk) in chunks.iter().enumerate() {
        let mut body = String::from("<ListRecords>");
        for &k in *chunk {
            body.push_str(&record(k, version, datestamp));
        }
        if n + 1 < chunks.len() {
            body.push_str(&format!("<resumptionToken cursor=\"{}\" completeListSize=\"{}\">{prefix}{}</resumptionToken>", n * page, ks.len(), n + 1));
        } else {
            body.push_str(&format!(
                "<resumptionToken cursor=\"{}\" completeListSize=\"{}\"/>",
                n * page,
                ks.len()
            ));
        }
        body.push_str("</ListRecords>");
        let tmp = dir.join(format!(".{prefix}{n}.xml"));
        std::fs::write(&tmp, oai(&body, "ListRecords"))?;
        std::fs::rename(tmp, dir.join(format!("{prefix}{n}.xml")))?;
    }
    Ok(())
}

fn write_identify(dir: &Path) -> anyhow::Result<()> {
    std::fs::write(
        dir.join("Identify.xml"),
        oai("<Identify><repositoryName>bench</repositoryName><baseURL>http://127.0.0.1/oai</baseURL><protocolVersion>2.0</protocolVersion><adminEmail>a@example.org</adminEmail><earliestDatestamp>2001-01-01T00:00:00Z</earliestDatestamp><deletedRecord>persistent</deletedRecord><granularity>YYYY-MM-DDThh:mm:ssZ</granularity></Identify>", "Identify"),
    )?;
    Ok(())
}

/// The repository (child process): `/oai?verb=Identify`, the first page `p0.xml`, a list
/// asked `from` a date starts at `c0.xml` (the changes, once written; else noRecordsMatch), a
/// token `X` is the page `X.xml`.
async fn serve_pages(dir: PathBuf) -> anyhow::Result<()> {
    use axum::extract::{Query, State};
    let app = axum::Router::new()
        .route(
            "/oai",
            axum::routing::get(|State(dir): State<Arc<PathBuf>>, Query(q): Query<HashMap<String, String>>| async move {
                let file = match (q.get("verb").map(String::as_str), q.get("resumptionToken"), q.contains_key("from")) {
                    (Some("Identify"), _, _) => "Identify.xml".to_string(),
                    (Some("ListRecords"), Some(t), _) => format!("{t}.xml"),
                    (Some("ListRecords"), None, true) => "c0.xml".into(),
                    (Some("ListRecords"), None, false) => "p0.xml".into(),
                    _ => return (axum::http::StatusCode::BAD_REQUEST, "bad verb").into_response(),
                };
                match tokio::fs::read(dir.join(&file)).await {
                    Ok(b) => ([("content-type", "text/xml; charset=utf-8")], b).into_response(),
                    Err(_) => (
                        [("content-type", "text/xml; charset=utf-8")],
                        oai("<error code=\"noRecordsMatch\">nothing in this window</error>", "ListRecords"),
                    )
                        .into_response(),
                }
            }),
        )
        .with_state(Arc::new(dir));
    use axum::response::IntoResponse;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("LISTENING {}", listener.local_addr()?);
    use std::io::Write;
    std::io::stdout().flush()?;
    let eof = tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = eof.await;
        })
        .await?;
    Ok(())
}

/// Starts the repository as a child process serving `dir`; its base URL.
fn start_repository(dir: &Path) -> anyhow::Result<(std::process::Child, String)> {
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg("--serve-pages").arg(dir);
    let (child, addr) = common::spawn_child(cmd)?;
    Ok((child, format!("http://{addr}/oai")))
}

fn collect_config(data: &Path, base: &str) -> Config {
    let mut c = Config::defaults();
    c.server.data_dir = data.to_path_buf();
    c.server.base_url = "http://127.0.0.1:1".into();
    c.hub.allow_networks = vec!["127.0.0.0/8".parse().expect("a network")];
    c.admin.token = "bench-admin-token".into();
    c.collect.insert("bench".into(), CollectConfig::new(base));
    c
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve-pages") {
        return serve_pages(PathBuf::from(&args[i + 1])).await;
    }
    if let Some(i) = args.iter().position(|a| a == "--kind") {
        let kind = args.get(i + 1).map_or("", String::as_str);
        if kind != "oai-pmh" {
            return kinds::run(kind, &args).await;
        }
    }
    let records = arg("--records", 100_000) as usize;
    let page = arg("--page", 500) as usize;
    // `--dir D`: work under D (a file system of one's choice; file creation dominates).
    let tmp = match args.iter().position(|a| a == "--dir") {
        Some(i) => tempfile::tempdir_in(&args[i + 1])?,
        None => tempfile::tempdir()?,
    };
    let pages = tmp.path().join("pages");
    std::fs::create_dir_all(&pages)?;
    write_identify(&pages)?;
    let ks: Vec<usize> = (0..records).collect();
    write_pages(&pages, "p", &ks, page, "v1", "2026-11-01T00:00:00Z")?;
    let bytes: u64 = std::fs::read_dir(&pages)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "repository: {records} records in {} pages of {page}, {:.0} MB ({:.1} KB a record)",
        records.div_ceil(page),
        bytes as f64 / 1e6,
        bytes as f64 / records as f64 / 1024.0
    );
    let (mut repo, base) = start_repository(&pages)?;

    // Ours: one run, in this process.
    let config = Arc::new(collect_config(&tmp.path().join("ours"), &base));
    let store = resourcesync_hub::app::open_store(&config).await?;
    store
        .ensure_set(
            &SetName::parse("bench").map_err(anyhow::Error::msg)?,
            Timestamp::now(),
        )
        .await?;
    let ctx = Arc::new(resourcesync_hub::context::Context::new(
        config.clone(),
        store,
        Default::default(),
    ));
    let collectors =
        resourcesync_hub::collect::Collectors::new(&config, ctx, Arc::new(|_| {}), "bench".into())
            .await?;
    reset_peak();
    let rss0 = common::proc_status_mb("self", "VmRSS:");
    let (t, cpu0) = (Instant::now(), common::proc_cpu_secs("self"));
    let out = collectors
        .once(None, &tokio_util::sync::CancellationToken::new())
        .await;
    let (secs, cpu) = (
        t.elapsed().as_secs_f64(),
        common::proc_cpu_secs("self") - cpu0,
    );
    let peak = common::proc_status_mb("self", "VmHWM:");
    for (name, r) in &out {
        println!(
            "  {name}: {}",
            r.as_ref()
                .map_or_else(|e| format!("FAILED: {e}"), |w| w.clone())
        );
    }
    let ours_rate = records as f64 / secs;
    println!(
        "ours:   {records} records in {secs:.1} s = {ours_rate:.0} records/s; CPU {:.0} µs a record; peak RSS {peak:.0} MB ({:+.0} MB over the start)",
        cpu * 1e6 / records as f64,
        peak - rss0
    );

    if !args.iter().any(|a| a == "--ours-only") {
        let py = common::py_tool("python");
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/common/scythe_collect.py");
        let o = std::process::Command::new(py)
            .arg(script)
            .arg(&base)
            .arg(tmp.path().join("scythe"))
            .output()?;
        anyhow::ensure!(
            o.status.success(),
            "scythe failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
        let n = v["records"].as_f64().unwrap_or(0.0);
        let rate = n / v["secs"].as_f64().unwrap_or(f64::NAN);
        println!(
            "scythe: {n} records in {:.1} s = {rate:.0} records/s; CPU {:.0} µs a record; peak RSS {:.0} MB",
            v["secs"].as_f64().unwrap_or(0.0),
            v["cpu_secs"].as_f64().unwrap_or(0.0) * 1e6 / n,
            v["max_rss_kb"].as_f64().unwrap_or(0.0) / 1024.0
        );
        println!("ours / scythe: {:.1}x records/s", ours_rate / rate);
    }
    drop(repo.stdin.take());
    let _ = repo.wait();

    let changes = arg("--changes", 1_000) as usize;
    if changes > 0 {
        latency(
            arg("--latency-records", 5_000) as usize,
            changes,
            page,
            tmp.path(),
        )
        .await?;
    }
    Ok(())
}

/// Change at the repository → file at a subscribed destination.
async fn latency(records: usize, changes: usize, page: usize, dir: &Path) -> anyhow::Result<()> {
    let pages = dir.join("latency-pages");
    std::fs::create_dir_all(&pages)?;
    write_identify(&pages)?;
    let ks: Vec<usize> = (0..records).collect();
    write_pages(&pages, "p", &ks, page, "v1", "2026-11-01T00:00:00Z")?;
    let (mut repo, base) = start_repository(&pages)?;
    let mut config = collect_config(&dir.join("latency-server"), &base);
    config.server.base_url = String::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stx, srx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(resourcesync_hub::app::run(config, listener, async move {
        let _ = srx.await;
    }));
    let client = reqwest::Client::builder().no_proxy().build()?;
    let status = |client: reqwest::Client| async move {
        client
            .get(format!("http://{addr}/admin/v1/collect/bench"))
            .bearer_auth("bench")
            .send()
            .await?
            .json::<serde_json::Value>()
            .await
    };
    loop {
        if status(client.clone())
            .await
            .is_ok_and(|v| v["last_ended"].is_string() && v["state"] != "running")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut hc = HarvestConfig::defaults();
    hc.source.url = format!("http://{addr}/.well-known/resourcesync");
    hc.state.dir = dir.join("latency-harvest");
    hc.output.dir = dir.join("latency-mirror");
    hc.follow.check_interval_secs = 3600;
    hc.push.listen = "127.0.0.1:0".into();
    let (htx, hrx) = tokio::sync::oneshot::channel::<()>();
    let hl = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let harvester = tokio::spawn(destination::run(hc.clone(), Some(hl), async move {
        let _ = hrx.await;
    }));
    let db = hc.database_path();
    let watched = db.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        while !watched.exists() {
            std::thread::sleep(Duration::from_millis(20));
        }
        let s = State::open(&watched)?;
        loop {
            if let Some(r) = s.sets()?.first() {
                let active = s
                    .subscription(r.id)?
                    .is_some_and(|sub| sub.state == destination::state::SubState::Active);
                if r.baseline_done && active {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await??;
    println!("push path: {records} records collected and mirrored; the destination is subscribed");

    // `changes` records change, a page at a time, each followed by a run.
    let mut commits = Vec::new();
    let per = page.min(changes).max(1);
    let changed: Vec<usize> = (0..changes).map(|i| (i * 7) % records).collect();
    for (round, chunk) in changed.chunks(per).enumerate() {
        let before = status(client.clone()).await?["last_ended"]
            .as_str()
            .map(str::to_string);
        let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
        write_pages(&pages, "c", chunk, page, &format!("v{}", round + 2), &now)?;
        let at = Timestamp::now();
        for &k in chunk {
            commits.push((
                format!(
                    "http://{addr}/files/bench/{}",
                    resourcesync_hub::model::origin::record_path(&format!("oai:bench:{k}"))
                ),
                at,
            ));
        }
        client
            .post(format!("http://{addr}/admin/v1/collect/bench/run"))
            .bearer_auth("bench")
            .send()
            .await?;
        loop {
            let v = status(client.clone()).await?;
            if v["last_ended"].as_str().map(str::to_string) != before && v["state"] != "running" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let lat = loop {
        let lat = common::push_latencies(&db, &commits)?;
        if lat.len() >= commits.len() || Instant::now() > deadline {
            break lat;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "push path: {} of {} changed records at the destination; change at the repository → file there: p50 {:.0} ms, p99 {:.0} ms",
        lat.len(),
        commits.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99)
    );
    let _ = htx.send(());
    let _ = harvester.await;
    let _ = stx.send(());
    let _ = server.await;
    drop(repo.stdin.take());
    let _ = repo.wait();
    Ok(())
}
