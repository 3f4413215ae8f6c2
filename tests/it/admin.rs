//! The admin API, `/metrics` and the OpenAPI document, against a live server with real
//! subscribers; schemathesis fuzzes the API from its own OpenAPI document.

use std::time::Duration;

use serde_json::Value;

use crate::hub::{fat_ping, hub_config, subscribed};
use crate::subscriber::TestSubscriber;
use crate::support::*;

const ADMIN: &str = "admin-token-for-tests";

async fn admin_app(
    tweak: impl FnOnce(&mut resourcesync_hub::config::Config),
) -> (TestApp, tempfile::TempDir) {
    let (mut c, d) = hub_config();
    c.admin.token = ADMIN.into();
    tweak(&mut c);
    (TestApp::start_with(c).await, d)
}

/// An admin request; returns (status, body text).
async fn admin(app: &TestApp, method: &str, path: &str) -> (u16, String) {
    let rb = match method {
        "GET" => app.client.get(app.url(path)),
        "POST" => app.client.post(app.url(path)),
        "DELETE" => app.client.delete(app.url(path)),
        _ => unreachable!(),
    };
    let r = rb
        .header("authorization", format!("Bearer {ADMIN}"))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn admin_json(app: &TestApp, path: &str) -> Value {
    let (s, t) = admin(app, "GET", path).await;
    assert_eq!(s, 200, "{path}: {t}");
    serde_json::from_str(&t).unwrap()
}

#[tokio::test]
async fn the_admin_api_needs_its_token_and_is_off_without_one() {
    let (c, _d) = hub_config();
    let app = TestApp::start_with(c).await;
    let r = app
        .client
        .get(app.url("/admin/v1/stats"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("admin.token"), "says why");
    app.stop().await;

    let (app, _d) = admin_app(|_| {}).await;
    let r = app
        .client
        .get(app.url("/admin/v1/stats"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = app
        .client
        .get(app.url("/admin/v1/stats"))
        .header("authorization", "Bearer wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = app
        .client
        .get(app.url("/admin/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the API description is public");
    let doc: Value = r.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    assert!(doc["paths"]["/admin/v1/subscriptions/{id}"]["delete"].is_object());
    app.stop().await;
}

#[tokio::test]
async fn every_endpoint_answers_and_no_secret_ever_appears() {
    let (app, _d) = admin_app(|_| {}).await;
    let sub = TestSubscriber::start().await;
    let t = app.config.topic_base() + "/news";
    subscribed(
        &app,
        &sub,
        &t,
        "/secret-one",
        &[("hub.secret", "TOPSECRET-42")],
    )
    .await;
    subscribed(&app, &sub, &t, "/plain", &[]).await;
    // A callback that never answers keeps its verification pending.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_cb = format!("http://{}/cb", silent.local_addr().unwrap());
    let r = app
        .client
        .post(app.url("/hub"))
        .form(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", t.as_str()),
            ("hub.callback", silent_cb.as_str()),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    assert_eq!(fat_ping(&app, &t, "<n/>").await.0, 200);
    sub.wait_deliveries("/secret-one", 1).await;
    sub.wait_deliveries("/plain", 1).await;
    // Outcomes are written in batches: wait until both deliveries are recorded.
    wait_until("both deliveries recorded", || async {
        admin_json(&app, "/admin/v1/subscriptions").await["items"]
            .as_array()
            .is_some_and(|items| items.iter().filter(|i| i["delivered"] == 1).count() == 2)
    })
    .await;

    let mut bodies = Vec::new();
    let page = admin_json(&app, "/admin/v1/subscriptions").await;
    bodies.push(page.to_string());
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    let secret = items
        .iter()
        .find(|i| i["callback"].as_str().unwrap().ends_with("/secret-one"))
        .unwrap();
    assert_eq!(secret["secret_set"], true);
    assert_eq!(secret["state"], "active");
    assert_eq!(secret["delivered"], 1);
    let id = secret["id"].as_str().unwrap().to_string();

    let page = admin_json(&app, "/admin/v1/subscriptions?limit=1").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    let next = page["next_cursor"].as_str().unwrap().to_string();
    let page2 = admin_json(
        &app,
        &format!("/admin/v1/subscriptions?limit=1&cursor={next}"),
    )
    .await;
    assert_eq!(page2["items"].as_array().unwrap().len(), 1);
    assert_ne!(
        page2["items"][0]["id"], page["items"][0]["id"],
        "cursor paging"
    );
    assert!(page2["next_cursor"].is_null());
    let filtered = admin_json(&app, "/admin/v1/subscriptions?callback=plain").await;
    assert_eq!(filtered["items"].as_array().unwrap().len(), 1);
    let by_topic = admin_json(
        &app,
        &format!("/admin/v1/subscriptions?topic={}", urlencode(&t)),
    )
    .await;
    assert_eq!(by_topic["items"].as_array().unwrap().len(), 2);
    let pending = admin_json(&app, "/admin/v1/subscriptions?state=pending_verification").await;
    assert_eq!(pending["items"][0]["callback"], silent_cb.as_str());
    assert!(pending["items"][0]["id"]
        .as_str()
        .unwrap()
        .starts_with("pending-"));
    assert_eq!(
        admin_json(&app, "/admin/v1/subscriptions?state=expired").await["items"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    assert_eq!(
        admin(&app, "GET", "/admin/v1/subscriptions?state=bogus")
            .await
            .0,
        400
    );
    assert_eq!(
        admin(&app, "GET", "/admin/v1/subscriptions?limit=0")
            .await
            .0,
        400
    );

    let detail = admin_json(&app, &format!("/admin/v1/subscriptions/{id}")).await;
    bodies.push(detail.to_string());
    assert!(detail["lease_expires"].is_string() && detail["verified_at"].is_string());
    assert_eq!(detail["last_success"]["status"], 200);
    assert_eq!(detail["pending"], 0);
    assert_eq!(
        admin(&app, "GET", "/admin/v1/subscriptions/999999").await.0,
        404
    );

    let topics = admin_json(&app, "/admin/v1/topics").await;
    bodies.push(topics.to_string());
    let news = topics
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["topic"] == t.as_str())
        .unwrap();
    assert_eq!(news["subscribers"], 2);
    assert!(news["last_publish"].is_string());
    let latest = admin_json(
        &app,
        &format!("/admin/v1/topics/latest?topic={}", urlencode(&t)),
    )
    .await;
    assert_eq!(latest["payload"], "<n/>");

    let deliveries = admin_json(&app, &format!("/admin/v1/deliveries?subscription={id}")).await;
    bodies.push(deliveries.to_string());
    assert_eq!(deliveries.as_array().unwrap().len(), 1);
    assert_eq!(deliveries[0]["outcome"], "delivered");
    assert_eq!(
        admin_json(&app, "/admin/v1/deliveries?outcome=given_up")
            .await
            .as_array()
            .unwrap()
            .len(),
        0
    );

    let stats = admin_json(&app, "/admin/v1/stats").await;
    bodies.push(stats.to_string());
    assert_eq!(stats["subscriptions"]["active"], 2);
    assert_eq!(stats["subscriptions"]["pending_verification"], 1);
    assert_eq!(stats["delivered"], 2);
    assert_eq!(stats["attempts_by_outcome"]["delivered"], 2);

    let (s, text) = admin(
        &app,
        "POST",
        &format!("/admin/v1/subscriptions/{id}/verify"),
    )
    .await;
    assert_eq!(s, 202, "{text}");
    sub.wait_verifications("/secret-one", 2).await;
    let (s, text) = admin(&app, "POST", &format!("/admin/v1/subscriptions/{id}/retry")).await;
    assert_eq!((s, text.as_str()), (200, r#"{"requeued":0}"#));

    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for want in [
        "rshub_deliveries_total{outcome=\"delivered\"} 2",
        "rshub_subscriptions{state=\"active\"} 2",
        "rshub_queue_depth 0",
        "rshub_delivery_seconds_bucket",
        "rshub_store_errors_total 0",
    ] {
        assert!(metrics.contains(want), "{want} in\n{metrics}");
    }
    bodies.push(metrics);

    let (s, _) = admin(
        &app,
        "DELETE",
        &format!("/admin/v1/subscriptions/{id}?deny=true&reason=bye"),
    )
    .await;
    assert_eq!(s, 204);
    let v = sub.wait_verifications("/secret-one", 3).await;
    assert_eq!(
        (v[2]["hub.mode"].as_str(), v[2]["hub.reason"].as_str()),
        ("denied", "bye")
    );
    assert_eq!(
        admin(&app, "DELETE", &format!("/admin/v1/subscriptions/{id}"))
            .await
            .0,
        404
    );
    for b in bodies {
        assert!(!b.contains("TOPSECRET"), "a secret in a response: {b}");
    }
    app.stop().await;
}

fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[tokio::test]
async fn a_failing_subscriber_shows_failing_then_active_after_a_retry() {
    let (app, _d) = admin_app(|c| {
        c.hub.retry_schedule_secs = vec![1, 1, 3600];
        c.hub.retry_jitter = 0.0;
    })
    .await;
    let sub = TestSubscriber::start().await;
    let t = app.config.topic_base() + "/t";
    subscribed(&app, &sub, &t, "/flaky", &[]).await;
    sub.answer("/flaky", 500);
    assert_eq!(fat_ping(&app, &t, "<a/>").await.0, 200);
    sub.wait_deliveries("/flaky", 3).await;
    let id = admin_json(&app, "/admin/v1/subscriptions").await["items"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut detail = Value::Null;
    for _ in 0..100 {
        detail = admin_json(&app, &format!("/admin/v1/subscriptions/{id}")).await;
        if detail["retry_attempts"] == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(detail["state"], "failing", "{detail}");
    assert_eq!(detail["retry_attempts"], 3);
    assert_eq!(detail["last_failure"]["status"], 500);
    assert_eq!(
        detail["last_failure"]["error"],
        "callback answered 500 Internal Server Error"
    );
    assert_eq!(detail["pending"], 1);
    assert!(
        detail["next_attempt_at"].is_string(),
        "the next retry is an hour away"
    );
    assert_eq!(
        admin_json(&app, "/admin/v1/subscriptions?state=failing").await["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    sub.answer("/flaky", 200);
    let (s, _) = admin(&app, "POST", &format!("/admin/v1/subscriptions/{id}/retry")).await;
    assert_eq!(s, 200);
    sub.wait_deliveries("/flaky", 4).await;
    for _ in 0..100 {
        detail = admin_json(&app, &format!("/admin/v1/subscriptions/{id}")).await;
        if detail["state"] == "active" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(detail["state"], "active", "{detail}");
    assert_eq!(detail["last_success"]["status"], 200);
    assert_eq!(detail["delivered"], 1);
    assert_eq!(detail["pending"], 0);
    let attempts = admin_json(&app, &format!("/admin/v1/deliveries?subscription={id}")).await;
    let outcomes: Vec<&str> = attempts
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        ["delivered", "retry", "retry", "retry"],
        "newest first"
    );
    app.stop().await;
}

/// schemathesis (PyPI, in the tests' Python environment) generates requests from /admin/v1/openapi.json:
/// every check (no 5xx, responses conform, schema-valid requests accepted, invalid ones
/// refused, ...): the document declares every constraint the API enforces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_passes_every_check_against_the_openapi_document() {
    // It sends wrong tokens on purpose (to check they are refused): every one is counted, and
    // the fuzzing would otherwise meet mostly 429s once the address is out of guesses.
    let (app, _d) = admin_app(|c| c.admin.wrong_tokens_per_minute = 1_000_000).await;
    let sub = TestSubscriber::start().await;
    let t = app.config.topic_base() + "/fuzz";
    subscribed(&app, &sub, &t, "/cb", &[("hub.secret", "s")]).await;
    assert_eq!(fat_ping(&app, &t, "<x/>").await.0, 200);
    let url = app.url("/admin/v1/openapi.json");
    let out = tokio::task::spawn_blocking(move || {
        // Its caches (.schemathesis, .hypothesis) go to a scratch folder, not the repository.
        let scratch = tempfile::tempdir().unwrap();
        // What a schema cannot say: whether a PEM parses or a token URL's network is allowed,
        // and a length in bytes (JSON Schema's maxLength counts characters: 199 non-ASCII
        // characters are a schema-valid secret over WebSub's 199 bytes). Schema-valid bodies of
        // PUT …/auth and POST …/secret may be refused (400 with the reason), so for those
        // operations alone 400 counts as an answer to valid data; every other check holds there.
        // (One filter, the operation's name: include filters of one block are OR-ed, so an
        // include-method beside an include-path would select every operation of that method.)
        let accepts_400 = |name: &str| {
            format!(
                "[[operations]]\ninclude-name = \"{name}\"\n\
                 checks.positive_data_acceptance.expected-statuses = \
                 [\"2xx\", 400, 401, 403, 404]\n"
            )
        };
        std::fs::write(
            scratch.path().join("schemathesis.toml"),
            accepts_400("PUT /admin/v1/subscriptions/{id}/auth")
                + &accepts_400("POST /admin/v1/subscriptions/{id}/secret"),
        )
        .unwrap();
        std::process::Command::new(PyEnv::get().python())
            .current_dir(scratch.path())
            .args([
                "-m",
                "schemathesis.cli",
                "run",
                &url,
                "--header",
                &format!("Authorization: Bearer {ADMIN}"),
            ])
            .args(["--checks", "all", "--max-examples", "25", "--no-color"])
            .output()
            .expect("the tests' python runs")
    })
    .await
    .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "schemathesis failed:\n{report}");
    // Every operation of the document was exercised (15 today).
    let total = report
        .split_once(" selected / ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no operation count:\n{report}"));
    assert!(total.parse::<u32>().unwrap() >= 15, "{report}");
    assert!(
        report.contains(&format!("Tested: {total}")),
        "every operation was exercised:\n{report}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_cli_prints_tables_from_a_running_server() {
    let (app, _d) = admin_app(|_| {}).await;
    let sub = TestSubscriber::start().await;
    let t = app.config.topic_base() + "/cli";
    subscribed(&app, &sub, &t, "/cb", &[("hub.secret", "HIDDEN-SECRET")]).await;
    assert_eq!(fat_ping(&app, &t, "<x/>").await.0, 200);
    sub.wait_deliveries("/cb", 1).await;
    let base = format!("http://{}", app.addr);
    let cli = move |args: Vec<String>, token: &'static str| {
        let base = base.clone();
        tokio::task::spawn_blocking(move || {
            let out = std::process::Command::new(ChildServer::BIN)
                .args(["admin", "--url", &base, "--token", token])
                .args(&args)
                .output()
                .unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
    };
    let (ok, list, err) = cli(vec!["subscriptions".into(), "list".into()], ADMIN)
        .await
        .unwrap();
    assert!(ok, "{err}");
    assert!(list.starts_with("ID  STATE"), "{list}");
    assert!(
        list.contains(&sub.url("/cb")) && list.contains("active"),
        "{list}"
    );
    let id = list
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let (ok, show, _) = cli(
        vec!["subscriptions".into(), "show".into(), id.clone()],
        ADMIN,
    )
    .await
    .unwrap();
    assert!(
        ok && show.contains("secret_set") && show.contains("true") && !show.contains("HIDDEN"),
        "{show}"
    );
    let alg_row = |show: &str| {
        show.lines()
            .find(|l| l.starts_with("signature_algorithm"))
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_string()
    };
    assert_eq!(alg_row(&show), "sha256");
    // Without a secret nothing is signed, and show says so instead of naming an algorithm.
    subscribed(&app, &sub, &t, "/plain", &[]).await;
    let (_, list, _) = cli(vec!["subscriptions".into(), "list".into()], ADMIN)
        .await
        .unwrap();
    let plain_id = list
        .lines()
        .find(|l| l.contains("/plain"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let (ok, show, _) = cli(vec!["subscriptions".into(), "show".into(), plain_id], ADMIN)
        .await
        .unwrap();
    assert!(ok && show.contains("secret_set"), "{show}");
    assert_eq!(alg_row(&show), "-", "{show}");
    let (ok, topics, _) = cli(vec!["topics".into()], ADMIN).await.unwrap();
    assert!(ok && topics.contains(&t), "{topics}");
    let (ok, stats, _) = cli(vec!["stats".into()], ADMIN).await.unwrap();
    assert!(ok && stats.contains("subscriptions active"), "{stats}");
    let (ok, _, err) = cli(vec!["stats".into()], "wrong").await.unwrap();
    assert!(!ok && err.contains("the admin token is wrong"), "{err}");
    // Help: every subcommand says what it does.
    let (ok, help, _) = cli(vec!["subscriptions".into(), "--help".into()], ADMIN)
        .await
        .unwrap();
    assert!(ok, "{help}");
    for sub in ["list", "show", "delete"] {
        let line = help
            .lines()
            .find(|l| l.trim_start().starts_with(sub))
            .unwrap_or_else(|| panic!("{help}"));
        assert!(
            line.split_whitespace().count() > 2,
            "{sub} has a description: {help}"
        );
    }
    let (ok, out, err) = cli(
        vec!["subscriptions".into(), "delete".into(), id.clone()],
        ADMIN,
    )
    .await
    .unwrap();
    assert!(ok, "{err}");
    assert!(out.contains("deleted"));
    let (ok, _, err) = cli(vec!["subscriptions".into(), "show".into(), id], ADMIN)
        .await
        .unwrap();
    assert!(!ok && err.contains("404"), "{err}");
    app.stop().await;
}

/// An admin request with a JSON body; returns (status, body text).
async fn admin_post(app: &TestApp, path: &str, body: Value) -> (u16, String) {
    let r = app
        .client
        .post(app.url(path))
        .header("authorization", format!("Bearer {ADMIN}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Redelivery of a window: exactly the messages published in it, next, in order, with the
/// ids they were first sent with; a window before what the hub keeps is refused with 409
/// naming the oldest message kept; the CLI does the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_of_messages_is_delivered_again_in_order_with_the_same_ids() {
    let (app, _d) = admin_app(|c| c.hub.retention_hours = 24).await;
    let sub = TestSubscriber::start().await;
    let t = app.config.topic_base() + "/again";
    subscribed(&app, &sub, &t, "/r", &[]).await;
    subscribed(&app, &sub, &t, "/other", &[]).await;
    let mark = || {
        let t = resourcesync_hub::model::Timestamp::now();
        std::thread::sleep(Duration::from_millis(5));
        t.to_string()
    };
    for n in 0..2 {
        assert_eq!(fat_ping(&app, &t, &format!("<m n=\"{n}\"/>")).await.0, 200);
    }
    let since = mark();
    for n in 2..4 {
        assert_eq!(fat_ping(&app, &t, &format!("<m n=\"{n}\"/>")).await.0, 200);
    }
    let until = mark();
    assert_eq!(fat_ping(&app, &t, "<m n=\"4\"/>").await.0, 200);
    let first = sub.wait_deliveries("/r", 5).await;
    sub.wait_deliveries("/other", 5).await;
    let items = admin_json(&app, "/admin/v1/subscriptions?callback=/r").await;
    let id = items["items"][0]["id"].as_str().unwrap().to_string();
    let path = format!("/admin/v1/subscriptions/{id}/redeliver");

    let (s, body) = admin_post(&app, &path, serde_json::json!({"since": since})).await;
    assert_eq!((s, body.as_str()), (202, "{\"queued\":3}"));
    let got = sub.wait_deliveries("/r", 8).await;
    let again: Vec<(String, String)> = got[5..]
        .iter()
        .map(|d| (d.text(), d.header("webhook-id").unwrap().to_string()))
        .collect();
    let originals: Vec<(String, String)> = first[2..]
        .iter()
        .map(|d| (d.text(), d.header("webhook-id").unwrap().to_string()))
        .collect();
    assert_eq!(again, originals, "messages 2..4 again, in order, same ids");

    let (s, body) = admin_post(
        &app,
        &path,
        serde_json::json!({"since": since, "until": until}),
    )
    .await;
    assert_eq!((s, body.as_str()), (202, "{\"queued\":2}"));
    let got = sub.wait_deliveries("/r", 10).await;
    assert_eq!(
        got[8..].iter().map(|d| d.text()).collect::<Vec<_>>(),
        ["<m n=\"2\"/>", "<m n=\"3\"/>"]
    );
    // Nothing else of its own and nothing to the other subscriber.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sub.deliveries("/r").len(), 10);
    assert_eq!(sub.deliveries("/other").len(), 5);

    // Before retention: 409, naming the oldest message kept.
    let old = resourcesync_hub::model::Timestamp::from_secs(
        resourcesync_hub::model::Timestamp::now().micros() / 1_000_000 - 25 * 3600,
    );
    let (s, body) = admin_post(&app, &path, serde_json::json!({"since": old.to_string()})).await;
    assert_eq!(s, 409, "{body}");
    assert!(
        body.contains("hub.retention_hours")
            && body.contains("oldest message kept for this topic is number 1"),
        "{body}"
    );
    for (bad, why) in [
        (serde_json::json!({"since": "yesterday"}), "since"),
        (
            serde_json::json!({"since": "2026-01-01T00:00:00"}),
            "time zone",
        ),
        (serde_json::json!({"from": since}), "JSON like"),
    ] {
        let (s, body) = admin_post(&app, &path, bad.clone()).await;
        assert_eq!(s, 400, "{bad}: {body}");
        assert!(body.contains(why), "{bad}: {body}");
    }
    // An empty window (until not after since) queues nothing.
    let (s, body) = admin_post(
        &app,
        &path,
        serde_json::json!({"since": until, "until": since}),
    )
    .await;
    assert_eq!((s, body.as_str()), (202, "{\"queued\":0}"));
    let (s, _) = admin_post(
        &app,
        "/admin/v1/subscriptions/42/redeliver",
        serde_json::json!({"since": since}),
    )
    .await;
    assert_eq!(s, 404);

    // The CLI.
    let out = tokio::task::spawn_blocking({
        let base = format!("http://{}", app.addr);
        let id = id.clone();
        let since = since.clone();
        move || {
            std::process::Command::new(ChildServer::BIN)
                .args(["admin", "--url", &base, "--token", ADMIN])
                .args(["subscriptions", "redeliver", &id, "--since", &since])
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("3 messages queued"), "{stdout}");
    sub.wait_deliveries("/r", 13).await;
    app.stop().await;
}
