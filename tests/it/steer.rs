//! Steering subscriptions: an admin's pause and resume (API and CLI), and the disable that
//! follows a subscriber failing for `hub.disable_after_secs`, with the operator's event.

use std::time::Duration;

use serde_json::Value;

use crate::hub::{fat_ping, hub_config, standard_verdicts, subscribed};
use crate::subscriber::{number, TestSubscriber};
use crate::support::*;

const ADMIN: &str = "admin-token-for-tests";

async fn admin(app: &TestApp, method: reqwest::Method, path: &str) -> (u16, Value) {
    admin_call(app, ADMIN, method, path, None).await
}

async fn sub_id(app: &TestApp, callback_part: &str) -> String {
    let (s, page) = admin(
        app,
        reqwest::Method::GET,
        &format!("/admin/v1/subscriptions?callback={callback_part}"),
    )
    .await;
    assert_eq!(s, 200, "{page}");
    page["items"][0]["id"].as_str().unwrap().to_string()
}

async fn metric(app: &TestApp, line: &str) -> bool {
    let text = get_text(&app.client, &app.url("/metrics")).await;
    text.lines().any(|l| l == line)
}

/// The CLI against the running server; (success, stdout + stderr).
async fn cli(app: &TestApp, args: &[&str]) -> (bool, String) {
    let base = app.url("");
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(ChildServer::BIN)
            .args(["admin", "--url", &base, "--token", ADMIN])
            .args(&args)
            .output()
            .unwrap();
        (out.status.success(), output_text(&out))
    })
    .await
    .unwrap()
}

/// A paused subscription is sent nothing while its topic keeps publishing (its neighbour gets
/// everything meanwhile); resumed, it gets every message it missed, in order, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_subscription_gets_its_backlog_in_order_once_on_resume() {
    let (mut c, _d) = hub_config();
    c.admin.token = ADMIN.into();
    let app = TestApp::start_with(c).await;
    let sub = TestSubscriber::start().await;
    let t = app.config.topic_base() + "/steer";
    subscribed(&app, &sub, &t, "/paused", &[]).await;
    subscribed(&app, &sub, &t, "/neighbour", &[]).await;
    let id = sub_id(&app, "/paused").await;

    let (s, v) = admin(
        &app,
        reqwest::Method::POST,
        &format!("/admin/v1/subscriptions/{id}/pause"),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "paused");
    assert!(v["held_since"].is_string(), "{v}");

    // Five minutes' worth of a busy topic (one message a second), published at once.
    const N: usize = 300;
    for i in 0..N {
        assert_eq!(fat_ping(&app, &t, &format!("<n i=\"{i}\"/>")).await.0, 200);
    }
    let neighbour = sub.wait_deliveries("/neighbour", N).await;
    assert_eq!(
        neighbour.iter().map(number).collect::<Vec<_>>(),
        (0..N).collect::<Vec<_>>()
    );
    assert!(
        sub.deliveries("/paused").is_empty(),
        "nothing is sent while paused"
    );
    let (_, detail) = admin(
        &app,
        reqwest::Method::GET,
        &format!("/admin/v1/subscriptions/{id}"),
    )
    .await;
    assert_eq!(
        (detail["state"].as_str(), detail["pending"].as_u64()),
        (Some("paused"), Some(N as u64)),
        "{detail}"
    );
    assert!(metric(&app, "rshub_subscriptions{state=\"paused\"} 1").await);

    // Resumed with the CLI.
    let (ok, out) = cli(&app, &["subscriptions", "resume", &id]).await;
    assert!(ok, "{out}");
    assert!(out.contains("active"), "{out}");
    let got = sub.wait_deliveries("/paused", N).await;
    assert_eq!(
        got.iter().map(number).collect::<Vec<_>>(),
        (0..N).collect::<Vec<_>>(),
        "every message missed, in order"
    );
    let ids: std::collections::HashSet<_> = got
        .iter()
        .map(|d| d.header("webhook-id").unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), N, "each once");
    wait_until("the queue is empty", || async {
        let (_, d) = admin(
            &app,
            reqwest::Method::GET,
            &format!("/admin/v1/subscriptions/{id}"),
        )
        .await;
        d["pending"] == 0 && d["state"] == "active"
    })
    .await;
    assert_eq!(sub.deliveries("/paused").len(), N, "nothing twice");

    // The CLI sets a rate limit, and takes it back to the hub's default.
    let (ok, out) = cli(&app, &["subscriptions", "limit", &id, "2.5"]).await;
    assert!(
        ok && out.contains("at most 2.5 deliveries a second"),
        "{out}"
    );
    let (ok, out) = cli(&app, &["subscriptions", "limit", &id, "default"]).await;
    assert!(ok && out.contains("the hub's default"), "{out}");
    let (ok, out) = cli(&app, &["subscriptions", "limit", &id, "fast"]).await;
    assert!(!ok && out.contains("\"fast\" is not a number"), "{out}");

    // Pausing with the CLI; an unknown id is a 404 that names it.
    let (ok, out) = cli(&app, &["subscriptions", "pause", &id]).await;
    assert!(ok && out.contains("paused"), "{out}");
    let (s, v) = admin(
        &app,
        reqwest::Method::POST,
        "/admin/v1/subscriptions/987654/pause",
    )
    .await;
    assert_eq!(s, 404, "{v}");
    assert!(v["error"].as_str().unwrap().contains("987654"), "{v}");
    app.stop().await;
}

