//! The console in a real browser: Debian's Chromium driven headless by Selenium
//! (`tests/tools/console_browser.py`), as an admin finding a failing subscriber would use it.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::hub::{fat_ping, hub_config, subscribed};
use crate::subscriber::TestSubscriber;
use crate::support::*;

const TOKEN: &str = "console-admin-token";

/// Chromium and its driver, as `.ci/run` installs them; their absence fails the test, saying
/// how to install them (it never passes without a browser).
pub fn browser_present() {
    let missing: Vec<&str> = [
        "/usr/bin/chromium",
        "/usr/bin/chromedriver",
        "/usr/bin/firefox-esr",
    ]
    .into_iter()
    .filter(|p| !std::path::Path::new(p).exists())
    .collect();
    assert!(
        missing.is_empty(),
        "the console tests drive real browsers and {missing:?} is missing: install Debian's \
         chromium, chromium-driver and firefox-esr (apt-get install chromium chromium-driver \
         firefox-esr; .ci/run does)"
    );
}

/// Where screenshots of every view go: `target/console-screenshots/`.
fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target/tmp has a parent")
        .join("console-screenshots")
}

/// Runs `tests/tools/console_browser.py` with `args` (and the screenshots' folder), answering
/// each word it prints with `act(word)` and a line on its stdin; returns its findings.
async fn browse(args: &[&str], mut act: impl FnMut(&str)) -> serde_json::Value {
    let shots = screenshots();
    // Chromium and its driver put their profile and singleton socket under TMPDIR, and leave
    // the socket's folder behind: a folder of the test's own, removed when it ends.
    let tmp = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(PyEnv::get().python())
        .env("TMPDIR", tmp.path())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/tools/console_browser.py"
        ))
        .args(args)
        .arg(&shots)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the test environment's Python");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in stdout.lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut findings = None;
    while let Some(line) = tokio::time::timeout(Duration::from_secs(180), rx.recv())
        .await
        .expect("the browser script went silent for 3 minutes")
    {
        if line.starts_with('{') {
            findings = Some(line);
        } else {
            act(&line);
            writeln!(stdin, "done").unwrap();
            stdin.flush().unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the browser script failed (screenshots in {}):\n{}",
        shots.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let f: serde_json::Value =
        serde_json::from_str(&findings.expect("the script's findings")).unwrap();
    assert_eq!(
        f["console_errors"],
        serde_json::json!([]),
        "the browser's console log has errors: {f}"
    );
    for (name, p) in f["pages"].as_object().unwrap() {
        let bytes = p["bytes"].as_u64().unwrap();
        assert!(bytes <= 200_000, "{name} weighs {bytes} bytes: {p}");
        assert!(shots.join(format!("{name}.png")).exists(), "{name}");
    }
    f
}

/// A hub with its console on (the admin token [`TOKEN`]), `healthy` subscribers (`/ok<i>`) and
/// one answering 500 (`/bad`) on one topic, `messages` published: every healthy one has them,
/// the failing one was tried `tries` times (`retry`: its schedule). Returns the hub, the
/// subscriber, the failing subscription's id and the data folder.
async fn one_failing_among(
    healthy: usize,
    messages: usize,
    retry: Vec<u64>,
    tries: usize,
) -> (TestApp, TestSubscriber, String, tempfile::TempDir) {
    let (mut c, dir) = hub_config();
    c.admin.token = TOKEN.into();
    c.hub.retry_schedule_secs = retry;
    let app = TestApp::start_with(c).await;
    let sub = TestSubscriber::start().await;
    let topic = format!("{}/console", app.config.topic_base());
    for i in 0..healthy {
        subscribed(&app, &sub, &topic, &format!("/ok{i}"), &[]).await;
    }
    sub.answer("/bad", 500);
    subscribed(&app, &sub, &topic, "/bad", &[]).await;
    for n in 0..messages {
        let (status, text) = fat_ping(&app, &topic, &format!("message {n}")).await;
        assert!(status < 300, "{text}");
    }
    sub.wait_until("every healthy subscriber has the messages", |s| {
        (0..healthy).all(|i| s.deliveries(&format!("/ok{i}")).len() >= messages)
    })
    .await;
    sub.wait_until("the failing subscriber was tried", |s| {
        s.deliveries("/bad").len() >= tries
    })
    .await;
    let (status, page) = admin_call(
        &app,
        TOKEN,
        reqwest::Method::GET,
        "/admin/v1/subscriptions?state=failing",
        None,
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let failing = page["items"][0]["id"].as_str().unwrap().to_string();
    (app, sub, failing, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_reaches_a_failing_subscriber_and_redelivers_from_the_browser() {
    browser_present();
    // A failing subscriber is retried twice a second apart, so the page has attempts to
    // show, then not for an hour: what reaches it after the fix is the console's redelivery.
    let (app, sub, failing, _dir) = one_failing_among(20, 3, vec![1, 1, 3600], 1).await;

    let mut fixed_at = None;
    let f = browse(&["hub", &app.url(""), TOKEN, &failing], |word| {
        assert_eq!(word, "FIX");
        // The admin has seen the 500s: the receiver is mended.
        sub.answer("/bad", 200);
        fixed_at = Some(tokio::time::Instant::now());
    })
    .await;
    let text = |k: &str| f[k].as_str().unwrap_or_default().to_string();

    assert!(text("wrong_token").contains("not the admin token"), "{f}");
    assert_eq!(f["cookie"]["httpOnly"], true, "{f}");
    assert_eq!(f["cookie"]["sameSite"], "Strict", "{f}");
    assert_eq!(f["cookie"]["path"], "/console", "{f}");
    assert_eq!(f["post_without_csrf"][0], 403, "{f}");
    assert!(
        f["post_without_csrf"][1]
            .as_str()
            .unwrap()
            .contains("CSRF token"),
        "{f}"
    );
    assert_eq!(text("first_tab"), "Skip to content", "{f}");
    // One click from the overview to the page holding the redeliver form, then two to send
    // it (submit, confirm): three in all.
    assert_eq!(f["clicks_to_redeliver_form"], 1, "{f}");
    assert!(text("attempts_text").contains("500"), "{f}");
    assert!(
        text("attempts_text").contains("HTTP 500") || text("attempts_text").contains("retry"),
        "{f}"
    );
    assert_eq!(
        f["failing_listed"],
        serde_json::json!([format!("#{failing}")]),
        "{f}"
    );
    assert_eq!(
        text("listed_first"),
        format!("#{failing}"),
        "failing first: {f}"
    );
    assert!(
        text("bad_filter").contains("not a subscription state"),
        "{f}"
    );
    assert!(text("confirm_text").contains("Deliver again to"), "{f}");
    assert_eq!(
        text("done"),
        "0 message(s) already sent queued again; 3 pending sent now.",
        "{f}"
    );
    assert_eq!(text("state_after"), "active", "{f}");
    assert!(text("attempts_after").contains("delivered"), "{f}");
    assert!(text("after_logout").ends_with("/console/login"), "{f}");
    // At the callback: each of the 3 messages answered 200 after the fix. The page may show
    // the first delivery while the others are still on their way (a loaded runner): wait for
    // them, then check that nothing else came.
    let fixed_at = fixed_at.expect("the script asked for the fix");
    let after_fix = |s: &TestSubscriber| -> std::collections::BTreeSet<String> {
        s.deliveries("/bad")
            .into_iter()
            .filter(|d| d.at >= fixed_at)
            .map(|d| d.text())
            .collect()
    };
    let want: std::collections::BTreeSet<String> = (0..3).map(|n| format!("message {n}")).collect();
    sub.wait_until("the mended subscriber to get every message", |s| {
        after_fix(s).len() >= want.len()
    })
    .await;
    assert_eq!(
        after_fix(&sub),
        want,
        "the mended subscriber got every message"
    );
    app.stop().await;
}

/// Without a session, nothing of the console is shown or done; with one, a form without its
/// CSRF token and bad input get readable refusals, never a 500.
#[tokio::test]
async fn the_console_refuses_without_a_session_or_its_csrf_token() {
    let (mut c, _dir) = hub_config();
    c.admin.token = TOKEN.into();
    let app = TestApp::start_with(c).await;
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for path in ["/console/", "/console/subscriptions", "/console/sets"] {
        let r = client.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 303, "{path}");
        assert_eq!(r.headers()["location"], "/console/login");
        let csp = r.headers()["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"));
    }
    let r = client
        .post(app.url("/console/subscriptions/1/delete"))
        .form(&[("confirm", "yes")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // A token in the URL is not a way in.
    let r = client
        .get(app.url(&format!("/console/?token={TOKEN}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);

    let r = client
        .post(app.url("/console/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    let session = cookie.split(';').next().unwrap().to_string();
    let get = |path: &str| {
        client
            .get(app.url(path))
            .header("cookie", session.clone())
            .send()
    };
    for (path, status, says) in [
        (
            "/console/subscriptions?state=nonsense",
            400,
            "not a subscription state",
        ),
        ("/console/subscriptions?after=-3", 400, "not a position"),
        ("/console/subscriptions?topic=ftp://x", 400, "topic filter"),
        ("/console/subscriptions/abc", 404, "not a subscription id"),
        ("/console/subscriptions/99999", 404, "no subscription 99999"),
        ("/console/static/nothing.js", 404, "no console file"),
    ] {
        let r = get(path).await.unwrap();
        assert_eq!(r.status(), status, "{path}");
        assert_eq!(
            r.headers()["content-type"],
            "text/html; charset=utf-8",
            "{path}: a refusal is a page"
        );
        let body = r.text().await.unwrap();
        assert!(body.contains(says), "{path}: {body}");
    }
    let r = client
        .post(app.url("/console/subscriptions/1/retry"))
        .header("cookie", session.clone())
        .form(&[("confirm", "yes"), ("csrf", "forged")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("CSRF token"));
    // A tampered cookie is no session.
    let tampered = format!("{session}x");
    let r = client
        .get(app.url("/console/"))
        .header("cookie", tampered)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    app.stop().await;
}

/// The harvester's console over 40 sources: one down says why, a running baseline's bar
/// moves, and an audit run from a source's page reports it in sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harvesters_console_shows_forty_sources_and_audits_one() {
    use crate::aggregate::{source, static_source};
    use crate::hostile::{described, entry, rl_md, urlset, Hostile};
    use std::sync::atomic::{AtomicUsize, Ordering};
    browser_present();
    let dir = tempfile::tempdir().unwrap();
    let mut statics = Vec::new();
    for i in 0..38 {
        statics.push(static_source(&format!("s{i}"), 3).await.0);
    }
    // The slow source: 100 resources, each served once the test lets that many through.
    let slow = Hostile::start().await;
    let allowed = Arc::new(AtomicUsize::new(20));
    let mut entries = Vec::new();
    for i in 0..100 {
        let body = format!("slow resource {i}\n");
        let (gate, b) = (allowed.clone(), body.clone());
        slow.on(&format!("/r/{i}"), move |_| {
            use axum::response::IntoResponse;
            let (gate, b) = (gate.clone(), b.clone());
            let s = futures_util::stream::once(async move {
                while gate.load(Ordering::SeqCst) <= i {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok::<_, std::io::Error>(axum::body::Bytes::from(b))
            });
            (
                [("content-type", "text/plain")],
                axum::body::Body::from_stream(s),
            )
                .into_response()
        });
        entries.push(entry(&slow.url(&format!("/r/{i}")), &described(&body)));
    }
    slow.xml("/rl.xml", urlset(&rl_md(), &entries));
    slow.source(&[slow.set("s", &[("resourcelist", slow.url("/rl.xml"))], false)]);

    let mut cfg = crate::harvest::harvest_config(dir.path(), "");
    cfg.sources = statics
        .iter()
        .enumerate()
        .map(|(i, s)| source(&format!("static{i}"), s.url("/.well-known/resourcesync")))
        .collect();
    cfg.sources
        .push(source("slow", slow.url("/.well-known/resourcesync")));
    let closed = format!(
        "http://127.0.0.1:{}/.well-known/resourcesync",
        crate::harvest::free_port()
    );
    cfg.sources.push(source("down", closed));
    cfg.fetch.per_host_concurrency = 4;
    let h = crate::harvest::TestHarvester::start(cfg).await;
    crate::harvest::wait_state(&h, "the static sources baselined", 120, |s| {
        let sets = s.sets().unwrap();
        (0..38).all(|i| {
            sets.iter()
                .any(|r| r.source == format!("static{i}") && r.baseline_done)
        })
    })
    .await;

    let base = format!("http://{}", h.addr);
    let f = browse(
        &["harvest", &base, "slow", "down", "static7"],
        |word| match word {
            "MORE" => allowed.store(50, Ordering::SeqCst),
            "REST" => allowed.store(1_000, Ordering::SeqCst),
            other => panic!("unexpected word {other}"),
        },
    )
    .await;
    assert_eq!(f["rows"], 40, "{f}");
    // Forty sources of weight 1: each has 2.5% of the walks; the limit of open files is shown.
    assert!(f["down_row"].as_str().unwrap().contains("2.5%"), "{f}");
    assert!(
        f["open_files"]
            .as_str()
            .unwrap()
            .starts_with("open files: limit "),
        "{f}"
    );
    assert!(
        f["down_row"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("connection refused"),
        "{f}"
    );
    let (first, then) = (
        f["progress_first"].as_u64().unwrap(),
        f["progress_then"].as_u64().unwrap(),
    );
    // Entries settle as fetched or, when a gated one outwaits the fetch timeout on a loaded
    // machine, as failed: either way the bar is short of the end at first, then moves.
    assert!((1..100).contains(&first) && then > first, "{f}");
    assert_eq!(f["progress_max"], "100", "{f}");
    assert!(f["audit"].as_str().unwrap().starts_with("IN SYNC"), "{f}");
    // The source's sets as a table: its set, its baseline done.
    let sets = f["status_text"].as_str().unwrap();
    assert!(
        sets.contains("capabilitylist") && sets.contains("done"),
        "{f}"
    );
    h.stop().await;
}

/// With `console.token_env`, the harvester's console asks for the token; forms without their
/// CSRF token and unknown sources get readable refusals.
#[tokio::test]
async fn the_harvesters_console_with_a_token_asks_for_it() {
    const VAR: &str = "HARVEST_CONSOLE_TEST_TOKEN";
    const SECRET: &str = "a-console-token-of-some-length";
    // A variable no other test reads (and no RSHUB_ one: child servers inherit the
    // environment, and their configuration refuses RSHUB_ variables it does not know).
    std::env::set_var(VAR, SECRET);
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = crate::aggregate::static_source("t", 2).await;
    let mut cfg = crate::harvest::harvest_config(dir.path(), &src.url("/.well-known/resourcesync"));
    cfg.console.token_env = VAR.into();
    let h = crate::harvest::TestHarvester::start(cfg).await;
    let base = format!("http://{}", h.addr);
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = client.get(format!("{base}/console/")).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/console/login");
    let r = client
        .post(format!("{base}/console/login"))
        .form(&[("token", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("not the console"));
    let r = client
        .post(format!("{base}/console/login"))
        .form(&[("token", SECRET)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"].to_str().unwrap();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    let session = cookie.split(';').next().unwrap().to_string();
    let get = |path: &str| {
        client
            .get(format!("{base}{path}"))
            .header("cookie", session.clone())
            .send()
    };
    let r = get("/console/").await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("frame-ancestors 'none'"));
    let r = get("/console/sources/nope").await.unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("no source named"));
    let r = client
        .post(format!("{base}/console/sources/-/audit"))
        .header("cookie", session.clone())
        .form(&[("csrf", "forged")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("CSRF token"));
    h.stop().await;
}

/// The same console in Firefox (Debian's ESR, over WebDriver BiDi): every view renders without
/// an error in its console, the redeliver form and its confirmation work, and the script keeps
/// the page current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_console_works_in_firefox() {
    browser_present();
    let (app, sub, failing, _dir) = one_failing_among(1, 2, vec![1, 3600], 2).await;
    sub.answer("/bad", 200);
    let shots = screenshots();
    let args: Vec<std::ffi::OsString> = vec![
        app.url("").into(),
        TOKEN.into(),
        failing.clone().into(),
        shots.clone().into(),
    ];
    let f = tokio::task::spawn_blocking(move || {
        let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        NodeEnv::get().tool_json("console_firefox.mjs", &refs)
    })
    .await
    .unwrap();
    assert_eq!(f["overview_title"], "Overview", "{f}");
    assert!(
        f["confirm"].as_str().unwrap().contains("Deliver again"),
        "{f}"
    );
    assert!(
        f["done"].as_str().unwrap().contains("pending sent now"),
        "{f}"
    );
    assert!(f["live_update"].as_u64().unwrap() >= 1, "{f}");
    assert_eq!(f["first_tab"], "Skip to content", "{f}");
    assert_eq!(f["errors"], serde_json::json!([]), "Firefox's console: {f}");
    for (name, p) in f["pages"].as_object().unwrap() {
        assert!(p["bytes"].as_u64().unwrap() <= 200_000, "{name}: {p}");
        assert!(shots.join(format!("{name}.png")).exists(), "{name}");
    }
    app.stop().await;
}

/// Without a token the harvester's console answers only requests addressed to an IP or
/// localhost: a page whose host name an attacker points at 127.0.0.1 gets nothing.
#[tokio::test]
async fn the_harvesters_console_without_a_token_refuses_other_host_names() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = crate::aggregate::static_source("r", 1).await;
    let cfg = crate::harvest::harvest_config(dir.path(), &src.url("/.well-known/resourcesync"));
    let h = crate::harvest::TestHarvester::start(cfg).await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://{}/console/", h.addr);
    let r = client
        .get(&url)
        .header("host", format!("rebound.example.org:{}", h.addr.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 421);
    assert!(r.text().await.unwrap().contains("console.token_env"));
    let r = client.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .contains("SameSite=Strict"));
    h.stop().await;
}

/// A hub with its console on and two collectors: `papers`, of a repository of `records`
/// records, and `closed`, whose repository answers 403. The repositories and the data folder
/// live as long as what is returned.
async fn collecting_hub(
    records: usize,
) -> (TestApp, [crate::collect::OaiServer; 2], tempfile::TempDir) {
    use crate::collect::{fixture, with_faults, OaiServer};
    let open = OaiServer::start(&fixture(records), 5);
    let closed = OaiServer::start(
        &with_faults(fixture(2), serde_json::json!({"refuse": 403})),
        5,
    );
    let (mut c, dir) = hub_config();
    c.admin.token = TOKEN.into();
    for (name, base) in [("papers", &open.base), ("closed", &closed.base)] {
        let mut cc = resourcesync_hub::config::CollectConfig::new(base);
        cc.retry_base_ms = 20;
        cc.attempts = 2;
        c.collect.insert(name.into(), cc);
    }
    (TestApp::start_with(c).await, [open, closed], dir)
}

/// Every link of every page of both consoles answers 2xx in Chromium, with no error in the
/// browser's console: the server's (signed in; subscriptions active and failing, a collector
/// idle and one stopped by its repository's 403, sets and their documents) and the
/// harvester's (its single `[source]` following the server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_link_of_both_consoles_answers() {
    browser_present();
    let (app, _repos, _dir) = collecting_hub(12).await;
    let sub = TestSubscriber::start().await;
    let topic = format!("{}/console", app.config.topic_base());
    subscribed(&app, &sub, &topic, "/ok", &[]).await;
    sub.answer("/bad", 500);
    subscribed(&app, &sub, &topic, "/bad", &[]).await;
    let (status, text) = fat_ping(&app, &topic, "a message").await;
    assert!(status < 300, "{text}");
    sub.wait_until("the failing subscriber was tried", |s| {
        !s.deliveries("/bad").is_empty()
    })
    .await;
    wait_until("both collectors ran", || async {
        let mut ended = 0;
        for name in ["papers", "closed"] {
            let (_, v) = admin_call(
                &app,
                TOKEN,
                reqwest::Method::GET,
                &format!("/admin/v1/collect/{name}"),
                None,
            )
            .await;
            ended += usize::from(v["last_ended"].is_string() && v["state"] != "running");
        }
        ended == 2
    })
    .await;

    let hdir = tempfile::tempdir().unwrap();
    let hc = crate::harvest::harvest_config(hdir.path(), &app.url("/.well-known/resourcesync"));
    let h = crate::harvest::TestHarvester::start(hc).await;
    crate::harvest::wait_state(&h, "the harvester's baselines", 60, |s| {
        let sets = s.sets().unwrap();
        !sets.is_empty() && sets.iter().all(|r| r.baseline_done)
    })
    .await;

    for (base, token) in [(app.url(""), TOKEN), (format!("http://{}", h.addr), "-")] {
        let f = browse(&["crawl", &base, token], |_| {}).await;
        assert_eq!(f["bad"], serde_json::json!([]), "{base}: {f}");
        assert!(f["visited"].as_u64().unwrap() >= 2, "{base}: {f}");
    }
    h.stop().await;
    app.stop().await;
}

/// A collector stopped by its repository's 403 is shown stopped, with the reason, on the
/// overview and its page; "Resume" asks to confirm, refuses a forged CSRF token, and once
/// confirmed reaches the collector (it runs again: here the repository still refuses, so it
/// stops again, saying so); "Run now" on an idle one runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_collector_is_resumed_and_an_idle_one_run_from_the_console() {
    let (app, _repos, _dir) = collecting_hub(3).await;
    let status = |name: &'static str| {
        let app = &app;
        async move {
            admin_call(
                app,
                TOKEN,
                reqwest::Method::GET,
                &format!("/admin/v1/collect/{name}"),
                None,
            )
            .await
            .1
        }
    };
    wait_until("closed stopped, papers idle", || async {
        status("closed").await["state"] == "stopped" && status("papers").await["state"] == "idle"
    })
    .await;
    let (client, session) = console_session(&app.url("/console/login"), TOKEN).await;
    let page = |path: &str| {
        let (client, session, url) = (client.clone(), session.clone(), app.url(path));
        async move {
            let r = client
                .get(url)
                .header("cookie", session)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.text().await.unwrap()
        }
    };
    let overview = page("/console/").await;
    assert!(
        overview.contains("Collectors needing a look")
            && overview.contains("/console/collectors/closed"),
        "{overview}"
    );
    let closed_page = page("/console/collectors/closed").await;
    assert!(
        closed_page.contains("stopped: 403 Forbidden"),
        "{closed_page}"
    );
    let csrf = closed_page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_string();
    let post = |path: &str, form: Vec<(&'static str, String)>| {
        let (client, session, url) = (client.clone(), session.clone(), app.url(path));
        async move {
            client
                .post(url)
                .header("cookie", session)
                .form(&form)
                .send()
                .await
                .unwrap()
        }
    };
    let forged = post(
        "/console/collectors/closed/resume",
        vec![("csrf", "forged".into()), ("confirm", "yes".into())],
    )
    .await;
    assert_eq!(forged.status(), 403);
    let asked = post(
        "/console/collectors/closed/resume",
        vec![("csrf", csrf.clone())],
    )
    .await;
    assert_eq!(asked.status(), 200);
    assert!(asked
        .text()
        .await
        .unwrap()
        .contains("Resume collector closed?"));
    assert_eq!(
        status("closed").await["control"]["resumes"],
        0,
        "nothing before the confirmation"
    );
    let started = status("closed").await["last_started"].clone();
    let done = post(
        "/console/collectors/closed/resume",
        vec![("csrf", csrf.clone()), ("confirm", "yes".into())],
    )
    .await;
    assert_eq!(done.status(), 303);
    assert_eq!(
        done.headers()["location"],
        "/console/collectors/closed?done=resume"
    );
    assert_eq!(status("closed").await["control"]["resumes"], 1);
    wait_until("the resumed collector ran and stopped again", || async {
        let v = status("closed").await;
        v["state"] == "stopped" && v["last_started"] != started
    })
    .await;

    let before = status("papers").await["last_ended"].clone();
    let done = post(
        "/console/collectors/papers/run",
        vec![("csrf", csrf), ("confirm", "yes".into())],
    )
    .await;
    assert_eq!(done.status(), 303);
    wait_until("papers ran again", || async {
        let v = status("papers").await;
        v["last_ended"] != before && v["state"] == "idle"
    })
    .await;
    app.stop().await;
}
