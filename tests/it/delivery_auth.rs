//! Delivery auth for receivers behind firewalls, against real peers: a Python `ssl` receiver
//! that requires a client certificate (mutual TLS), an OAuth2 token endpoint issuing
//! short-lived tokens, and an HTTP proxy (`hub.egress_proxy`) that must see every request.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use resourcesync_hub::model::websub::{
    Callback, Intent, IntentMode, Resolution, SignatureAlg, Topic,
};
use resourcesync_hub::model::Timestamp;
use resourcesync_hub::store::Store;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::hub::{fat_ping, hub_config, subscribed};
use crate::subscriber::TestSubscriber;
use crate::support::*;

const ADMIN: &str = "admin-token-for-tests";
const TOPIC: &str = "http://example.org/topics/auth";

async fn admin(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    admin_call(app, ADMIN, method, path, body).await
}

/// Records a verified subscription of `callback` to [`TOPIC`] in the store directly (the
/// receivers here cannot answer the hub's first verification: see docs/hub.md).
async fn subscription_in_store(store: &Store, callback: &str) -> i64 {
    let intent = Intent {
        id: 0,
        mode: IntentMode::Subscribe,
        topic: Topic::parse(TOPIC).unwrap(),
        callback: Callback::parse(callback).unwrap(),
        lease_secs: 86_400,
        secret: None,
        alg: SignatureAlg::Sha256,
        reason: None,
        requested_at: Timestamp::now(),
        verify_token: None,
    };
    let mut i = intent.clone();
    i.id = store.hub_add_intent(intent).await.unwrap();
    store
        .hub_resolve(
            i,
            Resolution::Subscribed {
                verified_at: Timestamp::now(),
                keep_old_secret_until: Timestamp::now(),
            },
        )
        .await
        .unwrap()
        .unwrap()
        .id
}

