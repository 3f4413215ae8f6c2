//! `bench_collect --kind resourcesync|activity|sitemap`: a collector of that kind against a
//! static source served by nginx (Debian's), `--resources` (20,000) files of about 2 KB.
//!
//! - `resourcesync`: the source's documents are made by PyPI `resync`'s `resync-build`
//!   (Resource List with md5, Capability List, Source Description); ours (a server in this
//!   process, its collector following the source through the harvest engine into its store)
//!   and `resync-sync --baseline` (a child) copy it in the same run. Then the push path:
//!   `--push-sources` (100) sets of another server of ours, each collected by its own
//!   collector, subscribed at that server's hub; `--changes` (500) changes at the origin, and
//!   printed is origin change → change notification from the collecting server at a
//!   subscriber, p50/p99.
//! - `sitemap`: a sitemap index (10,000 pages a sitemap, `lastmod`) named by `robots.txt`.
//! - `activity`: an IIIF Change Discovery stream of `Create`s, 1,000 to a page.
//!
//! Printed for each: resources/s and CPU per resource (this process: the server and its
//! collector; nginx is apart).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::common::{self, arg, percentile};
use resourcesync_hub::config::{CollectConfig, CollectKind, Config};
use resourcesync_hub::model::SetName;

const ADMIN: &str = "bench-collect-admin-token-0123";

const BODY: &str = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua. ";

fn cpu_self() -> f64 {
    common::proc_cpu_secs("self")
}

/// User + system CPU seconds of this process's children that ended.
fn cpu_children() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(13) + t(14)) / 100.0
}

fn resync(tool: &str, args: &[&str]) -> anyhow::Result<()> {
    let o = std::process::Command::new(common::py_tool(tool))
        .args(args)
        .output()?;
    let text = String::from_utf8_lossy(&o.stderr);
    anyhow::ensure!(
        o.status.success() && !text.contains("Traceback"),
        "{tool} {args:?}: {text}"
    );
    Ok(())
}

/// The files of the source: `files/d<k % 100>/r<k>.txt`, about 2 KB each.
fn write_files(site: &Path, n: usize) -> anyhow::Result<Vec<String>> {
    let mut rels = Vec::with_capacity(n);
    for k in 0..n {
        let rel = format!("files/d{}/r{k}.txt", k % 100);
        let p = site.join(&rel);
        std::fs::create_dir_all(p.parent().expect("a folder"))?;
        std::fs::write(&p, format!("resource {k}\n{}", BODY.repeat(16)))?;
        rels.push(rel);
    }
    Ok(rels)
}

/// The documents of a source of `kind` over `rels`, at `base`; the collector's URL.
fn write_documents(
    kind: CollectKind,
    site: &Path,
    base: &str,
    rels: &[String],
) -> anyhow::Result<String> {
    match kind {
        CollectKind::Resourcesync => {
            let map = format!("{base}/files/={}", site.join("files").display());
            let rl = site.join("resourcelist.xml");
            resync(
                "resync-build",
                &[
                    "--write-resourcelist",
                    "--hash",
                    "md5",
                    "--outfile",
                    rl.to_str().unwrap_or(""),
                    &map,
                ],
            )?;
            let caps = format!("resourcelist={base}/resourcelist.xml");
            let cap = site.join("capabilitylist.xml");
            resync(
                "resync-build",
                &[
                    "--write-capabilitylist",
                    &caps,
                    "--outfile",
                    cap.to_str().unwrap_or(""),
                ],
            )?;
            std::fs::create_dir_all(site.join(".well-known"))?;
            let sd = site.join(".well-known/resourcesync");
            resync(
                "resync-build",
                &[
                    "--write-sourcedescription",
                    &format!("{base}/capabilitylist.xml"),
                    "--outfile",
                    sd.to_str().unwrap_or(""),
                ],
            )?;
            Ok(format!("{base}/.well-known/resourcesync"))
        }
        CollectKind::Sitemap => {
            let mut index = String::from(
                r#"<?xml version="1.0" encoding="UTF-8"?><sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">"#,
            );
            for (i, chunk) in rels.chunks(10_000).enumerate() {
                let mut sm = String::from(
                    r#"<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">"#,
                );
                for rel in chunk {
                    sm.push_str(&format!(
                        "<url><loc>{base}/{rel}</loc><lastmod>2026-01-01</lastmod></url>"
                    ));
                }
                sm.push_str("</urlset>");
                std::fs::write(site.join(format!("sitemap-{i}.xml")), sm)?;
                index.push_str(&format!(
                    "<sitemap><loc>{base}/sitemap-{i}.xml</loc></sitemap>"
                ));
            }
            index.push_str("</sitemapindex>");
            std::fs::write(site.join("sitemap_index.xml"), index)?;
            std::fs::write(
                site.join("robots.txt"),
                format!("Sitemap: {base}/sitemap_index.xml\n"),
            )?;
            Ok(format!("{base}/sitemap_index.xml"))
        }
        CollectKind::Activity => {
            std::fs::create_dir_all(site.join("activity"))?;
            let pages: Vec<&[String]> = rels.chunks(1000).collect();
            for (i, chunk) in pages.iter().enumerate() {
                let items: Vec<serde_json::Value> = chunk
                    .iter()
                    .map(|rel| serde_json::json!({"type": "Create", "object": {"id": format!("{base}/{rel}"), "type": "Manifest"}, "endTime": "2026-01-01T00:00:00Z"}))
                    .collect();
                let mut page = serde_json::json!({"type": "OrderedCollectionPage", "id": format!("{base}/activity/page-{i}.xml"), "orderedItems": items});
                if i > 0 {
                    page["prev"] =
                        serde_json::json!({"id": format!("{base}/activity/page-{}.xml", i - 1)});
                }
                // Served as files named .xml (nginx's types here): the collector reads JSON
                // whatever the type.
                std::fs::write(
                    site.join(format!("activity/page-{i}.xml")),
                    page.to_string(),
                )?;
            }
            let top = serde_json::json!({"type": "OrderedCollection", "id": format!("{base}/activity/all.xml"),
                "last": {"id": format!("{base}/activity/page-{}.xml", pages.len() - 1)}});
            std::fs::write(site.join("activity/all.xml"), top.to_string())?;
            Ok(format!("{base}/activity/all.xml"))
        }
        CollectKind::OaiPmh => anyhow::bail!("--kind resourcesync|activity|sitemap"),
    }
}

