//! 120,000 resources with max_items_in_list = 50,000: a Resource List Index of 3 parts that
//! together list every resource exactly once.

use std::collections::HashSet;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_set_is_an_index_of_three_parts() {
    let (mut c, _dir) = test_config();
    c.set_defaults.max_items_in_list = 50_000;
    let app = TestApp::start_with(c).await;
    const N: usize = 120_000;
    let md5 = md5_hex(b"x");
    for batch in 0..(N / 20_000) {
        let lines: Vec<String> = (batch * 20_000..(batch + 1) * 20_000)
            .map(|i| change_line("created", &format!("d{}/r{i}.txt", i % 97), &md5, 1))
            .collect();
        app.ingest_ok("big", &lines.join("\n")).await;
    }
    let (index_body, index) = app.get_doc("/sets/big/resourcelist.xml").await;
    assert!(index.is_index);
    assert_eq!(index.entries.len(), 3);
    let mut seen = HashSet::with_capacity(N);
    let mut bodies = vec![("index".to_string(), index_body)];
    for part in &index.entries {
        let (body, doc) = app.get_doc(&app.path_of(&part.loc)).await;
        assert!(doc.entries.len() <= 50_000);
        for e in doc.entries {
            assert!(seen.insert(e.loc.clone()), "{} listed twice", e.loc);
        }
        bodies.push((part.loc.clone(), body));
    }
    assert_eq!(seen.len(), N);
    for i in [0, 49_999, 50_000, 119_999] {
        assert!(seen.contains(&format!(
            "{}/files/big/d{}/r{i}.txt",
            app.config.base_url(),
            i % 97
        )));
    }
    let refs: Vec<(&str, &str)> = bodies
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_valid(&refs);
    // The change log rolled over at 50,000 as well.
    let (_, cl) = app.get_doc("/sets/big/changelist.xml").await;
    assert!(cl.is_index);
    assert_eq!(cl.entries.len(), 3);
    app.stop().await;
}
