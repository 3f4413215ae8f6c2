//! Hostile peers against the server's trust boundary, as an attacker would try it: bytes a
//! repository or a publisher sends must never run in an admin's browser as this origin.

use crate::collect::{identify_xml, ADMIN};
use crate::hostile::Hostile;
use crate::hub::{hub_config, subscribed, TOKEN as PUBLISHER};
use crate::subscriber::TestSubscriber;
use crate::support::*;

/// The page an attacker hopes an admin opens: its script, run as the server's origin, would
/// read the console's CSRF token and delete every subscription with the admin's session.
const ATTACK: &str = r#"<html xmlns="http://www.w3.org/1999/xhtml"><head><title>a record</title></head><body><p>Metadata</p><script>//<![CDATA[
window.__ran = true; document.title = "RAN";
fetch("/console/subscriptions").then(function (r) { return r.text(); }).then(function (t) {
  var ids = t.match(/\/console\/subscriptions\/[0-9]+/g) || [];
  var csrf = (t.match(/name="csrf" value="([^"]+)"/) || [])[1];
  ids.forEach(function (id) {
    fetch(id + "/delete", {method: "POST", headers: {"content-type": "application/x-www-form-urlencoded"}, body: "csrf=" + csrf + "&confirm=yes"});
  });
});
//]]></script></body></html>"#;

/// A server (admin token [`ADMIN`]) collecting `repo`'s `/oai` into the set `papers`, one
/// attempt a request.
async fn collecting(repo: &Hostile) -> (TestApp, tempfile::TempDir) {
    let (mut c, dir) = test_config();
    c.admin.token = ADMIN.into();
    let mut cc = resourcesync_hub::config::CollectConfig::new(&repo.url("/oai"));
    cc.kind = Some(resourcesync_hub::config::CollectKind::OaiPmh);
    cc.retry_base_ms = 20;
    cc.attempts = 1;
    c.collect.insert("papers".into(), cc);
    (TestApp::start_with(c).await, dir)
}

/// The collector `papers` as the admin API shows it.
async fn collector(app: &TestApp) -> serde_json::Value {
    admin_call(
        app,
        ADMIN,
        reqwest::Method::GET,
        "/admin/v1/collect/papers",
        None,
    )
    .await
    .1
}

/// The first `<loc>` of a document that ends with `suffix`.
fn loc_ending(doc: &str, suffix: &str) -> String {
    doc.split("<loc>")
        .skip(1)
        .filter_map(|l| l.split("</loc>").next())
        .find(|l| l.ends_with(suffix))
        .unwrap_or_else(|| panic!("a <loc> ending in {suffix} in {doc}"))
        .to_string()
}

