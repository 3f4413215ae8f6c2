//! Benchmark: one harvester following many sources, against what aggregators script today.
//!
//! ```text
//! cargo run --release --example bench_aggregator -- [--sources 500] [--resources 200]
//!     [--peer-sources 500] [--dir /dev/shm/ba] [--idle-secs 10] [--hubs 4] [--changes 1000]
//!     [--rate 100] [--big 0] [--big-resources 200000] [--nofile SOFT:HARD] [--nginx]
//! ```
//!
//! Starts `--sources` static ResourceSync sources in this process, each on its own 127.0.0.1
//! port (Source Description, Capability List, Resource List and `--resources` small files),
//! then one harvester (this program again, as a child process, so that its memory, descriptors
//! and CPU are its own) with one `[[sources]]` table per source. Prints the baseline's
//! resources/s over all sources, the harvester's peak RSS and open descriptors, and its CPU
//! while nothing changes (`follow.check_interval_secs = 60`) over `--idle-secs`. The peer, in
//! the same run: `resync-sync --baseline` (PyPI `resync`: the tests' Python environment under
//! target/ when present, else on PATH) once per source in turn, over the first
//! `--peer-sources` sources, and the ratio. With `--nginx`, the static sources are files
//! served by nginx (Debian package `nginx`; one `server` per port) instead of this process.
//!
//! `--big N` adds N static sources of `--big-resources` each, listed first in the harvester's
//! configuration (so they start first): the time each source's baseline is done is printed for
//! the small and the big ones (fairness: `--sources 0` gives the big ones' time alone).
//! `--nofile SOFT:HARD` starts the harvester under those limits of open files (it raises the
//! soft one to the hard one itself; a hard limit too low for the sources makes it refuse).
//!
//! Beside the static sources, `--hubs` of our own servers (in this process, `--resources`
//! files each, hubs on) are followed by the same harvester with push on. Once everything is
//! baselined and idle has been measured, `--changes` updates are ingested at `--rate` per
//! second, spread over those servers in turn, and the latency from each ingest's answer (the
//! commit) to the file in the mirror (the harvester records it after the rename) is printed,
//! p50/p99.

mod common;
use common::{arg, ingest_line, percentile};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State as AxState;
use axum::http::{StatusCode, Uri};
use axum::response::IntoResponse;

fn resync_sync() -> PathBuf {
    common::py_tool("resync-sync")
}