/// The Python receiver requiring a client certificate (`tests/tools/mtls_receiver.py`).
struct MtlsReceiver {
    child: Child,
    /// Where its certificates and keys are written: removed when the test ends.
    _pems: tempfile::TempDir,
    setup: Value,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl MtlsReceiver {
    fn start() -> MtlsReceiver {
        let pems = tempfile::tempdir().unwrap();
        let mut child = Command::new(PyEnv::get().python())
            .arg(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/tools/mtls_receiver.py"),
            )
            .arg(pems.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        let setup: Value = serde_json::from_str(&first)
            .unwrap_or_else(|e| panic!("mtls_receiver.py did not start: {e}: {first:?}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        MtlsReceiver {
            child,
            _pems: pems,
            setup,
            lines,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.setup["port"])
    }

    fn pem(&self, name: &str) -> String {
        std::fs::read_to_string(self.setup[name].as_str().unwrap()).unwrap()
    }

    fn seen(&self) -> Vec<Value> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for MtlsReceiver {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Mutual TLS: a receiver that requires a client certificate gets nothing from the hub without
/// one (the failure says why), gets every delivery once its certificate is set (presented on
/// verifications too), and refuses a certificate from another CA; bad PEM and an http
/// callback are refused with a reason, and no key ever comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_requiring_a_client_certificate_gets_deliveries_only_with_it() {
    let rx = MtlsReceiver::start();
    let (mut c, _d) = hub_config();
    c.admin.token = ADMIN.into();
    c.hub.retry_schedule_secs = vec![1; 30];
    c.hub.retry_jitter = 0.0;
    let store = Store::open_embedded(&c.database_path()).unwrap();
    let good = subscription_in_store(&store, &rx.url("/good")).await;
    let stranger = subscription_in_store(&store, &rx.url("/stranger")).await;
    drop(store);
    let app = TestApp::start_with(c).await;

    assert_eq!(fat_ping(&app, TOPIC, "<m i=\"1\"/>").await.0, 200);
    let detail = |id: i64| {
        let app = &app;
        async move {
            admin(
                app,
                reqwest::Method::GET,
                &format!("/admin/v1/subscriptions/{id}"),
                None,
            )
            .await
            .1
        }
    };
    wait_until("the first attempt without a certificate failed", || async {
        detail(good).await["last_failure"]["error"].is_string()
    })
    .await;
    let error = detail(good).await["last_failure"]["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        error.to_lowercase().contains("certificate"),
        "the failure names the certificate: {error}"
    );
    assert!(
        rx.seen().iter().all(|l| l["method"] != "POST"),
        "nothing delivered without one"
    );

    let mtls = |cert: &str, key: &str| serde_json::json!({"mtls": {"certificate": rx.pem(cert), "key": rx.pem(key), "ca": rx.pem("ca")}});
    let path = |id: i64| format!("/admin/v1/subscriptions/{id}/auth");
    let (s, v) = admin(
        &app,
        reqwest::Method::PUT,
        &path(good),
        Some(mtls("client_cert", "client_key")),
    )
    .await;
    assert_eq!((s, v["auth"]["kind"].as_str()), (200, Some("mtls")), "{v}");
    assert!(
        !v.to_string().contains("BEGIN"),
        "no certificate or key shown back: {v}"
    );
    let (s, _) = admin(
        &app,
        reqwest::Method::PUT,
        &path(stranger),
        Some(mtls("stranger_cert", "stranger_key")),
    )
    .await;
    assert_eq!(s, 200);

    wait_until("the delivery with the certificate", || async {
        rx.seen()
            .iter()
            .any(|l| l["method"] == "POST" && l["path"] == "/good")
    })
    .await;
    let post = rx
        .seen()
        .into_iter()
        .find(|l| l["method"] == "POST")
        .unwrap();
    assert_eq!(post["client"], "hub.example.org", "{post}");
    assert_eq!(post["body"], "<m i=\"1\"/>", "{post}");
    // The stranger's certificate (another CA) is refused at each of its retries (a second
    // apart): handshakes go on being refused, and nothing reaches /stranger.
    let refused = || {
        rx.seen()
            .iter()
            .filter(|l| l["refused"].is_string())
            .count()
    };
    let before = refused();
    wait_until("the stranger's certificate refused twice more", || async {
        refused() >= before + 2
    })
    .await;
    assert!(
        rx.seen().iter().all(|l| l["path"] != "/stranger"),
        "{:?}",
        rx.seen()
    );
    assert!(
        detail(stranger).await["last_failure"]["error"].is_string(),
        "the stranger's failures are recorded"
    );

    // A verification carries the certificate too.
    let (s, v) = admin(
        &app,
        reqwest::Method::POST,
        &format!("/admin/v1/subscriptions/{good}/verify"),
        None,
    )
    .await;
    assert_eq!(s, 202, "{v}");
    wait_until("the verification with the certificate", || async {
        rx.seen()
            .iter()
            .any(|l| l["method"] == "GET" && l["client"] == "hub.example.org")
    })
    .await;

    // Bad input: a reason, nothing stored.
    let (s, v) = admin(
        &app,
        reqwest::Method::PUT,
        &path(good),
        Some(serde_json::json!({"mtls": {"certificate": "not a PEM", "key": "nor this"}})),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("certificate"), "{v}");
    let sub = TestSubscriber::start().await;
    subscribed(&app, &sub, TOPIC, "/plain", &[]).await;
    let plain = admin(
        &app,
        reqwest::Method::GET,
        "/admin/v1/subscriptions?callback=/plain",
        None,
    )
    .await
    .1["items"][0]["id"]
        .as_str()
        .unwrap()
        .parse::<i64>()
        .unwrap();
    let (s, v) = admin(
        &app,
        reqwest::Method::PUT,
        &path(plain),
        Some(mtls("client_cert", "client_key")),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("https"), "{v}");
    let (s, v) = admin(&app, reqwest::Method::DELETE, &path(good), None).await;
    assert_eq!((s, &v["auth"]), (200, &Value::Null), "{v}");
    app.stop().await;
}

/// The tests' OAuth2 token endpoint: client credentials with HTTP Basic auth, tokens
/// `tok-N` valid for `life` seconds.
#[derive(Clone)]
struct TokenEndpoint {
    issued: Arc<AtomicUsize>,
    life: u64,
}

async fn issue(
    State(t): State<TokenEndpoint>,
    headers: HeaderMap,
    body: String,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    use base64::Engine as _;
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("hub-client:hub-secret")
    );
    let form: Vec<(String, String)> = url::form_urlencoded::parse(body.as_bytes())
        .into_owned()
        .collect();
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(basic.as_str())
        || !form.contains(&("grant_type".into(), "client_credentials".into()))
        || !form.contains(&("scope".into(), "deliver".into()))
    {
        return (axum::http::StatusCode::UNAUTHORIZED, "bad client").into_response();
    }
    let n = t.issued.fetch_add(1, Ordering::SeqCst) + 1;
    axum::Json(serde_json::json!({"access_token": format!("tok-{n}"), "token_type": "Bearer", "expires_in": t.life}))
        .into_response()
}

/// OAuth2 client credentials: deliveries carry the bearer token; the token endpoint is asked
/// once per token lifetime, not per delivery; a 401 from the receiver fetches a new one and the
/// delivery goes again at once; a token URL on a refused network is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth2_tokens_are_fetched_once_per_lifetime_and_again_after_a_401() {
    let tokens = TokenEndpoint {
        issued: Arc::new(AtomicUsize::new(0)),
        life: 3,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let token_url = format!("http://{}/token", listener.local_addr().unwrap());
    let router = Router::new()
        .route("/token", post(issue))
        .with_state(tokens.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });

    let (mut c, _d) = hub_config();
    c.admin.token = ADMIN.into();
    let app = TestApp::start_with(c).await;
    let sub = TestSubscriber::start().await;
    subscribed(&app, &sub, TOPIC, "/o", &[]).await;
    let id = admin(
        &app,
        reqwest::Method::GET,
        "/admin/v1/subscriptions?callback=/o",
        None,
    )
    .await
    .1["items"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/admin/v1/subscriptions/{id}/auth");
    let oauth = |url: &str| serde_json::json!({"oauth2": {"token_url": url, "client_id": "hub-client", "client_secret": "hub-secret", "scope": "deliver"}});
    let (s, v) = admin(
        &app,
        reqwest::Method::PUT,
        &path,
        Some(oauth("http://10.1.2.3/token")),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("hub.allow_networks"),
        "{v}"
    );
    // The client secret never goes out in clear but to a network the operator listed.
    let (s, v) = admin(
        &app,
        reqwest::Method::PUT,
        &path,
        Some(oauth("http://tokens.example.org/token")),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("only over https"),
        "{v}"
    );
    let (s, v) = admin(&app, reqwest::Method::PUT, &path, Some(oauth(&token_url))).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["auth"]["kind"], "oauth2");
    assert_eq!(v["auth"]["client_id"], "hub-client");
    assert!(
        !v.to_string().contains("hub-secret"),
        "the secret is never shown: {v}"
    );

    let bearer =
        |d: &crate::subscriber::Delivery| d.header("authorization").unwrap_or("").to_string();
    for i in 0..3 {
        assert_eq!(
            fat_ping(&app, TOPIC, &format!("<m i=\"{i}\"/>")).await.0,
            200
        );
    }
    let got = sub.wait_deliveries("/o", 3).await;
    assert!(
        got.iter().all(|d| bearer(d) == "Bearer tok-1"),
        "{:?}",
        got.iter().map(bearer).collect::<Vec<_>>()
    );
    assert_eq!(
        tokens.issued.load(Ordering::SeqCst),
        1,
        "one token for three deliveries"
    );

    // The receiver says 401 (it revoked tok-1): a new token, the same message again at once.
    sub.script("/o", &[(401, None)]);
    assert_eq!(fat_ping(&app, TOPIC, "<m i=\"3\"/>").await.0, 200);
    let got = sub.wait_deliveries("/o", 5).await;
    assert_eq!(
        (bearer(&got[3]), bearer(&got[4]), got[4].text()),
        (
            "Bearer tok-1".to_string(),
            "Bearer tok-2".to_string(),
            "<m i=\"3\"/>".to_string()
        )
    );
    assert_eq!(tokens.issued.load(Ordering::SeqCst), 2);
    let fetched = std::time::Instant::now();

    // Past its lifetime (3 s, used until 0.3 s before): the next delivery gets a new one.
    wait_until("tok-2 has expired", || async {
        fetched.elapsed() > Duration::from_secs(3)
    })
    .await;
    assert_eq!(fat_ping(&app, TOPIC, "<m i=\"4\"/>").await.0, 200);
    let got = sub.wait_deliveries("/o", 6).await;
    assert_eq!(bearer(&got[5]), "Bearer tok-3");
    assert_eq!(tokens.issued.load(Ordering::SeqCst), 3, "once per lifetime");
    app.stop().await;
}

/// A forwarding HTTP proxy for the tests (absolute-form requests and CONNECT), counting the
/// requests it relays by their target.
struct Proxy {
    addr: String,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    async fn start() -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, log.clone()));
            }
        });
        Proxy { addr, seen }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// Relays one client connection: each request's line is logged; the upstream is the host of
