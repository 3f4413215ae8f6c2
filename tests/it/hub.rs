//! The WebSub hub against real callback servers: subscribe and verification of intent,
//! leases, denial, publishing (fat and thin pings), signed distribution, 410, retries on the
//! configured schedule (paused time), ordering, safety and the topic URIs.

use std::time::Duration;

use bytes::Bytes;

use hmac::{Hmac, KeyInit, Mac};
use resourcesync_hub::config::Config;
use resourcesync_hub::model::websub::{Callback, Topic};
use resourcesync_hub::model::Timestamp;
use resourcesync_hub::store::Store;

use crate::subscriber::{TestSubscriber, Verify};
use crate::support::{add_file_set, change_line, md5_hex, test_config, wait_until, TestApp};

pub const TOKEN: &str = "pub-token";

pub fn hub_config() -> (Config, tempfile::TempDir) {
    let (mut c, dir) = test_config();
    c.hub.allow_networks = vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
    c.hub.publisher_token = TOKEN.into();
    (c, dir)
}

async fn start(c: Config) -> TestApp {
    TestApp::start_with(c).await
}

fn topic(app: &TestApp, name: &str) -> String {
    format!("{}/{name}", app.config.topic_base())
}

async fn form(app: &TestApp, pairs: &[(&str, &str)]) -> (u16, String) {
    let r = form_response(app, pairs).await;
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

/// The hub's whole answer to a form (headers included).
async fn form_response(app: &TestApp, pairs: &[(&str, &str)]) -> reqwest::Response {
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish();
    app.client
        .post(app.url("/hub"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn subscribe(
    app: &TestApp,
    topic: &str,
    callback: &str,
    extra: &[(&str, &str)],
) -> (u16, String) {
    let mut p = vec![
        ("hub.mode", "subscribe"),
        ("hub.topic", topic),
        ("hub.callback", callback),
    ];
    p.extend_from_slice(extra);
    form(app, &p).await
}

pub async fn fat_ping(app: &TestApp, topic: &str, body: &str) -> (u16, String) {
    let r = app
        .client
        .post(app.url("/hub"))
        .header("content-type", "application/xml")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header(
            "link",
            format!(
                "<{topic}>; rel=\"self\", <{}>; rel=\"hub\"",
                app.config.hub_url()
            ),
        )
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

/// Subscribes and waits until the hub recorded the verified subscription.
pub async fn subscribed(
    app: &TestApp,
    sub: &TestSubscriber,
    topic: &str,
    path: &str,
    extra: &[(&str, &str)],
) {
    let store = resourcesync_hub::app::open_store(&app.config)
        .await
        .unwrap();
    let (t, cb) = (
        Topic::parse(topic).unwrap(),
        Callback::parse(&sub.url(path)).unwrap(),
    );
    let before = Timestamp::now();
    let (status, text) = subscribe(app, topic, &sub.url(path), extra).await;
    assert_eq!(status, 202, "{text}");
    for _ in 0..500 {
        if store
            .hub_subscription(&t, &cb)
            .await
            .unwrap()
            .is_some_and(|s| s.verified_at >= before)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("subscription of {path} not recorded");
}

/// Subscribers of a topic, read from the store.
async fn subscriber_count(app: &TestApp, topic: &str) -> u64 {
    let store = Store::open_embedded(&app.config.database_path()).unwrap();
    store
        .hub_topic(&Topic::parse(topic).unwrap())
        .await
        .unwrap()
        .map_or(0, |i| i.subscribers)
}

/// Waits until the hub has recorded the outcome of every verification it started (its
/// intents in flight are gone: confirmed, or dropped as failed).
async fn wait_intents_resolved(app: &TestApp) {
    let store = Store::open_embedded(&app.config.database_path()).unwrap();
    wait_until("every verification's outcome recorded", || async {
        store.hub_intents().await.unwrap().is_empty()
    })
    .await;
}

async fn wait_subscribers(app: &TestApp, topic: &str, n: u64) {
    for _ in 0..200 {
        if subscriber_count(app, topic).await == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{topic} never got to {n} subscriber(s)");
}

pub fn hmac_hex<M: Mac + KeyInit>(key: &[u8], body: &[u8]) -> String {
    let mut m = <M as KeyInit>::new_from_slice(key).unwrap();
    m.update(body);
    m.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn subscribe_is_accepted_at_once_then_verified_and_deliveries_are_signed_iff_a_secret_was_given(
) {
    let (c, _d) = hub_config();
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let t = topic(&app, "papers/changes");

    let (status, text) = subscribe(
        &app,
        &t,
        &sub.url("/signed?id=7&hub.mode=keep"),
        &[
            ("hub.secret", "s3cret"),
            ("hub.lease_seconds", "3600"),
            ("x.other", "ignored"),
        ],
    )
    .await;
    assert_eq!(status, 202, "{text}");
    let v = &sub.wait_verifications("/signed", 1).await[0];
    assert_eq!(v["id"], "7", "the callback's own query string is kept");
    assert_eq!(v["hub.topic"], t);
    assert_eq!(v["hub.lease_seconds"], "3600");
    assert!(v["hub.challenge"].len() >= 32, "a random challenge: {v:?}");
    subscribed(&app, &sub, &t, "/plain", &[]).await;
    let v2 = &sub.verifications("/plain")[0];
    assert_ne!(
        v["hub.challenge"], v2["hub.challenge"],
        "challenges are single-use"
    );

    let payload = r#"<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"/>"#;
    let (status, text) = fat_ping(&app, &t, payload).await;
    assert_eq!(
        (status, text.as_str()),
        (200, "published to 2 subscriber(s)\n")
    );

    let d = &sub.wait_deliveries("/signed", 1).await[0];
    assert_eq!(d.text(), payload);
    assert_eq!(d.header("content-type"), Some("application/xml"));
    let link = d.header("link").unwrap();
    assert!(
        link.contains(&format!("<{}>; rel=\"hub\"", app.config.hub_url()))
            && link.contains(&format!("<{t}>; rel=\"self\"")),
        "{link}"
    );
    let expected = format!(
        "sha256={}",
        hmac_hex::<Hmac<sha2::Sha256>>(b"s3cret", payload.as_bytes())
    );
    assert_eq!(d.header("x-hub-signature"), Some(expected.as_str()));
    let d = &sub.wait_deliveries("/plain", 1).await[0];
    assert_eq!(d.header("x-hub-signature"), None, "no secret, no signature");
    assert_eq!(d.text(), payload);
    app.stop().await;
}

#[tokio::test]
async fn configured_algorithms_and_pubsubhubbub_clients_get_their_signatures() {
    for alg in ["sha1", "sha384", "sha512"] {
        let (mut c, _d) = hub_config();
        c.hub.signature_algorithm = resourcesync_hub::hub::SignatureAlg::parse(alg).unwrap();
        let app = start(c).await;
        let sub = TestSubscriber::start().await;
        let t = topic(&app, "t");
        subscribed(&app, &sub, &t, "/cb", &[("hub.secret", "k")]).await;
        subscribed(
            &app,
            &sub,
            &t,
            "/legacy",
            &[
                ("hub.secret", "k"),
                ("hub.verify", "async"),
                ("hub.verify_token", "vt"),
            ],
        )
        .await;
        assert_eq!(
            sub.verifications("/legacy")[0]["hub.verify_token"],
            "vt",
            "0.3's verify_token is echoed"
        );
        fat_ping(&app, &t, "<x/>").await;
        let got = sub.wait_deliveries("/cb", 1).await[0]
            .header("x-hub-signature")
            .unwrap()
            .to_string();
        let want = match alg {
            "sha1" => format!("sha1={}", hmac_hex::<Hmac<sha1::Sha1>>(b"k", b"<x/>")),
            "sha384" => format!("sha384={}", hmac_hex::<Hmac<sha2::Sha384>>(b"k", b"<x/>")),
            _ => format!("sha512={}", hmac_hex::<Hmac<sha2::Sha512>>(b"k", b"<x/>")),
        };
        assert_eq!(got, want);
        let legacy = sub.wait_deliveries("/legacy", 1).await[0]
            .header("x-hub-signature")
            .unwrap()
            .to_string();
        assert_eq!(
            legacy,
            format!("sha1={}", hmac_hex::<Hmac<sha1::Sha1>>(b"k", b"<x/>")),
            "PubSubHubbub 0.3 subscribers get sha1"
        );
        app.stop().await;
    }
}

#[tokio::test]
async fn a_failed_verification_leaves_no_subscription() {
    let (c, _d) = hub_config();
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let t = topic(&app, "t");
    sub.set_verify("/wrong", Verify::WrongChallenge);
    sub.set_verify("/refuses", Verify::NotFound);
    assert_eq!(subscribe(&app, &t, &sub.url("/wrong"), &[]).await.0, 202);
    assert_eq!(subscribe(&app, &t, &sub.url("/refuses"), &[]).await.0, 202);
    sub.wait_verifications("/wrong", 1).await;
    sub.wait_verifications("/refuses", 1).await;
    wait_intents_resolved(&app).await;
    assert_eq!(subscriber_count(&app, &t).await, 0);
    assert_eq!(
        fat_ping(&app, &t, "<x/>").await.1,
        "published to 0 subscriber(s)\n"
    );

    // A failed re-subscription leaves the existing one as it was (secret included).
    subscribed(&app, &sub, &t, "/ok", &[("hub.secret", "first")]).await;
    sub.set_verify("/ok", Verify::WrongChallenge);
    assert_eq!(
        subscribe(&app, &t, &sub.url("/ok"), &[("hub.secret", "second")])
            .await
            .0,
        202
    );
    sub.wait_verifications("/ok", 2).await;
    wait_intents_resolved(&app).await;
    fat_ping(&app, &t, "<y/>").await;
    let d = &sub.wait_deliveries("/ok", 1).await[0];
    let want = format!(
        "sha256={}",
        hmac_hex::<Hmac<sha2::Sha256>>(b"first", b"<y/>")
    );
    assert_eq!(d.header("x-hub-signature"), Some(want.as_str()));
    app.stop().await;
}

#[tokio::test]
async fn resubscribing_updates_in_place_and_unsubscribing_stops_deliveries() {
    let (c, _d) = hub_config();
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let t = topic(&app, "t");
    subscribed(&app, &sub, &t, "/cb", &[("hub.lease_seconds", "1000")]).await;
    subscribed(&app, &sub, &t, "/cb", &[("hub.lease_seconds", "2000")]).await;
    assert_eq!(sub.verifications("/cb")[1]["hub.lease_seconds"], "2000");
    assert_eq!(
        subscriber_count(&app, &t).await,
        1,
        "one subscription per (topic, callback)"
    );
    fat_ping(&app, &t, "<one/>").await;
    sub.wait_deliveries("/cb", 1).await;
    // A marker behind it: one lane per subscriber delivers in order, so a repeat of the first
    // would arrive before the marker.
    fat_ping(&app, &t, "<marker/>").await;
    let got: Vec<Bytes> = sub
        .wait_deliveries("/cb", 2)
        .await
        .into_iter()
        .map(|d| d.body)
        .collect();
    assert_eq!(
        got,
        ["<one/>", "<marker/>"],
        "exactly one delivery per publish"
    );

    let (status, _) = form(
        &app,
        &[
            ("hub.mode", "unsubscribe"),
            ("hub.topic", &t),
            ("hub.callback", &sub.url("/cb")),
        ],
    )
    .await;
    assert_eq!(status, 202);
    let v = sub.wait_verifications("/cb", 3).await;
    assert_eq!(v[2]["hub.mode"], "unsubscribe");
    wait_subscribers(&app, &t, 0).await;
    assert_eq!(
        fat_ping(&app, &t, "<two/>").await.1,
        "published to 0 subscriber(s)\n"
    );
    assert_eq!(
        sub.deliveries("/cb").len(),
        2,
        "nothing after unsubscribing"
    );
    app.stop().await;
}

#[tokio::test]
async fn leases_are_clamped_and_enforced() {
    let (mut c, _d) = hub_config();
    c.hub.lease_min_secs = 1;
    c.hub.lease_default_secs = 600;
    c.hub.lease_max_secs = 7200;
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let t = topic(&app, "t");
    subscribed(&app, &sub, &t, "/default", &[]).await;
    subscribed(
        &app,
        &sub,
        &t,
        "/long",
        &[("hub.lease_seconds", "999999999")],
    )
    .await;
    subscribed(&app, &sub, &t, "/short", &[("hub.lease_seconds", "1")]).await;
    assert_eq!(sub.verifications("/default")[0]["hub.lease_seconds"], "600");
    assert_eq!(sub.verifications("/long")[0]["hub.lease_seconds"], "7200");
    assert_eq!(sub.verifications("/short")[0]["hub.lease_seconds"], "1");
    let store = Store::open_embedded(&app.config.database_path()).unwrap();
    let short = store
        .hub_subscription(
            &Topic::parse(&t).unwrap(),
            &Callback::parse(&sub.url("/short")).unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    wait_until("the 1-second lease's end", || async {
        Timestamp::now() > short.expires_at
    })
    .await;
    assert_eq!(
        fat_ping(&app, &t, "<x/>").await.1,
        "published to 2 subscriber(s)\n",
        "the 1-second lease has ended"
    );
    // Both recipients served: the expired one was not among them.
    sub.wait_deliveries("/long", 1).await;
    sub.wait_deliveries("/default", 1).await;
    assert!(sub.deliveries("/short").is_empty());
    app.stop().await;
}

#[tokio::test]
async fn topics_outside_the_policy_are_denied_to_the_callback() {
    let (mut c, _d) = hub_config();
    c.hub.topic_prefixes = vec!["https://allowed.example.org/".into()];
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let (status, _) = subscribe(
        &app,
        "https://elsewhere.example.net/feed",
        &sub.url("/cb"),
        &[],
    )
    .await;
    assert_eq!(status, 202, "policy is decided after the answer");
    let v = &sub.wait_verifications("/cb", 1).await[0];
    assert_eq!(v["hub.mode"], "denied");
    assert_eq!(v["hub.topic"], "https://elsewhere.example.net/feed");
    assert!(
        v.contains_key("hub.reason") && !v.contains_key("hub.challenge"),
        "{v:?}"
    );
    // Allowed prefixes and the hub's own topics are verified as usual.
    subscribed(&app, &sub, "https://allowed.example.org/a", "/ok", &[]).await;
    assert_eq!(sub.verifications("/ok")[0]["hub.mode"], "subscribe");
    subscribed(&app, &sub, &topic(&app, "own"), "/own", &[]).await;
    assert_eq!(sub.verifications("/own")[0]["hub.mode"], "subscribe");
    app.stop().await;
}

#[tokio::test]
async fn private_callbacks_are_refused_unless_allow_listed() {
    let (mut c, _d) = hub_config();
    c.hub.allow_networks.clear();
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let t = topic(&app, "t");
    for cb in [
        sub.url("/cb"),
        "http://10.1.2.3/cb".into(),
        "http://[::1]:9/cb".into(),
        "http://localhost:9/cb".into(),
        "http://169.254.169.254/latest".into(),
    ] {
        let (status, text) = subscribe(&app, &t, &cb, &[]).await;
        assert_eq!(status, 400, "{cb}: {text}");
        assert!(text.contains("hub.allow_networks"), "{text}");
    }
    let (status, text) = subscribe(
        &app,
        "http://192.168.1.1/feed",
        "https://subscriber.example.org/cb",
        &[],
    )
    .await;
    assert_eq!(status, 400, "private topics too: {text}");
    // A verification starts only from a recorded intent: none was recorded.
    let store = Store::open_embedded(&app.config.database_path()).unwrap();
    assert!(
        store.hub_intents().await.unwrap().is_empty(),
        "no verification was started"
    );
    assert!(
        sub.verifications("/cb").is_empty(),
        "the refused callback was never called"
    );
    app.stop().await;
}

#[tokio::test]
async fn malformed_requests_get_a_plain_text_4xx() {
    let (mut c, _d) = hub_config();
    c.hub.max_body_bytes = 4096;
    c.hub.requests_per_callback_per_minute = 2;
    let app = start(c).await;
    let t = topic(&app, "t");
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("hub.topic", &t)], "hub.mode is required"),
        (
            &[("hub.mode", "subscribe"), ("hub.topic", &t)],
            "hub.callback is required",
        ),
        (
            &[
                ("hub.mode", "subscribe"),
                ("hub.topic", &t),
                ("hub.callback", "not a url"),
            ],
            "not a URL",
        ),
        (
            &[
                ("hub.mode", "subscribe"),
                ("hub.topic", &t),
                ("hub.callback", "http://127.0.0.1:1/"),
                ("hub.lease_seconds", "soon"),
            ],
            "hub.lease_seconds",
        ),
        (&[("hub.mode", "publish")], "needs hub.topic or hub.url"),
    ];
    for (pairs, want) in cases {
        let r = app
            .client
            .post(app.url("/hub"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(
                url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(pairs.iter())
                    .finish(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        assert_eq!(r.headers()["content-type"], "text/plain; charset=utf-8");
        let text = r.text().await.unwrap();
        assert!(text.contains(want), "{pairs:?}: {text}");
    }
    let secret = "s".repeat(200);
    let (s, text) = subscribe(
        &app,
        &t,
        "http://127.0.0.1:1/cb",
        &[("hub.secret", &secret)],
    )
    .await;
    assert_eq!(s, 400, "{text}");
    assert!(text.contains("less than 200 bytes"));

    let big = "x".repeat(5000);
    assert_eq!(
        subscribe(&app, &t, "http://127.0.0.1:1/cb", &[("pad", &big)])
            .await
            .0,
        413
    );

    // Rate limit per callback.
    assert_eq!(
        subscribe(&app, &t, "http://127.0.0.1:1/rl", &[]).await.0,
        202
    );
    assert_eq!(
        subscribe(&app, &t, "http://127.0.0.1:1/rl", &[]).await.0,
        202
    );
    let r = app
        .client
        .post(app.url("/hub"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "hub.mode=subscribe&hub.topic={t}&hub.callback=http://127.0.0.1:1/rl"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));

    // Fat pings: token, Link rel=self, a body.
    let post = |auth: Option<&'static str>, link: Option<String>, body: &'static str| {
        let mut rb = app
            .client
            .post(app.url("/hub"))
            .header("content-type", "application/xml")
            .body(body);
        if let Some(a) = auth {
            rb = rb.header("authorization", a);
        }
        if let Some(l) = link {
            rb = rb.header("link", l);
        }
        async move {
            let r = rb.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let self_link = Some(format!("<{t}>; rel=\"self\""));
    assert_eq!(post(None, self_link.clone(), "<x/>").await.0, 401);
    assert_eq!(
        post(Some("Bearer nope"), self_link.clone(), "<x/>").await.0,
        403
    );
    let (s, text) = post(Some("Bearer pub-token"), None, "<x/>").await;
    assert_eq!(s, 400);
    assert!(text.contains("rel=\"self\""), "{text}");
    assert_eq!(
        post(Some("Bearer pub-token"), self_link.clone(), "")
            .await
            .0,
        400
    );
    app.stop().await;

    let (c, _d2) = test_config();
    let app = start(c).await;
    let (s, text) = fat_ping(&app, &topic(&app, "t"), "<x/>").await;
    assert_eq!(s, 403);
    assert!(text.contains("hub.publisher_token"), "{text}");
    app.stop().await;
}

#[tokio::test]
async fn a_thin_ping_fetches_the_topic_and_keeps_its_content_type() {
    let (c, _d) = hub_config();
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let feed = sub.url("/topic");
    sub.serve_topic("application/atom+xml; charset=utf-8", "<feed>v1</feed>");
    subscribed(&app, &sub, &feed, "/cb", &[]).await;
    let (status, _) = form(&app, &[("hub.mode", "publish"), ("hub.url", &feed)]).await;
    assert_eq!(status, 202);
    let d = &sub.wait_deliveries("/cb", 1).await[0];
    assert_eq!(d.text(), "<feed>v1</feed>");
    assert_eq!(
        d.header("content-type"),
        Some("application/atom+xml; charset=utf-8")
    );
    assert!(d
        .header("link")
        .unwrap()
        .contains(&format!("<{feed}>; rel=\"self\"")));
    app.stop().await;
}

#[tokio::test]
async fn topic_uris_answer_get_and_head_with_the_latest_payload() {
    let (c, _d) = hub_config();
    let app = start(c).await;
    let t = topic(&app, "set1/changes");
    let path = app.path_of(&t);
    assert_eq!(
        app.client
            .get(app.url(&path))
            .send()
            .await
            .unwrap()
            .status(),
        404,
        "unknown before any publish"
    );
    fat_ping(&app, &t, "<first/>").await;
    fat_ping(&app, &t, "<latest/>").await;
    for head in [false, true] {
        let rb = if head {
            app.client.head(app.url(&path))
        } else {
            app.client.get(app.url(&path))
        };
        let r = rb.send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "application/xml");
        let link = r.headers()["link"].to_str().unwrap().to_string();
        assert!(
            link.contains(&format!("<{t}>; rel=\"self\""))
                && link.contains(&format!("<{}>; rel=\"hub\"", app.config.hub_url())),
            "{link}"
        );
        let body = r.text().await.unwrap();
        assert_eq!(body, if head { "" } else { "<latest/>" });
    }
    let home = app.client.get(app.url("/")).send().await.unwrap();
    assert_eq!(
        home.headers()["link"],
        format!("<{}>; rel=\"hub\"", app.config.hub_url()).as_str(),
        "the hub is advertised"
    );
    app.stop().await;
}

#[tokio::test]
async fn gone_ends_the_subscription() {
    let (c, _d) = hub_config();
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let t = topic(&app, "t");
    subscribed(&app, &sub, &t, "/gone", &[]).await;
    sub.answer("/gone", 410);
    fat_ping(&app, &t, "<a/>").await;
    sub.wait_deliveries("/gone", 1).await;
    wait_subscribers(&app, &t, 0).await;
    assert_eq!(
        fat_ping(&app, &t, "<b/>").await.1,
        "published to 0 subscriber(s)\n"
    );
    assert_eq!(sub.deliveries("/gone").len(), 1);
    app.stop().await;
}

/// Paused time: the waits between attempts are the schedule's (jitter off), stretched to a
/// subscriber's Retry-After; a failing subscriber holds up only its own queue, in order; an
/// exhausted schedule fails the delivery and keeps the subscription; every attempt of one
/// message carries its one `Webhook-Id`.
#[tokio::test(start_paused = true)]
async fn retries_follow_the_schedule_and_honour_retry_after() {
    let (mut c, _d) = hub_config();
    c.hub.retry_schedule_secs = vec![10, 60, 300];
    c.hub.retry_jitter = 0.0;
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let t = topic(&app, "t");
    subscribed(&app, &sub, &t, "/flaky", &[]).await;
    subscribed(&app, &sub, &t, "/healthy", &[]).await;
    subscribed(&app, &sub, &t, "/down", &[]).await;
    sub.script("/flaky", &[(500, None), (503, Some("120")), (502, None)]);
    sub.answer("/down", 500);

    fat_ping(&app, &t, "<m1/>").await;
    fat_ping(&app, &t, "<m2/>").await;
    let healthy = sub.wait_deliveries("/healthy", 2).await;
    assert_eq!(
        healthy.iter().map(|d| d.text()).collect::<Vec<_>>(),
        ["<m1/>", "<m2/>"]
    );

    let flaky = sub.wait_deliveries("/flaky", 5).await;
    let bodies: Vec<String> = flaky.iter().map(|d| d.text()).collect();
    assert_eq!(
        bodies,
        ["<m1/>", "<m1/>", "<m1/>", "<m1/>", "<m2/>"],
        "m2 waits behind m1"
    );
    let gaps: Vec<u64> = flaky
        .windows(2)
        .map(|w| (w[1].at - w[0].at).as_secs())
        .collect();
    assert_eq!(
        &gaps[..3],
        &[10, 120, 300],
        "schedule 10, 60 (Retry-After 120 wins), 300"
    );
    assert!(
        healthy[1].at < flaky[1].at,
        "the healthy subscriber was not held up"
    );
    // One `Webhook-Id` per message: the same on every retry (and for every subscriber),
    // another for the next message.
    let id = |d: &crate::subscriber::Delivery| d.header("webhook-id").unwrap().to_string();
    let flaky_ids: Vec<String> = flaky.iter().map(id).collect();
    assert!(flaky_ids[0].starts_with("msg_"), "{flaky_ids:?}");
    assert!(
        flaky_ids[..4].iter().all(|i| *i == flaky_ids[0]),
        "retries of m1 keep its id: {flaky_ids:?}"
    );
    assert_ne!(flaky_ids[4], flaky_ids[0], "m2 has its own id");
    assert_eq!(
        healthy.iter().map(id).collect::<Vec<_>>(),
        [flaky_ids[0].clone(), flaky_ids[4].clone()]
    );

    // /down: 1 attempt + 3 retries, then m1 is marked failed and m2 gets its own attempts.
    let down = sub.wait_deliveries("/down", 5).await;
    assert_eq!(
        down.iter().take(4).filter(|d| d.text() == "<m1/>").count(),
        4
    );
    assert_eq!(
        down[4].text(),
        "<m2/>",
        "after the schedule is exhausted the queue moves on"
    );
    sub.answer("/down", 200);
    assert_eq!(
        fat_ping(&app, &t, "<m3/>").await.1,
        "published to 3 subscriber(s)\n",
        "the failing subscription stays active"
    );
    sub.wait_until("m3 at /down", |s| {
        s.deliveries("/down").iter().any(|d| d.text() == "<m3/>")
    })
    .await;
    app.stop().await;
}

/// The hub's own topics are published by the hub alone: anonymous pings of a set's change
/// topic are refused and never cause a delivery; the subscriber gets each notification once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_of_the_hubs_own_topics_are_refused_and_deliver_nothing() {
    let (mut c, dir) = hub_config();
    add_file_set(&mut c, "papers", &dir.path().join("root"), None);
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let topic = app.config.change_topic("papers");
    // The set is configured, so it exists (and its topic) before anything is ingested.
    subscribed(&app, &sub, &topic, "/changes", &[]).await;
    app.ingest_ok(
        "papers",
        &change_line("created", "b.txt", &md5_hex(b"b"), 1),
    )
    .await;
    sub.wait_deliveries("/changes", 1).await;
    for _ in 0..10 {
        let (s, text) = form(&app, &[("hub.mode", "publish"), ("hub.url", &topic)]).await;
        assert_eq!(s, 403, "{text}");
        assert!(text.contains("published by this hub itself"), "{text}");
    }
    // A marker behind the refused pings: the next change's notification. The subscriber's
    // lane delivers in order, so a wrongly accepted ping would arrive before it.
    app.ingest_ok(
        "papers",
        &change_line("created", "c.txt", &md5_hex(b"c"), 1),
    )
    .await;
    let got = sub.wait_deliveries("/changes", 2).await;
    assert_eq!(got.len(), 2, "each notification once");
    assert!(
        String::from_utf8_lossy(&got[1].body).contains("c.txt"),
        "the marker came second"
    );
    app.stop().await;
}

/// A subscription form sent with another Content-Type gets 415 and a plain reason.
#[tokio::test]
async fn a_form_with_the_wrong_content_type_gets_415() {
    let (c, _d) = hub_config();
    let app = start(c).await;
    for ct in ["text/plain", "application/json"] {
        let r = app
            .client
            .post(app.url("/hub"))
            .header("content-type", ct)
            .body("hub.mode=subscribe&hub.topic=https://example.org/t&hub.callback=https://example.org/cb")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 415);
        let text = r.text().await.unwrap();
        assert!(
            text.contains("application/x-www-form-urlencoded") && text.contains(ct),
            "{text}"
        );
    }
    app.stop().await;
}

/// Isolation: 50 callbacks that never answer, on the same host as a healthy subscriber, with
/// only 20 delivery slots: new and failing subscribers deliver from their own budget, so the
/// healthy one still gets every publish well within the hung ones' 8 s request timeout (the
/// wait a slot held by them would cost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_callbacks_never_take_a_healthy_subscribers_slots() {
    let (mut c, _d) = hub_config();
    c.hub.max_concurrent_deliveries = 20;
    c.hub.request_timeout_secs = 8;
    let app = start(c).await;
    let t = topic(&app, "t");
    let healthy = TestSubscriber::start().await;
    subscribed(&app, &healthy, &t, "/ok", &[]).await;
    fat_ping(&app, &t, "<first/>").await;
    healthy.wait_deliveries("/ok", 1).await;

    let hung = TestSubscriber::start().await;
    hung.set_delay(Duration::from_secs(60));
    for i in 0..50 {
        subscribed(&app, &hung, &t, &format!("/hung{i}"), &[]).await;
    }
    for n in 2..=6 {
        let sent = std::time::Instant::now();
        fat_ping(&app, &t, &format!("<n{n}/>")).await;
        healthy.wait_deliveries("/ok", n).await;
        assert!(
            sent.elapsed() < Duration::from_secs(4),
            "publish {n} reached the healthy subscriber after {:?}",
            sent.elapsed()
        );
    }
    app.stop().await;
}

/// One host registering many callbacks is limited as a whole, not only per callback URL, and
/// by its address: its other names do not get budgets of their own.
#[tokio::test]
async fn subscribe_requests_are_limited_per_callback_host() {
    let (mut c, _d) = hub_config();
    c.hub.requests_per_host_per_minute = 5;
    let app = start(c).await;
    let t = topic(&app, "t");
    let mut statuses = Vec::new();
    for i in 0..7 {
        let (s, _) = subscribe(&app, &t, &format!("http://127.0.0.1:1/cb{i}"), &[]).await;
        statuses.push(s);
    }
    assert_eq!(
        statuses,
        [202, 202, 202, 202, 202, 429, 429],
        "distinct callbacks, one host"
    );
    // Other names of the same machine share its budget (it was one budget per name).
    for alias in ["localhost", "localhost.", "127.0.0.2"] {
        let (s, text) = subscribe(&app, &t, &format!("http://{alias}:1/alias"), &[]).await;
        assert_eq!(s, 429, "{alias}: {text}");
        assert!(text.contains("address 127.0.0.0/8"), "{text}");
    }
    let (s, text) = subscribe(&app, &t, "http://[::1]:1/other", &[]).await;
    assert_eq!(s, 202, "another address is not held back: {text}");
    app.stop().await;
}

/// Topic and callback are sent back exactly as given (WebSub §5.3, §6): a topic without a
/// path, with an upper-case host or with `%7E` reaches the subscriber's verification as it was
/// written; and `~` and `%7E` name one topic, so they are one subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verification_carries_the_topic_exactly_as_subscribed() {
    let (c, _d) = hub_config();
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let port = app.addr.rsplit(':').next().unwrap().to_string();
    let topics = [
        format!("http://127.0.0.1:{port}"),
        format!("http://LOCALHOST:{port}/topics/Upper"),
        format!("http://127.0.0.1:{port}/topics/%7Eann/feed"),
    ];
    for (i, t) in topics.iter().enumerate() {
        let (s, text) = subscribe(&app, t, &sub.url(&format!("/exact{i}")), &[]).await;
        assert_eq!(s, 202, "{t}: {text}");
        let v = sub.wait_verifications(&format!("/exact{i}"), 1).await;
        assert_eq!(
            v[0]["hub.topic"],
            t.as_str(),
            "sent back exactly as subscribed"
        );
    }
    // `~` and `%7E`: one topic, one subscription (updated in place).
    let tilde = format!("http://127.0.0.1:{port}/topics/~ann/feed");
    let (s, _) = subscribe(&app, &tilde, &sub.url("/exact2"), &[]).await;
    assert_eq!(s, 202);
    let v = sub.wait_verifications("/exact2", 2).await;
    assert_eq!(v[1]["hub.topic"], tilde.as_str());
    wait_subscribers(&app, &topics[2], 1).await;
    assert_eq!(
        subscriber_count(&app, &tilde).await,
        1,
        "~ and %7E are one subscription"
    );
    app.stop().await;
}

/// A receiver for the backlog test: answers 500 until told otherwise, then records the
/// number each delivery carries (`<n i="K">`), nothing else.
#[derive(Clone, Default)]
struct Counter {
    fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
    got: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    attempts: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

async fn counter_receiver(c: Counter) -> String {
    use axum::routing::get;
    async fn verify(
        axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
    ) -> String {
        q.get("hub.challenge").cloned().unwrap_or_default()
    }
    async fn post(
        axum::extract::State(c): axum::extract::State<Counter>,
        body: axum::body::Bytes,
    ) -> axum::http::StatusCode {
        c.attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if c.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return axum::http::StatusCode::INTERNAL_SERVER_ERROR;
        }
        let s = std::str::from_utf8(&body).unwrap_or("");
        let n = s
            .split('"')
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(usize::MAX);
        c.got.lock().unwrap().push(n);
        axum::http::StatusCode::NO_CONTENT
    }
    let app = axum::Router::new()
        .route("/dead", get(verify).post(post))
        .with_state(c);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/dead")
}

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    kb / 1024.0
}

/// 100,000 messages (1 KB each) queued for a subscriber that answers 500: the hub holds a
/// bounded window of them, not the backlog (its memory does not grow by the backlog's
/// 100 MB), and once the subscriber recovers it receives every one, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_subscribers_backlog_costs_bounded_memory_and_arrives_in_order() {
    const N: usize = 100_000;
    let (mut c, _d) = hub_config();
    c.hub.retry_schedule_secs = vec![1; 60];
    c.hub.retry_jitter = 0.0;
    let app = start(c.clone()).await;
    let counter = Counter::default();
    counter
        .fail
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let cb = counter_receiver(counter.clone()).await;
    let t = topic(&app, "backlog");
    let (s, _) = subscribe(&app, &t, &cb, &[]).await;
    assert_eq!(s, 202);
    wait_subscribers(&app, &t, 1).await;
    app.stop().await;

    // The backlog, written straight into the log while the hub is down.
    let store = Store::open_embedded(&c.database_path()).unwrap();
    let topic = Topic::parse(&t).unwrap();
    let pad = "x".repeat(1000);
    for chunk in 0..N / 1000 {
        let payloads = (0..1000)
            .map(|k| {
                (
                    topic.clone(),
                    "application/xml".to_string(),
                    bytes::Bytes::from(format!("<n i=\"{}\">{pad}</n>", chunk * 1000 + k)),
                )
            })
            .collect();
        store
            .hub_publish(payloads, None, Timestamp::now())
            .await
            .unwrap();
    }
    drop(store);

    let before = rss_mb();
    let app = start(c).await;
    wait_until("the first attempt at the dead subscriber", || async {
        counter.attempts.load(std::sync::atomic::Ordering::SeqCst) >= 2
    })
    .await;
    let during = rss_mb();
    eprintln!("RSS before {before:.0} MB, with the backlog pending {during:.0} MB");
    assert!(
        during - before < 40.0,
        "RSS grew by {:.0} MB with a {N}-message backlog",
        during - before
    );

    counter
        .fail
        .store(false, std::sync::atomic::Ordering::SeqCst);
    crate::support::wait_for_count("backlog delivered", N, || counter.got.lock().unwrap().len())
        .await;
    let got = counter.got.lock().unwrap().clone();
    assert_eq!(
        got,
        (0..N).collect::<Vec<_>>(),
        "every message, once, in order"
    );
    app.stop().await;
}

/// One callback host holds at most `hub.max_subscriptions_per_host` subscriptions; renewing
/// one it holds is still fine.
#[tokio::test]
async fn subscriptions_per_callback_host_are_capped() {
    let (mut c, _d) = hub_config();
    c.hub.max_subscriptions_per_host = 3;
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let t = topic(&app, "t");
    for i in 0..3 {
        subscribed(&app, &sub, &t, &format!("/cap{i}"), &[]).await;
    }
    let (s, text) = subscribe(&app, &t, &sub.url("/cap3"), &[]).await;
    assert_eq!(s, 403, "{text}");
    assert!(text.contains("hub.max_subscriptions_per_host"), "{text}");
    let (s, text) = subscribe(&app, &t, &sub.url("/cap0"), &[]).await;
    assert_eq!(s, 202, "a renewal is not a new subscription: {text}");
    app.stop().await;
}

/// A topic or callback over 2,048 characters is refused at the request with 400 and a reason
/// (it was answered 202, stored, then never verified, with a misleading "callback
/// unreachable"); nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlong_topic_or_callback_is_refused_at_the_request() {
    let (c, _dir) = hub_config();
    let app = start(c).await;
    let t = topic(&app, "papers/changes");
    let long_topic = format!("{t}?{}", "x".repeat(100_000));
    let (status, body) = form(
        &app,
        &[
            ("hub.mode", "subscribe"),
            ("hub.topic", &long_topic),
            ("hub.callback", "http://127.0.0.1:9/cb"),
        ],
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("hub.topic is") && body.contains("at most 2048"),
        "{body}"
    );
    let long_callback = format!("http://127.0.0.1:9/cb?{}", "y".repeat(3000));
    let (status, body) = form(
        &app,
        &[
            ("hub.mode", "subscribe"),
            ("hub.topic", &t),
            ("hub.callback", &long_callback),
        ],
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("hub.callback is"), "{body}");
    assert_eq!(subscriber_count(&app, &t).await, 0);
    let store = Store::open_embedded(&app.config.database_path()).unwrap();
    assert!(
        store.hub_intents().await.unwrap().is_empty(),
        "a verification was started"
    );
}

/// Callbacks that accept the verification's connection and never answer hold at most
/// `hub.max_concurrent_verifications` connections; a host's requests beyond
/// `hub.max_verifications_per_host` (waiting or in flight) are answered 503 with Retry-After
/// and start nothing (2,000 hung callbacks had held 2,018 descriptors).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_verification_callbacks_are_bounded() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = hung.local_addr().unwrap().port();
    let conns = std::sync::Arc::new(AtomicUsize::new(0));
    let c = conns.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = hung.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            held.push(s);
        }
    });
    let (mut cfg, _d) = hub_config();
    cfg.hub.max_concurrent_verifications = 2;
    cfg.hub.max_verifications_per_host = 3;
    cfg.hub.request_timeout_secs = 60;
    let app = start(cfg).await;
    let t = topic(&app, "t");
    for i in 0..3 {
        let (s, text) = subscribe(&app, &t, &format!("http://127.0.0.1:{port}/cb{i}"), &[]).await;
        assert_eq!(s, 202, "{text}");
    }
    let cb = format!("http://localhost:{port}/cb9");
    let r = form_response(
        &app,
        &[
            ("hub.mode", "subscribe"),
            ("hub.topic", &t),
            ("hub.callback", &cb),
        ],
    )
    .await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let text = r.text().await.unwrap();
    assert!(text.contains("max_verifications_per_host"), "{text}");
    wait_until("two verifications connected", || async {
        conns.load(Ordering::SeqCst) >= 2
    })
    .await;
    // The third waits for a place: no connection while the two hang (watched a while).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(conns.load(Ordering::SeqCst), 2, "more than two in flight");
    let store = Store::open_embedded(&app.config.database_path()).unwrap();
    assert_eq!(
        store.hub_intents().await.unwrap().len(),
        3,
        "the 503'd one is not stored"
    );
    app.stop().await;
}

