//! The LDN inbox and COAR Notify (issue 61): COAR's own library posts its patterns; a
//! DSpace-shaped offer naming a collected record has it collected at once and pushed to a
//! subscriber; hostile senders cost bounded work and reach nothing.

use std::time::{Duration, Instant};

use resourcesync_hub::config::SenderConfig;

use crate::collect::{collect_config, fixture, now_datestamp, rewrite, OaiServer};
use crate::hostile::Canary;
use crate::hub::subscribed;
use crate::subscriber::TestSubscriber;
use crate::support::{admin_call, PyEnv, TestApp};

const ORIGIN: &str = "https://repository.example.edu";
const ORIGIN_INBOX: &str = "https://repository.example.edu/ldn/inbox";

/// The sender's own inbox, receiving the server's answers with COAR's library
/// (`tests/tools/coar_inbox.py`: each answer parsed and validated by its models).
pub struct CoarInbox {
    child: std::process::Child,
    pub url: String,
}

impl CoarInbox {
    pub fn start(hang: bool) -> CoarInbox {
        use std::io::BufRead as _;
        let mut cmd = std::process::Command::new(PyEnv::get().python());
        cmd.arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/coar_inbox.py"));
        if hang {
            cmd.arg("--hang");
        }
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = serde_json::from_str::<serde_json::Value>(&line)
            .unwrap_or_else(|e| panic!("coar_inbox.py did not start: {e}: {line:?}"))["port"]
            .clone();
        CoarInbox {
            child,
            url: format!("http://127.0.0.1:{port}/inbox"),
        }
    }