/// the first request's absolute URL (or CONNECT's target).
async fn relay(mut client: tokio::net::TcpStream, log: Arc<Mutex<Vec<String>>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let line = head.lines().next().unwrap_or("").to_string();
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let upstream_addr = if method == "CONNECT" {
        target.to_string()
    } else {
        let u = url::Url::parse(target).unwrap();
        format!(
            "{}:{}",
            u.host_str().unwrap(),
            u.port_or_known_default().unwrap()
        )
    };
    let Ok(mut upstream) = tokio::net::TcpStream::connect(&upstream_addr).await else {
        return;
    };
    if method == "CONNECT" {
        log.lock().unwrap().push(line);
        let _ = client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await;
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        return;
    }
    // Absolute-form: forward the bytes as they come, logging every request line.
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = upstream.into_split();
    let back = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut ur, &mut cw).await;
    });
    let mut pending = buf;
    loop {
        let text = String::from_utf8_lossy(&pending).to_string();
        for l in text.split("\r\n") {
            if ["GET http", "POST http", "HEAD http"]
                .iter()
                .any(|m| l.starts_with(m))
            {
                log.lock().unwrap().push(l.to_string());
            }
        }
        if uw.write_all(&pending).await.is_err() {
            break;
        }
        match cr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => pending = chunk[..n].to_vec(),
        }
    }
    back.abort();
}