/// A signed-in admin opens a collected record that is an XHTML page with a script, the same
/// page as a topic's HTML payload, and a dump package holding the record: every such answer
/// is sandboxed and unsniffed, no script runs (in Chromium), and the console is as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outsiders_bytes_never_run_as_the_consoles_origin() {
    crate::console::browser_present();
    let repo = Hostile::start().await;
    repo.xml("/oai?verb=Identify", identify_xml());
    repo.xml(
        "/oai?verb=ListRecords&metadataPrefix=oai_dc",
        format!(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/"><responseDate>2026-11-26T10:00:00Z</responseDate><request verb="ListRecords">http://x/oai</request><ListRecords><record><header><identifier>oai:evil:1</identifier><datestamp>2026-11-01T00:00:00Z</datestamp></header><metadata>{ATTACK}</metadata></record></ListRecords></OAI-PMH>"#
        ),
    );
    let (mut c, _dir) = hub_config();
    c.admin.token = ADMIN.into();
    c.dumps.enabled = true;
    c.dumps.check_interval_secs = 1;
    let mut cc = resourcesync_hub::config::CollectConfig::new(&repo.url("/oai"));
    cc.kind = Some(resourcesync_hub::config::CollectKind::OaiPmh);
    cc.retry_base_ms = 20;
    cc.attempts = 1;
    c.collect.insert("papers".into(), cc);
    let app = TestApp::start_with(c).await;
    let sub = TestSubscriber::start().await;
    let topic = format!("{}/news", app.config.topic_base());
    subscribed(&app, &sub, &topic, "/cb", &[]).await;
    // The same page as a publisher's payload, kept as the topic's latest.
    let r = app
        .client
        .post(app.url("/hub"))
        .header("content-type", "text/html")
        .header("authorization", format!("Bearer {PUBLISHER}"))
        .header(
            "link",
            format!(
                "<{topic}>; rel=\"self\", <{}>; rel=\"hub\"",
                app.config.hub_url()
            ),
        )
        .body(ATTACK)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());

    // The record, once collected, and the Resource Dump's package holding it.
    let raw = reqwest::Client::builder().no_proxy().build().unwrap();
    let get = |path: String| {
        let raw = raw.clone();
        let url = app.url(&path);
        async move { raw.get(url).send().await.unwrap() }
    };
    wait_until("the record collected", || async {
        let r = get("/sets/papers/resourcelist.xml".into()).await;
        r.status() == 200 && r.text().await.unwrap().contains("<loc>")
    })
    .await;
    let record = loc_ending(
        &get("/sets/papers/resourcelist.xml".into())
            .await
            .text()
            .await
            .unwrap(),
        ".xml",
    );
    wait_until("the Resource Dump", || async {
        get("/sets/papers/resourcedump.xml".into()).await.status() == 200
    })
    .await;
    let package = loc_ending(
        &get("/sets/papers/resourcedump.xml".into())
            .await
            .text()
            .await
            .unwrap(),
        ".zip",
    );
    let opened = [record, topic.clone(), package];

    // Every one of them, and the documents and answers around them, is inert.
    for url in opened.iter().cloned().chain(
        [
            "/",
            "/sets/papers/resourcelist.xml",
            "/oai?verb=ListRecords&metadataPrefix=oai_dc",
            "/no/such/page",
        ]
        .map(|p| app.url(p)),
    ) {
        let r = raw.get(&url).send().await.unwrap();
        let h = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
        assert!(
            h("content-security-policy")
                .is_some_and(|c| c.starts_with("sandbox") && c.contains("default-src 'none'"))
                && h("x-content-type-options").as_deref() == Some("nosniff"),
            "{url} ({}) is not inert: {:?}",
            r.status(),
            r.headers()
        );
    }
    // The console keeps its own policy (its script runs; nothing else does).
    let r = raw.get(app.url("/console/login")).send().await.unwrap();
    let csp = r.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");

    let out = tokio::task::spawn_blocking({
        let (base, urls) = (app.url(""), opened.to_vec());
        move || {
            std::process::Command::new(PyEnv::get().python())
                .arg(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/tools/inert_browser.py"
                ))
                .arg(base.trim_end_matches('/'))
                .arg(ADMIN)
                .args(urls)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "the browser script failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for o in f["opened"].as_array().unwrap() {
        assert!(
            o["ran"] == false && o["title"] != "RAN",
            "a script ran as the server's origin: {o}"
        );
    }
    assert!(
        f["console_after"].as_str().unwrap().contains("/cb"),
        "the console lost its subscription: {f}"
    );
    let (s, v) = admin_call(
        &app,
        ADMIN,
        reqwest::Method::GET,
        "/admin/v1/subscriptions",
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["items"].as_array().map(Vec::len), Some(1), "{v}");
}

