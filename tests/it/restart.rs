//! Restart the server on the same data: every resource, change and closed Change List is
//! served byte-identically (apart from the `at`/`completed` of Resource Lists, which are
//! snapshots generated anew).

use crate::support::*;

/// Removes `at="…"` and `completed="…"` attributes.
fn without_snapshot_times(s: &str) -> String {
    let mut out = s.to_string();
    for attr in [" at=\"", " completed=\""] {
        while let Some(i) = out.find(attr) {
            let end = out[i + attr.len()..].find('"').unwrap() + i + attr.len() + 1;
            out.replace_range(i..end, "");
        }
    }
    out
}

async fn all_documents(app: &TestApp) -> Vec<(String, String)> {
    let mut paths = vec![
        "/.well-known/resourcesync".to_string(),
        "/sets/s/capabilitylist.xml".into(),
        "/sets/s/resourcelist.xml".into(),
        "/sets/s/changelist.xml".into(),
    ];
    for index in ["/sets/s/resourcelist.xml", "/sets/s/changelist.xml"] {
        let (_, doc) = app.get_doc(index).await;
        for e in doc.entries {
            paths.push(app.path_of(&e.loc));
        }
    }
    let mut out = Vec::new();
    for p in paths {
        out.push((p.clone(), app.get_text(&p).await));
    }
    out
}

#[tokio::test]
async fn restart_serves_the_same_documents() {
    let (mut c, _dir) = test_config();
    c.server.base_url = "http://hub.test:8080".into();
    c.set_defaults.max_items_in_list = 5;
    let app = TestApp::start_with(c.clone()).await;
    for round in 0..4 {
        let lines: Vec<String> = (0..6)
            .map(|i| {
                let n = format!("r{round}-{i}.txt");
                match (round, i) {
                    (_, 0) if round > 0 => {
                        change_line("deleted", &format!("r{}-1.txt", round - 1), "", 0)
                    }
                    (_, 5) if round > 0 => change_line(
                        "updated",
                        &format!("r{}-2.txt", round - 1),
                        &md5_hex(b"u"),
                        1,
                    ),
                    _ => change_line("created", &n, &md5_hex(n.as_bytes()), n.len() as u64),
                }
            })
            .collect();
        app.ingest_ok("s", &lines.join("\n")).await;
    }
    let before = all_documents(&app).await;
    assert!(before.len() > 8, "indexes with several parts and lists");
    app.stop().await;

    let app = TestApp::start_with(c.clone()).await;
    let after = all_documents(&app).await;
    assert_eq!(before.len(), after.len());
    for ((p, a), (_, b)) in before.iter().zip(&after) {
        if p.contains("resourcelist") {
            assert_eq!(without_snapshot_times(a), without_snapshot_times(b), "{p}");
        } else {
            assert_eq!(a, b, "{p} changed across a restart");
        }
    }
    // And it carries on where it stopped.
    app.ingest_ok("s", &change_line("created", "after.txt", &md5_hex(b"a"), 1))
        .await;
    let (_, cl) = app.get_doc("/sets/s/changelist.xml").await;
    let (_, open) = app
        .get_doc(&app.path_of(&cl.entries.last().unwrap().loc))
        .await;
    assert!(open.entries.iter().any(|e| e.loc.ends_with("/after.txt")));
    app.stop().await;
}
