//! The destination (`resourcesync-hub harvest`) against our server and against static files
//! made by the Python reference tool: baseline, push, gap filling, never skipping.

use std::path::{Path, PathBuf};
use std::time::Duration;

use resourcesync_hub::destination::{
    self,
    config::HarvestConfig,
    state::{State, SubState},
};
use tokio::sync::oneshot;

use crate::hub::hub_config;
use crate::support::*;

/// A harvester running in-process on a callback listener of its own.
pub struct TestHarvester {
    pub cfg: HarvestConfig,
    /// Where its callback server (and its console) listens.
    pub addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// Set when the harvester stopped with an error (shown by `wait_state`).
    ended: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

impl TestHarvester {
    pub async fn start(cfg: HarvestConfig) -> TestHarvester {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let ended = std::sync::Arc::new(std::sync::Mutex::new(None));
        let note = ended.clone();
        let run = destination::run(cfg.clone(), Some(listener), async move {
            let _ = rx.await;
        });
        let handle = tokio::spawn(async move {
            let r = run.await;
            if let Err(e) = &r {
                *note.lock().unwrap() = Some(format!("{e:#}"));
            }
            r
        });
        TestHarvester {
            cfg,
            addr,
            stop: Some(tx),
            handle: Some(handle),
            ended,
        }
    }

    pub fn state(&self) -> State {
        State::open(&self.cfg.database_path()).unwrap()
    }

    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.handle.take().unwrap().await.unwrap().unwrap();
    }
}

/// A harvest configuration in `dir` for the source at `url`.
pub fn harvest_config(dir: &Path, url: &str) -> HarvestConfig {
    let mut c = HarvestConfig::defaults();
    c.source.url = url.into();
    c.state.dir = dir.join("state");
    c.output.dir = dir.join("mirror");
    c.push.listen = "127.0.0.1:0".into();
    c.fetch.backoff_initial_ms = 20;
    c.fetch.backoff_max_ms = 200;
    c.fetch.attempts = 2;
    c
}

/// Writes `body` at `root/rel` and returns its created/updated line.
pub fn file_line(root: &Path, change: &str, rel: &str, body: &str) -> String {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, body).unwrap();
    format!(
        r#"{{"change":"{change}","location":{{"type":"rel_path","value":"{rel}"}},"length":{},"md5":"{}","mime":"text/plain"}}"#,
        body.len(),
        md5_hex(body.as_bytes())
    )
}