/// One static source's documents and files, by path.
type Site = Arc<HashMap<String, (&'static str, Vec<u8>)>>;

fn site(base: &str, resources: usize) -> Site {
    use md5::{Digest, Md5};
    let mut m = HashMap::new();
    let mut urls = String::new();
    for i in 0..resources {
        let body = format!("resource {i} of {base}\n").into_bytes();
        let md5 = resourcesync_hub::digest::hex_digest(Md5::digest(&body));
        urls.push_str(&format!(
            "<url><loc>{base}/r/{i}.txt</loc><rs:md hash=\"md5:{md5}\" length=\"{}\" type=\"text/plain\"/></url>",
            body.len()
        ));
        m.insert(format!("/r/{i}.txt"), ("text/plain", body));
    }
    let ns = r#"xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/""#;
    m.insert(
        "/rl.xml".into(),
        (
            "application/xml",
            format!(r#"<urlset {ns}><rs:md capability="resourcelist" at="2026-01-01T00:00:00Z"/>{urls}</urlset>"#).into_bytes(),
        ),
    );
    m.insert(
        "/s/capabilitylist.xml".into(),
        (
            "application/xml",
            format!(r#"<urlset {ns}><rs:md capability="capabilitylist"/><url><loc>{base}/rl.xml</loc><rs:md capability="resourcelist"/></url></urlset>"#).into_bytes(),
        ),
    );
    m.insert(
        "/.well-known/resourcesync".into(),
        (
            "application/xml",
            format!(r#"<urlset {ns}><rs:md capability="description"/><url><loc>{base}/s/capabilitylist.xml</loc><rs:md capability="capabilitylist"/></url></urlset>"#).into_bytes(),
        ),
    );
    Arc::new(m)
}

async fn serve(AxState(site): AxState<Site>, uri: Uri) -> axum::response::Response {
    match site.get(uri.path()) {
        Some((ct, body)) => ([("content-type", *ct)], body.clone()).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `/proc/<pid>/status` field in kB.
fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// User + system CPU seconds of process `pid`.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// What the open descriptors of `pid` are: sockets, files under each top folder, others.
fn fd_kinds(pid: u32) -> String {
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let target = std::fs::read_link(e.path()).unwrap_or_default();
        let t = target.to_string_lossy();
        let kind = match t.split_once(':') {
            Some((k, _)) if !t.starts_with('/') => k.to_string(),
            _ => t
                .rsplit_once('/')
                .map_or(t.to_string(), |(d, _)| format!("{d}/")),
        };
        *kinds.entry(kind).or_default() += 1;
    }
    let mut v: Vec<_> = kinds.into_iter().collect();
    v.sort_by_key(|b| std::cmp::Reverse(b.1));
    v.iter()
        .take(6)
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The resource files (`*.txt`) under `dir`.
fn files_under(dir: &Path) -> usize {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file() && e.path().extension().is_some_and(|x| x == "txt"))
        .count()
}

fn main() -> anyhow::Result<()> {
    // The harvester's own process: `--harvest-child CONFIG`.
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--harvest-child") {
        let cfg_path = PathBuf::from(&args[i + 1]);
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
        let cfg = resourcesync_hub::destination::config::HarvestConfig::load(Some(&cfg_path))?;
        return tokio::runtime::Runtime::new()?.block_on(
            resourcesync_hub::destination::run_reloading(
                cfg,
                Some(cfg_path),
                None,
                resourcesync_hub::app::shutdown_signal(),
            ),
        );
    }
    tokio::runtime::Runtime::new()?.block_on(bench())
}

async fn bench() -> anyhow::Result<()> {
    // Thousands of sources on their own ports, in this process.
    resourcesync_hub::conn::raise_open_files()?;
    let n_small = arg("--sources", 500) as usize;
    let per = arg("--resources", 200) as usize;
    let n_big = arg("--big", 0) as usize;
    let big_per = arg("--big-resources", 200_000) as usize;
    // Static sources: the big ones first, then the small ones.
    let n_sources = n_big + n_small;
    let per_of = |i: usize| if i < n_big { big_per } else { per };
    let peer_sources = (arg("--peer-sources", 500) as usize).min(n_sources);
    let idle_secs = arg("--idle-secs", 10);
    let dir = match std::env::args().skip_while(|a| a != "--dir").nth(1) {
        Some(d) => PathBuf::from(d),
        None => std::env::temp_dir().join(format!("bench_aggregator_{}", std::process::id())),
    };
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;

    // The sources, each on its own port: in this process, or nginx serving them as files.
    let use_nginx = std::env::args().any(|a| a == "--nginx");
    let mut bases = Vec::new();
    let mut nginx = None;
    if use_nginx {
        let mut servers = Vec::new();
        // Held until every port is chosen, so that no two sources get the same one.
        let mut held = Vec::new();
        for i in 0..n_sources {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            let port = l.local_addr()?.port();
            held.push(l);
            let base = format!("http://127.0.0.1:{port}");
            let root = dir.join("www").join(i.to_string());
            for (path, (_, body)) in site(&base, per_of(i)).iter() {
                let f = root.join(path.trim_start_matches('/'));
                std::fs::create_dir_all(f.parent().unwrap())?;
                std::fs::write(f, body)?;
            }
            servers.push((port, root));
            bases.push(base);
        }
        drop(held);
        nginx = Some(common::nginx(&dir.join("nginx"), &servers)?);
        let probe = reqwest::Client::builder().no_proxy().build()?;
        let t = Instant::now();
        for b in [bases.first(), bases.last()].into_iter().flatten() {
            while probe
                .get(format!("{b}/rl.xml"))
                .send()
                .await
                .map_or(true, |r| !r.status().is_success())
            {
                anyhow::ensure!(
                    t.elapsed() < Duration::from_secs(20),
                    "nginx did not start: see {}",
                    dir.join("nginx/nginx-error.log").display()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    } else {
        for i in 0..n_sources {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let base = format!("http://{}", l.local_addr()?);
            let app = axum::Router::new()
                .fallback(serve)
                .with_state(site(&base, per_of(i)));
            tokio::spawn(async move { axum::serve(l, app).await });
            bases.push(base);
        }
    }
    // CPU of whatever serves the static sources: this process, or nginx's workers.
    let nginx_pid = nginx.as_ref().map(|c: &std::process::Child| c.id());
    let sources_cpu = move || -> f64 {
        match nginx_pid {
            None => cpu_secs(std::process::id()),
            Some(master) => {
                let kids = std::process::Command::new("pgrep")
                    .args(["-P", &master.to_string()])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
                    .unwrap_or_default();
                cpu_secs(master)
                    + kids
                        .split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .map(cpu_secs)
                        .sum::<f64>()
            }
        }
    };
    // Our servers with hubs, each with its own set of `per` files.
    let hubs = arg("--hubs", 4) as usize;
    let mut ours_servers = Vec::new();
    let client = reqwest::Client::builder().no_proxy().build()?;
    for k in 0..hubs {
        let data = dir.join(format!("hub{k}"));
        let root = data.join("root");
        let c = common::bench_server_config(&data.join("data"), &root);
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", l.local_addr()?);
        tokio::spawn(resourcesync_hub::app::run(c, l, std::future::pending()));
        std::fs::create_dir_all(&root)?;
        let mut lines = Vec::new();
        for i in 0..per {
            let (rel, body) = (format!("r{i}.txt"), format!("resource {i} of hub {k}\n"));
            std::fs::write(root.join(&rel), &body)?;
            lines.push(ingest_line(&rel, &body, "created"));
        }
        common::post_ingest(
            &client,
            &format!("{base}/api/v1/resource-sets/bench/changes"),
            lines.join("\n"),
        )
        .await?;
        ours_servers.push((base, root));
    }
    let total = (n_small + hubs) * per + n_big * big_per;
    println!("{n_small} static sources + {n_big} big ones of {big_per} + {hubs} of our servers with hubs, x {per} resources = {total} resources, one port each");

    // Ours: one harvester, a [[sources]] table each.
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?
    };
    let mut toml = format!("[state]\ndir = \"state\"\n[output]\ndir = \"mirror\"\n[push]\nlisten = \"{listen}\"\n[follow]\ncheck_interval_secs = 60\n[fetch]\nconcurrency = 32\n");
    for (i, b) in bases.iter().enumerate() {
        let name = match i < n_big {
            true => format!("big{i}"),
            false => format!("s{i}"),
        };
        toml.push_str(&format!(
            "[[sources]]\nname = \"{name}\"\nurl = \"{b}/.well-known/resourcesync\"\n"
        ));
    }
    for (k, (b, _)) in ours_servers.iter().enumerate() {
        toml.push_str(&format!(
            "[[sources]]\nname = \"hub{k}\"\nurl = \"{b}/.well-known/resourcesync\"\n"
        ));
    }
    let ours_dir = dir.join("ours");
    std::fs::create_dir_all(&ours_dir)?;
    let cfg_path = ours_dir.join("harvest.toml");
    std::fs::write(&cfg_path, toml)?;
    let t = Instant::now();
    let src_cpu0 = sources_cpu();
    // BENCH_PERF=FILE: the harvester runs under `perf record` (call graphs) into FILE; its
    // figures then include perf's own cost.
    let perf = std::env::var_os("BENCH_PERF");
    let mut cmd = match &perf {
        Some(out) => {
            let mut c = std::process::Command::new("perf");
            c.args([
                "record",
                "-e",
                "cpu-clock",
                "-F",
                "499",
                "--call-graph",
                "dwarf,32768",
                "-o",
            ])
            .arg(out)
            .arg("--")
            .arg(std::env::current_exe()?);
            c
        }
        None => std::process::Command::new(std::env::current_exe()?),
    };
    if let Some(lim) = std::env::args().skip_while(|a| a != "--nofile").nth(1) {
        let (soft, hard) = lim
            .split_once(':')
            .and_then(|(s, h)| Some((s.parse::<u64>().ok()?, h.parse::<u64>().ok()?)))
            .ok_or_else(|| anyhow::anyhow!("--nofile SOFT:HARD, such as 1024:8192"))?;
        use std::os::unix::process::CommandExt;
        // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let l = libc::rlimit {
                    rlim_cur: soft,
                    rlim_max: hard,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd
        .args(["--harvest-child"])
        .arg(&cfg_path)
        .current_dir(&ours_dir)
        // BENCH_LOG=info (or debug) for more of the harvester's log in ours/harvest.log.
        .env(
            "RUST_LOG",
            std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stderr(std::fs::File::create(ours_dir.join("harvest.log"))?)
        .spawn()?;
    let mut pid = child.id();
    if perf.is_some() {
        // The harvester is perf's child.
        let t = Instant::now();
        loop {
            let kids = std::process::Command::new("pgrep")
                .args(["-P", &pid.to_string()])
                .output()?;
            if let Some(p) = String::from_utf8_lossy(&kids.stdout)
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
            {
                pid = p;
                break;
            }
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(10),
                "perf did not start the harvester"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let cfg = resourcesync_hub::destination::config::HarvestConfig::load(Some(&cfg_path))?;
    let db = ours_dir.join(cfg.database_path());
    let mut fds_peak = 0usize;
    let mut fds_kinds = String::new();
    // When each source's baseline was seen done, by source name.
    let mut done_at: HashMap<String, f64> = HashMap::new();
    let mut state = None;
    let n_all = n_sources + hubs;
    loop {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count())
            .unwrap_or(0);
        if fds > fds_peak {
            fds_kinds = fd_kinds(pid);
        }
        fds_peak = fds_peak.max(fds);
        if let Some(code) = child.try_wait()? {
            let log = std::fs::read_to_string(ours_dir.join("harvest.log")).unwrap_or_default();
            // Its error (before any backtrace), else the end of its log.
            match log.lines().find(|l| l.starts_with("Error: ")) {
                Some(e) => println!("the harvester stopped ({code}): {e}"),
                None => {
                    let tail: Vec<&str> = log.lines().rev().take(5).collect();
                    println!("the harvester stopped ({code}); its log ends with:");
                    for l in tail.iter().rev() {
                        println!("  {l}");
                    }
                }
            }
            anyhow::bail!("the harvester stopped early");
        }
        if state.is_none() && db.exists() {
            state = Some(resourcesync_hub::destination::state::State::open(&db)?);
        }
        if let Some(st) = &state {
            let now = t.elapsed().as_secs_f64();
            for r in st.sets()? {
                if r.baseline_done {
                    done_at.entry(r.source).or_insert(now);
                }
            }
            if done_at.len() >= n_all {
                break;
            }
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(3600),
            "not done in an hour"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // When the sources named `prefix…` were baselined, earliest first.
    let times = |prefix: &str| {
        let mut v: Vec<f64> = done_at
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| *v)
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let (small, big) = (times("s"), times("big"));
    if !small.is_empty() {
        println!(
            "small sources baselined: p50 at {:.1} s, the last at {:.1} s after start",
            percentile(&small, 0.5),
            small[small.len() - 1]
        );
    }
    if !big.is_empty() {
        println!(
            "big sources baselined at: {} s after start",
            big.iter()
                .map(|v| format!("{v:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let ours = t.elapsed().as_secs_f64();
    let (harvester_cpu, served_cpu) = (cpu_secs(pid), sources_cpu() - src_cpu0);
    let rss_peak = status_kb(pid, "VmHWM:") / 1024;
    println!(
        "ours, one harvester:     {total} resources in {ours:.2} s = {:.0} resources/s; peak RSS {rss_peak} MB, peak open descriptors {fds_peak}",
        total as f64 / ours
    );
    println!("  descriptors at the peak: {fds_kinds}");
    println!(
        "  CPU: harvester {harvester_cpu:.1} s ({:.0} µs a resource), {} {served_cpu:.1} s",
        harvester_cpu / total as f64 * 1e6,
        if use_nginx {
            "nginx (static sources)"
        } else {
            "this process (sources and hubs)"
        }
    );
    // Idle: nothing changes; the periodic check is a minute away.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (c0, t0) = (cpu_secs(pid), Instant::now());
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let idle = (cpu_secs(pid) - c0) / t0.elapsed().as_secs_f64() * 100.0;
    let fds_idle = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    println!("ours, idle:              {idle:.2}% of one core over {idle_secs} s; {fds_idle} open descriptors");

    // Push: updates on our servers, commit -> file in the mirror.
    let state = state.expect("opened above");
    let active = || -> anyhow::Result<bool> {
        let sets = state.sets()?;
        let ours: Vec<_> = sets
            .iter()
            .filter(|r| r.source.starts_with("hub"))
            .collect();
        Ok(ours.len() == hubs
            && ours.iter().all(|r| {
                state.subscription(r.id).ok().flatten().is_some_and(|s| {
                    s.state == resourcesync_hub::destination::state::SubState::Active
                })
            }))
    };
    let t = Instant::now();
    while !active()? {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(60),
            "subscriptions not active in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let changes = arg("--changes", 1000) as usize;
    let rate = arg("--rate", 100).max(1);
    let gap = Duration::from_micros(1_000_000 / rate);
    let mut commits = Vec::with_capacity(changes);
    let mut next = Instant::now();
    for k in 0..changes.min(hubs * per * 1000) {
        if hubs == 0 {
            break;
        }
        let (base, root) = &ours_servers[k % hubs];
        let i = (k / hubs) % per;
        let (rel, body) = (format!("r{i}.txt"), format!("update {k}\n"));
        std::fs::write(root.join(&rel), &body)?;
        tokio::time::sleep_until(next.into()).await;
        next += gap;
        common::post_ingest(
            &client,
            &format!("{base}/api/v1/resource-sets/bench/changes"),
            ingest_line(&rel, &body, "updated"),
        )
        .await?;
        commits.push((
            format!("{base}/files/bench/{rel}"),
            resourcesync_hub::model::Timestamp::now(),
        ));
    }
    let t = Instant::now();
    let applied = || -> anyhow::Result<u64> {
        let mut n = 0;
        for r in state.sets()?.iter().filter(|r| r.source.starts_with("hub")) {
            n += state.applied_count(r.id)?;
        }
        Ok(n)
    };
    while applied()? < commits.len() as u64 && t.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lat = common::push_latencies(&db, &commits)?;
    println!(
        "ours, push:              {} updates at {rate}/s over {hubs} hubs: {} applied; commit -> file p50 {:.1} ms, p99 {:.1} ms",
        commits.len(),
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99)
    );
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();

    // The peer: resync-sync --baseline once per source, in turn.
    let peer_dir = dir.join("resync");
    std::fs::create_dir_all(&peer_dir)?;
    let t = Instant::now();
    for (i, b) in bases.iter().take(peer_sources).enumerate() {
        let dest = peer_dir.join(format!("s{i}"));
        std::fs::create_dir_all(&dest)?;
        let map = format!("{b}/r/={}", dest.display());
        let out = tokio::process::Command::new(resync_sync())
            .current_dir(&dest)
            .args([
                "--baseline",
                "--capabilitylist",
                &format!("{b}/s/capabilitylist.xml"),
                &map,
            ])
            .output()
            .await?;
        let text = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(
            !text.contains("Traceback") && !text.contains("FatalError"),
            "resync-sync failed on {b}:\n{text}"
        );
    }
    let theirs = t.elapsed().as_secs_f64();
    let copied = files_under(&peer_dir);
    println!(
        "resync-sync, in turn:    {copied} resources ({peer_sources} sources) in {theirs:.2} s = {:.0} resources/s",
        copied as f64 / theirs
    );
    println!(
        "ratio (ours / resync):   {:.1}x",
        (total as f64 / ours) / (copied as f64 / theirs)
    );
    if let Some(mut n) = nginx {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &n.id().to_string()])
            .status();
        let _ = n.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