/// A subscriber answering 500 for longer than `hub.disable_after_secs` is disabled: nothing
/// more is attempted, the operator webhook gets a signed `subscription.disabled` event that the
/// Standard Webhooks libraries verify, and the metrics count it. Resumed once it answers
/// again, it gets its whole backlog in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_failing_past_the_disable_period_is_disabled_and_resumes_in_order() {
    let ops = TestSubscriber::start().await;
    let (mut c, _d) = hub_config();
    c.admin.token = ADMIN.into();
    c.hub.disable_after_secs = 2;
    c.hub.retry_schedule_secs = vec![1; 20];
    c.hub.retry_jitter = 0.0;
    c.hub.operator_webhook = ops.url("/ops");
    c.hub.operator_webhook_secret = "operator secret".into();
    let app = TestApp::start_with(c).await;
    let sub = TestSubscriber::start().await;
    sub.answer("/down", 500);
    let t = app.config.topic_base() + "/steer";
    subscribed(&app, &sub, &t, "/down", &[]).await;
    let id = sub_id(&app, "/down").await;
    for i in 0..3 {
        assert_eq!(fat_ping(&app, &t, &format!("<n i=\"{i}\"/>")).await.0, 200);
    }

    let event = &ops.wait_deliveries("/ops", 1).await[0];
    let body: Value = serde_json::from_str(&event.text()).unwrap();
    assert_eq!(body["type"], "subscription.disabled", "{body}");
    assert_eq!(body["data"]["subscription_id"], id.as_str(), "{body}");
    assert_eq!(body["data"]["callback"], sub.url("/down"), "{body}");
    assert!(
        body["data"]["last_error"].as_str().unwrap().contains("500"),
        "{body}"
    );
    for verdicts in standard_verdicts(event, None, &["operator secret", "another"]) {
        assert_eq!(
            verdicts[0],
            Value::Null,
            "the operator's library verifies it: {verdicts:?}"
        );
        assert!(verdicts[1].is_string(), "{verdicts:?}");
    }
    let (_, detail) = admin(
        &app,
        reqwest::Method::GET,
        &format!("/admin/v1/subscriptions/{id}"),
    )
    .await;
    assert_eq!(detail["state"], "disabled", "{detail}");
    assert!(detail["failing_since"].is_string(), "{detail}");
    assert!(metric(&app, "rshub_subscriptions{state=\"disabled\"} 1").await);

    // Disabled: no attempt is made, however long (three retry periods here), while the topic
    // keeps publishing.
    let attempts = sub.deliveries("/down").len();
    for i in 3..6 {
        assert_eq!(fat_ping(&app, &t, &format!("<n i=\"{i}\"/>")).await.0, 200);
    }
    let quiet_until = std::time::Instant::now() + Duration::from_secs(3);
    wait_until("three retry periods have passed", || async {
        std::time::Instant::now() >= quiet_until
    })
    .await;
    assert_eq!(
        sub.deliveries("/down").len(),
        attempts,
        "nothing sent while disabled"
    );

    sub.answer("/down", 200);
    let (s, v) = admin(
        &app,
        reqwest::Method::POST,
        &format!("/admin/v1/subscriptions/{id}/resume"),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert!(
        v["state"] == "failing" || v["state"] == "active",
        "no longer disabled: {v}"
    );
    let got = sub.wait_deliveries("/down", attempts + 6).await;
    let delivered: Vec<usize> = got[attempts..].iter().map(number).collect();
    assert_eq!(
        delivered,
        (0..6).collect::<Vec<_>>(),
        "the backlog in order"
    );
    wait_until("active again", || async {
        let (_, d) = admin(
            &app,
            reqwest::Method::GET,
            &format!("/admin/v1/subscriptions/{id}"),
        )
        .await;
        d["state"] == "active" && d["pending"] == 0
    })
    .await;
    assert_eq!(ops.deliveries("/ops").len(), 1, "one event");
    app.stop().await;
}

