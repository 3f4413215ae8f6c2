//! The LDN inbox and COAR Notify (issue 61): COAR's own library posts its patterns; a
//! DSpace-shaped offer naming a collected record has it collected at once and pushed to a
//! subscriber; hostile senders cost bounded work and reach nothing.

use std::time::{Duration, Instant};

use resourcesync_hub::config::SenderConfig;

use crate::collect::{collect_config, fixture, now_datestamp, rewrite, OaiServer};
use crate::hostile::Canary;
use crate::hub::subscribed;
use crate::subscriber::TestSubscriber;
use crate::support::{PyEnv, TestApp};

const ORIGIN: &str = "https://repository.example.edu";
const ORIGIN_INBOX: &str = "https://repository.example.edu/ldn/inbox";

/// A server collecting `repo` into `papers`, its inbox taking notifications from one sender,
/// the repository, posting from loopback.
async fn start(
    repo: &OaiServer,
    edit: impl FnOnce(&mut resourcesync_hub::config::Config),
) -> (TestApp, tempfile::TempDir) {
    let (mut c, dir) = collect_config(&repo.base);
    c.hub.allow_networks = vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
    c.inbox.enabled = true;
    c.inbox.senders.insert(
        "repo".into(),
        SenderConfig {
            id: ORIGIN.into(),
            inbox: ORIGIN_INBOX.into(),
            collect: "papers".into(),
            networks: vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
            token_env: String::new(),
        },
    );
    edit(&mut c);
    (TestApp::start_with(c).await, dir)
}

/// DSpace's offer to ingest an item, naming it by `object_id`.
fn offer(object_id: &str) -> serde_json::Value {
    serde_json::json!({
        "@context": ["https://www.w3.org/ns/activitystreams", "https://coar-notify.net"],
        "id": format!("urn:uuid:{}", uuid_like()),
        "type": ["Offer", "coar-notify:IngestAction"],
        "actor": {"id": ORIGIN, "type": "Service", "name": "DSpace"},
        "origin": {"id": ORIGIN, "inbox": ORIGIN_INBOX, "type": "Service"},
        "target": {"id": "https://aggregator.example.org", "inbox": "https://aggregator.example.org/inbox", "type": "Service"},
        "object": {
            "id": object_id,
            "ietf:cite-as": "https://hdl.handle.net/123/456",
            "ietf:item": {"id": "https://repository.example.edu/bitstreams/1/download", "mediaType": "application/pdf", "type": ["Article", "sorg:ScholarlyArticle"]},
            "type": ["Page", "sorg:AboutPage"]
        }
    })
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    format!(
        "00000000-0000-4000-8000-{:012x}",
        N.fetch_add(1, Ordering::SeqCst)
    )
}

