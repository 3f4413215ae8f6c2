//! Collection spread over processes on Elasticsearch (osmem-server): collectors shared out
//! among the live processes, a killed process's taken over, each host's politeness kept over
//! all of them together, nothing recorded twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{ChildServer, Osmem};

const ADMIN: &str = "collect-spread-admin-token";
const HOSTS: usize = 3;
const SOURCES: usize = 30;
const PAGES: usize = 10;

/// A host serving sitemaps `/s<k>/sitemap.xml` of pages `/s<k>/p<j>.html` (each answered after
/// 40 ms), empty until `fill`: it counts the requests in flight at once, and the most seen.
struct Peer {
    base: String,
    filled: Arc<AtomicBool>,
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    pages: Arc<Mutex<HashMap<String, usize>>>,
}

impl Peer {
    async fn start() -> Peer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (filled, now, most) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let pages: Arc<Mutex<HashMap<String, usize>>> = Default::default();
        let (f, n, m, p, b) = (
            filled.clone(),
            now.clone(),
            most.clone(),
            pages.clone(),
            base.clone(),
        );
        let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
            let (f, n, m, p, b) = (f.clone(), n.clone(), m.clone(), p.clone(), b.clone());
            async move {
                let in_flight = n.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(in_flight, Ordering::SeqCst);
                // Counted out when the answer ends, or when the client goes (a killed process).
                let _out = Out(n.clone());
                let path = uri.path().to_string();
                let body = if let Some(source) = path.strip_suffix("/sitemap.xml") {
                    let urls: String = if f.load(Ordering::SeqCst) {
                        (0..PAGES)
                            .map(|j| format!("<url><loc>{b}{source}/p{j}.html</loc><lastmod>2026-01-01</lastmod></url>"))
                            .collect()
                    } else {
                        String::new()
                    };
                    format!(r#"<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>"#)
                } else {
                    *p.lock().unwrap().entry(path.clone()).or_default() += 1;
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    format!("<p>{path}</p>")
                };
                body
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        Peer {
            base,
            filled,
            now,
            most,
            pages,
        }
    }
}

struct Out(Arc<AtomicUsize>);

impl Drop for Out {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn status(client: &reqwest::Client, server: &ChildServer) -> Vec<serde_json::Value> {
    let v: serde_json::Value = client
        .get(server.url("/admin/v1/collect"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["collectors"].as_array().unwrap().clone()
}

/// How many collectors each process holds now.
async fn held(client: &reqwest::Client, servers: &[&ChildServer]) -> Vec<usize> {
    let mut out = Vec::new();
    for s in servers {
        out.push(
            status(client, s)
                .await
                .iter()
                .filter(|c| c["live"]["held_here"] == true)
                .count(),
        );
    }
    out
}

/// Three processes on one Elasticsearch store collect 30 sitemaps on 3 hosts: the collectors
/// are shared out among them; one process is killed (SIGKILL) mid-run; the others take its
/// collectors over and every source completes within 60 s; each page is recorded once; and no
/// host ever sees more than 2 requests in flight (counted at the host).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_thirty_sources_keep_each_hosts_limit_and_survive_a_kill() {
    let mut peers = Vec::new();
    for _ in 0..HOSTS {
        peers.push(Peer::start().await);
    }
    let tmp = tempfile::tempdir().unwrap();
    let es = Osmem::clone_url().await;
    let mut toml = format!(
        "[server]\nbase_url = \"http://spread.test\"\n\
         [store]\nbackend = \"elasticsearch\"\n[store.elasticsearch]\nurl = \"{es}\"\n\
         [hub]\npartition_lease_secs = 3\n[admin]\ntoken = \"{ADMIN}\"\n"
    );
    for k in 0..SOURCES {
        let host = &peers[k % HOSTS].base;
        toml.push_str(&format!(
            "[sets.s{k}]\nresource_root_dir = {:?}\n\
             [collect.s{k}]\nurl = \"{host}/s{k}/sitemap.xml\"\nkind = \"sitemap\"\nretry_base_ms = 20\nrequest_timeout_secs = 10\n",
            tmp.path().join("files").join(format!("s{k}"))
        ));
    }
    let cfg = tmp.path().join("rshub.toml");
    std::fs::write(&cfg, toml).unwrap();
    let servers = [
        ChildServer::serve_one_of(tmp.path(), "a", &cfg),
        ChildServer::serve_one_of(tmp.path(), "b", &cfg),
        ChildServer::serve_one_of(tmp.path(), "c", &cfg),
    ];
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    // The empty first runs done, the collectors are shared out: each process holds some.
    crate::support::wait_until("the collectors shared out among the three", || async {
        let h = held(&client, &servers.iter().collect::<Vec<_>>()).await;
        h.iter().all(|n| *n > 0) && h.iter().sum::<usize>() == SOURCES
    })
    .await;
    let shares = held(&client, &servers.iter().collect::<Vec<_>>()).await;
    assert!(shares.iter().all(|n| *n >= 8 && *n <= 12), "{shares:?}");

    // The sources fill; every collector asked to run.
    for p in &peers {
        p.filled.store(true, Ordering::SeqCst);
    }
    for k in 0..SOURCES {
        let r = client
            .post(servers[k % 3].url(&format!("/admin/v1/collect/s{k}/run")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    // Mid-run: the process holding the most is killed.
    crate::support::wait_until("some pages fetched", || async {
        peers
            .iter()
            .map(|p| p.pages.lock().unwrap().len())
            .sum::<usize>()
            >= 30
    })
    .await;
    let shares = held(&client, &servers.iter().collect::<Vec<_>>()).await;
    let victim = (0..3).max_by_key(|i| shares[*i]).unwrap();
    let [a, b, c] = servers;
    let mut all = vec![Some(a), Some(b), Some(c)];
    let killed = all[victim].take().unwrap();
    let killed_at = Instant::now();
    killed.signal("KILL");
    let rest: Vec<ChildServer> = all.into_iter().flatten().collect();

    // Every source completes, within 60 s of the kill.
    let store = crate::support::elastic_store(&es).await;
    loop {
        let mut done = 0;
        for k in 0..SOURCES {
            let set = resourcesync_hub::model::SetName::parse(&format!("s{k}")).unwrap();
            let counts = store.counts(&set).await.unwrap();
            if counts.resources == PAGES as u64 {
                done += 1;
            }
        }
        if done == SOURCES {
            break;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(60),
            "{done} of {SOURCES} sources complete 60 s after the kill; held now: {:?}",
            held(&client, &rest.iter().collect::<Vec<_>>()).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "every source complete {:.1} s after the kill",
        killed_at.elapsed().as_secs_f64()
    );
    // Each page recorded once, and every collector now held by a live process.
    for k in 0..SOURCES {
        let set = resourcesync_hub::model::SetName::parse(&format!("s{k}")).unwrap();
        let counts = store.counts(&set).await.unwrap();
        assert_eq!(
            (counts.resources, counts.changes),
            (PAGES as u64, PAGES as u64),
            "s{k}"
        );
    }
    crate::support::wait_until("every collector held by a live process", || async {
        held(&client, &rest.iter().collect::<Vec<_>>())
            .await
            .iter()
            .sum::<usize>()
            == SOURCES
    })
    .await;
    for (i, p) in peers.iter().enumerate() {
        let most = p.most.load(Ordering::SeqCst);
        assert!(most <= 2, "host {i} saw {most} requests in flight at once");
        assert_eq!(p.now.load(Ordering::SeqCst), 0);
    }
}