/// Polls the harvester's state until `check` holds.
pub async fn wait_state(h: &TestHarvester, what: &str, secs: u64, check: impl Fn(&State) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if check(&h.state()) {
            return;
        }
        if let Some(e) = h.ended.lock().unwrap().clone() {
            panic!("the harvester stopped while waiting for {what}: {e}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            destination::status(&h.cfg).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn set_done(s: &State, held: u64) -> bool {
    s.sets()
        .unwrap()
        .first()
        .is_some_and(|r| r.baseline_done && s.count_held(r.id).unwrap() == held)
}

pub fn applied(s: &State) -> u64 {
    s.sets()
        .unwrap()
        .first()
        .map_or(0, |r| s.applied_count(r.id).unwrap())
}

pub fn pending(s: &State) -> u64 {
    s.sets()
        .unwrap()
        .first()
        .map_or(0, |r| s.count_pending(r.id).unwrap())
}

pub async fn audit(cfg: &HarvestConfig) -> (String, bool) {
    destination::audit(cfg).await.unwrap()
}

/// 5,000 resources baselined, then 300 creates, updates and deletes applied by push (the
/// periodic check is an hour away), and the audit says IN SYNC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baseline_then_push_keeps_a_mirror_in_sync() {
    let (mut c, dir) = hub_config();
    let root = dir.path().join("root");
    add_file_set(&mut c, "papers", &root, None);
    let app = TestApp::start_with(c).await;
    let lines: Vec<String> = (0..5000)
        .map(|i| {
            file_line(
                &root,
                "created",
                &format!("d{}/r{i}.txt", i % 50),
                &format!("resource {i}\n"),
            )
        })
        .collect();
    for chunk in lines.chunks(1000) {
        app.ingest_ok("papers", &chunk.join("\n")).await;
    }
    let mut hc = harvest_config(dir.path(), &app.url("/.well-known/resourcesync"));
    hc.follow.check_interval_secs = 3600;
    let hook_log = dir.path().join("hook.ndjson");
    hc.output.exec = format!("cat >> '{}'", hook_log.display());
    let h = TestHarvester::start(hc.clone()).await;
    wait_state(&h, "the baseline", 120, |s| set_done(s, 5000)).await;
    wait_state(&h, "an active subscription", 20, |s| {
        s.sets()
            .unwrap()
            .first()
            .and_then(|r| s.subscription(r.id).unwrap())
            .is_some_and(|sub| sub.state == SubState::Active)
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(
            h.state()
                .held(
                    1,
                    &format!("{}/files/papers/d7/r7.txt", app.config.base_url())
                )
                .unwrap()
                .unwrap()
                .path
        )
        .unwrap(),
        "resource 7\n"
    );

    let mut batch = Vec::new();
    for i in 0..100 {
        batch.push(file_line(
            &root,
            "created",
            &format!("new/n{i}.txt"),
            &format!("new {i}\n"),
        ));
        batch.push(file_line(
            &root,
            "updated",
            &format!("d{}/r{i}.txt", i % 50),
            &format!("second version {i}\n"),
        ));
        let gone = format!("d{}/r{}.txt", (4000 + i) % 50, 4000 + i);
        std::fs::remove_file(root.join(&gone)).unwrap();
        batch.push(change_line("deleted", &gone, "", 0));
    }
    for chunk in batch.chunks(30) {
        app.ingest_ok("papers", &chunk.join("\n")).await;
    }
    wait_state(&h, "300 changes applied by push", 60, |s| {
        applied(s) == 300 && pending(s) == 0
    })
    .await;
    let (report, in_sync) = audit(&hc).await;
    assert!(in_sync, "{report}");
    assert!(
        report.contains("5000 listed") && report.contains("0 held but no longer listed"),
        "{report}"
    );
    let row = h.state().sets().unwrap()[0].clone();
    assert!(row.last_push_at.is_some(), "applied by push");
    // The exec hook saw each applied change once, as JSON.
    let hooks: Vec<serde_json::Value> = std::fs::read_to_string(&hook_log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(hooks.len(), 300);
    let created = hooks.iter().find(|v| v["change"] == "created").unwrap();
    assert_eq!(
        std::fs::read_to_string(created["path"].as_str().unwrap())
            .unwrap()
            .len() as u64,
        created["length"].as_u64().unwrap()
    );
    assert_eq!(
        hooks.iter().filter(|v| v["change"] == "deleted").count(),
        100
    );
    h.stop().await;
    app.stop().await;
}

/// The set's single subscription, once the hub has verified it.
async fn active_subscription(
    h: &TestHarvester,
) -> resourcesync_hub::destination::state::Subscription {
    wait_state(h, "an active subscription", 20, |s| {
        s.sets()
            .unwrap()
            .first()
            .and_then(|r| s.subscription(r.id).unwrap())
            .is_some_and(|sub| sub.state == SubState::Active)
    })
    .await;
    let s = h.state();
    let id = s.sets().unwrap()[0].id;
    s.subscription(id).unwrap().unwrap()
}

/// A small set served by our server, its files in `root`.
pub async fn small_source(
    n: usize,
    tweak: impl FnOnce(&mut resourcesync_hub::config::Config),
) -> (TestApp, tempfile::TempDir, PathBuf) {
    let (mut c, dir) = hub_config();
    let root = dir.path().join("root");
    add_file_set(&mut c, "papers", &root, None);
    tweak(&mut c);
    let app = TestApp::start_with(c).await;
    let lines: Vec<String> = (0..n)
        .map(|i| {
            file_line(
                &root,
                "created",
                &format!("r{i}.txt"),
                &format!("resource {i}\n"),
            )
        })
        .collect();
    app.ingest_ok("papers", &lines.join("\n")).await;
    (app, dir, root)
}

/// A delivery signed with the wrong secret, or not signed, is acknowledged (2xx), counted and
/// ignored: nothing is queued or written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrongly_signed_deliveries_are_acknowledged_ignored_and_counted() {
    let (app, dir, root) = small_source(3, |_| {}).await;
    let h = TestHarvester::start(harvest_config(
        dir.path(),
        &app.url("/.well-known/resourcesync"),
    ))
    .await;
    wait_state(&h, "the baseline", 30, |s| set_done(s, 3)).await;
    let sub = active_subscription(&h).await;
    file_line(&root, "created", "forged.txt", "forged\n");
    let uri = format!("{}/files/papers/forged.txt", app.config.base_url());
    let body = format!(
        r#"<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:ln rel="up" href="{cap}"/><rs:md capability="change-notification" from="2000-01-01T00:00:00Z" until="2100-01-01T00:00:00Z"/><url><loc>{uri}</loc><rs:md change="created" datetime="2099-01-01T00:00:00Z" length="7"/></url></urlset>"#,
        cap = app.url("/sets/papers/capabilitylist.xml")
    );
    let wrong = resourcesync_hub::hub::signature(
        resourcesync_hub::hub::SignatureAlg::Sha256,
        b"not-the-secret",
        body.as_bytes(),
    );
    for sig in [Some(wrong.as_str()), None] {
        let mut rq = app
            .client
            .post(&sub.callback)
            .header("content-type", "application/xml")
            .body(body.clone());
        if let Some(s) = sig {
            rq = rq.header("x-hub-signature", s);
        }
        let r = rq.send().await.unwrap();
        assert!(r.status().is_success(), "acknowledged: {}", r.status());
    }
    let s = h.state();
    assert_eq!(
        (
            s.counter("bad_signature").unwrap(),
            s.counter("unsigned").unwrap()
        ),
        (1, 1)
    );
    assert_eq!((applied(&s), pending(&s)), (0, 0), "nothing queued");
    assert!(s.held(1, &uri).unwrap().is_none());
    assert!(!dir
        .path()
        .join("mirror")
        .join(format!(
            "127.0.0.1_{}",
            app.addr.rsplit(':').next().unwrap()
        ))
        .join("files/papers/forged.txt")
        .exists());
    assert!(destination::status(&h.cfg)
        .unwrap()
        .contains("1 unsigned, 1 with a wrong signature"));
    h.stop().await;
    app.stop().await;
}

/// A resource served with content that does not match its listed md5 is not written, stays
/// queued, and holds the position; once it is served correctly it is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_md5_holds_the_position_until_the_resource_is_served_right() {
    let (app, dir, root) = small_source(3, |_| {}).await;
    let mut hc = harvest_config(dir.path(), &app.url("/.well-known/resourcesync"));
    hc.follow.check_interval_secs = 1;
    hc.fetch.max_tries = 2;
    let h = TestHarvester::start(hc.clone()).await;
    wait_state(&h, "the baseline", 30, |s| set_done(s, 3)).await;
    active_subscription(&h).await;
    // Listed as "fixed\n", served as "brokn\n" (same length: only the md5 tells).
    let line = file_line(&root, "updated", "r1.txt", "fixed\n");
    std::fs::write(root.join("r1.txt"), "brokn\n").unwrap();
    app.ingest_ok("papers", &line).await;
    let later = file_line(&root, "updated", "r2.txt", "fine\n");
    app.ingest_ok("papers", &later).await;
    wait_state(
        &h,
        "the good change applied and the bad one failed",
        30,
        |s| {
            applied(s) == 1
                && s.problems().unwrap().iter().any(|(_, p)| {
                    p.standing == resourcesync_hub::destination::state::Standing::Failed
                        && p.change.uri.ends_with("/r1.txt")
                })
        },
    )
    .await;
    let s = h.state();
    let row = s.sets().unwrap()[0].clone();
    let bad = s.pending(row.id).unwrap()[0].clone();
    assert!(
        bad.last_error.as_deref().unwrap().contains("md5"),
        "{:?}",
        bad.last_error
    );
    assert!(
        row.position.unwrap() <= bad.change.datetime,
        "the position does not pass the failed change"
    );
    let uri = format!("{}/files/papers/r1.txt", app.config.base_url());
    assert_eq!(
        std::fs::read_to_string(s.held(row.id, &uri).unwrap().unwrap().path).unwrap(),
        "resource 1\n",
        "not written"
    );
    assert!(destination::status(&hc).unwrap().contains("FAILED"));

    std::fs::write(root.join("r1.txt"), "fixed\n").unwrap();
    // The position moves once the pass that applied it ends (a moment after the record).
    wait_state(
        &h,
        "the fixed resource applied, the position past it",
        30,
        |s| {
            applied(s) == 2
                && pending(s) == 0
                && s.sets().unwrap()[0].position.unwrap() > bad.change.datetime
        },
    )
    .await;
    let s = h.state();
    assert_eq!(
        std::fs::read_to_string(s.held(row.id, &uri).unwrap().unwrap().path).unwrap(),
        "fixed\n"
    );
    h.stop().await;
    app.stop().await;
}

/// The subscription removed at the hub while changes go on: the periodic check catches up
/// from the Change Lists and the harvester subscribes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_subscription_is_caught_up_and_renewed() {
    const ADMIN: &str = "admin-token-for-tests";
    let (app, dir, root) = small_source(3, |c| c.admin.token = ADMIN.into()).await;
    let mut hc = harvest_config(dir.path(), &app.url("/.well-known/resourcesync"));
    hc.follow.check_interval_secs = 1;
    let h = TestHarvester::start(hc).await;
    wait_state(&h, "the baseline", 30, |s| set_done(s, 3)).await;
    let sub = active_subscription(&h).await;
    let list = |app: &TestApp| {
        let rq = app
            .client
            .get(app.url("/admin/v1/subscriptions"))
            .bearer_auth(ADMIN);
        async move {
            rq.send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    let items = list(&app).await;
    let id = items["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["callback"] == sub.callback.as_str())
        .unwrap()["id"]
        .clone();
    let r = app
        .client
        .delete(app.url(&format!(
            "/admin/v1/subscriptions/{}",
            id.as_str().map_or(id.to_string(), String::from)
        )))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let lines: Vec<String> = (0..20)
        .map(|i| {
            file_line(
                &root,
                "created",
                &format!("later/{i}.txt"),
                &format!("later {i}\n"),
            )
        })
        .collect();
    app.ingest_ok("papers", &lines.join("\n")).await;
    wait_state(&h, "the 20 changes caught up", 30, |s| {
        applied(s) == 20 && pending(s) == 0
    })
    .await;
    wait_until("a new subscription at the hub", || async {
        list(&app).await["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["callback"] == sub.callback.as_str() && i["state"] == "active")
    })
    .await;
    h.stop().await;
    app.stop().await;
}

/// The harvester as a child process (`harvest --config FILE`), its log drained.
pub struct ChildHarvester {
    pub child: std::process::Child,
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl ChildHarvester {
    pub fn start(config: &Path) -> ChildHarvester {
        ChildHarvester::start_in(config, Path::new("."))
    }

    /// Started from the folder `cwd`.
    pub fn start_in(config: &Path, cwd: &Path) -> ChildHarvester {
        ChildHarvester::start_limited(config, cwd, None)
    }

    /// Started from the folder `cwd`, with `nofile` as its soft and hard limits of open files.
    pub fn start_limited(config: &Path, cwd: &Path, nofile: Option<u64>) -> ChildHarvester {
        use std::io::{BufRead, BufReader};
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(ChildServer::BIN);
        cmd.current_dir(cwd)
            .args(["harvest", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        if let Some(n) = nofile {
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let l = libc::rlimit {
                        rlim_cur: n as libc::rlim_t,
                        rlim_max: n as libc::rlim_t,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = log.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        ChildHarvester { child, log }
    }

    /// The process's peak resident memory so far, in bytes (`VmHWM`).
    pub fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        kb * 1024
    }

    /// Sends SIGTERM and waits for the exit: how long it took, and the exit status.
    pub fn terminate(mut self) -> (Duration, std::process::ExitStatus) {
        let started = std::time::Instant::now();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = started + Duration::from_secs(20);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return (started.elapsed(), s);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "still running 20 s after SIGTERM:\n{}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for ChildHarvester {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port for a child's callback server.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The harvester killed (SIGKILL) while changes stream in; 200 more while it is down, across
/// a Change List that closes meanwhile; restarted, it fills the gap from the Change Lists
/// (following the index), the audit says IN SYNC, and its log holds every change once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_stream_it_resumes_from_the_change_lists_and_applies_nothing_twice() {
    let (app, dir, root) = small_source(200, |c| {
        c.sets.get_mut("papers").unwrap().max_items_in_list = Some(150);
    })
    .await;
    let cfg_file = dir.path().join("harvest.toml");
    std::fs::write(
        &cfg_file,
        format!(
            "[source]\nurl = \"{}\"\n[state]\ndir = \"{}\"\n[output]\ndir = \"{}\"\n[push]\nlisten = \"127.0.0.1:{}\"\n[follow]\ncheck_interval_secs = 1\n[fetch]\nbackoff_initial_ms = 20\n",
            app.url("/.well-known/resourcesync"),
            dir.path().join("state").display(),
            dir.path().join("mirror").display(),
            free_port()
        ),
    )
    .unwrap();
    let hc = HarvestConfig::load(Some(&cfg_file)).unwrap();
    let state = || State::open(&hc.database_path()).unwrap();
    let wait = |what: &'static str, check: Box<dyn Fn(&State) -> bool>| {
        let db = hc.database_path();
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                if db.exists() && check(&State::open(&db).unwrap()) {
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "timed out waiting for {what}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let h = ChildHarvester::start(&cfg_file);
    wait("the baseline", Box::new(|s| set_done(s, 200))).await;
    let lists_before = app
        .get_doc("/sets/papers/changelist.xml")
        .await
        .1
        .entries
        .len();

    // 100 changes in batches; kill once some (not all) are applied.
    let mut n = 0;
    let change = |root: &Path, n: &mut usize| {
        *n += 1;
        let n = *n;
        match n % 3 {
            0 => file_line(root, "created", &format!("k/{n}.txt"), &format!("k {n}\n")),
            1 => file_line(
                root,
                "updated",
                &format!("r{}.txt", n % 200),
                &format!("v{n}\n"),
            ),
            _ => file_line(
                root,
                "created",
                &format!("k2/{n}.txt"),
                &format!("k2 {n}\n"),
            ),
        }
    };
    for _ in 0..10 {
        let batch: Vec<String> = (0..10).map(|_| change(&root, &mut n)).collect();
        app.ingest_ok("papers", &batch.join("\n")).await;
        if applied(&state()) >= 30 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    wait("some changes applied", Box::new(|s| applied(s) >= 10)).await;
    let log = h.log.lock().unwrap().clone();
    h.kill();
    let sent_before = n;
    // While it is down: the rest of the 100, then 200 more (the open list closes at 150).
    while n < 300 {
        let batch: Vec<String> = (0..10).map(|_| change(&root, &mut n)).collect();
        app.ingest_ok("papers", &batch.join("\n")).await;
    }
    let lists_after = app
        .get_doc("/sets/papers/changelist.xml")
        .await
        .1
        .entries
        .len();
    assert!(
        lists_after > lists_before.max(1),
        "a Change List closed while the harvester was down ({lists_before} -> {lists_after})"
    );
    assert!(sent_before < 300);

    let h = ChildHarvester::start(&cfg_file);
    wait(
        "every change applied",
        Box::new(|s| applied(s) == 300 && pending(s) == 0),
    )
    .await;
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(ChildServer::BIN)
            .args(["harvest", "audit", "--config"])
            .arg(&cfg_file)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && report.contains("IN SYNC") && !report.contains("NOT IN SYNC"),
        "{report}\n{}",
        h.log.lock().unwrap()
    );
    // The log of applied changes has each of the 300 once: nothing applied twice, nothing lost.
    let s = state();
    assert_eq!(s.applied_count(1).unwrap(), 300);
    drop(log);
    drop(h);
    app.stop().await;
}

/// Serves `dir` as plain static files on 127.0.0.1:0 (what a py-resourcesync deployment
/// puts behind a web server); returns the base URL.
pub async fn static_server(dir: PathBuf) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback_service(tower_http::services::ServeDir::new(dir));
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// Writes `body` to `path` with a modification time 5 s ahead (what `resync-build` reads as
/// `lastmod`, to the second).
pub fn write_ahead(path: &Path, body: &str) {
    std::fs::write(path, body).unwrap();
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(std::time::SystemTime::now() + Duration::from_secs(5))
        .unwrap();
}

pub fn resync_build(args: &[&str]) {
    let out = std::process::Command::new(PyEnv::get().bin("resync-build"))
        .args(args)
        .output()
        .unwrap();
    let text = output_text(&out);
    assert!(
        out.status.success() && !text.contains("Traceback"),
        "resync-build {args:?}:\n{text}"
    );
}

/// A source nobody here wrote: documents made by the Python reference tool `resync-build` for
/// a folder, served as static files. Baseline from its Resource List, then an incremental
/// sync from the Change List it writes (no `datetime`, no md5, deletions dated by their old
/// `lastmod`), including an update that keeps the length (seen by its `lastmod` alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_build_static_source_baselines_and_follows_its_change_list() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site");
    let files = site.join("files");
    std::fs::create_dir_all(files.join("sub")).unwrap();
    for i in 0..20 {
        std::fs::write(files.join(format!("sub/f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let base = static_server(site.clone()).await;
    let map = format!("{base}/files/={}", files.display());
    let (rl, cl, cap) = (
        site.join("resourcelist.xml"),
        site.join("changelist.xml"),
        site.join("capabilitylist.xml"),
    );
    let caps = format!("resourcelist={base}/resourcelist.xml,changelist={base}/changelist.xml");
    tokio::task::spawn_blocking({
        let (rl, cl, cap, map, caps) = (
            rl.clone(),
            cl.clone(),
            cap.clone(),
            map.clone(),
            caps.clone(),
        );
        move || {
            resync_build(&[
                "--write-resourcelist",
                "--outfile",
                rl.to_str().unwrap(),
                &map,
            ]);
            resync_build(&[
                "--write-changelist",
                "--empty",
                "--outfile",
                cl.to_str().unwrap(),
            ]);
            resync_build(&[
                "--write-capabilitylist",
                &caps,
                "--outfile",
                cap.to_str().unwrap(),
            ]);
        }
    })
    .await
    .unwrap();

    let mut hc = harvest_config(dir.path(), &format!("{base}/capabilitylist.xml"));
    hc.push.enabled = false;
    hc.follow.check_interval_secs = 1;
    let h = TestHarvester::start(hc.clone()).await;
    wait_state(
        &h,
        "the baseline from resync-build's Resource List",
        30,
        |s| set_done(s, 20),
    )
    .await;
    let (report, in_sync) = audit(&hc).await;
    assert!(in_sync, "{report}");

    // Changes on disk, described by resync-build's Change List against its Resource List.
    for i in 0..3 {
        std::fs::write(
            files.join(format!("sub/f{i}.txt")),
            format!("file {i}, second version\n"),
        )
        .unwrap();
    }
    // An update that keeps the length: without md5 in resync-build's lists, only its
    // lastmod tells (the file's time is set ahead: lastmod has one-second resolution).
    write_ahead(&files.join("sub/f5.txt"), "FILE 5\n");
    std::fs::remove_file(files.join("sub/f19.txt")).unwrap();
    std::fs::write(files.join("sub/new.txt"), "new\n").unwrap();
    let (rl_now, map_now) = (rl.clone(), map.clone());
    tokio::task::spawn_blocking(move || {
        let (rl, map) = (rl_now, map_now);
        let tmp = cl.with_extension("new");
        resync_build(&[
            "--write-changelist",
            "--reference",
            rl.to_str().unwrap(),
            "--outfile",
            tmp.to_str().unwrap(),
            &map,
        ]);
        std::fs::rename(&tmp, &cl).unwrap();
    })
    .await
    .unwrap();
    wait_state(&h, "the incremental from the Change List", 30, |s| {
        applied(s) == 6 && pending(s) == 0
    })
    .await;
    let f5 = h
        .state()
        .held(1, &format!("{base}/files/sub/f5.txt"))
        .unwrap()
        .unwrap();
    assert_eq!(std::fs::read_to_string(f5.path).unwrap(), "FILE 5\n");
    // The audit against a new Resource List (no md5 either): in sync; then a same-length
    // change the harvester was not told of is seen by its lastmod.
    let rebuild = |rl: PathBuf, map: String| async move {
        tokio::task::spawn_blocking(move || {
            resync_build(&[
                "--write-resourcelist",
                "--outfile",
                rl.to_str().unwrap(),
                &map,
            ])
        })
        .await
        .unwrap()
    };
    rebuild(rl.clone(), map.clone()).await;
    let (report, in_sync) = audit(&hc).await;
    assert!(in_sync, "{report}");
    write_ahead(&files.join("sub/f6.txt"), "FILE 6\n");
    rebuild(rl.clone(), map.clone()).await;
    let (report, in_sync) = audit(&hc).await;
    assert!(
        !in_sync && report.contains("f6.txt (the list's lastmod is newer"),
        "{report}"
    );
    let held = h
        .state()
        .held(1, &format!("{base}/files/sub/f1.txt"))
        .unwrap()
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(held.path).unwrap(),
        "file 1, second version\n"
    );
    assert!(
        h.state()
            .held(1, &format!("{base}/files/sub/f19.txt"))
            .unwrap()
            .is_none(),
        "deleted"
    );
    h.stop().await;
}

/// The harvester killed (SIGKILL) in the middle of a baseline, with files already in the
/// mirror whose state record was not yet committed (records go in batches, in the
/// background): restarted, it finishes the baseline with every resource held once, each file
/// as served, nothing left half-written, and the audit says IN SYNC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_baseline_between_files_and_their_record_it_loses_nothing() {
    const N: u64 = 3000;
    let (app, dir, _root) = small_source(N as usize, |_| {}).await;
    let mirror = dir.path().join("mirror");
    let cfg_file = dir.path().join("harvest.toml");
    // Requests 1 ms apart: the baseline takes seconds, so it can be caught in the middle.
    std::fs::write(
        &cfg_file,
        format!(
            "[source]\nurl = \"{}\"\n[state]\ndir = \"{}\"\n[output]\ndir = \"{}\"\n[push]\nenabled = false\n[fetch]\nper_host_delay_ms = 1\n",
            app.url("/.well-known/resourcesync"),
            dir.path().join("state").display(),
            mirror.display(),
        ),
    )
    .unwrap();
    let hc = HarvestConfig::load(Some(&cfg_file)).unwrap();
    let db = hc.database_path();
    let held = |db: &Path| {
        let s = State::open(db).unwrap();
        s.sets().unwrap().first().map_or((0, false), |r| {
            (s.count_held(r.id).unwrap(), r.baseline_done)
        })
    };
    let files = |mirror: &Path| -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut dirs = vec![mirror.to_path_buf()];
        while let Some(d) = dirs.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.map(Result::unwrap) {
                if e.file_type().unwrap().is_dir() {
                    dirs.push(e.path());
                } else {
                    out.push(e.path());
                }
            }
        }
        out
    };
    let h = ChildHarvester::start(&cfg_file);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if db.exists() {
            let (n, done) = held(&db);
            assert!(
                !done,
                "the baseline finished before it could be interrupted"
            );
            if n >= 256 && files(&mirror).len() as u64 > n + 10 {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no batch recorded in 60 s:\n{}",
            h.log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.kill();
    let (recorded, done) = held(&db);
    let written = files(&mirror)
        .iter()
        .filter(|p| !p.components().any(|c| c.as_os_str() == ".rshub-tmp"))
        .count() as u64;
    assert!(!done && recorded < N);
    assert!(
        written > recorded,
        "killed with files in the mirror not yet recorded ({written} files, {recorded} held)"
    );

    let h = ChildHarvester::start(&cfg_file);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while held(&db) != (N, true) {
        assert!(
            std::time::Instant::now() < deadline,
            "the baseline did not finish after the restart ({:?}):\n{}",
            held(&db),
            h.log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.kill();
    let mut all = files(&mirror);
    all.retain(|p| !p.components().any(|c| c.as_os_str() == ".rshub-tmp"));
    assert_eq!(all.len() as u64, N, "one file per resource, no strays");
    for p in &all {
        let name = p.file_name().unwrap().to_str().unwrap();
        let i: u64 = name
            .trim_start_matches('r')
            .trim_end_matches(".txt")
            .parse()
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(p).unwrap(),
            format!("resource {i}\n"),
            "{}",
            p.display()
        );
    }
    let (report, ok) = audit(&hc).await;
    assert!(ok && report.contains("IN SYNC"), "{report}");
    app.stop().await;
}

const RS: &str = r#"xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/""#;

/// A static source's set `name` in `site`: a Capability List, a Resource List of `n` files and
/// an empty Change List.
fn static_set(site: &Path, base: &str, name: &str, n: usize) {
    let dir = site.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let mut urls = String::new();
    for i in 0..n {
        let body = format!("{name} file {i}\n");
        std::fs::write(dir.join(format!("f{i}.txt")), &body).unwrap();
        urls.push_str(&format!(
            "<url><loc>{base}/{name}/f{i}.txt</loc><lastmod>2026-01-01T00:00:00Z</lastmod><rs:md length=\"{}\" hash=\"md5:{}\"/></url>",
            body.len(),
            md5_hex(body.as_bytes())
        ));
    }
    let up = format!("<rs:ln rel=\"up\" href=\"{base}/{name}/capabilitylist.xml\"/>");
    for (file, body) in [
        (
            "capabilitylist.xml",
            format!(
                "<rs:ln rel=\"up\" href=\"{base}/sourcedescription.xml\"/><rs:md capability=\"capabilitylist\"/>\
                 <url><loc>{base}/{name}/resourcelist.xml</loc><rs:md capability=\"resourcelist\"/></url>\
                 <url><loc>{base}/{name}/changelist.xml</loc><rs:md capability=\"changelist\"/></url>"
            ),
        ),
        (
            "resourcelist.xml",
            format!("{up}<rs:md capability=\"resourcelist\" at=\"2026-01-01T00:00:00Z\"/>{urls}"),
        ),
        (
            "changelist.xml",
            format!("{up}<rs:md capability=\"changelist\" from=\"2026-01-01T00:00:00Z\"/>"),
        ),
    ] {
        std::fs::write(
            dir.join(file),
            format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<urlset {RS}>{body}</urlset>\n"),
        )
        .unwrap();
    }
}

/// The static source's Source Description, listing `sets`.
fn static_description(site: &Path, base: &str, sets: &[&str]) {
    let urls: String = sets
        .iter()
        .map(|s| {
            format!("<url><loc>{base}/{s}/capabilitylist.xml</loc><rs:md capability=\"capabilitylist\"/></url>")
        })
        .collect();
    let tmp = site.join("sourcedescription.new");
    std::fs::write(
        &tmp,
        format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<urlset {RS}><rs:md capability=\"description\"/>{urls}</urlset>\n"),
    )
    .unwrap();
    std::fs::rename(&tmp, site.join("sourcedescription.xml")).unwrap();
}

/// A harvester following every set of its source (`sets = []`) follows a set the source
/// lists after it started, within a check, and says of a set the source stopped listing that
/// it is no longer followed; neither needs a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_listed_later_is_followed_and_one_dropped_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site");
    let base = static_server(site.clone()).await;
    static_set(&site, &base, "a", 3);
    static_description(&site, &base, &["a"]);
    let mut hc = harvest_config(dir.path(), &format!("{base}/sourcedescription.xml"));
    hc.push.enabled = false;
    hc.follow.check_interval_secs = 1;
    assert!(hc.source.sets.is_empty(), "every set the source lists");
    let h = TestHarvester::start(hc.clone()).await;
    wait_state(&h, "set a", 30, |s| set_done(s, 3)).await;

    // A second set appears at the source.
    static_set(&site, &base, "b", 4);
    static_description(&site, &base, &["a", "b"]);
    let listed = std::time::Instant::now();
    wait_state(&h, "set b mirrored", 30, |s| {
        let sets = s.sets().unwrap();
        sets.len() == 2 && sets[1].baseline_done && s.count_held(sets[1].id).unwrap() == 4
    })
    .await;
    let took = listed.elapsed();
    assert!(
        h.state()
            .held(2, &format!("{base}/b/f3.txt"))
            .unwrap()
            .is_some(),
        "b's files mirrored"
    );
    eprintln!("set b mirrored {took:?} after it was listed (check interval 1 s)");

    // Set a is no longer listed: it is said, and b goes on.
    static_description(&site, &base, &["b"]);
    wait_state(&h, "set a reported gone", 30, |s| {
        s.sets().unwrap()[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("no longer lists this set"))
    })
    .await;
    let status = destination::status(&hc).unwrap();
    assert!(status.contains("no longer lists this set"), "{status}");
    h.stop().await;
}
