//! Delivery shared by three processes on one Elasticsearch store (osmem-server): 60
//! subscribers, 400 fat pings published through all three, one process SIGKILLed halfway.
//! Every subscriber gets all 400 in order with at most 2 repeats, each process delivers a
//! share, and a process paused (SIGSTOP) past its partition leases sends, once it runs again,
//! at most the one request per lane that the lane had checked its lease for and not yet
//! written at the pause (the message after the last its subscriber had, under the same
//! Webhook-Id): nothing from its queues (without fencing, its lanes' queues made 27 repeats,
//! up to 2 per subscriber). A redelivery asked of either process reaches the one that delivers
//! the subscription.

use std::time::{Duration, Instant};

use crate::subscriber::{first_seen, number, numbered, TestSubscriber};
use crate::support::{get_text, ChildServer, Osmem};

const SUBSCRIBERS: usize = 60;
const PINGS: usize = 400;
const PARTITIONS: u32 = 32;
const TOPIC: &str = "http://hub.test/topics/shards";

fn config(dir: &std::path::Path, es: &str) -> std::path::PathBuf {
    let cfg = dir.join("hub.toml");
    // Topics are named by the public base URL, which every process shares.
    std::fs::write(
        &cfg,
        format!(
            "[server]\nbase_url = \"http://hub.test\"\n\
             [store]\nbackend = \"elasticsearch\"\n[store.elasticsearch]\nurl = \"{es}\"\n\
             [hub]\nallow_networks = [\"127.0.0.0/8\"]\npublisher_token = \"t\"\n\
             partitions = {PARTITIONS}\npartition_lease_secs = 3\n[admin]\ntoken = \"shards-admin-token\"\n"
        ),
    )
    .unwrap();
    cfg
}