/// Every secret the server is given (the admin, ingest and publisher tokens, the operator
/// webhook's secret, a subscriber's `hub.secret` and its rotation, an OAuth2 client secret, a
/// client key, a wrong guess at the admin token) is used and never written: not in the log
/// (the server's own modules at TRACE), not in an error, not in the admin API or the console.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_log_an_error_or_an_answer() {
    const SECRETS: &[(&str, &str)] = &[
        ("admin", "adm-7f3a-secret-token"),
        ("ingest", "ing-91c2-secret-token"),
        ("publisher", "pub-4d8e-secret-token"),
        ("operator", "ops-55b1-secret-value"),
        ("hub.secret", "sub-0a7c-secret-value"),
        ("rotated", "rot-3e9f-secret-value"),
        ("oauth2", "oau-8b2d-client-secret"),
        ("key", "MIIEkeyb64secretmaterial"),
        ("guess", "adm-7f3a-secret-tokeX"),
    ];
    let secret = |name: &str| SECRETS.iter().find(|(n, _)| *n == name).unwrap().1;
    let tokens = axum::Router::new().route(
        "/token",
        axum::routing::post(|| async { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "no") }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let token_url = format!("http://{}/token", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, tokens).await });
    let sub = TestSubscriber::start().await;

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("server.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\ndata_dir = {:?}\n[admin]\ntoken = {:?}\n[ingest]\ntoken = {:?}\n[hub]\npublisher_token = {:?}\noperator_webhook = {:?}\noperator_webhook_secret = {:?}\nallow_networks = [\"127.0.0.0/8\"]\nretry_schedule_secs = [1]\n",
            dir.path().join("data"),
            secret("admin"),
            secret("ingest"),
            secret("publisher"),
            sub.url("/ops"),
            secret("operator"),
        ),
    )
    .unwrap();
    let server = ChildServer::serve(
        &["--config", cfg.to_str().unwrap()],
        &[("RUST_LOG", "resourcesync_hub=trace,info")],
    );
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = |p: &str| server.url(p);
    let topic = url("/topics/secrets");
    let mut answers = String::new();
    // A subscription with a secret.
    let r = client
        .post(url("/hub"))
        .form(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", topic.as_str()),
            ("hub.callback", sub.url("/cb").as_str()),
            ("hub.secret", secret("hub.secret")),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
    let admin =
        |method: reqwest::Method, path: &str, token: &str, body: Option<serde_json::Value>| {
            let mut rb = client
                .request(method, url(path))
                .bearer_auth(token.to_string());
            if let Some(b) = body {
                rb = rb.json(&b);
            }
            async move {
                let r = rb.send().await.unwrap();
                (r.status().as_u16(), r.text().await.unwrap())
            }
        };
    let listed = || async {
        let (_, t) = admin(
            reqwest::Method::GET,
            "/admin/v1/subscriptions",
            secret("admin"),
            None,
        )
        .await;
        serde_json::from_str::<serde_json::Value>(&t).unwrap()["items"][0].clone()
    };
    wait_until("the subscription verified", || async {
        listed().await["state"] == "active"
    })
    .await;
    let id = listed().await["id"].as_str().unwrap().to_string();
    // A rotation, an OAuth2 client whose token endpoint fails, a client key refused.
    for (method, path, body) in [
        (
            reqwest::Method::POST,
            format!("/admin/v1/subscriptions/{id}/secret"),
            serde_json::json!({"secret": secret("rotated")}),
        ),
        (
            reqwest::Method::PUT,
            format!("/admin/v1/subscriptions/{id}/auth"),
            serde_json::json!({"mtls": {"certificate": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----", "key": format!("-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----", secret("key"))}}),
        ),
        (
            reqwest::Method::PUT,
            format!("/admin/v1/subscriptions/{id}/auth"),
            serde_json::json!({"oauth2": {"token_url": token_url, "client_id": "c", "client_secret": secret("oauth2")}}),
        ),
    ] {
        let (s, t) = admin(method, &path, secret("admin"), Some(body)).await;
        assert!(s == 200 || s == 400, "{path}: {s} {t}");
        answers.push_str(&t);
    }
    // A delivery: it fails at the token endpoint, with its reason recorded.
    let r = client
        .post(url("/hub"))
        .header("content-type", "application/xml")
        .bearer_auth(secret("publisher"))
        .header(
            "link",
            format!("<{topic}>; rel=\"self\", <{}>; rel=\"hub\"", url("/hub")),
        )
        .body("<m/>")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    wait_until("the attempt failed at the token endpoint", || async {
        let (_, t) = admin(
            reqwest::Method::GET,
            &format!("/admin/v1/subscriptions/{id}"),
            secret("admin"),
            None,
        )
        .await;
        t.contains("OAuth2 token URL")
    })
    .await;
    // Wrong guesses (the API and the console's sign-in), a right sign-in, a console page.
    let (s, t) = admin(
        reqwest::Method::GET,
        "/admin/v1/stats",
        secret("guess"),
        None,
    )
    .await;
    assert_eq!(s, 403, "{t}");
    answers.push_str(&t);
    let browser = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut cookie = String::new();
    for token in [secret("guess"), secret("admin")] {
        let r = browser
            .post(url("/console/login"))
            .form(&[("token", token)])
            .send()
            .await
            .unwrap();
        if let Some(c) = r.headers().get("set-cookie") {
            cookie = c.to_str().unwrap().split(';').next().unwrap().to_string();
        }
        answers.push_str(&r.text().await.unwrap());
    }
    assert!(!cookie.is_empty(), "signed in");
    let page = browser
        .get(url(&format!("/console/subscriptions/{id}")))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    answers.push_str(&page.text().await.unwrap());
    // An ingest with its token (and one with a wrong one).
    for token in [secret("ingest"), secret("guess")] {
        let r = client
            .post(url("/api/v1/resource-sets/s/changes"))
            .bearer_auth(token)
            .body(r#"{"change": "created", "uri": "http://x/a", "md5": "0cc175b9c0f1b6a831c399e269772661", "length": 1}"#)
            .send()
            .await
            .unwrap();
        answers.push_str(&r.text().await.unwrap());
    }
    let (_, t) = admin(
        reqwest::Method::GET,
        &format!("/admin/v1/subscriptions/{id}"),
        secret("admin"),
        None,
    )
    .await;
    answers.push_str(&t);
    let log = server.log.clone();
    server.signal("TERM");
    let log = log.lock().unwrap().clone();
    assert!(
        log.contains("subscription settings changed"),
        "the log is collected:\n{log}"
    );
    for (name, s) in SECRETS {
        assert!(!log.contains(s), "the {name} secret is in the log:\n{log}");
        assert!(
            !answers.contains(s),
            "the {name} secret is in an answer:\n{answers}"
        );
    }
}

/// Admin access resists guessing and ends when asked: signing out ends the session for good
/// (its cookie replayed opens nothing); wrong tokens are refused with 429 and `Retry-After`
/// past 10 a minute from one address, on the console's sign-in and the admin API alike, and
/// then even the right token waits (a guess that happens to be right gains nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_out_ends_the_session_and_guessing_is_throttled() {
    let (mut c, _dir) = test_config();
    c.admin.token = ADMIN.into();
    let app = TestApp::start_with(c).await;
    let browser = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let sign_in = |token: &'static str| {
        let r = browser
            .post(app.url("/console/login"))
            .form(&[("token", token)])
            .send();
        async move { r.await.unwrap() }
    };
    let cookie = console_cookie(&app, ADMIN).await;
    let open = |cookie: String| {
        let r = browser
            .get(app.url("/console/"))
            .header("cookie", cookie)
            .send();
        async move { r.await.unwrap() }
    };
    let page = open(cookie.clone()).await;
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_else(|| panic!("a CSRF token on the overview: {page}"))
        .to_string();
    let r = browser
        .post(app.url("/console/logout"))
        .header("cookie", cookie.clone())
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    // The copy of the cookie an attacker kept opens nothing (the store keeps the list).
    let replayed = open(cookie.clone()).await;
    assert_eq!(
        replayed.status(),
        303,
        "a signed-out session still opens the console"
    );
    assert!(replayed.headers()["location"]
        .to_str()
        .unwrap()
        .contains("/console/login"));

    // Guessing: ten wrong tokens are told so; then the address waits, whatever it sends.
    for i in 0..10 {
        let r = sign_in("wrong-guess-00000").await;
        assert_eq!(r.status(), 403, "guess {i}");
    }
    let r = sign_in("wrong-guess-00000").await;
    assert_eq!(r.status(), 429);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    assert!(r.text().await.unwrap().contains("Too many wrong tokens"));
    assert_eq!(
        sign_in(ADMIN).await.status(),
        429,
        "the right token waits too"
    );
    // The admin API shares the count (one address, one budget).
    let (s, v) = admin_call(&app, ADMIN, reqwest::Method::GET, "/admin/v1/stats", None).await;
    assert_eq!(s, 429, "{v}");
    app.stop().await;

    // A fresh server: the admin API counts wrong bearer tokens the same way.
    let (mut c, _dir) = test_config();
    c.admin.token = ADMIN.into();
    let app = TestApp::start_with(c).await;
    for i in 0..10 {
        let (s, v) = admin_call(
            &app,
            "wrong-guess-00000",
            reqwest::Method::GET,
            "/admin/v1/stats",
            None,
        )
        .await;
        assert_eq!(s, 403, "guess {i}: {v}");
    }
    let (s, v) = admin_call(
        &app,
        "wrong-guess-00000",
        reqwest::Method::GET,
        "/admin/v1/stats",
        None,
    )
    .await;
    assert_eq!(s, 429, "{v}");
    let (s, _) = admin_call(&app, ADMIN, reqwest::Method::GET, "/admin/v1/stats", None).await;
    assert_eq!(s, 429);
    app.stop().await;
}

/// A repository whose page holds nine records that are not namespace-well-formed XML (each
/// of a kind a scan for tags misses) and one that is not UTF-8, among good ones: only those
/// ten are quarantined, each with its reason; the good ones are collected in the same run;
/// and every `/oai` answer over the set is XML that validates against OAI-PMH.xsd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_record_costs_that_record_and_never_an_oai_page() {
    let bad = [
        r#"<a k="&undefined;"/>"#,
        r#"<a k="a & b"/>"#,
        r#"<a k="a<b"/>"#,
        r#"<a k="1" k="2"/>"#,
        r#"<p:a/>"#,
        r#"<1t/>"#,
        r#"<a><!-- a -- b --></a>"#,
        r#"<a><?xml version="1.0"?></a>"#,
        r#"<a xmlns:p=""/>"#,
    ];
    let rec = |id: &str, meta: &str| {
        format!("<record><header><identifier>{id}</identifier><datestamp>2026-11-01T00:00:00Z</datestamp></header><metadata>{meta}</metadata></record>")
    };
    let dc = |t: &str| {
        format!(
            r#"<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>{t}</dc:title></oai_dc:dc>"#
        )
    };
    let mut page = br#"<?xml version="1.0" encoding="UTF-8"?>
<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/"><responseDate>2026-11-26T10:00:00Z</responseDate><request verb="ListRecords">http://x/oai</request><ListRecords>"#.to_vec();
    for i in 0..3 {
        page.extend(rec(&format!("oai:r:good{i}"), &dc(&format!("good {i}"))).as_bytes());
    }
    for (i, m) in bad.iter().enumerate() {
        page.extend(rec(&format!("oai:r:bad{i}"), m).as_bytes());
    }
    let latin1 = rec("oai:r:latin1", &dc("caf\u{0}"));
    page.extend(
        latin1
            .replace('\u{0}', "\u{FF}")
            .as_bytes()
            .iter()
            .filter(|&&b| b != 0xC3),
    );
    page.extend(rec("oai:r:good3", &dc("good 3")).as_bytes());
    page.extend(b"</ListRecords></OAI-PMH>");
    let repo = Hostile::start().await;
    repo.xml("/oai?verb=Identify", identify_xml());
    repo.on("/oai?verb=ListRecords&metadataPrefix=oai_dc", move |_| {
        use axum::response::IntoResponse;
        ([("content-type", "text/xml")], page.clone()).into_response()
    });
    let (app, _dir) = collecting(&repo).await;
    let status = || collector(&app);
    wait_until("the run ended", || async {
        status().await["last_ended"].is_string()
    })
    .await;
    let v = status().await;
    assert_eq!(v["totals"]["created"], 4, "{v:#}");
    assert_eq!(v["totals"]["quarantined"], 10, "{v:#}");
    let reasons = v["quarantine"].to_string();
    assert!(
        reasons.contains("not UTF-8") && reasons.contains("not well-formed"),
        "{reasons}"
    );
    // Every answer over the set is XML and valid (the validator walks every list and error).
    let (base, xsd) = (
        app.url("/oai"),
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schemas/OAI-PMH.xsd"),
    );
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(PyEnv::get().python())
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/tools/oai_validate.py"
            ))
            .arg(base)
            .arg(xsd)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(f["invalid"], serde_json::json!([]), "{f}");
    assert_eq!(f["records"], 4, "{f}");
    app.stop().await;
}

