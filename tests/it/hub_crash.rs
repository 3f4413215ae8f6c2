//! Durability: the hub as a child process is killed with SIGKILL in the middle of a fan-out;
//! after a restart every subscriber has every notification (at least once, at most one of them
//! twice), in publish order, each with one `Webhook-Id` (a repeat with the same), and no
//! subscription is lost.

use std::collections::HashMap;
use std::time::Duration;

use resourcesync_hub::store::Store;

use crate::subscriber::{first_seen, number, numbered, TestSubscriber};
use crate::support::ChildServer;

const SUBSCRIBERS: usize = 50;
const NOTIFICATIONS: usize = 20;

/// Debug logging, so that the check that no secret reaches the log means something.
fn start_hub(dir: &std::path::Path) -> ChildServer {
    let cfg = dir.join("hub.toml");
    std::fs::write(
        &cfg,
        "[hub]\nallow_networks = [\"127.0.0.0/8\"]\npublisher_token = \"t\"\nretry_schedule_secs = [1, 1, 1]\n",
    )
    .unwrap();
    ChildServer::serve(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--data-dir",
            dir.join("data").to_str().unwrap(),
        ],
        &[("RUST_LOG", "debug,hyper=info,hyper_util=info,reqwest=info")],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_killed_mid_fan_out_delivers_everything_after_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let sub = TestSubscriber::start().await;
    // Slow subscribers make the fan-out last long enough to be interrupted: each lane needs
    // at least 2 s for its 20 messages, so a kill at a third leaves most of it to do even on
    // a machine too busy to notice the third at once.
    sub.set_delay(Duration::from_millis(100));
    let hub = start_hub(tmp.path());
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let topic = format!("http://{}/topics/crash", hub.addr);
    for i in 0..SUBSCRIBERS {
        let r = client
            .post(hub.url("/hub"))
            .form(&[
                ("hub.mode", "subscribe"),
                ("hub.topic", topic.as_str()),
                ("hub.callback", &sub.url(&format!("/cb/{i}"))),
                ("hub.secret", &format!("SeCrEt-{i}")),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    let store = Store::open_embedded(&tmp.path().join("data/rshub.sqlite")).unwrap();
    crate::support::wait_until("all verified", || async {
        store.hub_subscriptions().await.unwrap().len() == SUBSCRIBERS
    })
    .await;

    for n in 0..NOTIFICATIONS {
        let r = client
            .post(hub.url("/hub"))
            .header("content-type", "application/xml")
            .header("authorization", "Bearer t")
            .header("link", format!("<{topic}>; rel=\"self\""))
            .body(format!("<n i=\"{n}\"/>"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "publish {n}");
    }
    let total = SUBSCRIBERS * NOTIFICATIONS;
    sub.wait_until("a third of the fan-out", |s| {
        s.all_deliveries().len() >= total / 3
    })
    .await;
    let first_log = hub.log();
    let status = hub.signal("KILL");
    assert!(!status.success());
    let at_kill = sub.all_deliveries().len();
    assert!(
        at_kill < total,
        "killed mid-fan-out ({at_kill} of {total} delivered)"
    );

    let hub = start_hub(tmp.path());
    sub.wait_until("every notification at every callback", |s| {
        let r = numbered(s);
        r.len() == SUBSCRIBERS
            && r.values().all(|v| {
                let mut u = v.clone();
                u.sort();
                u.dedup();
                u.len() == NOTIFICATIONS
            })
    })
    .await;
    let r = numbered(&sub);
    for (path, got) in &r {
        assert_eq!(
            first_seen(got),
            (0..NOTIFICATIONS).collect::<Vec<_>>(),
            "{path} got them out of order: {got:?}"
        );
    }
    let dupes = sub.all_deliveries().len() - total;
    println!("killed after {at_kill} of {total} deliveries; {dupes} redelivered after the restart");
    // A lane sends the next message only once the outcome of the last is durable: a crash
    // repeats at most the one delivery each subscriber had in flight.
    for (path, got) in &r {
        assert!(
            got.len() <= NOTIFICATIONS + 1,
            "{path} got {} repeats after one crash (at most 1): {got:?}",
            got.len() - NOTIFICATIONS
        );
    }
    // A repeat after the crash carries the message's `Webhook-Id`; messages have their own.
    let mut ids: HashMap<usize, std::collections::HashSet<String>> = HashMap::new();
    for d in sub.all_deliveries() {
        let n = number(&d);
        ids.entry(n)
            .or_default()
            .insert(d.header("webhook-id").expect("a Webhook-Id").to_string());
    }
    assert!(
        ids.values().all(|s| s.len() == 1),
        "one id per message, repeats included: {ids:?}"
    );
    let distinct: std::collections::HashSet<&String> = ids.values().flatten().collect();
    assert_eq!(distinct.len(), NOTIFICATIONS, "each message its own id");
    assert_eq!(
        store.hub_subscriptions().await.unwrap().len(),
        SUBSCRIBERS,
        "no subscription lost"
    );
    assert!(hub.log().contains("pending_deliveries="), "{}", hub.log());
    assert!(
        sub.all_deliveries()
            .iter()
            .all(|d| d.header("x-hub-signature").is_some()),
        "every delivery is signed"
    );
    assert!(
        first_log.contains("DEBUG") && first_log.contains("published"),
        "debug logging was on"
    );
    for log in [&first_log, &hub.log()] {
        assert!(!log.contains("SeCrEt"), "a secret reached the log");
    }
    drop(hub);
}
