//! The harvester against sources it does not control: a small misbehaving source (127.0.0.1,
//! port 0) that names other hosts, serves too much, too slowly or forever, collides names
//! and lies in its dumps, with a second "canary" port that counts every connection made to
//! it. Each case asserts what a user would notice: nothing reached the canary, memory, disk
//! and log stayed small, the rest of the source was harvested, the refusal is in `harvest
//! status`, and the position was not held.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use resourcesync_hub::destination::{
    self,
    config::HarvestConfig,
    state::{State, SubState},
};
use resourcesync_hub::model::websub::{signature, SignatureAlg};

use crate::harvest::{free_port, harvest_config, wait_state, ChildHarvester, TestHarvester};
use crate::support::*;

type Handler = Arc<dyn Fn(&HeaderMap) -> Response + Send + Sync>;

/// The misbehaving source: a table of paths (with query) to handlers, a count of requests per
/// path, and a hub endpoint (`POST /hub`) that records subscription requests and answers 202.
pub struct Hostile {
    pub base: String,
    routes: Arc<Mutex<HashMap<String, Handler>>>,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    subscriptions: Arc<Mutex<Vec<HashMap<String, String>>>>,
}

impl Hostile {
    pub async fn start() -> Hostile {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let routes: Arc<Mutex<HashMap<String, Handler>>> = Default::default();
        let hits: Arc<Mutex<HashMap<String, usize>>> = Default::default();
        let subscriptions: Arc<Mutex<Vec<HashMap<String, String>>>> = Default::default();
        let (r, h, s) = (routes.clone(), hits.clone(), subscriptions.clone());
        let app = axum::Router::new().fallback(
            move |method: axum::http::Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let (r, h, s) = (r.clone(), h.clone(), s.clone());
                async move {
                    let key = uri
                        .path_and_query()
                        .map_or("/".into(), |p| p.as_str().to_string());
                    *h.lock().unwrap().entry(key.clone()).or_default() += 1;
                    if method == axum::http::Method::POST && key == "/hub" {
                        let form: HashMap<String, String> =
                            url::form_urlencoded::parse(&body).into_owned().collect();
                        s.lock().unwrap().push(form);
                        return StatusCode::ACCEPTED.into_response();
                    }
                    // An exact route, else one registered as a prefix (ending in `*`).
                    let handler = {
                        let routes = r.lock().unwrap();
                        routes.get(&key).cloned().or_else(|| {
                            routes
                                .iter()
                                .filter_map(|(k, f)| {
                                    let p = k.strip_suffix('*')?;
                                    key.starts_with(p).then_some((p.len(), f))
                                })
                                .max_by_key(|(n, _)| *n)
                                .map(|(_, f)| f.clone())
                        })
                    };
                    match handler {
                        Some(f) => f(&headers),
                        None => StatusCode::NOT_FOUND.into_response(),
                    }
                }
            },
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Hostile {
            base,
            routes,
            hits,
            subscriptions,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn on(&self, path: &str, f: impl Fn(&HeaderMap) -> Response + Send + Sync + 'static) {
        self.routes
            .lock()
            .unwrap()
            .insert(path.to_string(), Arc::new(f));
    }

    pub fn xml(&self, path: &str, body: String) {
        self.on(path, move |_| {
            ([("content-type", "application/xml")], body.clone()).into_response()
        });
    }

    /// A resource served as it is; returns its Resource List entry (md5 and length).
    pub fn resource(&self, path: &str, body: &str) -> String {
        let b = body.to_string();
        self.on(path, move |_| {
            ([("content-type", "text/plain")], b.clone()).into_response()
        });
        entry(&self.url(path), &described(body))
    }

    pub fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    /// The subscription requests the hub got so far.
    pub fn subscriptions(&self) -> Vec<HashMap<String, String>> {
        self.subscriptions.lock().unwrap().clone()
    }

    /// A Source Description listing these Capability Lists, at `/.well-known/resourcesync`.
    pub fn source(&self, capability_lists: &[String]) {
        let entries: Vec<String> = capability_lists
            .iter()
            .map(|c| entry(c, r#"capability="capabilitylist""#))
            .collect();
        self.xml(
            "/.well-known/resourcesync",
            urlset(r#"capability="description""#, &entries),
        );
    }

    /// A Capability List at `/<set>/capabilitylist.xml` with these `(capability, loc)`, and a
    /// change-notification topic served by `/hub` when `hub` is set; returns its URL.
    pub fn set(&self, name: &str, docs: &[(&str, String)], hub: bool) -> String {
        let mut entries: Vec<String> = docs
            .iter()
            .map(|(c, loc)| entry(loc, &format!(r#"capability="{c}""#)))
            .collect();
        if hub {
            entries.push(format!(
                r#"<url><loc>{}</loc><rs:ln rel="hub" href="{}"/><rs:md capability="change-notification"/></url>"#,
                self.url(&format!("/{name}/notifications")),
                self.url("/hub")
            ));
        }
        let path = format!("/{name}/capabilitylist.xml");
        self.xml(&path, urlset(r#"capability="capabilitylist""#, &entries));
        self.url(&path)
    }
}

/// A port that counts every connection made to it (and closes it at once).
pub struct Canary {
    pub port: u16,
    count: Arc<AtomicUsize>,
}

impl Canary {
    pub async fn start() -> Canary {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                drop(s);
            }
        });
        Canary { port, count }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn connections(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

pub fn entry(loc: &str, md: &str) -> String {
    format!("<url><loc>{loc}</loc><rs:md {md}/></url>")
}

/// `hash` and `length` of a body, as `rs:md` attributes.
pub fn described(body: &str) -> String {
    format!(
        r#"hash="md5:{}" length="{}""#,
        md5_hex(body.as_bytes()),
        body.len()
    )
}

pub fn urlset(md: &str, entries: &[String]) -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md {md}/>{}</urlset>"#,
        entries.join("")
    )
}

pub fn sitemapindex(md: &str, locs: &[String]) -> String {
    let entries: String = locs
        .iter()
        .map(|l| format!("<sitemap><loc>{l}</loc></sitemap>"))
        .collect();
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md {md}/>{entries}</sitemapindex>"#
    )
}

const AT: &str = r#"at="2026-01-01T00:00:00Z""#;

/// A Change List (open, from the lists' `at`) of these entries.
pub fn changelist(entries: &[String]) -> String {
    urlset(
        r#"capability="changelist" from="2026-01-01T00:00:00Z""#,
        entries,
    )
}

/// A change entry of `loc` at `datetime`, describing `body` when given.
pub fn change(loc: &str, kind: &str, datetime: &str, body: Option<&str>) -> String {
    let md = body.map(described).unwrap_or_default();
    entry(
        loc,
        &format!(r#"change="{kind}" datetime="{datetime}" {md}"#),
    )
}

pub fn rl_md() -> String {
    format!(r#"capability="resourcelist" {AT}"#)
}

/// A body that never ends: 1 MB at once, then silence (a harvester reading past the length
/// it was given would leave a file of 1 MB lying for its idle timeout).
pub fn endless() -> Response {
    use futures_util::StreamExt;
    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
    let s =
        futures_util::stream::iter((0..16).map(move |_| Ok::<_, std::io::Error>(chunk.clone())))
            .chain(futures_util::stream::pending());
    Body::from_stream(s).into_response()
}

/// `body` one byte every `every`.
pub fn trickle(body: &'static [u8], every: Duration) -> Response {
    let s = futures_util::stream::unfold(0usize, move |i| async move {
        if i >= body.len() {
            return None;
        }
        tokio::time::sleep(every).await;
        Some((
            Ok::<_, std::io::Error>(Bytes::from_static(&body[i..i + 1])),
            i + 1,
        ))
    });
    Body::from_stream(s).into_response()
}

/// The largest file under `dir` (0 when none), but for the documents being read in the
/// harvester's scratch folder.
fn largest_file(dir: &Path) -> u64 {
    walk(dir)
        .iter()
        .filter(|(p, _)| !p.to_string_lossy().contains(".rshub-tmp"))
        .map(|(_, n)| *n)
        .max()
        .unwrap_or(0)
}

fn walk(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        match e.metadata() {
            Ok(m) if m.is_dir() => out.extend(walk(&p)),
            Ok(m) => out.push((p, m.len())),
            Err(_) => {}
        }
    }
    out
}

fn status(cfg: &HarvestConfig) -> String {
    destination::status(cfg).unwrap()
}

fn held(s: &State, set: i64) -> u64 {
    s.count_held(set).unwrap()
}

fn baseline_done(s: &State, name: &str) -> bool {
    s.sets()
        .unwrap()
        .iter()
        .any(|r| r.name == name && r.baseline_done)
}

fn set_id(s: &State, name: &str) -> i64 {
    s.sets()
        .unwrap()
        .iter()
        .find(|r| r.name == name)
        .unwrap()
        .id
}

/// The hub's part, played by the test: the verification of intent for the subscription the
/// harvester asked `/hub` for; returns its callback and secret.
async fn verify_subscription(src: &Hostile) -> (String, String) {
    let mut sub = None;
    wait_until("a subscription request at the hub", || {
        sub = src.subscriptions().into_iter().last();
        let found = sub.is_some();
        async move { found }
    })
    .await;
    let sub = sub.unwrap();
    let callback = sub["hub.callback"].clone();
    let r = reqwest::Client::new()
        .get(&callback)
        .query(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", sub["hub.topic"].as_str()),
            ("hub.challenge", "c-123"),
            ("hub.lease_seconds", "86400"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "c-123");
    (callback, sub["hub.secret"].clone())
}

/// Everything a source names outside its authority is refused before connecting: Capability
/// Lists, list documents, index parts, Resource List and Change List entries, redirect
/// targets and the entries of a correctly signed notification. Nested indexes and list
/// documents listed as resources are refused too. The canary sees no connection; the rest of
/// the source is harvested, the refusals are in `harvest status`, the position moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_outside_the_source_is_reached() {
    let src = Hostile::start().await;
    let canary = Canary::start().await;
    let dir = tempfile::tempdir().unwrap();
    let a_cap = src.set(
        "a",
        &[
            ("resourcelist", src.url("/a/rl-index.xml")),
            ("changelist", src.url("/a/cl.xml")),
        ],
        true,
    );
    let b_cap = src.set("b", &[("resourcelist", canary.url("/b/rl.xml"))], false);
    src.source(&[a_cap, b_cap, canary.url("/c/capabilitylist.xml")]);
    src.xml(
        "/a/rl-index.xml",
        sitemapindex(
            &rl_md(),
            &[
                src.url("/a/rl1.xml"),
                canary.url("/a/rl2.xml"),
                src.url("/a/rl-index.xml"),
                src.url("/a/nested.xml"),
            ],
        ),
    );
    src.xml(
        "/a/nested.xml",
        sitemapindex(&rl_md(), &[src.url("/a/rl3.xml")]),
    );
    let mut entries: Vec<String> = (1..=3)
        .map(|i| src.resource(&format!("/a/r{i}"), &format!("resource {i}\n")))
        .collect();
    entries.push(entry(&canary.url("/x"), ""));
    let to = canary.url("/y");
    src.on("/a/redir", move |_| {
        (StatusCode::FOUND, [("location", to.clone())]).into_response()
    });
    entries.push(entry(&src.url("/a/redir"), ""));
    entries.push(entry(&src.url("/a/rl1.xml"), ""));
    src.xml("/a/rl1.xml", urlset(&rl_md(), &entries));
    let r1 = "resource 1, second version\n";
    src.resource("/a/r1", r1);
    src.xml(
        "/a/cl.xml",
        changelist(&[
            change(
                &src.url("/a/r1"),
                "updated",
                "2026-01-02T00:00:00Z",
                Some(r1),
            ),
            change(&canary.url("/z"), "created", "2026-01-03T00:00:00Z", None),
        ]),
    );

    let mut hc = harvest_config(dir.path(), &src.url("/.well-known/resourcesync"));
    hc.follow.check_interval_secs = 3600;
    let h = TestHarvester::start(hc.clone()).await;
    wait_state(&h, "set a's baseline and catch-up", 30, |s| {
        baseline_done(s, "a")
            && s.sets().unwrap()[0].position.is_some_and(|p| {
                p >= resourcesync_hub::model::Timestamp::parse("2026-01-03T00:00:00Z").unwrap()
            })
    })
    .await;
    let s = h.state();
    let a = set_id(&s, "a");
    assert_eq!(held(&s, a), 3);
    let r1_held = s.held(a, &src.url("/a/r1")).unwrap().unwrap();
    assert_eq!(std::fs::read_to_string(&r1_held.path).unwrap(), r1);
    assert_eq!(s.count_pending(a).unwrap(), 0, "nothing refused is queued");

    // A correctly signed notification naming another host: its entry is refused, the one
    // on the source applied.
    let (callback, secret) = verify_subscription(&src).await;
    let r4 = "resource 4\n";
    src.resource("/a/r4", r4);
    let note = urlset(
        r#"capability="change-notification" from="2026-01-03T00:00:00Z" until="2026-01-04T00:00:00Z""#,
        &[
            change(&canary.url("/n"), "created", "2026-01-03T12:00:00Z", None),
            change(
                &src.url("/a/r4"),
                "created",
                "2026-01-03T12:00:00Z",
                Some(r4),
            ),
        ],
    );
    let r = reqwest::Client::new()
        .post(&callback)
        .header(
            "x-hub-signature",
            signature(SignatureAlg::Sha256, secret.as_bytes(), note.as_bytes()),
        )
        .body(note)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    wait_state(&h, "the notification applied", 20, |s| held(s, a) == 4).await;

    let report = status(&hc);
    for (what, why) in [
        (
            canary.url("/c/capabilitylist.xml"),
            "outside the source's authority",
        ),
        (canary.url("/b/rl.xml"), "outside the source's authority"),
        (canary.url("/a/rl2.xml"), "outside the source's authority"),
        (src.url("/a/rl-index.xml"), "list document"),
        (src.url("/a/nested.xml"), "index inside an index"),
        (canary.url("/x"), "outside the source's authority"),
        (src.url("/a/redir"), "redirected"),
        (src.url("/a/rl1.xml"), "list document"),
        (canary.url("/z"), "outside the source's authority"),
        (canary.url("/n"), "outside the source's authority"),
    ] {
        assert!(
            report
                .lines()
                .any(|l| l.contains(&format!("{what} (")) && l.contains(why)),
            "{what} ({why}) not in:\n{report}"
        );
    }
    assert_eq!(
        src.hits("/a/rl3.xml"),
        0,
        "a nested index's parts are not read"
    );
    assert_eq!(canary.connections(), 0, "the canary was reached");
    assert!(!dir
        .path()
        .join(format!("mirror/127.0.0.1_{}", canary.port))
        .exists());
    h.stop().await;
}

/// A Resource Dump of one package listed with `length`.
fn resourcedump(package: &str, length: usize) -> String {
    urlset(
        r#"capability="resourcedump" at="2026-01-01T00:00:00Z""#,
        &[entry(
            package,
            &format!(r#"length="{length}" type="application/zip""#),
        )],
    )
}

/// A ZIP package: `manifest.xml` first, then each `(path, bytes)` stored.
fn package(manifest: &str, files: &[(&str, &[u8])]) -> Vec<u8> {
    use std::io::Write;
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    z.start_file("manifest.xml", opts).unwrap();
    z.write_all(manifest.as_bytes()).unwrap();
    for (p, b) in files {
        z.start_file(*p, opts).unwrap();
        z.write_all(b).unwrap();
    }
    z.finish().unwrap().into_inner()
}

/// Dumps that lie. Set `d1`: a package whose manifest names a resource on another host (its
/// bytes are in the package) and gives one resource a wrong md5: the first is refused and
/// never lands in the mirror, the second is fetched on its own and checked against the
/// Resource List. Set `d2`: a package served at 50,605 bytes where the dump lists 1,000: read
/// no further than that once, and the baseline completes from the Resource List.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lying_dumps_are_checked_against_the_resource_list() {
    let src = Hostile::start().await;
    let canary = Canary::start().await;
    let dir = tempfile::tempdir().unwrap();
    let body = |i: usize| format!("resource {i}\n");
    let mut caps = Vec::new();
    for set in ["d1", "d2"] {
        let rl: Vec<String> = (0..5)
            .map(|i| src.resource(&format!("/{set}/r{i}"), &body(i)))
            .collect();
        src.xml(&format!("/{set}/rl.xml"), urlset(&rl_md(), &rl));
        src.xml(&format!("/{set}/cl.xml"), changelist(&[]));
        caps.push(src.set(
            set,
            &[
                ("resourcelist", src.url(&format!("/{set}/rl.xml"))),
                ("resourcedump", src.url(&format!("/{set}/rd.xml"))),
                ("changelist", src.url(&format!("/{set}/cl.xml"))),
            ],
            false,
        ));
    }
    src.source(&caps);
    // d1: r0..r3 right, r4 with a wrong md5 in the manifest, and a resource of the canary.
    let mut m = Vec::new();
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for i in 0..5 {
        let b = body(i);
        let md = if i == 4 {
            format!(r#"hash="md5:{}" length="{}""#, "0".repeat(32), b.len())
        } else {
            described(&b)
        };
        m.push(entry(
            &src.url(&format!("/d1/r{i}")),
            &format!(r#"{md} path="/r{i}""#),
        ));
        files.push((format!("r{i}"), b.into_bytes()));
    }
    let evil = "not from the source\n";
    m.push(entry(
        &canary.url("/evil"),
        &format!(r#"{} path="/evil""#, described(evil)),
    ));
    files.push(("evil".into(), evil.as_bytes().to_vec()));
    let manifest = urlset(
        r#"capability="resourcedump-manifest" at="2026-01-01T00:00:00Z""#,
        &m,
    );
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(p, b)| (p.as_str(), &b[..])).collect();
    let p1 = package(&manifest, &refs);
    let p1_len = p1.len();
    src.on("/d1/p1.zip", move |_| p1.clone().into_response());
    src.xml("/d1/rd.xml", resourcedump(&src.url("/d1/p1.zip"), p1_len));
    // d2: a package far longer than listed.
    src.on("/d2/p1.zip", |_| vec![b'z'; 50_605].into_response());
    src.xml("/d2/rd.xml", resourcedump(&src.url("/d2/p1.zip"), 1000));

    let mut hc = harvest_config(dir.path(), &src.url("/.well-known/resourcesync"));
    hc.source.baseline = destination::config::BaselineFrom::Dump;
    hc.push.enabled = false;
    hc.follow.check_interval_secs = 1;
    let h = TestHarvester::start(hc.clone()).await;
    wait_state(&h, "both baselines", 30, |s| {
        baseline_done(s, "d1") && baseline_done(s, "d2")
    })
    .await;
    let s = h.state();
    for set in ["d1", "d2"] {
        let id = set_id(&s, set);
        assert_eq!(held(&s, id), 5, "{set}:\n{}", status(&hc));
        assert_eq!(s.count_pending(id).unwrap(), 0, "{set}");
        for i in 0..5 {
            let h = s
                .held(id, &src.url(&format!("/{set}/r{i}")))
                .unwrap()
                .unwrap();
            assert_eq!(std::fs::read_to_string(&h.path).unwrap(), body(i));
        }
    }
    assert_eq!(
        src.hits("/d1/r4"),
        1,
        "the bitstream the manifest got wrong, fetched once"
    );
    assert_eq!(src.hits("/d1/r0"), 0, "the others came from the package");
    assert_eq!(
        src.hits("/d2/p1.zip"),
        1,
        "an oversized package is read once"
    );
    let report = status(&hc);
    assert!(
        report.contains(&format!("{} (", canary.url("/evil")))
            && report.contains("outside the source's authority"),
        "{report}"
    );
    assert!(
        !dir.path()
            .join(format!("mirror/127.0.0.1_{}", canary.port))
            .exists(),
        "the package's bytes for another host reached the mirror"
    );
    // Checks later the oversized package is still not fetched again. (A set's first check
    // follows its baseline: it may not have happened yet.)
    let d2 = set_id(&s, "d2");
    wait_state(&h, "the first check after the baseline", 30, |s| {
        s.set_by_id(d2).unwrap().unwrap().checked_at.is_some()
    })
    .await;
    let checked = s.set_by_id(d2).unwrap().unwrap().checked_at.unwrap();
    wait_state(&h, "two more checks", 30, |s| {
        s.set_by_id(d2)
            .unwrap()
            .unwrap()
            .checked_at
            .is_some_and(|t| t.0 > checked.0 + 1_500_000)
    })
    .await;
    assert_eq!(src.hits("/d2/p1.zip"), 1);
    assert_eq!(canary.connections(), 0);
    let (report, in_sync) = destination::audit(&hc).await.unwrap();
    assert!(in_sync, "{report}");
    h.stop().await;
}

/// What one resource or document can cost is bounded: a resource listed with 100 bytes served
/// forever is cut after 101 bytes (no file ever grows past that), one listed with 1,000 and
/// served with a Content-Length of 10,000 is refused at its headers, once per pass; no empty
/// or partial download is left behind; the rest of the list is harvested.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_is_never_read_past_its_listed_length() {
    let src = Hostile::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut rl: Vec<String> = (0..5)
        .map(|i| src.resource(&format!("/s/r{i}"), &format!("resource {i}\n")))
        .collect();
    src.on("/s/endless", |_| endless());
    rl.push(entry(
        &src.url("/s/endless"),
        &format!(r#"hash="md5:{}" length="100""#, "0".repeat(32)),
    ));
    src.on("/s/big", |_| vec![b'b'; 10_000].into_response());
    rl.push(entry(
        &src.url("/s/big"),
        &format!(r#"hash="md5:{}" length="1000""#, "0".repeat(32)),
    ));
    src.on("/s/gone", |_| StatusCode::NOT_FOUND.into_response());
    rl.push(entry(&src.url("/s/gone"), r#"length="3""#));
    src.xml("/s/rl.xml", urlset(&rl_md(), &rl));
    src.source(&[src.set("s", &[("resourcelist", src.url("/s/rl.xml"))], false)]);
    let mut hc = harvest_config(dir.path(), &src.url("/.well-known/resourcesync"));
    hc.push.enabled = false;
    hc.follow.check_interval_secs = 3600;
    let h = TestHarvester::start(hc.clone()).await;
    // Watch the files while the harvester works.
    let mirror = hc.output.dir.clone();
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (w, m) = (watching.clone(), mirror.clone());
    let watcher = std::thread::spawn(move || {
        let mut largest = 0;
        while w.load(Ordering::SeqCst) {
            largest = largest.max(largest_file(&m));
            std::thread::sleep(Duration::from_millis(2));
        }
        largest
    });
    wait_state(&h, "the baseline", 30, |s| baseline_done(s, "s")).await;
    watching.store(false, Ordering::SeqCst);
    let largest = watcher.join().unwrap();
    assert!(largest <= 101, "a file of {largest} bytes was written");
    let s = h.state();
    assert_eq!(held(&s, 1), 5);
    assert_eq!(
        src.hits("/s/big"),
        1,
        "refused at its headers, not retried in the pass"
    );
    assert_eq!(src.hits("/s/endless"), 1);
    let report = status(&hc);
    assert!(
        report.contains("more than its listed length (100)")
            && report.contains("Content-Length 10000, more than its listed length (1000)"),
        "{report}"
    );
    let leftovers: Vec<PathBuf> = walk(&mirror)
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p.to_string_lossy().contains(".rshub-part"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    h.stop().await;
}

/// A body of 100 bytes, served at one byte a second.
pub const SLOW: &[u8] = b"slow resource, slow resource, slow resource, slow resource, slow resource, slow resource, slow!!!\n";

/// Eight resources trickling one byte a second, listed before ten normal ones, with the
/// default fetch settings: the trickles are cut off by the idle/low-speed rule and retried
/// later, the ten normal ones arrive within 30 s (they waited 242 s before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_resources_do_not_hold_every_slot() {
    let src = Hostile::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut rl = Vec::new();
    for i in 0..8 {
        let path = format!("/t/slow{i}");
        src.on(&path, |_| trickle(SLOW, Duration::from_secs(1)));
        rl.push(entry(
            &src.url(&path),
            &described(std::str::from_utf8(SLOW).unwrap()),
        ));
    }
    for i in 0..10 {
        rl.push(src.resource(&format!("/t/r{i}"), &format!("resource {i}\n")));
    }
    src.xml("/t/rl.xml", urlset(&rl_md(), &rl));
    src.source(&[src.set("t", &[("resourcelist", src.url("/t/rl.xml"))], false)]);
    let mut hc = harvest_config(dir.path(), &src.url("/.well-known/resourcesync"));
    let defaults = HarvestConfig::defaults().fetch;
    hc.fetch = defaults;
    hc.push.enabled = false;
    let h = TestHarvester::start(hc.clone()).await;
    let normal: Vec<String> = (0..10).map(|i| src.url(&format!("/t/r{i}"))).collect();
    let started = std::time::Instant::now();
    wait_state(&h, "the ten normal resources", 30, |s| {
        normal.iter().all(|u| s.held(1, u).unwrap().is_some())
    })
    .await;
    eprintln!("the ten normal resources in after {:?}", started.elapsed());
    let report = status(&hc);
    assert!(report.contains("too slow"), "{report}");
    // Cut off, not waited for: the stop is prompt although eight trickles may be under way.
    h.stop().await;
}

/// POSTs `body` to `url` with chunked transfer encoding (no Content-Length) and an
/// `X-Hub-Signature`; the answer's status (0 when there is none).
async fn post_chunked(url: &str, sig: &str, body: &[u8]) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let u = url::Url::parse(url).unwrap();
    let mut s = tokio::net::TcpStream::connect((u.host_str().unwrap(), u.port().unwrap()))
        .await
        .unwrap();
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nX-Hub-Signature: {sig}\r\nContent-Type: application/xml\r\nTransfer-Encoding: chunked\r\n\r\n",
        u.path(),
        u.authority()
    );
    let _ = s.write_all(head.as_bytes()).await;
    for c in body.chunks(1 << 20) {
        let chunk = [format!("{:x}\r\n", c.len()).as_bytes(), c, b"\r\n"].concat();
        if s.write_all(&chunk).await.is_err() {
            break;
        }
    }
    let _ = s.write_all(b"0\r\n\r\n").await;
    let mut answer = vec![0u8; 64];
    let n = s.read(&mut answer).await.unwrap_or(0);
    String::from_utf8_lossy(&answer[..n])
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// A harvest configuration file for a child harvester of `url` in `dir`; `extra` is added to
/// the `[fetch]` table.
fn child_config(dir: &Path, url: &str, push: bool, extra_fetch: &str) -> PathBuf {
    let f = dir.join("harvest.toml");
    std::fs::write(
        &f,
        format!(
            "[source]\nurl = \"{url}\"\n[state]\ndir = \"{}\"\n[output]\ndir = \"{}\"\n[push]\nenabled = {push}\nlisten = \"127.0.0.1:{}\"\n[follow]\ncheck_interval_secs = 3600\n[fetch]\nbackoff_initial_ms = 20\n{extra_fetch}\n",
            dir.join("state").display(),
            dir.join("mirror").display(),
            free_port()
        ),
    )
    .unwrap();
    f
}

/// Waits (up to `secs`) until `check` holds on the state of the harvester configured by `f`.
pub async fn wait_child(f: &Path, what: &str, secs: u64, check: impl Fn(&State) -> bool) {
    let db = HarvestConfig::load(Some(f)).unwrap().database_path();
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if db.exists() && check(&State::open(&db).unwrap()) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            destination::status(&HarvestConfig::load(Some(f)).unwrap()).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A Resource List of 200 MB whose one `<loc>` is the whole of it, and one of 30 MB (under
/// the document cap) with a 30 MB `<loc>` among three normal entries, streamed without a
/// Content-Length: the first is cut at `fetch.max_document_bytes`, the long URL is refused
/// without being read whole or logged, the normal entries are harvested; the harvester's peak
/// memory stays under 200 MB and its log under 1 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mb_loc_costs_neither_memory_nor_log() {
    let src = Hostile::start().await;
    let dir = tempfile::tempdir().unwrap();
    let streamed_loc = |prefix: String, loc_mb: usize, tail: String| {
        move |_: &HeaderMap| {
            let parts: Vec<Bytes> = std::iter::once(Bytes::from(prefix.clone()))
                .chain(std::iter::repeat_n(
                    Bytes::from(vec![b'a'; 1 << 20]),
                    loc_mb,
                ))
                .chain(std::iter::once(Bytes::from(tail.clone())))
                .collect();
            Body::from_stream(futures_util::stream::iter(
                parts.into_iter().map(Ok::<_, std::io::Error>),
            ))
            .into_response()
        }
    };
    let head = urlset(&rl_md(), &[]).replace("</urlset>", "");
    src.on(
        "/big/rl.xml",
        streamed_loc(
            format!("{head}<url><loc>{}/", src.url("/big")),
            200,
            "</loc></url></urlset>".into(),
        ),
    );
    let normal: Vec<String> = (0..3)
        .map(|i| src.resource(&format!("/long/r{i}"), &format!("resource {i}\n")))
        .collect();
    src.on(
        "/long/rl.xml",
        streamed_loc(
            format!(
                "{head}{}<url><loc>{}/",
                normal[..2].join(""),
                src.url("/long")
            ),
            30,
            format!("</loc></url>{}</urlset>", normal[2]),
        ),
    );
    src.source(&[
        src.set("big", &[("resourcelist", src.url("/big/rl.xml"))], false),
        src.set("long", &[("resourcelist", src.url("/long/rl.xml"))], false),
    ]);
    let f = child_config(dir.path(), &src.url("/.well-known/resourcesync"), false, "");
    let h = ChildHarvester::start(&f);
    wait_child(
        &f,
        "the normal entries and the oversized list's error",
        60,
        |s| {
            baseline_done(s, "long")
                && s.count_held(set_id(s, "long")).unwrap() == 3
                && s.sets().unwrap().iter().any(|r| {
                    r.name == "big"
                        && r.last_error
                            .as_deref()
                            .is_some_and(|e| e.contains("fetch.max_document_bytes"))
                })
        },
    )
    .await;
    let rss = h.peak_rss();
    let log = h.log.lock().unwrap().clone();
    let cfg = HarvestConfig::load(Some(&f)).unwrap();
    let report = status(&cfg);
    h.kill();
    eprintln!("peak RSS {} MB, log {} bytes", rss >> 20, log.len());
    assert!(rss < 200 << 20, "peak RSS {} MB", rss >> 20);
    assert!(log.len() < 1 << 20, "a log of {} bytes", log.len());
    assert!(
        report.contains("bytes or more, longer than fetch.max_url_length (2048)"),
        "{report}"
    );
    assert!(report.len() < 16 << 10, "status of {} bytes", report.len());
}

/// Eight unsigned 60 MB deliveries at the right callback are answered unread, eight more
/// signed with a wrong secret and no Content-Length are cut at `push.max_body_bytes`, at most
/// `push.max_concurrent_deliveries` at once: the harvester's peak memory stays under 200 MB.
/// A forged `denied` for its active subscription changes nothing; a callback without the
/// subscription's token is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_at_the_callback_are_not_read() {
    let src = Hostile::start().await;
    let dir = tempfile::tempdir().unwrap();
    let rl = vec![src.resource("/p/r0", "resource 0\n")];
    src.xml("/p/rl.xml", urlset(&rl_md(), &rl));
    src.source(&[src.set("p", &[("resourcelist", src.url("/p/rl.xml"))], true)]);
    let f = child_config(dir.path(), &src.url("/.well-known/resourcesync"), true, "");
    let h = ChildHarvester::start(&f);
    let (callback, secret) = verify_subscription(&src).await;
    wait_child(&f, "an active subscription", 20, |s| {
        s.subscription(1)
            .unwrap()
            .is_some_and(|sub| sub.state == SubState::Active)
    })
    .await;
    let client = reqwest::Client::new();
    // Forged: a denial of the active subscription, and the callback without its token.
    let topic = src.url("/p/notifications");
    let denied = client
        .get(&callback)
        .query(&[("hub.mode", "denied"), ("hub.topic", topic.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status(), 404);
    let tokenless = callback.rsplit_once('/').unwrap().0.to_string();
    let r = client
        .post(format!("{tokenless}/0123456789abcdef0123456789abcdef"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 410);

    let big = Bytes::from(vec![b'<'; 60 << 20]);
    let mut sends = Vec::new();
    for i in 0..16 {
        let (client, callback, big) = (client.clone(), callback.clone(), big.clone());
        let wrong = signature(SignatureAlg::Sha256, b"not the secret", b"x");
        sends.push(tokio::spawn(async move {
            if i % 2 == 0 {
                client
                    .post(&callback)
                    .body(big)
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0)
            } else {
                // No Content-Length: read until the cap.
                post_chunked(&callback, &wrong, &big).await
            }
        }));
    }
    let mut statuses = Vec::new();
    for s in sends {
        statuses.push(s.await.unwrap());
    }
    assert!(
        statuses.iter().all(|s| [0, 202, 413, 503].contains(s)),
        "{statuses:?}"
    );
    let rss = h.peak_rss();
    let cfg = HarvestConfig::load(Some(&f)).unwrap();
    let s = State::open(&cfg.database_path()).unwrap();
    assert_eq!(s.subscription(1).unwrap().unwrap().state, SubState::Active);
    assert!(s.counter("unsigned").unwrap() >= 1, "{statuses:?}");
    let _ = secret;
    h.kill();
    eprintln!("peak RSS {} MB; answers {statuses:?}", rss >> 20);
    assert!(rss < 200 << 20, "peak RSS {} MB", rss >> 20);
}

/// A harvester busy with its first baseline (eight trickling resources) answers every signed
/// delivery at once: kept on disk (202) while the deliveries waiting fit
/// `push.max_queued_bytes`, 503 with Retry-After past it. The kept ones (more than the 64 a
/// hub waited behind before) are applied once the baseline is done, and the inbox is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_harvester_never_keeps_the_hub_waiting() {
    let src = Hostile::start().await;
    let dir = tempfile::tempdir().unwrap();
    let slow = std::str::from_utf8(SLOW).unwrap();
    let rl: Vec<String> = (0..8)
        .map(|i| {
            let path = format!("/b/slow{i}");
            src.on(&path, |_| trickle(SLOW, Duration::from_secs(1)));
            entry(&src.url(&path), &described(slow))
        })
        .collect();
    src.xml("/b/rl.xml", urlset(&rl_md(), &rl));
    src.source(&[src.set("b", &[("resourcelist", src.url("/b/rl.xml"))], true)]);
    let f = child_config(
        dir.path(),
        &src.url("/.well-known/resourcesync"),
        true,
        "idle_timeout_secs = 4",
    );
    let text = std::fs::read_to_string(&f).unwrap().replace(
        "[push]\n",
        "[push]\nmax_body_bytes = 2048\nmax_queued_bytes = 16384\n",
    );
    std::fs::write(&f, text).unwrap();
    let h = ChildHarvester::start(&f);
    let (callback, secret) = verify_subscription(&src).await;
    let client = reqwest::Client::new();
    let body = format!("<urlset>{}</urlset>", "x".repeat(183));
    assert_eq!(body.len(), 200);
    let sig = signature(SignatureAlg::Sha256, secret.as_bytes(), body.as_bytes());
    let (mut statuses, mut slowest) = (Vec::new(), Duration::ZERO);
    for _ in 0..100 {
        let started = std::time::Instant::now();
        let r = client
            .post(&callback)
            .header("x-hub-signature", &sig)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        slowest = slowest.max(started.elapsed());
        if r.status() == 503 {
            assert_eq!(r.headers()["retry-after"], "30");
        }
        statuses.push(r.status().as_u16());
    }
    let cfg = HarvestConfig::load(Some(&f)).unwrap();
    let state = State::open(&cfg.database_path()).unwrap();
    assert!(
        !state.sets().unwrap()[0].baseline_done,
        "the deliveries came while the baseline ran"
    );
    let kept = statuses.iter().filter(|s| **s == 202).count();
    eprintln!(
        "kept {kept}, refused {}; slowest answer {slowest:?}",
        100 - kept
    );
    assert_eq!(kept, 16384 / 200, "{statuses:?}");
    assert!(statuses[kept..].iter().all(|s| *s == 503), "{statuses:?}");
    assert!(
        slowest < Duration::from_secs(3),
        "slowest answer {slowest:?}"
    );
    wait_child(&f, "the baseline and the inbox applied", 60, |s| {
        s.sets().unwrap()[0].baseline_done && s.inbox_size().unwrap().0 == 0
    })
    .await;
    h.kill();
}

/// SIGTERM stops the harvester within 2 s in every phase, and what it holds is kept: while it
/// reads a trickling Resource List (the baseline walk), while eight trickling resources are
/// being downloaded, while a dump package of 20,000 entries is being unpacked (restarted, it
/// finishes the baseline), and while the queue drains eight trickling updates (the position
/// does not move, the updates stay queued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_it_within_two_seconds_in_every_phase() {
    let src = Hostile::start().await;
    // The baseline walk: a list that trickles.
    src.on("/walk/rl.xml", |_| {
        trickle(SLOW, Duration::from_millis(200))
    });
    // Downloads: eight trickling resources.
    let slow: Vec<String> = (0..8)
        .map(|i| {
            let path = format!("/dl/slow{i}");
            src.on(&path, |_| trickle(SLOW, Duration::from_secs(1)));
            entry(
                &src.url(&path),
                &described(std::str::from_utf8(SLOW).unwrap()),
            )
        })
        .collect();
    src.xml("/dl/rl.xml", urlset(&rl_md(), &slow));
    // Unpacking: a package of 20,000 small files.
    let n = 20_000;
    let bodies: Vec<String> = (0..n).map(|i| format!("file {i}\n")).collect();
    let mut rl = Vec::new();
    let mut m = Vec::new();
    for (i, b) in bodies.iter().enumerate() {
        let loc = src.url(&format!("/un/f{i}"));
        rl.push(entry(&loc, &described(b)));
        m.push(entry(&loc, &format!(r#"{} path="/f{i}""#, described(b))));
    }
    let names: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
    let files: Vec<(&str, &[u8])> = names
        .iter()
        .zip(&bodies)
        .map(|(p, b)| (p.as_str(), b.as_bytes()))
        .collect();
    let p = package(
        &urlset(
            r#"capability="resourcedump-manifest" at="2026-01-01T00:00:00Z""#,
            &m,
        ),
        &files,
    );
    let plen = p.len();
    src.on("/un/p.zip", move |_| p.clone().into_response());
    src.xml("/un/rl.xml", urlset(&rl_md(), &rl));
    src.xml("/un/rd.xml", resourcedump(&src.url("/un/p.zip"), plen));
    // Draining: a baseline of one resource, then a Change List updating eight, trickling.
    src.xml(
        "/dr/rl.xml",
        urlset(&rl_md(), &[src.resource("/dr/r", "resource\n")]),
    );
    let updates: Vec<String> = (0..8)
        .map(|i| {
            change(
                &src.url(&format!("/dl/slow{i}")),
                "updated",
                "2026-01-02T00:00:00Z",
                Some(std::str::from_utf8(SLOW).unwrap()),
            )
        })
        .collect();
    src.xml("/dr/cl.xml", changelist(&updates));
    let walk = src.set("walk", &[("resourcelist", src.url("/walk/rl.xml"))], false);
    let dl = src.set("dl", &[("resourcelist", src.url("/dl/rl.xml"))], false);
    let un = src.set(
        "un",
        &[
            ("resourcelist", src.url("/un/rl.xml")),
            ("resourcedump", src.url("/un/rd.xml")),
        ],
        false,
    );
    let dr = src.set(
        "dr",
        &[
            ("resourcelist", src.url("/dr/rl.xml")),
            ("changelist", src.url("/dr/cl.xml")),
        ],
        false,
    );

    let phase = |name: &'static str, cap: String| {
        let dir = tempfile::tempdir().unwrap();
        let f = child_config(dir.path(), &cap, false, "");
        (dir, f, name)
    };
    let stopped = |h: ChildHarvester, what: &str| {
        let log = h.log.clone();
        let (took, status) = h.terminate();
        eprintln!("{what}: stopped {} ms after SIGTERM", took.as_millis());
        assert!(
            took < Duration::from_secs(5) && status.success(),
            "{what}: {status} after {took:?}\n{}",
            log.lock().unwrap()
        );
    };

    let (_d, f, what) = phase("the baseline walk", walk);
    let h = ChildHarvester::start(&f);
    wait_until("the list being read", || async {
        src.hits("/walk/rl.xml") > 0
    })
    .await;
    stopped(h, what);

    let (_d, f, what) = phase("downloads", dl);
    let h = ChildHarvester::start(&f);
    wait_until("eight downloads under way", || async {
        (0..8).all(|i| src.hits(&format!("/dl/slow{i}")) > 0)
    })
    .await;
    stopped(h, what);

    let (d, f, what) = phase("unpacking", un);
    std::fs::write(
        &f,
        std::fs::read_to_string(&f)
            .unwrap()
            .replace("[source]\n", "[source]\nbaseline = \"dump\"\n"),
    )
    .unwrap();
    let h = ChildHarvester::start(&f);
    let host = url::Url::parse(&src.base).unwrap();
    let unpacked = d.path().join(format!(
        "mirror/{}_{}/un",
        host.host_str().unwrap(),
        host.port().unwrap()
    ));
    wait_until("unpacking under way", || {
        let dir = unpacked.clone();
        async move { std::fs::read_dir(&dir).is_ok_and(|mut e| e.next().is_some()) }
    })
    .await;
    stopped(h, what);
    let cfg = HarvestConfig::load(Some(&f)).unwrap();
    let s = State::open(&cfg.database_path()).unwrap();
    let held_then = s.count_held(1).unwrap();
    assert!(
        !s.sets().unwrap()[0].baseline_done && held_then < n as u64,
        "stopped before the package was unpacked ({held_then} held)"
    );
    let h = ChildHarvester::start(&f);
    wait_child(&f, "the rest of the dump baseline", 120, |s| {
        baseline_done(s, "un") && s.count_held(1).unwrap() == n as u64
    })
    .await;
    h.kill();
    assert_eq!(src.hits("/un/f0"), 0, "everything came from the package");

    let (_d, f, what) = phase("draining", dr);
    let h = ChildHarvester::start(&f);
    wait_child(&f, "the baseline", 20, |s| baseline_done(s, "dr")).await;
    wait_until("eight updates being fetched", || async {
        (0..8).all(|i| src.hits(&format!("/dl/slow{i}")) > 1)
    })
    .await;
    let cfg = HarvestConfig::load(Some(&f)).unwrap();
    let before = State::open(&cfg.database_path()).unwrap().sets().unwrap()[0].position;
    stopped(h, what);
    let s = State::open(&cfg.database_path()).unwrap();
    assert_eq!(s.sets().unwrap()[0].position, before, "the position held");
    assert_eq!(s.count_pending(1).unwrap(), 8, "the updates stay queued");
}

/// URIs that would share one file are detected: `dir/` and `dir/index`, `q?x=1` and
/// `q%3Fx=1`, a file where another resource needs a folder; the second is refused with the
/// first named, never written over it. A name of the harvester's own (`.rshub-part-…`) and
/// one that cannot be a file (`%2e%2e`) are refused; `col.rshub-part` is an ordinary name and
/// survives an update of `col`. `harvest audit` reports each bad entry and compares the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_collide_are_refused_not_overwritten() {
    let src = Hostile::start().await;
    let dir = tempfile::tempdir().unwrap();
    let pairs = [
        ("/c/dir/", "/c/dir/index"),
        ("/c/q?x=1", "/c/q%3Fx=1"),
        ("/c/leaf", "/c/leaf/under"),
    ];
    let mut rl = Vec::new();
    for (first, second) in pairs {
        rl.push(src.resource(first, &format!("first {first}\n")));
        rl.push(src.resource(second, &format!("second {second}\n")));
    }
    rl.push(src.resource("/c/.rshub-part-0123", "reserved\n"));
    rl.push(src.resource("/c/%2e%2e/up", "up\n"));
    rl.push(src.resource("/c/col", "col 1\n"));
    rl.push(src.resource("/c/col.rshub-part", "part\n"));
    src.xml("/c/rl.xml", urlset(&rl_md(), &rl));
    let col2 = "col 2\n";
    src.resource("/c/col", col2);
    src.xml(
        "/c/cl.xml",
        changelist(&[change(
            &src.url("/c/col"),
            "updated",
            "2026-01-02T00:00:00Z",
            Some(col2),
        )]),
    );
    src.source(&[src.set(
        "c",
        &[
            ("resourcelist", src.url("/c/rl.xml")),
            ("changelist", src.url("/c/cl.xml")),
        ],
        false,
    )]);
    let mut hc = harvest_config(dir.path(), &src.url("/.well-known/resourcesync"));
    hc.push.enabled = false;
    hc.follow.check_interval_secs = 3600;
    let h = TestHarvester::start(hc.clone()).await;
    wait_state(&h, "the baseline and the update", 30, |s| {
        baseline_done(s, "c")
            && s.applied_count(1).unwrap() >= 1
            && s.count_pending(1).unwrap() == 0
    })
    .await;
    let s = h.state();
    for (first, _) in pairs {
        let held = s.held(1, &src.url(first)).unwrap().unwrap();
        assert_eq!(
            std::fs::read_to_string(&held.path).unwrap(),
            format!("first {first}\n"),
            "{first} was overwritten"
        );
    }
    let col = s.held(1, &src.url("/c/col")).unwrap().unwrap();
    assert_eq!(std::fs::read_to_string(&col.path).unwrap(), col2);
    let part = s.held(1, &src.url("/c/col.rshub-part")).unwrap().unwrap();
    assert_eq!(std::fs::read_to_string(&part.path).unwrap(), "part\n");
    assert_eq!(held(&s, 1), 5);
    let report = status(&hc);
    for (first, second) in pairs {
        assert!(
            report
                .lines()
                .any(|l| l.contains(&format!("{} (", src.url(second)))
                    && l.contains(&src.url(first))),
            "{second} not refused naming {first}:\n{report}"
        );
    }
    assert!(
        report.contains("kept for the harvester's own files"),
        "{report}"
    );
    assert!(report.contains("cannot be a file name"), "{report}");

    // The source's Resource List catches up with the update.
    rl[8] = entry(&src.url("/c/col"), &described(col2));
    src.xml("/c/rl.xml", urlset(&rl_md(), &rl));
    let (report, in_sync) = destination::audit(&hc).await.unwrap();
    assert!(in_sync, "{report}");
    assert!(report.contains("5 refused"), "{report}");
    assert!(report.contains("cannot be a file name"), "{report}");
    // The rest is still compared: a changed copy is found.
    std::fs::write(&col.path, "changed\n").unwrap();
    let (report, in_sync) = destination::audit(&hc).await.unwrap();
    assert!(!in_sync && report.contains("different"), "{report}");
    h.stop().await;
}
