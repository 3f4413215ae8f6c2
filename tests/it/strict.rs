//! What ingest accepts stays valid forever: events that would make a document schema-invalid
//! (over-long URLs, bad media types, characters XML cannot carry, years past 9999) are refused
//! with a reason naming the line, and every document built from random accepted events
//! validates against the official schemas.

use crate::support::*;

/// A small deterministic generator (xorshift), so a failure replays the same events.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }

    /// A string of awkward characters: markup, quotes, non-ASCII, now and then a control
    /// character XML 1.0 forbids or a long run.
    fn text(&mut self, max: u64) -> String {
        const PIECES: &[&str] = &[
            "a", "Z", "0", "-", "_", ".", "~", "&", "<", ">", "\"", "'", "]]>", " ", "%", "%41",
            "#", "?", "=", "é", "日本", "🦀", "\u{0085}", "\u{FEFF}", "\u{1}", "\u{1b}", "\u{7f}",
            "\t", "\r\n", "\u{FFFE}", "/", "//", "\\",
        ];
        let n = 1 + self.below(max);
        let mut s = String::new();
        for _ in 0..n {
            s.push_str(self.pick(PIECES));
        }
        if self.below(25) == 0 {
            s.push_str(&"x".repeat(self.below(3000) as usize));
        }
        s
    }

    fn mime(&mut self) -> String {
        match self.below(4) {
            0 => self.text(6),
            1 => format!(
                "{}/{}",
                "a".repeat(1 + self.below(140) as usize),
                "b".repeat(1 + self.below(140) as usize)
            ),
            _ => self
                .pick(&[
                    "application/pdf",
                    "text/plain; charset=utf-8",
                    "application/ld+json",
                    "image/svg+xml",
                    "application/vnd.ms-excel",
                    "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
                    "text/x-foo_bar",
                    "application/",
                    "/json",
                    "text/ plain",
                ])
                .to_string(),
        }
    }

    fn date(&mut self) -> String {
        match self.below(6) {
            0 => self.text(4),
            1 => format!("{:04}-01-01T00:00:00Z", 1 + self.below(9999)),
            2 => "+10000-01-01T00:00:00Z".into(),
            3 => "0000-12-31T23:59:59Z".into(),
            _ => format!(
                "20{:02}-0{}-1{}T0{}:30:00.{}Z",
                self.below(30),
                1 + self.below(9),
                self.below(9),
                self.below(9),
                self.below(1000)
            ),
        }
    }

    fn location(&mut self) -> serde_json::Value {
        match self.below(3) {
            0 => {
                serde_json::json!({"type": "url", "value": format!("http://example.org/{}", self.text(8))})
            }
            _ => serde_json::json!({"type": "rel_path", "value": self.text(10)}),
        }
    }

    fn event(&mut self) -> serde_json::Value {
        let change = self.pick(&["created", "created", "updated", "deleted"]);
        let mut e = serde_json::json!({"change": change, "location": self.location()});
        if self.below(2) == 0 {
            e["mime"] = self.mime().into();
        }
        if self.below(2) == 0 {
            e["lastmod"] = self.date().into();
        }
        if self.below(3) == 0 {
            e["length"] = self.below(1 << 40).into();
            e["md5"] = md5_hex(self.text(3).as_bytes()).into();
        }
        if self.below(3) == 0 {
            let rel = self
                .pick(&[
                    "describedby",
                    "alternate",
                    "http://example.org/rel/x",
                    "bad rel",
                    "x\u{2}y",
                ])
                .to_string();
            let mut l = serde_json::json!({"rel": rel, "href": self.location()});
            if self.below(2) == 0 {
                l["mime"] = self.mime().into();
            }
            e["ln"] = serde_json::json!([l]);
        }
        e
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_accepted_events_make_only_valid_documents() {
    let (mut c, dir) = test_config();
    // Small lists, so parts, an index and closed Change Lists all appear.
    add_file_set(&mut c, "s", &dir.path().join("root"), Some(25));
    let app = TestApp::start_with(c).await;
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..1500 {
        let event = rng.event().to_string();
        let r = app.ingest("s", &event).await;
        match r.status().as_u16() {
            200 => accepted += 1,
            422 => {
                let body: serde_json::Value = r.json().await.unwrap();
                assert_eq!(body["lines"][0]["line"], 1, "{body}");
                assert!(
                    !body["lines"][0]["reason"].as_str().unwrap().is_empty(),
                    "{body}"
                );
                refused += 1;
            }
            s => panic!("{s} for {event}"),
        }
    }
    assert!(
        accepted > 200 && refused > 200,
        "a useful mix: {accepted} accepted, {refused} refused"
    );

    // Every document the set has now, including every part and every Change List.
    let mut docs = vec![(
        "sd".to_string(),
        app.get_text("/.well-known/resourcesync").await,
    )];
    docs.push((
        "cap".into(),
        app.get_text("/sets/s/capabilitylist.xml").await,
    ));
    for index in ["/sets/s/resourcelist.xml", "/sets/s/changelist.xml"] {
        let (body, doc) = app.get_doc(index).await;
        assert!(doc.is_index, "{index} should be an index by now");
        for e in &doc.entries {
            docs.push((e.loc.clone(), app.get_text(&app.path_of(&e.loc)).await));
        }
        docs.push((index.into(), body));
    }
    assert!(
        docs.len() >= 8,
        "{} documents from {accepted} accepted events",
        docs.len()
    );
    assert_valid(
        &docs
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_str()))
            .collect::<Vec<_>>(),
    );
    app.stop().await;
}

