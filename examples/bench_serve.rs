//! Benchmark: requests/s and server CPU per request for one small resource file and for the
//! Source Description, our server and nginx in the same run.
//!
//! ```text
//! cargo run --release --example bench_serve -- [--runs 3] [--secs 10] [--connections 50]
//!     [--bytes 2048]
//! ```
//!
//! Starts our server (this program again, as a child process, embedded store) with one set
//! whose resource folder holds one file of `--bytes`, and nginx (Debian package `nginx`)
//! serving the same file and a copy of our Source Description as static files. Then, for each
//! run, `wrk` (Debian package `wrk`: one thread, `--connections` keep-alive connections,
//! `--secs`) loads each URL in turn, ours and nginx alternating. Prints requests/s, the
//! server's CPU per request (user + system of the server's processes over the run, from
//! /proc) and ours as a share of nginx's requests/s, with the range over runs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// User + system CPU seconds of `pid` and its children's threads (nginx: the master and its
/// workers).
fn cpu_secs(pids: &[u32]) -> f64 {
    pids.iter()
        .map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let f: Vec<&str> = after.split_whitespace().collect();
            let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            (ticks(11) + ticks(12)) / 100.0
        })
        .sum()
}

/// The process and its direct children (nginx's workers).
fn with_children(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    let kids =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    pids.extend(
        kids.split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok()),
    );
    pids
}

/// One `wrk` run against `url`: requests/s and CPU seconds of `pids` per request.
fn wrk(url: &str, secs: u64, connections: u64, pids: &[u32]) -> anyhow::Result<(f64, f64)> {
    let cpu0 = cpu_secs(pids);
    let out = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-d{secs}s"),
            url,
        ])
        .output()
        .map_err(|e| anyhow::anyhow!("wrk: {e} (apt-get install wrk)"))?;
    let cpu = cpu_secs(pids) - cpu0;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        !text.contains("Non-2xx"),
        "{url} answered errors under load:\n{text}"
    );
    let field = |name: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    let rps = field("Requests/sec:").ok_or_else(|| anyhow::anyhow!("wrk said:\n{text}"))?;
    let requests = rps * secs as f64;
    Ok((rps, cpu / requests))
}

fn child(dir: &Path) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let c = common::bench_server_config(&dir.join("data"), &dir.join("root"));
        common::run_child_server(c).await
    })
}

fn range(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        return child(&PathBuf::from(&args[i + 1]));
    }
    let runs = common::arg("--runs", 3);
    let secs = common::arg("--secs", 10);
    let connections = common::arg("--connections", 50);
    let bytes = common::arg("--bytes", 2048) as usize;
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("d0"))?;
    let body: String = (0..bytes)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    std::fs::write(root.join("d0/r0.txt"), &body)?;

    // Ours.
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("--child").arg(tmp.path()).env("RUST_LOG", "warn");
    let (mut ours, addr) = common::spawn_child(cmd)?;
    let ours_pids = vec![ours.id()];

    // nginx: the same file, and our Source Description as a static file.
    let static_root = tmp.path().join("static");
    std::fs::create_dir_all(static_root.join("files/bench/d0"))?;
    std::fs::create_dir_all(static_root.join(".well-known"))?;
    std::fs::copy(
        root.join("d0/r0.txt"),
        static_root.join("files/bench/d0/r0.txt"),
    )?;
    let sd = {
        let mut r = None;
        for _ in 0..100 {
            if let Ok(b) = get(&format!("http://{addr}/.well-known/resourcesync")) {
                r = Some(b);
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        r.ok_or_else(|| anyhow::anyhow!("our server does not answer"))?
    };
    std::fs::write(static_root.join(".well-known/resourcesync"), &sd)?;
    let nginx_port = common::free_port();
    let mut nginx = common::nginx(&tmp.path().join("nginx"), &[(nginx_port, static_root)])?;
    let nginx_base = format!("http://127.0.0.1:{nginx_port}");
    for _ in 0..100 {
        if get(&format!("{nginx_base}/files/bench/d0/r0.txt")).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let nginx_pids = with_children(nginx.id());

    let targets = [
        (
            format!("resource file ({bytes} B)"),
            "/files/bench/d0/r0.txt",
        ),
        (
            "Source Description".to_string(),
            "/.well-known/resourcesync",
        ),
    ];
    println!(
        "wrk -t1 -c{connections} -d{secs}s, {runs} runs, ours and nginx alternating (server CPU from /proc)"
    );
    println!(
        "{:<28} {:>5} {:>12} {:>11} {:>12} {:>11} {:>8}",
        "document", "run", "ours req/s", "ours µs", "nginx req/s", "nginx µs", "ratio"
    );
    let mut summary = Vec::new();
    for (name, path) in &targets {
        let mut ratios = Vec::new();
        let mut ours_rps = Vec::new();
        let mut nginx_rps = Vec::new();
        let mut ours_us = Vec::new();
        let mut nginx_us = Vec::new();
        for run in 1..=runs {
            let (o, ocpu) = wrk(
                &format!("http://{addr}{path}"),
                secs,
                connections,
                &ours_pids,
            )?;
            let (n, ncpu) = wrk(
                &format!("{nginx_base}{path}"),
                secs,
                connections,
                &nginx_pids,
            )?;
            println!(
                "{name:<28} {run:>5} {o:>12.0} {:>11.1} {n:>12.0} {:>11.1} {:>7.0}%",
                ocpu * 1e6,
                ncpu * 1e6,
                100.0 * o / n
            );
            ratios.push(100.0 * o / n);
            ours_rps.push(o);
            nginx_rps.push(n);
            ours_us.push(ocpu * 1e6);
            nginx_us.push(ncpu * 1e6);
        }
        summary.push((
            name.clone(),
            range(&ours_rps),
            range(&ours_us),
            range(&nginx_rps),
            range(&nginx_us),
            range(&ratios),
        ));
    }
    println!("\nranges over {runs} runs:");
    for (name, o, ou, n, nu, r) in summary {
        println!(
            "{name}: ours {:.0}-{:.0} req/s ({:.0}-{:.0} µs CPU), nginx {:.0}-{:.0} req/s ({:.1}-{:.1} µs), ours = {:.0}-{:.0}% of nginx",
            o.0, o.1, ou.0, ou.1, n.0, n.1, nu.0, nu.1, r.0, r.1
        );
    }
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(nginx.id().to_string())
        .status();
    let _ = nginx.wait();
    drop(ours.stdin.take());
    let _ = ours.wait();
    Ok(())
}

/// One GET, its body (the bench needs a few before the load starts).
fn get(url: &str) -> anyhow::Result<Vec<u8>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let r = reqwest::Client::builder()
            .no_proxy()
            .build()?
            .get(url)
            .send()
            .await?;
        anyhow::ensure!(r.status().is_success(), "{url}: {}", r.status());
        Ok(r.bytes().await?.to_vec())
    })
}
