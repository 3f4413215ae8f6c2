//! Several server processes on one Elasticsearch store (osmem-server): each notification is
//! published once between them, each subscriber receives each change exactly once, and when
//! the process that delivers stops, another takes over.

use std::time::Duration;

use resourcesync_hub::model::websub::{Callback, Topic};

use crate::notify::{check_change_notifications, docs, url_line};
use crate::subscriber::TestSubscriber;
use crate::support::{get_text, ChildServer, Osmem};

const CHANGES: usize = 500;
const BATCH: usize = 10;
const CALLBACKS: [&str; 3] = ["/a", "/b", "/c"];

fn config(dir: &std::path::Path, es: &str) -> std::path::PathBuf {
    let cfg = dir.join("hub.toml");
    // Topics are named by the public base URL, which every process shares.
    std::fs::write(
        &cfg,
        format!(
            "[server]\nbase_url = \"http://hub.test\"\n\
             [store]\nbackend = \"elasticsearch\"\n[store.elasticsearch]\nurl = \"{es}\"\n\
             [hub]\nallow_networks = [\"127.0.0.0/8\"]\n\
             [notify]\npoll_interval_ms = 200\nmax_entries = 25\n\
             [admin]\ntoken = \"{CONSOLE_TOKEN}\"\n\
             [sets.papers]\n"
        ),
    )
    .unwrap();
    cfg
}

const CONSOLE_TOKEN: &str = "multi-console-token";

/// The partitions of each live process as `server`'s console lists them (signed in), once it
/// lists two.
async fn console_processes(server: &ChildServer) -> Vec<u64> {
    let (client, session) =
        crate::support::console_session(&server.url("/console/login"), CONSOLE_TOKEN).await;
    let shares = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    crate::support::wait_until("the console lists both processes", || {
        let (client, session) = (client.clone(), session.clone());
        let url = server.url("/console/");
        let shares = shares.clone();
        async move {
            let page = client
                .get(url)
                .header("cookie", session)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let Some(table) = page.split("Delivering processes").nth(1) else {
                return false;
            };
            let found: Vec<u64> = table
                .split("</table>")
                .next()
                .unwrap_or_default()
                .split("<tr><td><code>")
                .skip(1)
                .filter_map(|row| {
                    row.split("<td>")
                        .last()?
                        .split("</td>")
                        .next()?
                        .trim()
                        .parse()
                        .ok()
                })
                .collect();
            let two = found.len() == 2;
            *shares.lock().unwrap() = found;
            two
        }
    })
    .await;
    let found = shares.lock().unwrap().clone();
    found
}

async fn ingest(client: &reqwest::Client, server: &ChildServer, from: usize) {
    let lines: Vec<String> = (from..from + BATCH)
        .map(|n| {
            url_line(
                if n % 7 == 3 && n > 20 {
                    "updated"
                } else {
                    "created"
                },
                n % 400,
                None,
            )
        })
        .collect();
    let r = client
        .post(server.url("/api/v1/resource-sets/papers/changes"))
        .header("content-type", "application/x-ndjson")
        .body(lines.join("\n"))
        .send()
        .await
        .unwrap();
    let status = r.status();
    assert_eq!(status, 200, "{}", r.text().await.unwrap());
}

/// Which of the two holds the delivery lease (its log says so last).
/// Whether a process delivers, from its own /metrics (`rshub_delivering`).
async fn delivers(client: &reqwest::Client, s: &ChildServer) -> bool {
    get_text(client, &s.url("/metrics"))
        .await
        .lines()
        .any(|l| l == "rshub_delivering 1")
}