async fn post(app: &TestApp, body: &str, content_type: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(app.url("/inbox"))
        .header("content-type", content_type)
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// COAR's own library sends each Announce pattern it models with its client: each is taken
/// (201 + Location, as its test inbox expects), listed in the inbox (`ldp:contains`), and
/// retrievable at its URL as sent. The inbox is advertised on `/` and on the Capability List,
/// and answers OPTIONS with what it accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coars_library_posts_its_patterns_and_each_is_kept_and_listed() {
    let repo = OaiServer::start(&fixture(3), 10);
    let (app, _d) = start(&repo, |_| {}).await;
    let inbox = app.url("/inbox");
    let out = tokio::task::spawn_blocking({
        let inbox = inbox.clone();
        move || {
            std::process::Command::new(PyEnv::get().python())
                .arg(
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("tests/tools/coar_send.py"),
                )
                .args([
                    &inbox,
                    ORIGIN,
                    ORIGIN_INBOX,
                    "https://aggregator.example.org",
                ])
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sent.len(), 3);
    let c = reqwest::Client::new();
    for s in &sent {
        assert_eq!(s["action"], "created", "{s}");
        let loc = s["location"].as_str().unwrap();
        assert!(loc.starts_with(&format!("{inbox}/")), "{loc}");
        let r = c.get(loc).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/ld+json"));
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["id"], s["id"]);
        assert_eq!(body["origin"]["id"], ORIGIN);
    }
    let listing: serde_json::Value = c.get(&inbox).send().await.unwrap().json().await.unwrap();
    let listed: Vec<&str> = listing["ldp:contains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["@id"].as_str().unwrap())
        .collect();
    for s in &sent {
        assert!(
            listed.contains(&s["location"].as_str().unwrap()),
            "{listing}"
        );
    }
    let o = c
        .request(reqwest::Method::OPTIONS, &inbox)
        .send()
        .await
        .unwrap();
    assert!(o.headers()["accept-post"]
        .to_str()
        .unwrap()
        .contains("application/ld+json"));
    let advertised = format!("<{inbox}>; rel=\"http://www.w3.org/ns/ldp#inbox\"");
    for path in ["/", "/sets/papers/capabilitylist.xml"] {
        let r = c.get(app.url(path)).send().await.unwrap();
        let links: Vec<&str> = r
            .headers()
            .get_all("link")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert!(links.contains(&advertised.as_str()), "{path}: {links:?}");
    }
    app.stop().await;
}

/// A DSpace-shaped offer naming a record of the repository by its OAI identifier: the record
/// is fetched at once by `GetRecord` (no run in between) and its change reaches a subscriber;
/// the same offer again, the record being current, records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_has_its_record_collected_at_once_and_pushed() {
    let mut fx = fixture(5);
    let repo = OaiServer::start(&fx, 10);
    let (app, _d) = start(&repo, |_| {}).await;
    let c = crate::collect::Collecting { repo, app };
    let (repo, app) = (&c.repo, &c.app);
    let first = c.wait_ended(None).await;
    let sub = TestSubscriber::start().await;
    subscribed(
        app,
        &sub,
        &app.config.change_topic("papers"),
        "/changes",
        &[],
    )
    .await;
    let changes_before = c.app_counts().await;

    fx["records"][3]["dc"]["title"] = serde_json::json!(["Record 3, revised"]);
    fx["records"][3]["datestamp"] = serde_json::json!(now_datestamp());
    rewrite(repo, &fx);
    let t = Instant::now();
    let r = post(
        app,
        &offer("oai:test:3").to_string(),
        "application/ld+json; profile=\"https://www.w3.org/ns/activitystreams\"",
    )
    .await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let got = crate::support::wait_until("the change notification of oai:test:3", || async {
        crate::notify::docs(&sub, "/changes")
            .iter()
            .any(|(t, _)| t.contains("oai:test:3.xml"))
    });
    got.await;
    let took = t.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(
        c.app_counts().await,
        changes_before + 1,
        "one change recorded"
    );
    let status = c.status().await;
    assert_eq!(
        status["last_ended"], first["last_ended"],
        "no run in between: {status:#}"
    );
    let asked: serde_json::Value = reqwest::get(repo.base.replace("/oai", "/_requests"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        asked.as_array().unwrap().iter().any(|q| {
            let q = q["query"].as_str().unwrap_or("");
            q.contains("verb=GetRecord") && q.contains("oai%3Atest%3A3")
        }),
        "{asked}"
    );
    // Current now: the same offer records nothing.
    let r = post(app, &offer("oai:test:3").to_string(), "application/ld+json").await;
    assert_eq!(r.status(), 201);
    let loc = r.headers()["location"].to_str().unwrap().to_string();
    let seq: u64 = loc.rsplit('/').next().unwrap().parse().unwrap();
    crate::support::wait_until("the second offer settled", || async {
        outcome(app, seq)
            .await
            .is_some_and(|o| o["state"] == "collected")
    })
    .await;
    let o = outcome(app, seq).await.unwrap();
    assert_eq!(o["changed"], false, "{o}");
    assert_eq!(
        c.app_counts().await,
        changes_before + 1,
        "nothing more recorded"
    );
    c.app.stop().await;
}

/// What became of notification `seq`, read from the store as the inbox kept it.
pub async fn outcome(app: &TestApp, seq: u64) -> Option<serde_json::Value> {
    let store = resourcesync_hub::app::open_store(&app.config)
        .await
        .unwrap();
    let keep = u64::from(app.config.inbox.keep);
    let (json, _) = store
        .state(&format!("inbox/slot/{}", seq % keep))
        .await
        .unwrap()?;
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    (v["seq"] == seq).then(|| v["outcome"].clone())
}

/// Hostile senders: an oversized notification (413), one nested past any reason (400), one
/// that is not a pattern (400, naming what is wrong), an undeclared origin (403), a declared
/// one posting from elsewhere (403), another media type (415); a notification whose
/// `@context` and object point at a canary port makes no connection to it; a flood from one
/// sender is cut at its budget (429 with Retry-After) and the inbox keeps at most its ring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_senders_are_refused_in_words_and_reach_nothing() {
    let repo = OaiServer::start(&fixture(2), 10);
    let (app, _d) = start(&repo, |c| {
        c.inbox.keep = 5;
        c.inbox.per_sender_per_minute = 10;
        c.inbox.max_notification_bytes = 4096;
        c.inbox.senders.insert(
            "far".into(),
            SenderConfig {
                id: "https://far.example.org".into(),
                inbox: "https://far.example.org/inbox".into(),
                collect: "papers".into(),
                networks: vec!["192.0.2.0/24".parse().unwrap()],
                token_env: String::new(),
            },
        );
    })
    .await;
    let canary = Canary::start().await;
    let big = offer(&format!(
        "https://repository.example.edu/{}",
        "x".repeat(5000)
    ));
    let r = post(&app, &big.to_string(), "application/ld+json").await;
    assert_eq!(r.status(), 413);
    let nested = format!("{}{}", "[".repeat(2000), "]".repeat(2000));
    let r = post(&app, &nested, "application/ld+json").await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("not JSON"));
    let mut not_pattern = offer("oai:test:1");
    not_pattern["type"] = serde_json::json!(["Offer", "coar-notify:ReviewAction"]);
    let r = post(&app, &not_pattern.to_string(), "application/ld+json").await;
    assert_eq!(r.status(), 400);
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("not a pattern this inbox takes"));
    let mut stranger = offer("oai:test:1");
    stranger["origin"]["id"] = serde_json::json!("https://stranger.example.net");
    let r = post(&app, &stranger.to_string(), "application/ld+json").await;
    assert_eq!(r.status(), 403);
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("is not a sender this inbox takes"));
    let mut far = offer("oai:test:1");
    far["origin"]["id"] = serde_json::json!("https://far.example.org");
    let r = post(&app, &far.to_string(), "application/ld+json").await;
    assert_eq!(r.status(), 403);
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("posts from its networks only"));
    let r = post(&app, &offer("oai:test:1").to_string(), "text/html").await;
    assert_eq!(r.status(), 415);
    let mut lure = offer(&canary.url("/item"));
    lure["@context"] = serde_json::json!([
        "https://www.w3.org/ns/activitystreams",
        "https://coar-notify.net",
        canary.url("/context.jsonld")
    ]);
    lure["object"]["ietf:cite-as"] = serde_json::json!(canary.url("/cite"));
    let r = post(&app, &lure.to_string(), "application/ld+json").await;
    assert_eq!(r.status(), 201, "taken: its context is read, never fetched");
    let seq: u64 = r.headers()["location"]
        .to_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    crate::support::wait_until("the lure settled", || async {
        outcome(&app, seq)
            .await
            .is_some_and(|o| o["state"] != "received")
    })
    .await;
    assert_eq!(
        canary.connections(),
        0,
        "nothing a notification names is contacted"
    );
    // The sender's budget: 10 a minute, one spent on the lure.
    let mut statuses = Vec::new();
    for _ in 0..30 {
        let r = post(
            &app,
            &offer("oai:test:0").to_string(),
            "application/ld+json",
        )
        .await;
        if r.status() == 429 {
            assert!(r.headers().get("retry-after").is_some());
        }
        statuses.push(r.status().as_u16());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        9,
        "{statuses:?}"
    );
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 21);
    let listing: serde_json::Value = reqwest::get(app.url("/inbox"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listing["ldp:contains"].as_array().unwrap().len(),
        5,
        "the ring keeps 5: {listing}"
    );
    app.stop().await;
}