/// Our server, in this process, until `stop` is sent.
async fn start_server(
    config: Config,
) -> anyhow::Result<(String, tokio::sync::oneshot::Sender<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = format!("http://{}", listener.local_addr()?);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        if let Err(e) = resourcesync_hub::app::run(config, listener, async move {
            let _ = rx.await;
        })
        .await
        {
            eprintln!("server: {e:#}");
        }
    });
    Ok((addr, tx))
}

/// Waits until `set` of the store holds `n` resources.
async fn wait_resources(
    store: &resourcesync_hub::store::Store,
    set: &str,
    n: u64,
    limit: Duration,
) -> anyhow::Result<()> {
    let set = SetName::parse(set).map_err(anyhow::Error::msg)?;
    let t = Instant::now();
    loop {
        if store.counts(&set).await.map(|c| c.resources).unwrap_or(0) >= n {
            return Ok(());
        }
        anyhow::ensure!(
            t.elapsed() < limit,
            "{set} did not reach {n} resources in {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn run(kind: &str, args: &[String]) -> anyhow::Result<()> {
    let kind = match kind {
        "resourcesync" => CollectKind::Resourcesync,
        "sitemap" => CollectKind::Sitemap,
        "activity" => CollectKind::Activity,
        other => anyhow::bail!("--kind resourcesync|activity|sitemap, not {other:?}"),
    };
    let n = arg("--resources", 20_000) as usize;
    let tmp = match args.iter().position(|a| a == "--dir") {
        Some(i) => tempfile::tempdir_in(&args[i + 1])?,
        None => tempfile::tempdir()?,
    };
    let site = tmp.path().join("site");
    let rels = write_files(&site, n)?;
    let port = common::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let url = write_documents(kind, &site, &base, &rels)?;
    let mut nginx = common::nginx(&tmp.path().join("nginx"), &[(port, site.clone())])?;
    let client = reqwest::Client::builder().no_proxy().build()?;
    let t = Instant::now();
    while client.get(&url).send().await.is_err() {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(10),
            "nginx does not answer"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "source: {n} files of {} bytes served by nginx at {base}; the collector reads {url}",
        rels.first().map_or(0, |r| std::fs::metadata(site.join(r))
            .map_or(0, |m| m.len()))
    );

    // Ours.
    let mut c = Config::defaults();
    c.server.data_dir = tmp.path().join("ours");
    let mut cc = CollectConfig::new(&url);
    cc.kind = Some(kind);
    cc.interval_secs = 3600;
    c.collect.insert("bench".into(), cc);
    let store = resourcesync_hub::app::open_store(&c).await?;
    let (t, cpu0) = (Instant::now(), cpu_self());
    let (_addr, stop) = start_server(c).await?;
    wait_resources(&store, "bench", n as u64, Duration::from_secs(1800)).await?;
    let (secs, cpu) = (t.elapsed().as_secs_f64(), cpu_self() - cpu0);
    let ours = n as f64 / secs;
    println!(
        "ours ({}): {n} resources in {secs:.1} s = {ours:.0} resources/s; CPU {:.0} µs a resource",
        kind.as_str(),
        cpu * 1e6 / n as f64
    );
    let _ = stop.send(());

    if kind == CollectKind::Resourcesync && !args.iter().any(|a| a == "--ours-only") {
        let dest = tmp.path().join("resync-sync");
        std::fs::create_dir_all(&dest)?;
        let map = format!("{base}/files/={}", dest.display());
        let cap = format!("{base}/capabilitylist.xml");
        let (t, child0) = (Instant::now(), cpu_children());
        let dir = tmp.path().to_path_buf();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(common::py_tool("resync-sync"))
                .current_dir(dir)
                .args(["--baseline", "--capabilitylist", &cap, &map])
                .output()
        })
        .await??;
        let (theirs, cpu) = (t.elapsed().as_secs_f64(), cpu_children() - child0);
        let copied = walkdir::WalkDir::new(&dest)
            .into_iter()
            .flatten()
            .filter(|e| e.file_type().is_file())
            .count();
        println!(
            "resync-sync --baseline: {copied} resources in {theirs:.1} s = {:.0} resources/s; CPU {:.0} µs a resource",
            copied as f64 / theirs,
            cpu * 1e6 / copied.max(1) as f64
        );
        println!(
            "ours / resync-sync: {:.1}x resources/s",
            ours / (copied as f64 / theirs)
        );
    }
    let _ = nix_term(&mut nginx);
    if kind == CollectKind::Resourcesync {
        push(
            tmp.path(),
            arg("--push-sources", 100) as usize,
            arg("--changes", 500) as usize,
        )
        .await?;
    }
    Ok(())
}