/// `hub.egress_proxy`: the verification and every delivery go through the proxy; a callback on
/// a refused network is still refused (the proxy never hears of it); the configuration refuses
/// a proxy that is not a URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_goes_through_the_egress_proxy_and_the_policy_still_holds() {
    let proxy = Proxy::start().await;
    let (mut c, _d) = hub_config();
    c.hub.egress_proxy = format!("http://{}", proxy.addr);
    c.hub.allow_networks = vec!["127.0.0.1/32".parse().unwrap()];
    let app = TestApp::start_with(c.clone()).await;
    let sub = TestSubscriber::start().await;
    subscribed(&app, &sub, TOPIC, "/p", &[]).await;
    for i in 0..5 {
        assert_eq!(
            fat_ping(&app, TOPIC, &format!("<m i=\"{i}\"/>")).await.0,
            200
        );
    }
    sub.wait_deliveries("/p", 5).await;
    let seen = proxy.seen();
    let cb = sub.url("/p");
    assert_eq!(
        seen.iter()
            .filter(|l| l.starts_with(&format!("POST {cb}")))
            .count(),
        5,
        "every delivery went through the proxy: {seen:?}"
    );
    assert!(
        seen.iter().any(|l| l.starts_with(&format!("GET {cb}?"))),
        "the verification too: {seen:?}"
    );

    // 127.0.0.2 is loopback outside the allowed 127.0.0.1/32: refused before any request.
    let forbidden = format!(
        "http://127.0.0.2:{}/x",
        sub.addr.rsplit(':').next().unwrap()
    );
    let r = app
        .client
        .post(app.url("/hub"))
        .form(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", TOPIC),
            ("hub.callback", forbidden.as_str()),
        ])
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    assert!((400..500).contains(&status), "{status} {text}");
    assert!(text.contains("hub.allow_networks"), "{text}");
    assert!(
        proxy.seen().iter().all(|l| !l.contains("127.0.0.2")),
        "{:?}",
        proxy.seen()
    );
    app.stop().await;

    c.hub.egress_proxy = "proxy.example.org:3128".into();
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("hub.egress_proxy"), "{err}");
}

