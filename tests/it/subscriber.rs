//! `TestSubscriber`: a real callback server in the test process. It answers verification
//! GETs (echoing the challenge, or as told), records every delivery POST with its headers and
//! arrival time (tokio time, so paused-time tests read virtual time), answers deliveries with
//! a scripted list of statuses, and can serve a topic for thin pings.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    Echo,
    WrongChallenge,
    NotFound,
}

#[derive(Debug, Clone)]
pub struct Delivery {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
}

impl Delivery {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[derive(Default)]
struct Inner {
    verify: HashMap<String, Verify>,
    /// Per path: statuses (and Retry-After) to answer deliveries with, then 200.
    script: HashMap<String, VecDeque<(u16, Option<String>)>>,
    /// Per path: the status after the script runs out (default 200).
    then: HashMap<String, u16>,
    delay: Duration,
    verifications: Vec<(String, HashMap<String, String>)>,
    deliveries: Vec<Delivery>,
    topic: Option<(String, Bytes)>,
}

#[derive(Clone)]
pub struct TestSubscriber {
    pub addr: String,
    inner: Arc<Mutex<Inner>>,
}

impl TestSubscriber {
    pub async fn start() -> TestSubscriber {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new()
            .route("/{*path}", get(on_get).post(on_post))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await });
        TestSubscriber { addr, inner }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn set_verify(&self, path: &str, v: Verify) {
        self.inner.lock().unwrap().verify.insert(path.into(), v);
    }

    /// Deliveries to `path` are answered with these statuses (and Retry-After values) in turn.
    pub fn script(&self, path: &str, statuses: &[(u16, Option<&str>)]) {
        self.inner.lock().unwrap().script.insert(
            path.into(),
            statuses
                .iter()
                .map(|(s, r)| (*s, r.map(str::to_string)))
                .collect(),
        );
    }

    /// Deliveries to `path` are answered with `status` once any script has run out.
    pub fn answer(&self, path: &str, status: u16) {
        self.inner.lock().unwrap().then.insert(path.into(), status);
    }

    pub fn set_delay(&self, d: Duration) {
        self.inner.lock().unwrap().delay = d;
    }

    /// Serves `GET /topic` with this Content-Type and body (for thin pings).
    pub fn serve_topic(&self, content_type: &str, body: &str) {
        self.inner.lock().unwrap().topic =
            Some((content_type.into(), Bytes::from(body.to_string())));
    }

    pub fn verifications(&self, path: &str) -> Vec<HashMap<String, String>> {
        self.inner
            .lock()
            .unwrap()
            .verifications
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, q)| q.clone())
            .collect()
    }

    pub fn deliveries(&self, path: &str) -> Vec<Delivery> {
        self.inner
            .lock()
            .unwrap()
            .deliveries
            .iter()
            .filter(|d| d.path == path)
            .cloned()
            .collect()
    }

    pub fn all_deliveries(&self) -> Vec<Delivery> {
        self.inner.lock().unwrap().deliveries.clone()
    }

    /// Waits until `cond` holds, polling every 10 ms of tokio time (which paused-time tests
    /// advance), for at most 60 s of real time (a bound for a slow or loaded machine).
    pub async fn wait_until(&self, what: &str, cond: impl Fn(&TestSubscriber) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if cond(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting for {what}");
    }

    pub async fn wait_verifications(&self, path: &str, n: usize) -> Vec<HashMap<String, String>> {
        self.wait_until(&format!("{n} verification(s) of {path}"), |s| {
            s.verifications(path).len() >= n
        })
        .await;
        self.verifications(path)
    }

    pub async fn wait_deliveries(&self, path: &str, n: usize) -> Vec<Delivery> {
        self.wait_until(&format!("{n} deliveries to {path}"), |s| {
            s.deliveries(path).len() >= n
        })
        .await;
        self.deliveries(path)
    }
}

async fn on_get(
    State(inner): State<Arc<Mutex<Inner>>>,
    uri: Uri,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let path = uri.path().to_string();
    let mut st = inner.lock().unwrap();
    if path == "/topic" {
        return match &st.topic {
            Some((ct, body)) => ([("content-type", ct.clone())], body.clone()).into_response(),
            None => StatusCode::NOT_FOUND.into_response(),
        };
    }
    st.verifications.push((path.clone(), q.clone()));
    let challenge = q.get("hub.challenge").cloned().unwrap_or_default();
    match st.verify.get(&path).copied().unwrap_or(Verify::Echo) {
        Verify::Echo => (StatusCode::OK, challenge).into_response(),
        Verify::WrongChallenge => (StatusCode::OK, format!("{challenge}x")).into_response(),
        Verify::NotFound => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn on_post(
    State(inner): State<Arc<Mutex<Inner>>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let delay = inner.lock().unwrap().delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut st = inner.lock().unwrap();
    st.deliveries.push(Delivery {
        path: path.clone(),
        headers,
        body,
        at: Instant::now(),
    });
    let scripted = st.script.get_mut(&path).and_then(|q| q.pop_front());
    let (status, retry_after) =
        scripted.unwrap_or((st.then.get(&path).copied().unwrap_or(200), None));
    let mut resp = StatusCode::from_u16(status).unwrap().into_response();
    if let Some(ra) = retry_after {
        resp.headers_mut()
            .insert("retry-after", ra.parse().unwrap());
    }
    resp
}

/// The number K of a `<n i="K"/>` body (the crash and shard tests' notifications).
pub fn number(d: &Delivery) -> usize {
    d.text()
        .trim_start_matches("<n i=\"")
        .trim_end_matches("\"/>")
        .parse()
        .unwrap()
}

/// Per callback path, the numbers of the `<n i="K"/>` bodies received, in arrival order.
pub fn numbered(sub: &TestSubscriber) -> HashMap<String, Vec<usize>> {
    let mut m: HashMap<String, Vec<usize>> = HashMap::new();
    for d in sub.all_deliveries() {
        m.entry(d.path.clone()).or_default().push(number(&d));
    }
    m
}

/// The numbers in the order each was first received (repeats left out).
pub fn first_seen(got: &[usize]) -> Vec<usize> {
    let mut out = Vec::new();
    for n in got {
        if !out.contains(n) {
            out.push(*n);
        }
    }
    out
}