/// A subscriber limited to 5 deliveries a second gets all of 500 messages, in order, never two
/// closer than 200 ms (so never more than 5 in a second), while its neighbours get theirs at
/// once; overload answers (429) slow a subscriber down and successes speed it up again; bad
/// limits are refused with a reason. The clock is tokio's, paused: no test waits 100 s.
#[tokio::test(start_paused = true)]
async fn a_rate_limited_subscriber_gets_everything_in_order_at_its_pace_and_429_slows_it() {
    let (mut c, _d) = hub_config();
    c.admin.token = ADMIN.into();
    c.hub.retry_schedule_secs = vec![1];
    c.hub.retry_jitter = 0.0;
    let app = TestApp::start_with(c).await;
    let sub = TestSubscriber::start().await;
    let t = app.config.topic_base() + "/steer";
    for p in ["/limited", "/n1", "/n2", "/busy"] {
        subscribed(&app, &sub, &t, p, &[]).await;
    }
    let id = sub_id(&app, "/limited").await;
    let path = format!("/admin/v1/subscriptions/{id}");
    let patch = |body: Value| admin_call(&app, ADMIN, reqwest::Method::PATCH, &path, Some(body));
    for (bad, why) in [
        (serde_json::json!({"max_per_sec": -1}), "between 0"),
        (serde_json::json!({"max_per_sec": 1e9}), "between 0"),
        (serde_json::json!({"max_per_sec": "five"}), "JSON like"),
        (serde_json::json!([5]), "not an object"),
        (
            serde_json::json!({"max_per_sec": 5, "burst": 2}),
            "JSON like",
        ),
    ] {
        let (s, v) = patch(bad.clone()).await;
        assert_eq!(s, 400, "{bad}: {v}");
        assert!(v["error"].as_str().unwrap().contains(why), "{bad}: {v}");
    }
    let (s, v) = patch(serde_json::json!({})).await;
    assert_eq!(
        (s, &v["max_per_sec"]),
        (200, &Value::Null),
        "nothing changed: {v}"
    );
    let (s, v) = patch(serde_json::json!({"max_per_sec": 5})).await;
    assert_eq!((s, v["max_per_sec"].as_f64()), (200, Some(5.0)), "{v}");
    sub.script("/busy", &[(429, None)]);

    const N: usize = 500;
    let start = tokio::time::Instant::now();
    for i in 0..N {
        assert_eq!(fat_ping(&app, &t, &format!("<n i=\"{i}\"/>")).await.0, 200);
    }
    let limited = sub.wait_deliveries("/limited", N).await;
    let in_order = |d: &[crate::subscriber::Delivery]| d.iter().map(number).collect::<Vec<_>>();
    assert_eq!(in_order(&limited), (0..N).collect::<Vec<_>>());
    let closest = limited.windows(2).map(|w| w[1].at - w[0].at).min().unwrap();
    assert!(
        closest >= Duration::from_millis(200),
        "never two within 200 ms: {closest:?}"
    );
    for p in ["/n1", "/n2"] {
        let got = sub.deliveries(p);
        assert_eq!(in_order(&got), (0..N).collect::<Vec<_>>(), "{p}");
        assert!(
            got[N - 1].at < limited[10].at,
            "{p} got all {N} before the limited one got 11 ({:?} after the first publish)",
            got[N - 1].at - start
        );
    }
    // /busy: a 429 at the first message; its retry (after 1 s) and the next deliveries come
    // ever closer: 100 ms of slowdown, halved by each success.
    let busy = sub.wait_deliveries("/busy", N + 1).await;
    assert_eq!(in_order(&busy[1..]), (0..N).collect::<Vec<_>>());
    let gaps: Vec<u128> = busy
        .windows(2)
        .take(5)
        .map(|w| (w[1].at - w[0].at).as_millis())
        .collect();
    assert!(gaps[0] >= 1000, "the retry after 1 s: {gaps:?}");
    assert!(
        gaps[1] >= 50 && gaps[2] >= 25 && gaps[3] >= 12,
        "slowed down, then faster with each success: {gaps:?}"
    );
    assert!(gaps[4] < 12, "back to full speed: {gaps:?}");
    app.stop().await;
}