fn nix_term(child: &mut std::process::Child) -> std::io::Result<()> {
    // SAFETY: kill has no memory preconditions; the pid is our child's, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().map(|_| ())
}

/// A subscriber: answers verification, and records when each changed URL's notification came.
async fn subscriber(arrived: Arc<Mutex<HashMap<String, Vec<Instant>>>>) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = format!("http://{}", listener.local_addr()?);
    let app = axum::Router::new().fallback(
        move |q: axum::extract::Query<HashMap<String, String>>, body: axum::body::Bytes| {
            let arrived = arrived.clone();
            async move {
                if let Some(c) = q.get("hub.challenge") {
                    return c.clone();
                }
                let now = Instant::now();
                let text = String::from_utf8_lossy(&body);
                let mut a = arrived.lock().expect("arrivals");
                for part in text.split("<loc>").skip(1) {
                    if let Some(loc) = part.split("</loc>").next() {
                        a.entry(loc.to_string()).or_default().push(now);
                    }
                }
                String::new()
            }
        },
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// Waits until the hub of the server at `base` has `n` active subscriptions.
async fn active(client: &reqwest::Client, base: &str, n: usize) -> anyhow::Result<()> {
    let t = Instant::now();
    loop {
        let stats: serde_json::Value = client
            .get(format!("{base}/admin/v1/stats"))
            .bearer_auth(ADMIN)
            .send()
            .await?
            .json()
            .await
            .unwrap_or_default();
        let active = stats["subscriptions"]["active"].as_u64().unwrap_or(0);
        if active >= n as u64 {
            return Ok(());
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(120),
            "{active} of {n} subscriptions active at {base}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The push path: `sources` sets of an origin server, each collected by a collector of a
/// second server; `changes` changes at the origin; origin change → notification from the
/// collecting server, p50/p99.
async fn push(dir: &Path, sources: usize, changes: usize) -> anyhow::Result<()> {
    if sources == 0 {
        return Ok(());
    }
    let root = dir.join("origin-files");
    let mut a = common::bench_server_config(&dir.join("origin"), &root);
    a.admin.token = ADMIN.into();
    a.sets.clear();
    for k in 0..sources {
        a.sets.insert(
            format!("s{k}"),
            resourcesync_hub::config::SetOverrides {
                resource_root_dir: Some(root.join(format!("s{k}"))),
                ..Default::default()
            },
        );
    }
    let (origin, stop_a) = start_server(a).await?;
    let client = reqwest::Client::builder().no_proxy().build()?;
    for k in 0..sources {
        let lines: String = (0..5)
            .map(|j| {
                let rel = format!("r{j}.txt");
                let body = format!("set {k} resource {j} v0\n");
                let p = root.join(format!("s{k}")).join(&rel);
                let _ = std::fs::create_dir_all(p.parent().expect("a folder"));
                let _ = std::fs::write(&p, &body);
                common::ingest_line(&rel, &body, "created") + "\n"
            })
            .collect();
        common::post_ingest(
            &client,
            &format!("{origin}/api/v1/resource-sets/s{k}/changes"),
            lines,
        )
        .await?;
    }
    let mut b = Config::defaults();
    b.admin.token = ADMIN.into();
    b.server.data_dir = dir.join("collecting");
    b.hub.allow_networks = vec!["127.0.0.0/8".parse().expect("a network")];
    for k in 0..sources {
        let mut cc = CollectConfig::new(&format!("{origin}/sets/s{k}/capabilitylist.xml"));
        cc.kind = Some(CollectKind::Resourcesync);
        cc.interval_secs = 3600;
        b.collect.insert(format!("c{k}"), cc);
    }
    let store_b = resourcesync_hub::app::open_store(&b).await?;
    let (collecting, stop_b) = start_server(b).await?;
    let t = Instant::now();
    for k in 0..sources {
        wait_resources(&store_b, &format!("c{k}"), 5, Duration::from_secs(300)).await?;
    }
    println!(
        "push: {sources} sources collected (5 resources each) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // Every collector subscribed at the origin's hub.
    active(&client, &origin, sources).await?;
    // A subscriber of each collected set at the collecting server.
    let arrived: Arc<Mutex<HashMap<String, Vec<Instant>>>> = Default::default();
    let sub = subscriber(arrived.clone()).await?;
    let b_base = collecting.clone();
    for k in 0..sources {
        let r = client
            .post(format!("{collecting}/hub"))
            .form(&[
                ("hub.mode", "subscribe"),
                ("hub.topic", &format!("{b_base}/topics/c{k}/changes")),
                ("hub.callback", &format!("{sub}/c{k}")),
            ])
            .send()
            .await?;
        anyhow::ensure!(r.status().as_u16() == 202, "subscribe: {}", r.status());
    }
    active(&client, &collecting, sources).await?;
    // Changes at the origin, 50 a second; each is an update of one resource of one set.
    let origin_port = origin.rsplit(':').next().unwrap_or("");
    let mut sent: Vec<(String, Instant)> = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for i in 0..changes {
        tick.tick().await;
        let (k, j) = (i % sources, (i / sources) % 5);
        let rel = format!("r{j}.txt");
        let body = format!("set {k} resource {j} v{}\n", i + 1);
        std::fs::write(root.join(format!("s{k}")).join(&rel), &body)?;
        let at = Instant::now();
        common::post_ingest(
            &client,
            &format!("{origin}/api/v1/resource-sets/s{k}/changes"),
            common::ingest_line(&rel, &body, "updated"),
        )
        .await?;
        // Where the collecting server serves its copy (its mirror's path of the origin URL).
        sent.push((
            format!("{b_base}/files/c{k}/127.0.0.1_{origin_port}/files/s{k}/{rel}"),
            at,
        ));
    }
    let t = Instant::now();
    let mut lat: Vec<f64>;
    loop {
        let a = arrived.lock().expect("arrivals").clone();
        lat = Vec::new();
        let mut missing = 0;
        for (loc, at) in &sent {
            // The first arrival at or after the change (a URL changes more than once).
            match a.get(loc).and_then(|w| w.iter().find(|w| **w >= *at)) {
                Some(when) => lat.push((*when - *at).as_secs_f64() * 1000.0),
                None => missing += 1,
            }
        }
        if missing == 0 || t.elapsed() > Duration::from_secs(30) {
            if missing > 0 {
                let first: Vec<&String> = sent
                    .iter()
                    .map(|(l, _)| l)
                    .filter(|l| !a.contains_key(*l))
                    .take(3)
                    .collect();
                println!("push: {missing} of {changes} changes not notified within 30 s (such as {first:?}; {} URLs notified, such as {:?})", a.len(), a.keys().take(3).collect::<Vec<_>>());
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lat.sort_by(|x, y| x.total_cmp(y));
    println!(
        "push: {} changes over {sources} sources at 50/s: origin change -> notification from the collecting server p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN)
    );
    let _ = stop_b.send(());
    let _ = stop_a.send(());
    Ok(())
}