    /// What it received so far: [{type, pattern, valid, error, body}].
    pub async fn received(&self) -> Vec<serde_json::Value> {
        reqwest::get(self.url.replace("/inbox", "/_received"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

impl Drop for CoarInbox {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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

/// POSTs `body` as JSON-LD and asserts it is refused with `status`, saying `words`.
async fn refused(app: &TestApp, body: &str, status: u16, words: &str) {
    let r = post(app, body, "application/ld+json").await;
    assert_eq!(r.status(), status);
    let text = r.text().await.unwrap();
    assert!(text.contains(words), "{text}");
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
        // A sender's bytes: never run by a browser as this origin.
        assert!(r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("sandbox"));
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
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

/// A DSpace-shaped offer naming a record of the repository by its landing page (which the
/// record's `dc:identifier` carries): the record is fetched at once by `GetRecord` (no run in
/// between) and its change reaches a subscriber; an offer naming it by its OAI identifier,
/// the record being current, records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_has_its_record_collected_at_once_and_pushed() {
    let mut fx = fixture(5);
    // Its landing page and its handle, as DSpace's oai_dc carries them.
    fx["records"][3]["dc"]["identifier"] = serde_json::json!([
        "https://repository.example.edu/handle/123/3",
        "https://hdl.handle.net/123/3"
    ]);
    let repo = OaiServer::start(&fx, 10);
    let answers = CoarInbox::start(false);
    let inbox_url = answers.url.clone();
    let (app, _d) = start(&repo, |c| {
        c.inbox.senders.get_mut("repo").unwrap().inbox = inbox_url;
    })
    .await;
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
        &offer("https://repository.example.edu/handle/123/3").to_string(),
        "application/ld+json; profile=\"https://www.w3.org/ns/activitystreams\"",
    )
    .await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    // The notification of its update (the first run's creations may still be arriving).
    crate::support::wait_until("the update of oai:test:3 notified", || async {
        crate::notify::docs(&sub, "/changes").iter().any(|(_, d)| {
            d.entries.iter().any(|e| {
                e.loc.ends_with("oai:test:3.xml")
                    && e.md.get("change").map(String::as_str) == Some("updated")
            })
        })
    })
    .await;
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
    let seq = seq_of(&r);
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
    // Each offer was answered at the sender's inbox, Accept then the service result's
    // Announce, every answer valid for COAR's library; an offer naming no record it can
    // collect gets a Reject with the reason.
    let r = post(
        app,
        &offer("https://repository.example.edu/handle/1/2").to_string(),
        "application/ld+json",
    )
    .await;
    assert_eq!(r.status(), 201);
    crate::support::wait_until("five answers at the sender's inbox", || async {
        answers.received().await.len() >= 5
    })
    .await;
    let got = answers.received().await;
    let patterns: Vec<&str> = got
        .iter()
        .map(|a| a["pattern"].as_str().unwrap_or("refused"))
        .collect();
    assert_eq!(
        patterns,
        [
            "Accept",
            "AnnounceServiceResult",
            "Accept",
            "AnnounceServiceResult",
            "Reject"
        ],
        "{got:#?}"
    );
    assert!(got.iter().all(|a| a["valid"] == true), "{got:#?}");
    let announce = &got[1]["body"];
    let record_url = announce["object"]["id"].as_str().unwrap();
    assert!(record_url.ends_with("oai:test:3.xml"), "{announce}");
    let served = reqwest::get(record_url.replace(&app.config.base_url(), &app.url("")))
        .await
        .unwrap();
    assert_eq!(
        served.status(),
        200,
        "the announced record is served at its URL"
    );
    assert!(served.text().await.unwrap().contains("Record 3, revised"));
    assert!(got[4]["body"]["summary"]
        .as_str()
        .unwrap()
        .contains("OAI identifier"));
    // The admin API shows each notification, its outcome and its answers.
    crate::support::wait_until("every answer recorded as sent", || async {
        let (_, v) = admin_call(
            app,
            crate::collect::ADMIN,
            reqwest::Method::GET,
            "/admin/v1/inbox",
            None,
        )
        .await;
        v["notifications"].as_array().is_some_and(|n| {
            n.len() == 3
                && n.iter().all(|e| {
                    e["replies"]
                        .as_array()
                        .is_some_and(|r| !r.is_empty() && r.iter().all(|r| r["state"] == "sent"))
                })
        })
    })
    .await;
    let (s, v) = admin_call(
        app,
        crate::collect::ADMIN,
        reqwest::Method::GET,
        "/admin/v1/inbox",
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let newest = &v["notifications"][0];
    assert_eq!(newest["outcome"]["state"], "not_collected", "{v:#}");
    assert_eq!(newest["replies"][0]["kind"], "Reject");
    assert_eq!(v["notifications"][2]["outcome"]["state"], "collected");
    assert_eq!(v["notifications"][2]["outcome"]["changed"], true);
    // The console's Inbox page says the same in words.
    let page = crate::support::console_page(app, crate::collect::ADMIN, "/console/inbox").await;
    assert!(
        page.contains("oai:test:3 collected: a change recorded and pushed"),
        "{page}"
    );
    assert!(page.contains("oai:test:3 collected: already current"));
    assert!(page.contains("not collected: none of"));
    assert!(page.contains("Reject: sent"));
    c.app.stop().await;
}

/// The number of the notification a 201 answer's `Location` names.
fn seq_of(r: &reqwest::Response) -> u64 {
    let loc = r.headers()["location"].to_str().unwrap();
    loc.rsplit('/').next().unwrap().parse().unwrap()
}

/// Notification `seq` as the inbox kept it in the store (its outcome, its answers), unless
/// its slot holds another.
pub async fn kept(
    config: &resourcesync_hub::config::Config,
    seq: u64,
) -> Option<serde_json::Value> {
    let store = resourcesync_hub::app::open_store(config).await.unwrap();
    let keep = u64::from(config.inbox.keep);
    let (json, _) = store
        .state(&format!("inbox/slot/{}", seq % keep))
        .await
        .unwrap()?;
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    (v["seq"] == seq).then_some(v)
}

/// What became of notification `seq`, read from the store as the inbox kept it.
pub async fn outcome(app: &TestApp, seq: u64) -> Option<serde_json::Value> {
    kept(&app.config, seq).await.map(|v| v["outcome"].clone())
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
    // Markup in what a sender writes is shown as text on the console's Inbox page.
    let mut marked = offer("oai:test:1");
    marked["id"] = serde_json::json!("urn:x:<img src=x onerror=alert(1)>");
    marked["object"]["ietf:cite-as"] = serde_json::json!("https://e.org/<script>alert(2)</script>");
    let r = post(&app, &marked.to_string(), "application/ld+json").await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let page = crate::support::console_page(&app, crate::collect::ADMIN, "/console/inbox").await;
    assert!(
        page.contains("&lt;img src=x onerror=alert(1)&gt;"),
        "{page}"
    );
    assert!(!page.contains("<img src=x") && !page.contains("<script>alert"));
    let big = offer(&format!(
        "https://repository.example.edu/{}",
        "x".repeat(5000)
    ));
    let r = post(&app, &big.to_string(), "application/ld+json").await;
    assert_eq!(r.status(), 413);
    let nested = format!("{}{}", "[".repeat(2000), "]".repeat(2000));
    refused(&app, &nested, 400, "not JSON").await;
    let mut not_pattern = offer("oai:test:1");
    not_pattern["type"] = serde_json::json!(["Offer", "coar-notify:ReviewAction"]);
    refused(
        &app,
        &not_pattern.to_string(),
        400,
        "not a pattern this inbox takes",
    )
    .await;
    let mut stranger = offer("oai:test:1");
    stranger["origin"]["id"] = serde_json::json!("https://stranger.example.net");
    refused(
        &app,
        &stranger.to_string(),
        403,
        "is not a sender this inbox takes",
    )
    .await;
    let mut far = offer("oai:test:1");
    far["origin"]["id"] = serde_json::json!("https://far.example.org");
    refused(&app, &far.to_string(), 403, "posts from its networks only").await;
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
    let seq = seq_of(&r);
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
    // The sender's budget: 10 a minute, two spent (the marked notification, the lure).
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
        8,
        "{statuses:?}"
    );
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 22);
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

/// A sender's inbox that never answers: each answer is tried `inbox.reply_attempts` times
/// within the hub's request timeout, then given up (and said so beside the notification),
/// while the inbox goes on taking notifications at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_that_never_answers_costs_bounded_tries() {
    let repo = OaiServer::start(&fixture(2), 10);
    let hung = CoarInbox::start(true);
    let url = hung.url.clone();
    let (app, _d) = start(&repo, |c| {
        c.hub.request_timeout_secs = 1;
        c.inbox.reply_attempts = 2;
        c.inbox.senders.get_mut("repo").unwrap().inbox = url;
    })
    .await;
    let r = post(
        &app,
        &offer("https://repository.example.edu/handle/9/9").to_string(),
        "application/ld+json",
    )
    .await;
    assert_eq!(r.status(), 201);
    let seq = seq_of(&r);
    let t = Instant::now();
    let r = post(
        &app,
        &offer("https://repository.example.edu/handle/9/10").to_string(),
        "application/ld+json",
    )
    .await;
    assert_eq!(r.status(), 201);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "taken at once: {:?}",
        t.elapsed()
    );
    let replies = || async { kept(&app.config, seq).await.unwrap()["replies"].clone() };
    crate::support::wait_until("the Reject given up", || async {
        replies().await[0]["state"] == "given_up"
    })
    .await;
    let r = replies().await;
    assert_eq!(r[0]["kind"], "Reject");
    assert_eq!(r[0]["attempts"], 2, "{r}");
    app.stop().await;
}

/// On Elasticsearch (osmem-server) the inbox keeps its notifications too, and a second
/// process on the same store reads them at their URLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_are_kept_on_elasticsearch_and_read_by_another_process() {
    let mut fx = fixture(2);
    fx["records"][1]["dc"]["identifier"] =
        serde_json::json!(["https://repository.example.edu/handle/123/1"]);
    let repo = OaiServer::start(&fx, 10);
    let (mut c, _d) = collect_config(&repo.base);
    crate::support::use_elasticsearch(&mut c).await;
    c.inbox.enabled = true;
    c.inbox.senders.insert(
        "repo".into(),
        SenderConfig {
            id: ORIGIN.into(),
            inbox: ORIGIN_INBOX.into(),
            collect: "papers".into(),
            networks: vec!["127.0.0.0/8".parse().unwrap()],
            token_env: String::new(),
        },
    );
    let (_, other_dir) = crate::support::test_config();
    let mut c2 = c.clone();
    c2.server.data_dir = other_dir.path().to_path_buf();
    let one = TestApp::start_with(c).await;
    let two = TestApp::start_with(c2).await;
    let r = post(
        &one,
        &offer("oai:test:1").to_string(),
        "application/ld+json",
    )
    .await;
    assert_eq!(r.status(), 201);
    let loc = r.headers()["location"].to_str().unwrap().to_string();
    let path = &loc[loc.find("/inbox/").unwrap()..];
    let got: serde_json::Value = reqwest::get(two.url(path))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["object"]["id"], "oai:test:1");
    // A record's other names are kept there too: an offer by its landing page finds it.
    let store = resourcesync_hub::app::open_store(&one.config)
        .await
        .unwrap();
    let landing = "https://repository.example.edu/handle/123/1";
    crate::support::wait_until("the record's landing page known", || async {
        store.find_alias(landing).await.unwrap().is_some()
    })
    .await;
    assert_eq!(
        store.find_alias(landing).await.unwrap(),
        Some(("papers".to_string(), "oai:test:1".to_string()))
    );
    assert_eq!(
        store
            .find_alias("https://elsewhere.example.org/")
            .await
            .unwrap(),
        None
    );
    let listing: serde_json::Value = reqwest::get(two.url("/inbox"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listing["ldp:contains"].as_array().unwrap().len(),
        1,
        "{listing}"
    );
    two.stop().await;
    one.stop().await;
}

/// Answers still pending when the server stops are sent after it starts again, to the
/// sender's inbox as configured then, with the tries they have left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_left_pending_is_sent_after_a_restart() {
    let repo = OaiServer::start(&fixture(3), 10);
    let (app, dir) = start(&repo, |c| {
        // Nothing listens there: each try fails at once, and the answer waits for the next.
        c.inbox.senders.get_mut("repo").unwrap().inbox = "http://127.0.0.1:1/inbox".into();
    })
    .await;
    let config = app.config.clone();
    let r = post(
        &app,
        &offer("oai:test:1").to_string(),
        "application/ld+json",
    )
    .await;
    assert_eq!(r.status(), 201);
    let seq = seq_of(&r);
    let kept = || async { kept(&config, seq).await.unwrap() };
    crate::support::wait_until("the Accept tried and pending", || async {
        let k = kept().await;
        k["replies"][0]["state"] == "pending" && k["replies"][0]["attempts"].as_u64() >= Some(1)
    })
    .await;
    app.stop().await;