/// Every signed delivery also carries the Standard Webhooks headers, and the official
/// `standardwebhooks` libraries (Python's and JavaScript's) verify them with the `whsec_` form
/// of the `hub.secret`; a changed body or another secret fails their check.
#[tokio::test]
async fn signed_deliveries_pass_the_standard_webhooks_library() {
    let (c, _d) = hub_config();
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let t = topic(&app, "papers/changes");
    let secret = "a WebSub secret, any bytes";
    subscribed(&app, &sub, &t, "/sw", &[("hub.secret", secret)]).await;
    let payload = r#"<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"/>"#;
    let (status, text) = fat_ping(&app, &t, payload).await;
    assert_eq!(status, 200, "{text}");
    let d = &sub.wait_deliveries("/sw", 1).await[0];
    let id = d.header("webhook-id").expect("webhook-id").to_string();
    assert!(id.starts_with("msg_"), "{id}");
    let at: i64 = d.header("webhook-timestamp").unwrap().parse().unwrap();
    let now = Timestamp::now().0 / 1_000_000;
    assert!(
        (now - 60..=now).contains(&at),
        "the attempt's time: {at} (now {now})"
    );
    assert!(
        d.header("x-hub-signature").is_some(),
        "WebSub's signature is kept"
    );
    // Host and Content-Length are the hub's own (hyper adds them only when missing): each
    // once, naming the callback's host and port and the body's length.
    let once = |name: &str| {
        let all: Vec<_> = d.headers.get_all(name).iter().collect();
        assert_eq!(all.len(), 1, "one {name}: {all:?}");
        all[0].to_str().unwrap().to_string()
    };
    assert_eq!(once("host"), sub.addr, "the callback's host and port");
    assert_eq!(once("content-length"), payload.len().to_string());

    let changed = payload.replace("urlset", "urlsex");
    for verdicts in standard_verdicts(d, None, &[secret, "another secret"]) {
        assert_eq!(
            verdicts[0],
            serde_json::Value::Null,
            "the library verifies it: {verdicts:?}"
        );
        assert!(
            verdicts[1].is_string(),
            "another secret fails: {verdicts:?}"
        );
    }
    for verdicts in standard_verdicts(d, Some(changed.as_bytes()), &[secret]) {
        assert!(
            verdicts[0].is_string(),
            "a changed body fails: {verdicts:?}"
        );
    }
    app.stop().await;
}