/// Nothing a repository sends grows the server without bound (the real binary, three
/// hostile repositories): a fresh 60 KB resumption token on every page with the same records,
/// a page of 1,000 records with 50 KB identifiers that are all quarantined, and a 3 MB token,
/// each collected by a server of its own. Each run ends with its reason in words; peak memory
/// stays under 100 MB, the log under 1 MB, the admin API's answer under 1 MB, and every
/// outsider's text in them is cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_repositories_grow_nothing_without_bound() {
    use axum::response::IntoResponse;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let head = r#"<?xml version="1.0" encoding="UTF-8"?>
<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/"><responseDate>2026-11-26T10:00:00Z</responseDate><request verb="ListRecords">http://x/oai</request><ListRecords>"#;
    let rec = |id: &str, meta: &str| {
        format!("<record><header><identifier>{id}</identifier><datestamp>2026-11-01T00:00:00Z</datestamp></header><metadata>{meta}</metadata></record>")
    };
    let dc = r#"<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>t</dc:title></oai_dc:dc>"#;
    let src = Hostile::start().await;
    for name in ["fresh", "longids", "bigtoken"] {
        src.xml(&format!("/{name}/oai?verb=Identify"), identify_xml());
    }
    // The same two records on every page, under a fresh 60 KB token each time.
    let n = std::sync::Arc::new(AtomicUsize::new(0));
    let fresh = move |_: &axum::http::HeaderMap| {
        let k = n.fetch_add(1, Ordering::SeqCst);
        let token = format!("{k:08}{}", "t".repeat(60_000));
        let body = format!(
            "{head}{}{}<resumptionToken>{token}</resumptionToken></ListRecords></OAI-PMH>",
            rec("oai:f:1", dc),
            rec("oai:f:2", dc)
        );
        ([("content-type", "text/xml")], body).into_response()
    };
    src.on("/fresh/oai?verb=ListRecords*", fresh);
    // 1,000 records whose 50 KB identifiers hold a character XML cannot carry.
    let long: String = (0..1000)
        .map(|k| rec(&format!("oai:{k:04}:{}\u{1}", "i".repeat(50_000)), dc))
        .collect();
    src.xml(
        "/longids/oai?verb=ListRecords&metadataPrefix=oai_dc",
        format!("{head}{long}</ListRecords></OAI-PMH>"),
    );
    src.xml(
        "/bigtoken/oai?verb=ListRecords&metadataPrefix=oai_dc",
        format!(
            "{head}{}<resumptionToken>{}</resumptionToken></ListRecords></OAI-PMH>",
            rec("oai:b:1", dc),
            "x".repeat(3 << 20)
        ),
    );
    // Each scenario in a server of its own: its peak memory is that scenario's.
    for (name, ended) in [
        ("fresh", "the run ends here"),
        ("longids", "1000 quarantined"),
        ("bigtoken", "resumption token of 3145728 bytes"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let toml = format!(
            "[server]\ndata_dir = {:?}\n[admin]\ntoken = \"{ADMIN}\"\n\
             [collect.{name}]\nurl = \"{}\"\nretry_base_ms = 20\nattempts = 1\nmax_response_bytes = 67108864\n",
            dir.path().join("data"),
            src.url(&format!("/{name}/oai"))
        );
        let cfg = dir.path().join("rshub.toml");
        std::fs::write(&cfg, toml).unwrap();
        let server = ChildServer::serve(&["--config", cfg.to_str().unwrap()], &[]);
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let get = |path: String| {
            let r = client.get(server.url(&path)).bearer_auth(ADMIN).send();
            async move { r.await.unwrap().text().await.unwrap() }
        };
        let detail = format!("/admin/v1/collect/{name}");
        wait_until(&format!("{name}: the run to end"), || async {
            serde_json::from_str::<serde_json::Value>(&get(detail.clone()).await).unwrap()
                ["last_ended"]
                .is_string()
        })
        .await;
        let answers = get("/admin/v1/collect".into()).await + &get(detail.clone()).await;
        assert!(
            answers.len() < 1 << 20,
            "{name}: the admin API answered {} bytes",
            answers.len()
        );
        let v: serde_json::Value = serde_json::from_str(&get(detail.clone()).await).unwrap();
        let outcome = v["last_outcome"].to_string() + &v["last_error"].to_string();
        assert!(outcome.contains(ended), "{name}: {outcome}");
        let peak = (crate::support::proc_mb(server.child.id(), "VmHWM") * 1024.0) as u64;
        eprintln!("{name}: peak memory {peak} kB");
        let log = server.log();
        assert!(log.len() < 1 << 20, "{name}: {} bytes of log", log.len());
        assert!(
            !log.contains(&"i".repeat(1000)),
            "{name}: an identifier is logged whole"
        );
        assert!(peak < 100 * 1024, "{name}: peak memory {peak} kB");
    }
    assert!(
        src.hits("/fresh/oai?verb=ListRecords&metadataPrefix=oai_dc") == 1,
        "the fresh tokens were not followed for ever"
    );
}

