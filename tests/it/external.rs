//! External writers (the DIT-ES protocol): documents put straight into the indices by
//! `examples/dit_writer.rs` are adopted, served in the Resource List and Change List, and
//! notified, like ingested ones.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use resourcesync_hub::sitemap::Document;

use crate::hub::{hub_config, subscribed};
use crate::subscriber::TestSubscriber;
use crate::support::*;

const RESOURCES: usize = 25_000;
const UPDATES: usize = 100;
const DELETES: usize = 50;

/// `cargo test` builds the examples next to the test binary's directory.
fn example(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name)
}

/// Every entry of a document or, for an index, of the documents it lists.
async fn all_entries(
    app: &TestApp,
    path: &str,
) -> (
    Document,
    Vec<(String, std::collections::BTreeMap<String, String>)>,
    Vec<(String, String)>,
) {
    let (text, doc) = app.get_doc(path).await;
    let mut texts = vec![(path.to_string(), text)];
    let mut out = Vec::new();
    if doc.is_index {
        for e in &doc.entries {
            let p = app.path_of(&e.loc);
            let (t, d) = app.get_doc(&p).await;
            out.extend(d.entries.iter().map(|x| (x.loc.clone(), x.md.clone())));
            texts.push((p, t));
        }
    } else {
        out.extend(doc.entries.iter().map(|x| (x.loc.clone(), x.md.clone())));
    }
    (doc, out, texts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_writers_25000_resources_are_listed_once_and_their_changes_in_order() {
    let (mut c, _d) = hub_config();
    use_elasticsearch(&mut c).await;
    // Parts and lists of 10,000: the Resource List and the Change List are indexes.
    c.sets.insert(
        "papers".into(),
        resourcesync_hub::config::SetOverrides {
            max_items_in_list: Some(10_000),
            ..Default::default()
        },
    );
    c.notify.max_entries = 5000;
    let es = c.store.elasticsearch.url.clone();
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

    let out = std::process::Command::new(example("dit_writer"))
        .args([
            "--url",
            &es,
            "--set",
            "papers",
            "--resources",
            &RESOURCES.to_string(),
        ])
        .args([
            "--updates",
            &UPDATES.to_string(),
            "--deletes",
            &DELETES.to_string(),
        ])
        .output()
        .expect("the dit_writer example is built by cargo test");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let total = RESOURCES + UPDATES + DELETES;

    // Adoption runs before every notifier sweep: wait for every change to be notified.
    let notified = |s: &TestSubscriber| {
        crate::notify::docs(s, "/changes")
            .iter()
            .map(|(_, d)| d.entries.len())
            .sum::<usize>()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while notified(&sub) < total && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(notified(&sub), total, "every external change notified");

    let (rl, resources, texts) = all_entries(&app, "/sets/papers/resourcelist.xml").await;
    assert!(rl.is_index, "25,000 resources in parts of 10,000");
    assert_eq!(rl.entries.len(), 3);
    let locs: Vec<&String> = resources.iter().map(|(l, _)| l).collect();
    let unique: BTreeSet<&String> = locs.iter().copied().collect();
    assert_eq!(
        locs.len(),
        RESOURCES - DELETES,
        "each resource listed exactly once"
    );
    assert_eq!(unique.len(), locs.len(), "no resource listed twice");
    let expected: BTreeSet<String> = (0..RESOURCES - DELETES)
        .map(|n| format!("http://example.org/papers/{n}"))
        .collect();
    assert_eq!(
        unique.into_iter().cloned().collect::<BTreeSet<_>>(),
        expected
    );
    let kinds: Vec<(&str, &str)> = texts
        .iter()
        .enumerate()
        .map(|(i, (_, t))| {
            (
                if i == 0 {
                    "resourcelist-index"
                } else {
                    "resourcelist"
                },
                t.as_str(),
            )
        })
        .collect();
    assert_valid(&kinds);

    let (cl, changes, texts) = all_entries(&app, "/sets/papers/changelist.xml").await;
    assert!(cl.is_index, "25,150 changes in lists of 10,000");
    assert_eq!(changes.len(), total, "the Change List holds every change");
    // Instants, not strings: `…:02Z` sorts after `…:02.000001Z` as text.
    let dts: Vec<resourcesync_hub::model::Timestamp> = changes
        .iter()
        .map(|(_, md)| resourcesync_hub::model::Timestamp::parse(&md["datetime"]).unwrap())
        .collect();
    assert!(
        dts.windows(2).all(|w| w[0] <= w[1]),
        "forward chronological order"
    );
    let mut seen: HashMap<&str, Vec<&str>> = HashMap::new();
    for (loc, md) in &changes {
        seen.entry(loc.as_str())
            .or_default()
            .push(md["change"].as_str());
    }
    assert_eq!(seen.len(), RESOURCES);
    assert_eq!(seen["http://example.org/papers/0"], ["created", "updated"]);
    assert_eq!(
        seen[format!("http://example.org/papers/{}", RESOURCES - 1).as_str()],
        ["created", "deleted"]
    );
    assert_eq!(seen["http://example.org/papers/5000"], ["created"]);
    let kinds: Vec<(&str, &str)> = texts
        .iter()
        .enumerate()
        .map(|(i, (_, t))| {
            (
                if i == 0 {
                    "changelist-index"
                } else {
                    "changelist"
                },
                t.as_str(),
            )
        })
        .collect();
    assert_valid(&kinds);

    // Notified one to one with the Change List.
    let notified =
        crate::notify::check_change_notifications(&crate::notify::docs(&sub, "/changes"));
    let listed: Vec<(String, String, String)> = changes
        .iter()
        .map(|(l, md)| (l.clone(), md["change"].clone(), md["datetime"].clone()))
        .collect();
    assert_eq!(notified, listed);
    app.stop().await;
}