    let answers = CoarInbox::start(false);
    let mut config = config;
    config.inbox.senders.get_mut("repo").unwrap().inbox = answers.url.clone();
    let app = TestApp::start_with(config).await;
    crate::support::wait_until(
        "the Accept and the Announce at the sender's inbox",
        || async { answers.received().await.len() >= 2 },
    )
    .await;
    let got = answers.received().await;
    let patterns: Vec<&str> = got
        .iter()
        .map(|a| a["pattern"].as_str().unwrap_or("refused"))
        .collect();
    assert_eq!(patterns, ["Accept", "AnnounceServiceResult"], "{got:#?}");
    app.stop().await;
    drop(dir);
}

/// A sender declared with a token (and no networks) must send it: none or a wrong one is
/// refused with 401 in words, and the right one is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_declared_with_a_token_must_send_it() {
    const VAR: &str = "INBOX_TEST_SENDER_TOKEN";
    std::env::set_var(VAR, "a-sender-token-of-some-length");
    let repo = OaiServer::start(&fixture(2), 10);
    let (app, _d) = start(&repo, |c| {
        let s = c.inbox.senders.get_mut("repo").unwrap();
        s.networks.clear();
        s.token_env = VAR.into();
    })
    .await;
    let send = |token: Option<&'static str>| {
        let mut r = reqwest::Client::new()
            .post(app.url("/inbox"))
            .header("content-type", "application/ld+json")
            .body(offer("oai:test:1").to_string());
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let r = send(None).await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("sends its bearer token"));
    assert_eq!(
        send(Some("a-sender-token-of-some-lengtH"))
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        send(Some("a-sender-token-of-some-length"))
            .await
            .unwrap()
            .status(),
        201
    );
    app.stop().await;
}