/// A repository answering 503 with a long `Retry-After` is waited out, and the collector says
/// so, with until when, in the admin API, the CLI and the console (it said `running`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_retry_after_shows_as_waiting_until_when() {
    use axum::response::IntoResponse;
    let repo = Hostile::start().await;
    repo.on("/oai?verb=Identify", |_| {
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", "3600")],
            "busy",
        )
            .into_response()
    });
    let (app, _dir) = collecting(&repo).await;
    let status = || collector(&app);
    wait_until("the collector waits", || async {
        status().await["state"] == "waiting"
    })
    .await;
    let v = status().await;
    let until = v["waiting_until"].as_str().unwrap().to_string();
    let t = resourcesync_hub::model::Timestamp::parse(&until).expect("an RFC 3339 time");
    let ahead = t.micros() - resourcesync_hub::model::Timestamp::now().micros();
    assert!((3_500_000_000..=3_600_000_000).contains(&ahead), "{v:#}");
    // The CLI says the same.
    let base = app.url("");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(ChildServer::BIN)
            .args([
                "admin",
                "--url",
                base.trim_end_matches('/'),
                "--token",
                ADMIN,
                "collect",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("waiting until {until}")), "{text}");
    // And the console.
    let cookie = console_cookie(&app, ADMIN).await;
    let page = app
        .client
        .get(app.url("/console/sets"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(&format!("waiting until {until}")), "{page}");
    app.stop().await;
}