/// A hostile token endpoint costs a delivery attempt, not the hub: an answer larger than
/// 64 KiB, one that never comes (cut at `hub.request_timeout_secs`) and one that is not a
/// token each fail the attempt with the reason in the subscription's last failure, and
/// nothing reaches the receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_token_endpoint_fails_the_attempt_with_its_reason() {
    let router = Router::new()
        .route("/huge", post(|| async { "x".repeat(1 << 20) }))
        .route(
            "/hang",
            post(|| async {
                std::future::pending::<()>().await;
                ""
            }),
        )
        .route("/html", post(|| async { "<html>sign in</html>" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });

    let (mut c, _d) = hub_config();
    c.admin.token = ADMIN.into();
    c.hub.request_timeout_secs = 1;
    c.hub.retry_schedule_secs = vec![60];
    let app = TestApp::start_with(c).await;
    let sub = TestSubscriber::start().await;
    for (path, why) in [
        ("/huge", "more than 65536 bytes"),
        ("/hang", "timed out"),
        ("/html", "no token"),
    ] {
        subscribed(&app, &sub, TOPIC, path, &[]).await;
        let id = admin(
            &app,
            reqwest::Method::GET,
            &format!("/admin/v1/subscriptions?callback={path}"),
            None,
        )
        .await
        .1["items"][0]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let auth = serde_json::json!({"oauth2": {"token_url": format!("{base}{path}"),
            "client_id": "c", "client_secret": "s"}});
        let (s, v) = admin(
            &app,
            reqwest::Method::PUT,
            &format!("/admin/v1/subscriptions/{id}/auth"),
            Some(auth),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(fat_ping(&app, TOPIC, "<m/>").await.0, 200);
        wait_until(&format!("the attempt through {path} failed"), || async {
            admin(
                &app,
                reqwest::Method::GET,
                &format!("/admin/v1/subscriptions/{id}"),
                None,
            )
            .await
            .1["last_failure"]["error"]
                .is_string()
        })
        .await;
        let detail = admin(
            &app,
            reqwest::Method::GET,
            &format!("/admin/v1/subscriptions/{id}"),
            None,
        )
        .await
        .1;
        let error = detail["last_failure"]["error"].as_str().unwrap();
        assert!(
            error.contains(why) && error.contains("OAuth2 token URL"),
            "{path}: {error}"
        );
        assert!(sub.deliveries(path).is_empty(), "{path}: nothing delivered");
    }
    app.stop().await;
}

/// A token endpoint naming the largest lifetime there is (`expires_in` =
/// 18446744073709551615) gets its token used, not a lane that dies: the deliveries arrive,
/// and the hub asks for a token again within a day.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_for_ever_is_used_and_the_lane_lives() {
    let router = Router::new().route(
        "/forever",
        post(|| async {
            (
                [("content-type", "application/json")],
                r#"{"access_token": "forever", "token_type": "Bearer", "expires_in": 18446744073709551615}"#,
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let (mut c, _d) = hub_config();
    c.admin.token = ADMIN.into();
    let app = TestApp::start_with(c).await;
    let sub = TestSubscriber::start().await;
    subscribed(&app, &sub, TOPIC, "/f", &[]).await;
    let id = admin(
        &app,
        reqwest::Method::GET,
        "/admin/v1/subscriptions?callback=/f",
        None,
    )
    .await
    .1["items"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let auth = serde_json::json!({"oauth2": {"token_url": format!("{base}/forever"),
        "client_id": "c", "client_secret": "s"}});
    let (s, v) = admin(
        &app,
        reqwest::Method::PUT,
        &format!("/admin/v1/subscriptions/{id}/auth"),
        Some(auth),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    for i in 0..3 {
        assert_eq!(
            fat_ping(&app, TOPIC, &format!("<m i=\"{i}\"/>")).await.0,
            200
        );
    }
    let got = sub.wait_deliveries("/f", 3).await;
    assert!(
        got.iter()
            .all(|d| d.header("authorization") == Some("Bearer forever")),
        "{:?}",
        got.iter()
            .map(|d| d.header("authorization"))
            .collect::<Vec<_>>()
    );
    app.stop().await;
}