/// The listing's pages hold each notification kept once, newest first, each page linking the
/// next with `Link: rel="next"` until the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_pages_hold_each_notification_once() {
    let repo = OaiServer::start(&fixture(2), 10);
    let (app, _d) = start(&repo, |c| c.inbox.page_size = 2).await;
    let mut posted = Vec::new();
    for _ in 0..5 {
        let r = post(
            &app,
            &offer("oai:test:1").to_string(),
            "application/ld+json",
        )
        .await;
        assert_eq!(r.status(), 201);
        posted.push(r.headers()["location"].to_str().unwrap().to_string());
    }
    let mut listed = Vec::new();
    let mut url = Some(app.url("/inbox"));
    let mut pages = 0;
    while let Some(u) = url.take() {
        pages += 1;
        let r = reqwest::get(&u).await.unwrap();
        url = r
            .headers()
            .get("link")
            .and_then(|l| l.to_str().ok())
            .and_then(|l| l.strip_prefix('<'))
            .and_then(|l| l.split('>').next())
            .map(|l| l.replace(&app.config.base_url(), &app.url("")));
        let doc: serde_json::Value = r.json().await.unwrap();
        for e in doc["ldp:contains"].as_array().unwrap() {
            listed.push(e["@id"].as_str().unwrap().to_string());
        }
    }
    posted.reverse();
    assert_eq!(listed, posted, "newest first, each once");
    assert_eq!(pages, 3);
    app.stop().await;
}