/// An admin rotates a subscriber's secret without a gap, as a re-subscription does: the new
/// one signs `X-Hub-Signature` at once, and both verify with the Standard Webhooks libraries
/// during the grace period; a bad secret is refused with a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_rotates_a_secret_and_both_verify_during_the_grace_period() {
    let (mut c, _d) = hub_config();
    c.admin.token = ADMIN.into();
    let app = TestApp::start_with(c).await;
    let sub = TestSubscriber::start().await;
    let t = app.config.topic_base() + "/steer";
    subscribed(&app, &sub, &t, "/rot", &[("hub.secret", "old secret")]).await;
    let id = sub_id(&app, "/rot").await;
    let path = format!("/admin/v1/subscriptions/{id}/secret");
    let rotate = |body: Value| admin_call(&app, ADMIN, reqwest::Method::POST, &path, Some(body));
    for (bad, why) in [
        (serde_json::json!({"secret": ""}), "1 to 199 bytes"),
        (
            serde_json::json!({"secret": "x".repeat(200)}),
            "1 to 199 bytes",
        ),
        (serde_json::json!({"key": "x"}), "JSON like"),
    ] {
        let (s, v) = rotate(bad.clone()).await;
        assert_eq!(s, 400, "{bad}: {v}");
        assert!(v["error"].as_str().unwrap().contains(why), "{bad}: {v}");
    }
    let (s, v) = rotate(serde_json::json!({"secret": "new secret"})).await;
    assert_eq!(s, 200, "{v}");
    assert!(v["previous_secret_until"].is_string(), "{v}");
    assert!(!v.to_string().contains("secret\""), "no secret shown: {v}");
    assert_eq!(fat_ping(&app, &t, "<a/>").await.0, 200);
    let d = &sub.wait_deliveries("/rot", 1).await[0];
    let want = format!(
        "sha256={}",
        crate::hub::hmac_hex::<hmac::Hmac<sha2::Sha256>>(b"new secret", b"<a/>")
    );
    assert_eq!(d.header("x-hub-signature"), Some(want.as_str()));
    for verdicts in standard_verdicts(d, None, &["old secret", "new secret"]) {
        assert_eq!(
            verdicts,
            [Value::Null, Value::Null],
            "both verify: {verdicts:?}"
        );
    }
    app.stop().await;
}