/// `hub.standard_webhooks = false`: a signed delivery carries WebSub's signature and the
/// message id only, and the signature is still the right one.
#[tokio::test]
async fn standard_webhooks_off_signs_the_websub_way_only() {
    let (mut c, _d) = hub_config();
    c.hub.standard_webhooks = false;
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let t = topic(&app, "papers/changes");
    subscribed(&app, &sub, &t, "/ws", &[("hub.secret", "s3cret")]).await;
    let (status, text) = fat_ping(&app, &t, "<urlset/>").await;
    assert_eq!(status, 200, "{text}");
    let d = &sub.wait_deliveries("/ws", 1).await[0];
    let want = format!(
        "sha256={}",
        hmac_hex::<Hmac<sha2::Sha256>>(b"s3cret", &d.body)
    );
    assert_eq!(d.header("x-hub-signature"), Some(want.as_str()));
    assert!(d
        .header("webhook-id")
        .is_some_and(|i| i.starts_with("msg_")));
    for h in ["webhook-signature", "webhook-timestamp"] {
        assert_eq!(d.header(h), None, "{h} is sent although switched off");
    }
    app.stop().await;
}

/// What the official Standard Webhooks libraries (Python's, then JavaScript's) say of delivery
/// `d`, with its body replaced by `body` when given, for each of `secrets` (given as WebSub
/// `hub.secret`s): `null` where it verifies, else the library's error.
pub fn standard_verdicts(
    d: &crate::subscriber::Delivery,
    body: Option<&[u8]>,
    secrets: &[&str],
) -> [Vec<serde_json::Value>; 2] {
    use base64::Engine as _;
    let headers: serde_json::Value = ["webhook-id", "webhook-timestamp", "webhook-signature"]
        .iter()
        .map(|h| (h.to_string(), d.header(h).unwrap_or_default().into()))
        .collect::<serde_json::Map<_, _>>()
        .into();
    let body = base64::engine::general_purpose::STANDARD.encode(body.unwrap_or(&d.body));
    let cases: Vec<serde_json::Value> = secrets
        .iter()
        .map(|s| {
            serde_json::json!({
                "secret": resourcesync_hub::model::websub::whsec(s.as_bytes()),
                "headers": headers, "body_b64": body,
            })
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cases.json");
    std::fs::write(&file, serde_json::Value::from(cases).to_string()).unwrap();
    let list = |v: serde_json::Value| v.as_array().unwrap().clone();
    [
        list(crate::support::py_tool_json(
            "verify_standard_webhooks.py",
            &[file.as_os_str()],
        )),
        list(
            crate::support::NodeEnv::get()
                .tool_json("verify_standard_webhooks.mjs", &[file.as_os_str()]),
        ),
    ]
}

/// A subscriber that subscribes again with a new secret gets deliveries that both its old and
/// its new secret verify while `hub.secret_grace_secs` lasts (`X-Hub-Signature` with the new
/// one at once), and only the new one after.
#[tokio::test]
async fn a_rotated_secret_and_the_old_one_both_verify_until_the_grace_period_ends() {
    let (mut c, _d) = hub_config();
    c.hub.secret_grace_secs = 2;
    let app = start(c).await;
    let sub = TestSubscriber::start().await;
    let t = topic(&app, "papers/changes");
    subscribed(&app, &sub, &t, "/rot", &[("hub.secret", "old secret")]).await;
    let rotated = Timestamp::now();
    subscribed(&app, &sub, &t, "/rot", &[("hub.secret", "new secret")]).await;
    fat_ping(&app, &t, "<a/>").await;
    let d = &sub.wait_deliveries("/rot", 1).await[0];
    let want = format!(
        "sha256={}",
        hmac_hex::<Hmac<sha2::Sha256>>(b"new secret", b"<a/>")
    );
    assert_eq!(d.header("x-hub-signature"), Some(want.as_str()));
    for verdicts in standard_verdicts(d, None, &["old secret", "new secret", "neither"]) {
        assert_eq!(
            verdicts[..2],
            [serde_json::Value::Null, serde_json::Value::Null],
            "both verify during the grace period: {verdicts:?}"
        );
        assert!(verdicts[2].is_string(), "{verdicts:?}");
    }
    // The grace period (2 s from the rotation) is over: only the new secret signs.
    wait_until("the grace period is over", || async {
        Timestamp::now() > rotated.plus_secs(3)
    })
    .await;
    fat_ping(&app, &t, "<b/>").await;
    let d = &sub.wait_deliveries("/rot", 2).await[1];
    assert_eq!(d.text(), "<b/>");
    for verdicts in standard_verdicts(d, None, &["old secret", "new secret"]) {
        assert!(
            verdicts[0].is_string(),
            "the old secret no longer verifies: {verdicts:?}"
        );
        assert_eq!(verdicts[1], serde_json::Value::Null, "{verdicts:?}");
    }
    app.stop().await;
}

/// A delivery made long after its message was published (a retry, a backlog after a restart)
/// is signed at its attempt: the Standard Webhooks libraries, which refuse a timestamp more
/// than five minutes off, verify a message published six minutes before it is sent (written
/// into the store as published then, so no test waits six minutes).
#[tokio::test]
async fn a_delivery_long_after_publication_is_signed_at_its_attempt() {
    let (c, _d) = hub_config();
    let app = start(c.clone()).await;
    let sub = TestSubscriber::start().await;
    let t = topic(&app, "papers/changes");
    subscribed(&app, &sub, &t, "/late", &[("hub.secret", "k")]).await;
    let config = app.config.clone();
    app.stop().await;
    let store = Store::open_embedded(&config.database_path()).unwrap();
    let six_minutes_ago = Timestamp(Timestamp::now().0 - 360_000_000);
    let message = (
        Topic::parse(&t).unwrap(),
        "application/xml".to_string(),
        Bytes::from_static(b"<late/>"),
    );
    store
        .hub_publish(vec![message], None, six_minutes_ago)
        .await
        .unwrap();
    drop(store);
    let app = start(c).await;
    let d = &sub.wait_deliveries("/late", 1).await[0];
    assert_eq!(d.text(), "<late/>");
    let id = d.header("webhook-id").unwrap();
    assert!(
        id.starts_with(&format!("msg_{}_", six_minutes_ago.0)),
        "the message published six minutes ago: {id}"
    );
    for verdicts in standard_verdicts(d, None, &["k"]) {
        assert_eq!(verdicts[0], serde_json::Value::Null, "{verdicts:?}");
    }
    app.stop().await;
}