/// The index of the one process that delivers, once exactly one does.
async fn delivering(client: &reqwest::Client, a: &ChildServer, b: &ChildServer) -> Option<usize> {
    for _ in 0..500 {
        match (delivers(client, a).await, delivers(client, b).await) {
            (true, false) => return Some(0),
            (false, true) => return Some(1),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_store_notify_each_change_once_and_survive_one_stopping() {
    two_processes("TERM").await;
}

/// SIGKILL leaves no time to hand over: the other process takes over when the lease lapses
/// (10 s) and nothing is lost; a notification whose delivery was under way, or delivered but
/// not yet recorded, is delivered again (at least once, as WebSub specifies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_store_lose_nothing_when_the_delivering_one_is_killed() {
    two_processes("KILL").await;
}

async fn two_processes(signal: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let es = Osmem::clone_url().await;
    let cfg = config(tmp.path(), &es);
    let servers = vec![
        ChildServer::serve_one_of(tmp.path(), "a", &cfg),
        ChildServer::serve_one_of(tmp.path(), "b", &cfg),
    ];
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let sub = TestSubscriber::start().await;
    let topic = "http://hub.test/topics/papers/changes";

    // Subscribe through either process.
    for (i, path) in CALLBACKS.iter().enumerate() {
        let r = client
            .post(servers[i % 2].url("/hub"))
            .form(&[
                ("hub.mode", "subscribe"),
                ("hub.topic", topic),
                ("hub.callback", &sub.url(path)),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    let store = crate::support::elastic_store(&es).await;
    for path in CALLBACKS {
        let cb = Callback::parse(&sub.url(path)).unwrap();
        let mut ok = false;
        for _ in 0..500 {
            if store
                .hub_subscription(&Topic::parse(topic).unwrap(), &cb)
                .await
                .unwrap()
                .is_some()
            {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(ok, "subscription of {path} recorded");
    }
    let leader = delivering(&client, &servers[0], &servers[1])
        .await
        .expect("exactly one process delivers");
    // Either process's console shows both, each with its share of the partitions.
    for server in &servers {
        let shares = console_processes(server).await;
        assert_eq!(shares.len(), 2, "{shares:?}");
        assert!(shares.iter().all(|n| *n > 0), "{shares:?}");
    }

    // Half the changes through both processes, alternately.
    for (i, from) in (0..CHANGES / 2).step_by(BATCH).enumerate() {
        ingest(&client, &servers[i % 2], from).await;
    }
    // Stop the delivering process (SIGTERM: it finishes deliveries under way and hands over).
    let mut servers = servers;
    let stopped = servers.remove(leader);
    let survivor = servers.pop().unwrap();
    let status = stopped.signal(signal);
    assert_eq!(status.success(), signal == "TERM", "{status}");
    for from in (CHANGES / 2..CHANGES).step_by(BATCH) {
        ingest(&client, &survivor, from).await;
    }

    let all = |s: &TestSubscriber| {
        CALLBACKS.iter().all(|p| {
            docs(s, p)
                .iter()
                .map(|(_, d)| d.entries.len())
                .sum::<usize>()
                >= CHANGES
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while !all(&sub) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A marker change behind them, through the survivor: each subscriber's lane delivers in
    // order, so anything repeated (KILL allows a redelivery, checked below) arrives before it.
    let r = client
        .post(survivor.url("/api/v1/resource-sets/papers/changes"))
        .header("content-type", "application/x-ndjson")
        .body(url_line("created", 999, None))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let marked = |s: &TestSubscriber| {
        CALLBACKS.iter().all(|p| {
            docs(s, p).last().is_some_and(|(_, d)| {
                d.entries
                    .last()
                    .is_some_and(|e| e.loc == "http://example.org/r/999")
            })
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while !marked(&sub) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        delivers(&client, &survivor).await,
        "the survivor took over:\n{}",
        survivor.log()
    );

    // The Change List, read from the survivor: every change document, in order.
    let cl = client
        .get(survivor.url("/sets/papers/changelist.xml"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let cl = resourcesync_hub::sitemap::parse(cl.as_bytes()).unwrap();
    assert!(!cl.is_index);
    let expected: Vec<(String, String, String)> = cl
        .entries
        .iter()
        .map(|e| {
            (
                e.loc.clone(),
                e.md["change"].clone(),
                e.md["datetime"].clone(),
            )
        })
        .collect();
    assert_eq!(expected.len(), CHANGES + 1, "the changes and the marker");
    for path in CALLBACKS {
        let mut received = docs(&sub, path);
        if signal == "KILL" {
            // Repeats are whole notifications, made again: keep the first of each.
            let mut seen = std::collections::HashSet::new();
            received.retain(|(text, _)| seen.insert(text.clone()));
        }
        let got = check_change_notifications(&received);
        assert_eq!(got.len(), CHANGES + 1, "{path}: each change exactly once");
        assert_eq!(
            got, expected,
            "{path}: one to one with the change documents, in order"
        );
    }
}