/// A gauge or counter from a process's /metrics.
async fn metric(client: &reqwest::Client, s: &ChildServer, name: &str) -> u64 {
    get_text(client, &s.url("/metrics"))
        .await
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

async fn held(client: &reqwest::Client, s: &ChildServer) -> u64 {
    metric(client, s, "rshub_partitions_held").await
}

async fn delivered(client: &reqwest::Client, s: &ChildServer) -> u64 {
    metric(client, s, "rshub_deliveries_total{outcome=\"delivered\"}").await
}

async fn wait_for(what: &str, secs: u64, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out ({secs} s) waiting for {what}");
}

async fn publish(client: &reqwest::Client, s: &ChildServer, n: usize) {
    let r = client
        .post(s.url("/hub"))
        .header("content-type", "application/xml")
        .header("authorization", "Bearer t")
        .header("link", format!("<{TOPIC}>; rel=\"self\""))
        .body(format!("<n i=\"{n}\"/>"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "publish {n}");
}

fn all_received(sub: &TestSubscriber, upto: usize) -> bool {
    let r = numbered(sub);
    r.len() == SUBSCRIBERS
        && r.values().all(|v| {
            let mut u = v.clone();
            u.sort();
            u.dedup();
            u.len() == upto
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_delivery_survive_a_kill_and_fence_a_paused_one() {
    let tmp = tempfile::tempdir().unwrap();
    let es = Osmem::clone_url().await;
    let cfg = config(tmp.path(), &es);
    let mut procs: Vec<ChildServer> = ["a", "b", "c"]
        .iter()
        .map(|n| ChildServer::serve_one_of(tmp.path(), n, &cfg))
        .collect();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    wait_for("the partitions spread over the three", 30, async || {
        let mut sum = 0;
        for p in &procs {
            let h = held(&client, p).await;
            if h == 0 {
                return false;
            }
            sum += h;
        }
        sum == u64::from(PARTITIONS)
    })
    .await;

    let sub = TestSubscriber::start().await;
    for i in 0..SUBSCRIBERS {
        let r = client
            .post(procs[i % 3].url("/hub"))
            .form(&[
                ("hub.mode", "subscribe"),
                ("hub.topic", TOPIC),
                ("hub.callback", &sub.url(&format!("/cb/{i}"))),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    let store = crate::support::elastic_store(&es).await;
    wait_for("every subscription verified", 30, async || {
        store.hub_subscriptions().await.unwrap().len() == SUBSCRIBERS
    })
    .await;

    // Half through all three, in turn; the other half through the two left after a SIGKILL,
    // once the one to be killed has delivered a share of its own (its lanes start as it
    // picks up the new subscriptions of its partitions, however long that takes).
    for n in 0..PINGS / 2 {
        publish(&client, &procs[n % 3], n).await;
    }
    let victim = procs.remove(2);
    wait_for("the process to be killed delivering", 30, async || {
        delivered(&client, &victim).await > 0
    })
    .await;
    let victim_delivered = delivered(&client, &victim).await;
    let status = victim.signal("KILL");
    assert!(!status.success());
    let killed_at = Instant::now();
    for n in PINGS / 2..PINGS {
        publish(&client, &procs[n % 2], n).await;
    }
    wait_for("all 400 at every subscriber", 90, async || {
        all_received(&sub, PINGS)
    })
    .await;
    println!(
        "all delivered {:.1} s after the kill",
        killed_at.elapsed().as_secs_f64()
    );
    let r = numbered(&sub);
    for (path, got) in &r {
        assert_eq!(
            first_seen(got),
            (0..PINGS).collect::<Vec<_>>(),
            "{path} got them out of order"
        );
        assert!(
            got.len() <= PINGS + 2,
            "{path}: {} repeats (at most 2)",
            got.len() - PINGS
        );
    }
    let shares = [
        delivered(&client, &procs[0]).await,
        delivered(&client, &procs[1]).await,
        victim_delivered,
    ];
    println!("deliveries per process (the last killed halfway): {shares:?}");
    assert!(
        shares.iter().all(|n| *n > 0),
        "each delivered a share: {shares:?}"
    );
    // The two left hold every partition between them.
    wait_for("the survivors hold every partition", 20, async || {
        held(&client, &procs[0]).await + held(&client, &procs[1]).await == u64::from(PARTITIONS)
    })
    .await;

    // Pause one in the middle of delivering (slow subscribers: its lanes have queues) and
    // past its leases: the other takes its partitions over and delivers the rest. A lane
    // checks its lease just before it hands a request to its connection; a pause landing
    // between the two would let that one request out at the resume. With answers taking
    // 300 ms the lanes spend their time waiting for them, and that is where the pause lands
    // (with 40 ms, one run in six caught a request on its way out).
    sub.set_delay(Duration::from_millis(300));
    let paused_before = delivered(&client, &procs[0]).await;
    for n in PINGS..PINGS + 20 {
        publish(&client, &procs[1], n).await;
    }
    wait_for("the first process under way", 30, async || {
        delivered(&client, &procs[0]).await >= paused_before + 10
    })
    .await;
    procs[0].send("STOP");
    wait_for("the first process stopped", 10, async || {
        procs[0].is_stopped()
    })
    .await;
    // What each subscriber had when it stopped: a lane sends its next message only once the
    // previous one is answered and recorded, so the message a stopped lane had not yet sent
    // is the one after the last its subscriber got.
    let at_stop: std::collections::HashMap<String, usize> = numbered(&sub)
        .into_iter()
        .map(|(path, got)| (path, got.into_iter().max().unwrap_or(0)))
        .collect();
    let paused_at = delivered(&client, &procs[1]).await;
    wait_for("the other process holds every partition", 30, async || {
        held(&client, &procs[1]).await == u64::from(PARTITIONS)
    })
    .await;
    wait_for("the 20 published before the pause", 60, async || {
        all_received(&sub, PINGS + 20)
    })
    .await;
    assert!(
        delivered(&client, &procs[1]).await > paused_at,
        "the partitions taken over were delivered"
    );
    // Running again, it finds its leases taken: it sends nothing more for them (its lanes had
    // queues), rejoins, and gets partitions back by hand-over.
    let at_resume = sub.all_deliveries().len();
    procs[0].send("CONT");
    wait_for(
        "the paused process holds partitions again",
        30,
        async || {
            let a = held(&client, &procs[0]).await;
            a > 0 && a + held(&client, &procs[1]).await == u64::from(PARTITIONS)
        },
    )
    .await;
    sub.set_delay(Duration::ZERO);
    let since = resourcesync_hub::model::Timestamp::now();
    tokio::time::sleep(Duration::from_millis(5)).await;
    for n in PINGS + 20..PINGS + 40 {
        publish(&client, &procs[n % 2], n).await;
    }
    wait_for("20 more after the hand-over", 30, async || {
        all_received(&sub, PINGS + 40)
    })
    .await;
    let r = numbered(&sub);
    let mut repeats = 0;
    for (path, got) in &r {
        let after: Vec<usize> = got.iter().copied().filter(|n| *n >= PINGS).collect();
        assert_eq!(
            first_seen(&after),
            (PINGS..PINGS + 40).collect::<Vec<_>>(),
            "{path} got them out of order"
        );
        // The one in flight when it stopped; none at the hand-over back (the giver's lanes
        // stop and their outcomes are written before it releases the lease).
        assert!(
            after.len() <= 40 + 1,
            "{path}: {} repeats across the pause: the paused process kept sending ({after:?})",
            after.len() - 40
        );
        repeats += after.len() - 40;
    }
    println!("{repeats} repeats over {SUBSCRIBERS} subscribers across the pause and hand-over");

    // A redelivery asked of either process reaches the one delivering the subscription.
    let list: serde_json::Value = client
        .get(procs[0].url("/admin/v1/subscriptions?callback=/cb/7"))
        .bearer_auth("shards-admin-token")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = list["items"][0]["id"].as_str().unwrap().to_string();
    let before = sub.deliveries("/cb/7").len();
    for p in &procs {
        let r = client
            .post(p.url(&format!("/admin/v1/subscriptions/{id}/redeliver")))
            .bearer_auth("shards-admin-token")
            .json(&serde_json::json!({"since": since.to_string()}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        assert_eq!(r.text().await.unwrap(), "{\"queued\":20}");
    }
    wait_for("both redeliveries", 30, async || {
        sub.deliveries("/cb/7").len() >= before + 40
    })
    .await;
    let again: Vec<usize> = sub.deliveries("/cb/7")[before..]
        .iter()
        .map(number)
        .collect();
    let window: Vec<usize> = (PINGS + 20..PINGS + 40).collect();
    assert_eq!(
        again,
        [window.clone(), window].concat(),
        "twice the window, in order"
    );
    // Whatever arrived after the resume and had arrived before was sent again by the paused
    // process (the other delivered each once, in order, and hands back without repeating).
    // Fencing checks the lease before a request leaves, but the check and the request leaving
    // are not one step: a lane stopped between the two sends that one request when it runs
    // again. So the bound, and nothing more: at most one per lane, and only the message that
    // lane had not yet sent when it stopped, under the same Webhook-Id as its first delivery.
    let all = sub.all_deliveries();
    let mut first_id: std::collections::HashMap<(String, String), String> =
        std::collections::HashMap::new();
    for d in &all[..at_resume] {
        first_id
            .entry((d.path.clone(), d.text()))
            .or_insert_with(|| d.header("webhook-id").unwrap_or_default().to_string());
    }
    let mut again: std::collections::HashMap<String, Vec<usize>> = Default::default();
    for d in &all[at_resume..] {
        let Some(id) = first_id.get(&(d.path.clone(), d.text())) else {
            continue;
        };
        assert_eq!(
            d.header("webhook-id"),
            Some(id.as_str()),
            "{}: a repeat under another Webhook-Id",
            d.path
        );
        again.entry(d.path.clone()).or_default().push(number(d));
    }
    for (path, repeated) in &again {
        let unsent = at_stop.get(path).map_or(0, |n| n + 1);
        assert_eq!(
            repeated,
            &vec![unsent],
            "{path}: after it resumed, the paused process sent {repeated:?}; at most the one \
             message its lane had not yet sent ({unsent}) may go out"
        );
    }
    println!(
        "{} lanes sent the request they were about to send when the process was paused",
        again.len()
    );
}
