//! Change and framework notifications end to end: ingest → poller → hub → a real subscriber.
//! Every payload validates; intervals are consecutive; entries match the change documents one
//! to one, across restarts, late writers and shared datetimes.

use resourcesync_hub::config::{Config, SetOverrides};
use resourcesync_hub::sitemap::{self, Document};

use crate::hub::{hub_config, subscribed};
use crate::subscriber::TestSubscriber;
use crate::support::*;
use resourcesync_hub::model::Timestamp;

fn with_set(c: &mut Config, name: &str, max_items: Option<u32>) {
    c.sets.insert(
        name.into(),
        SetOverrides {
            max_items_in_list: max_items,
            ..Default::default()
        },
    );
}

pub(crate) fn url_line(change: &str, n: usize, datetime: Option<&str>) -> String {
    let dt = datetime
        .map(|d| format!(r#","datetime":"{d}""#))
        .unwrap_or_default();
    if change == "deleted" {
        return format!(
            r#"{{"change":"deleted","location":{{"type":"url","value":"http://example.org/r/{n}"}}{dt}}}"#
        );
    }
    format!(
        r#"{{"change":"{change}","location":{{"type":"url","value":"http://example.org/r/{n}"}},"md5":"{}","length":{n},"mime":"text/plain"{dt}}}"#,
        md5_hex(format!("{change}{n}").as_bytes())
    )
}

/// The notifications received at `path`, parsed, in arrival order.
pub(crate) fn docs(sub: &TestSubscriber, path: &str) -> Vec<(String, Document)> {
    sub.deliveries(path)
        .into_iter()
        .map(|d| {
            let t = d.text();
            let doc = sitemap::parse(t.as_bytes()).unwrap_or_else(|e| panic!("{e}: {t}"));
            (t, doc)
        })
        .collect()
}

/// (loc, change, datetime) of every entry.
fn entries(docs: &[(String, Document)]) -> Vec<(String, String, String)> {
    docs.iter()
        .flat_map(|(_, d)| {
            d.entries.iter().map(|e| {
                (
                    e.loc.clone(),
                    e.md["change"].clone(),
                    e.md["datetime"].clone(),
                )
            })
        })
        .collect()
}

/// Asserts the change-notification contract over consecutive payloads; returns the entries.
pub(crate) fn check_change_notifications(
    docs: &[(String, Document)],
) -> Vec<(String, String, String)> {
    // W3C datetimes are compared as instants: the fraction is written only when non-zero, so
    // `…:02Z` sorts after `…:02.000001Z` as a string.
    let instant = |s: &str| Timestamp::parse(s).unwrap_or_else(|e| panic!("{e}"));
    let mut prev_until: Option<Timestamp> = None;
    for (text, d) in docs {
        assert_eq!(d.md["capability"], "change-notification", "{text}");
        let (from, until) = (instant(&d.md["from"]), instant(&d.md["until"]));
        assert!(from < until, "{text}");
        if let Some(p) = prev_until {
            assert_eq!(from, p, "intervals are consecutive");
        }
        let dts: Vec<Timestamp> = d
            .entries
            .iter()
            .map(|e| instant(&e.md["datetime"]))
            .collect();
        assert!(
            dts.windows(2).all(|w| w[0] <= w[1]),
            "forward chronological order: {text}"
        );
        assert!(
            dts.iter().all(|t| *t >= from && *t < until),
            "entries lie in [from, until): {text}"
        );
        prev_until = Some(until);
    }
    let docs_for_validation: Vec<(&str, &str)> = docs
        .iter()
        .map(|(t, _)| ("change-notification", t.as_str()))
        .collect();
    assert_valid(&docs_for_validation);
    entries(docs)
}

/// (loc, change, datetime) of the set's Change List(s), i.e. the change documents.
async fn change_documents(app: &TestApp, set: &str) -> Vec<(String, String, String)> {
    let (_, cl) = app.get_doc(&format!("/sets/{set}/changelist.xml")).await;
    let mut out = Vec::new();
    let lists: Vec<String> = if cl.is_index {
        cl.entries.iter().map(|e| app.path_of(&e.loc)).collect()
    } else {
        vec![format!("/sets/{set}/changelist.xml")]
    };
    for l in lists {
        let (_, d) = app.get_doc(&l).await;
        out.extend(d.entries.iter().map(|e| {
            (
                e.loc.clone(),
                e.md["change"].clone(),
                e.md["datetime"].clone(),
            )
        }));
    }
    out
}

async fn wait_entries(sub: &TestSubscriber, path: &str, n: usize) {
    sub.wait_until(&format!("{n} notified changes at {path}"), |s| {
        entries(&docs(s, path)).len() >= n
    })
    .await;
}

/// Waits for `n` notified changes, the last of them the marker (`http://example.org/r/99`).
async fn wait_marker(sub: &TestSubscriber, path: &str, n: usize) {
    wait_entries(sub, path, n).await;
    let got = docs(sub, path);
    let last = &got.last().unwrap().1;
    assert_eq!(
        last.entries.last().unwrap().loc,
        "http://example.org/r/99",
        "the marker is the last change notified"
    );
}

#[tokio::test]
async fn every_change_is_notified_once_in_consecutive_validated_batches() {
    let (c, _d) = hub_config();
    every_change_once(c).await;
}

#[tokio::test]
async fn every_change_is_notified_once_on_elasticsearch() {
    let (mut c, _d) = hub_config();
    use_elasticsearch(&mut c).await;
    every_change_once(c).await;
}

async fn every_change_once(mut c: Config) {
    with_set(&mut c, "papers", None);
    c.notify.max_entries = 7;
    let app = TestApp::start_with(c).await;
    let sub = TestSubscriber::start().await;
    subscribed(
        &app,
        &sub,
        &app.config.change_topic("papers"),
        "/changes",
        &[],
    )
    .await;

    // 20 at once: cut at 7 entries. Then a few small batches, updates and deletes.
    let batch: Vec<String> = (0..20).map(|n| url_line("created", n, None)).collect();
    app.ingest_ok("papers", &batch.join("\n")).await;
    for n in 0..5 {
        app.ingest_ok(
            "papers",
            &[
                url_line("updated", n, None),
                url_line("deleted", n + 10, None),
            ]
            .join("\n"),
        )
        .await;
    }
    // Ten changes sharing one datetime (more than max_entries) travel together.
    let shared = resourcesync_hub::model::Timestamp::now().to_string();
    let batch: Vec<String> = (30..40)
        .map(|n| url_line("created", n, Some(&shared)))
        .collect();
    app.ingest_ok("papers", &batch.join("\n")).await;

    // A marker behind them: the subscriber's lane delivers in order, so a repeat of anything
    // before it arrives before it.
    app.ingest_ok("papers", &url_line("created", 99, None))
        .await;
    wait_marker(&sub, "/changes", 41).await;
    let got = docs(&sub, "/changes");
    assert!(
        got.iter().all(|(_, d)| d.entries.len() <= 7
            || d.entries
                .iter()
                .all(|e| e.md["datetime"] == d.entries[0].md["datetime"])),
        "cut at max_entries except a shared datetime"
    );
    assert!(
        got.iter().any(|(_, d)| d.entries.len() == 10),
        "the shared-datetime group is not split"
    );
    let notified = check_change_notifications(&got);
    assert_eq!(
        notified,
        change_documents(&app, "papers").await,
        "one to one with the change documents"
    );
    // The topic URI serves the latest notification.
    let latest = app
        .get_text(&app.path_of(&app.config.change_topic("papers")))
        .await;
    assert_eq!(latest, got.last().unwrap().0);
    app.stop().await;
}

#[tokio::test]
async fn a_restart_neither_misses_nor_repeats_and_offline_writes_are_notified() {
    let (mut c, dir) = hub_config();
    with_set(&mut c, "papers", None);
    // Topics are named by the public base URL, which a restart must keep (the port changes).
    c.server.base_url = "http://hub.test".into();
    let app = TestApp::start_with(c.clone()).await;
    let sub = TestSubscriber::start().await;
    subscribed(
        &app,
        &sub,
        &app.config.change_topic("papers"),
        "/changes",
        &[],
    )
    .await;
    app.ingest_ok(
        "papers",
        &(0..5)
            .map(|n| url_line("created", n, None))
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .await;
    wait_entries(&sub, "/changes", 5).await;
    let addr_before = app.addr.clone();
    app.stop().await;

    // Another writer while the server is down.
    let store = resourcesync_hub::store::Store::open_embedded(&c.database_path()).unwrap();
    let set = resourcesync_hub::model::SetName::parse("papers").unwrap();
    let sc = c.set_config("papers");
    let policy = resourcesync_hub::store::ListPolicy {
        max_items: 50_000,
        max_bytes: 50_000_000,
        rollover_secs: 0,
        max_future_skew_secs: 300,
    };
    let events: Vec<resourcesync_hub::model::NewChange> = (5..8)
        .map(|n| {
            serde_json::from_str::<resourcesync_hub::model::ChangeEvent>(&url_line(
                "created", n, None,
            ))
            .unwrap()
            .validate(&sc)
            .unwrap()
        })
        .collect();
    store
        .apply(
            &set,
            events,
            policy,
            resourcesync_hub::model::Timestamp::now(),
        )
        .await
        .unwrap();

    let app = TestApp::start_with(c).await;
    assert_ne!(app.addr, addr_before);
    wait_entries(&sub, "/changes", 8).await;
    app.ingest_ok(
        "papers",
        &(8..12)
            .map(|n| url_line("created", n, None))
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .await;
    app.ingest_ok("papers", &url_line("created", 99, None))
        .await;
    wait_marker(&sub, "/changes", 13).await;
    let notified = check_change_notifications(&docs(&sub, "/changes"));
    assert_eq!(
        notified,
        change_documents(&app, "papers").await,
        "none missed, none repeated"
    );
    app.stop().await;
    drop(dir);
}

#[tokio::test]
async fn late_changes_within_the_hold_back_are_notified_in_order() {
    let (mut c, _d) = hub_config();
    with_set(&mut c, "papers", None);
    c.notify.hold_back_secs = 2;
    let app = TestApp::start_with(c).await;
    let sub = TestSubscriber::start().await;
    subscribed(
        &app,
        &sub,
        &app.config.change_topic("papers"),
        "/changes",
        &[],
    )
    .await;
    // The set's open Change List starts when the server did: stay a second after that.
    let (_, cl) = app.get_doc("/sets/papers/changelist.xml").await;
    let from = resourcesync_hub::model::Timestamp::parse(&cl.md["from"]).unwrap();
    wait_until("a second past the open Change List's start", || async {
        resourcesync_hub::model::Timestamp::now().micros() - 1_000_000 > from.micros()
    })
    .await;
    let now = resourcesync_hub::model::Timestamp::now();
    let earlier = resourcesync_hub::model::Timestamp(now.micros() - 1_000_000);
    app.ingest_ok("papers", &url_line("created", 1, Some(&now.to_string())))
        .await;
    app.ingest_ok(
        "papers",
        &url_line("created", 2, Some(&earlier.to_string())),
    )
    .await;
    wait_entries(&sub, "/changes", 2).await;
    let notified = check_change_notifications(&docs(&sub, "/changes"));
    let locs: Vec<&str> = notified.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        locs,
        ["http://example.org/r/2", "http://example.org/r/1"],
        "the late one, dated earlier, comes first"
    );
    // Older than the last notification: refused, with the reason.
    let r = app
        .ingest(
            "papers",
            &url_line("created", 3, Some(&earlier.to_string())),
        )
        .await;
    assert_eq!(r.status(), 422);
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body.to_string().contains("hold_back_secs"), "{body}");
    app.stop().await;
}

#[tokio::test]
async fn framework_notifications_for_a_new_set_and_a_change_list_rollover() {
    let (mut c, _d) = hub_config();
    with_set(&mut c, "old", None);
    c.set_defaults.max_items_in_list = 4;
    let app = TestApp::start_with(c).await;
    let sub = TestSubscriber::start().await;
    subscribed(&app, &sub, &app.config.framework_topic("old"), "/old", &[]).await;
    subscribed(
        &app,
        &sub,
        &app.config.framework_topic("fresh"),
        "/fresh",
        &[],
    )
    .await;
    let cap = app.config.base_url() + "/sets/fresh/capabilitylist.xml";
    let sd = app.config.base_url() + "/.well-known/resourcesync";

    app.ingest_ok("fresh", &url_line("created", 1, None)).await;
    sub.wait_deliveries("/fresh", 2).await;
    let fresh = docs(&sub, "/fresh");
    let created = fresh
        .iter()
        .find(|(_, d)| {
            d.entries
                .iter()
                .any(|e| e.md["capability"] == "capabilitylist")
        })
        .expect("capabilitylist created");
    assert_eq!(created.1.link("up"), Some(sd.as_str()));
    let kinds: Vec<(String, String)> = created
        .1
        .entries
        .iter()
        .map(|e| (e.md["capability"].clone(), e.md["change"].clone()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("capabilitylist".into(), "created".into()),
            ("description".into(), "updated".into())
        ]
    );
    assert!(fresh.iter().any(|(_, d)| d
        .entries
        .iter()
        .any(|e| e.md["capability"] == "resourcelist" && e.md["change"] == "created")));
    let old = sub.wait_deliveries("/old", 1).await;
    assert!(
        old[0].text().contains("capability=\"description\""),
        "the Source Description update goes to every set's channel"
    );

    // 4 per Change List: the fifth change rolls over.
    let batch: Vec<String> = (2..7).map(|n| url_line("created", n, None)).collect();
    app.ingest_ok("fresh", &batch.join("\n")).await;
    sub.wait_until("the rollover notification", |s| {
        docs(s, "/fresh")
            .iter()
            .any(|(_, d)| d.entries.iter().any(|e| e.md["capability"] == "changelist"))
    })
    .await;
    let fresh = docs(&sub, "/fresh");
    let (text, roll) = fresh
        .iter()
        .find(|(_, d)| d.entries.iter().any(|e| e.md["capability"] == "changelist"))
        .unwrap();
    assert_eq!(roll.link("up"), Some(cap.as_str()));
    let base = app.config.base_url();
    let cl: Vec<(String, String, String)> = roll
        .entries
        .iter()
        .filter(|e| e.md["capability"] == "changelist")
        .map(|e| {
            (
                e.loc.clone(),
                e.md["change"].clone(),
                e.links[0]["href"].clone(),
            )
        })
        .collect();
    let index = format!("{base}/sets/fresh/changelist.xml");
    assert_eq!(
        cl,
        [
            (format!("{base}/sets/fresh/changelist/1.xml"), "updated".into(), index.clone()),
            (format!("{base}/sets/fresh/changelist/2.xml"), "created".into(), index.clone()),
        ],
        "rel=index under the Change List Index; never a notification about the index itself: {text}"
    );
    assert!(roll.entries.iter().all(|e| e.loc != index));
    let all: Vec<(String, &str)> = fresh
        .iter()
        .map(|(t, _)| ("framework".to_string(), t.as_str()))
        .collect();
    assert_valid(
        &all.iter()
            .map(|(n, t)| (n.as_str(), *t))
            .collect::<Vec<_>>(),
    );
    app.stop().await;
}