#[tokio::test]
async fn input_that_would_break_documents_is_refused_naming_the_line() {
    let app = TestApp::start().await;
    let ok = |v: &str| {
        format!(r#"{{"change":"created","location":{{"type":"rel_path","value":"{v}"}}}}"#)
    };
    let long = "p/".repeat(1100);
    let cases: Vec<(String, &str)> = vec![
        (ok(&long), "at most 2048"),
        (
            format!(r#"{{"change":"created","location":{{"type":"url","value":"http://example.org/{}"}}}}"#, "a".repeat(2100)),
            "at most 2048",
        ),
        (
            format!(
                r#"{{"change":"created","location":{{"type":"rel_path","value":"a"}},"ln":[{{"rel":"describedby","href":{{"type":"rel_path","value":"{long}"}}}}]}}"#
            ),
            "link href resolves to a URL of",
        ),
        (r#"{"change":"created","location":{"type":"rel_path","value":"a\u0001b"}}"#.into(), "U+0001"),
        (r#"{"change":"created","location":{"type":"url","value":"http://example.org/a b"}}"#.into(), "cannot hold there"),
        (
            format!(r#"{{"change":"created","location":{{"type":"rel_path","value":"a"}},"mime":"application/{}"}}"#, "x".repeat(300)),
            "at most 255",
        ),
        (r#"{"change":"created","location":{"type":"rel_path","value":"a"},"mime":"pdf"}"#.into(), "type/subtype"),
        (r#"{"change":"created","location":{"type":"rel_path","value":"a"},"mime":"text/pl\u0000ain"}"#.into(), "U+0000"),
        (r#"{"change":"created","location":{"type":"rel_path","value":"a"},"lastmod":"0000-12-31T23:59:59Z"}"#.into(), "0001 to 9999"),
        (
            r#"{"change":"created","location":{"type":"rel_path","value":"a"},"ln":[{"rel":"describedby","href":{"type":"url","value":"http://example.org/m"},"mime":"x"}]}"#.into(),
            "link mime",
        ),
    ];
    for (line, why) in &cases {
        // The bad line second, after a good one: the whole batch is refused, naming line 2.
        let batch = format!("{}\n{line}", ok("fine.txt"));
        let r = app.ingest("s", &batch).await;
        assert_eq!(r.status(), 422, "{line}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["lines"][0]["line"], 2, "{body}");
        let reason = body["lines"][0]["reason"].as_str().unwrap();
        assert!(reason.contains(why), "expected {why:?} in {reason:?}");
        assert!(
            reason.len() < 600,
            "the reason quotes a short prefix, not the whole input: {}",
            reason.len()
        );
    }
    // Nothing reached the store: the set was never created.
    let r = app
        .client
        .get(app.url("/sets/s/resourcelist.xml"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    app.stop().await;
}
