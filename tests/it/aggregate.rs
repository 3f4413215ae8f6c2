//! Many sources in one harvester (`[[sources]]`): forty static sources, two of our servers
//! pushing, a slow one and a closed one holding up no other, a bearer token sent to its own
//! source's authority only, politeness per server, status and audit per source, SIGTERM and
//! SIGHUP.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use resourcesync_hub::destination::{self, config::NamedSource};

use crate::harvest::{free_port, harvest_config, wait_state, TestHarvester};
use crate::hostile::{described, entry, rl_md, trickle, urlset, Hostile, SLOW};

pub fn source(name: &str, url: String) -> NamedSource {
    NamedSource {
        name: name.into(),
        url,
        sets: vec![],
        baseline: destination::config::BaselineFrom::ResourceList,
        allow_hosts: vec![],
        token_env: String::new(),
        provider: String::new(),
        weight: 1,
    }
}

/// Resources held by the baselined sets of `source`.
fn held(s: &destination::state::State, source: &str) -> u64 {
    s.sets()
        .unwrap()
        .iter()
        .filter(|r| r.source == source && r.baseline_done)
        .map(|r| s.count_held(r.id).unwrap())
        .sum()
}

/// A static source of `n` text resources at `/r/<i>`; returns it and the bodies.
pub async fn static_source(tag: &str, n: usize) -> (Hostile, Vec<String>) {
    let src = Hostile::start().await;
    let bodies: Vec<String> = (0..n).map(|i| format!("{tag} resource {i}\n")).collect();
    let rl: Vec<String> = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| src.resource(&format!("/r/{i}"), b))
        .collect();
    src.xml("/rl.xml", urlset(&rl_md(), &rl));
    src.source(&[src.set("s", &[("resourcelist", src.url("/rl.xml"))], false)]);
    (src, bodies)
}

/// A static source's resources, each counted: requests in flight now and at most (each body
/// is sent 20 ms after the headers), and requests carrying an `Authorization` header.
#[derive(Clone, Default)]
struct Counted {
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    authorized: Arc<AtomicUsize>,
}

impl Counted {
    /// Serves `body` at `path` of `src`, counted; returns its Resource List entry.
    fn serve(&self, src: &Hostile, path: &str, body: &str) -> String {
        use axum::body::{Body, Bytes};
        let (c, b) = (self.clone(), body.to_string());
        src.on(path, move |h: &HeaderMap| {
            if h.contains_key("authorization") {
                c.authorized.fetch_add(1, Ordering::SeqCst);
            }
            let n = c.now.fetch_add(1, Ordering::SeqCst) + 1;
            c.most.fetch_max(n, Ordering::SeqCst);
            let (now, b) = (c.now.clone(), b.clone());
            let s = futures_util::stream::once(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(Bytes::from(b))
            });
            ([("content-type", "text/plain")], Body::from_stream(s)).into_response()
        });
        entry(&src.url(path), &described(body))
    }
}

/// The harvester's whole day with 40 static sources on their own ports (10 of them with a
/// Change List), two of our servers with hubs, a source trickling one byte a second, one on a
/// closed port and one that needs a bearer token; one harvester process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_sources_and_two_hubs_in_one_harvester() {
    use crate::harvest::{file_line, ChildHarvester};
    use crate::hostile::{change, changelist};
    use crate::support::{add_file_set, output_text, ChildServer, TestApp};
    const STATICS: usize = 40;
    const EACH: usize = 10;
    const POLLED: usize = 10;
    let mut statics = Vec::new();
    for s in 0..STATICS {
        let src = Hostile::start().await;
        let counted = Counted::default();
        let bodies: Vec<String> = (0..EACH)
            .map(|i| format!("s{s:02} resource {i}\n"))
            .collect();
        let rl: Vec<String> = bodies
            .iter()
            .enumerate()
            .map(|(i, b)| counted.serve(&src, &format!("/r/{i}"), b))
            .collect();
        src.xml("/rl.xml", urlset(&rl_md(), &rl));
        let mut docs = vec![("resourcelist", src.url("/rl.xml"))];
        if s < POLLED {
            src.xml("/cl.xml", changelist(&[]));
            docs.push(("changelist", src.url("/cl.xml")));
        }
        src.source(&[src.set("s", &docs, false)]);
        statics.push((format!("s{s:02}"), src, counted, bodies));
    }
    // A slow source: four resources trickling one byte a second.
    let slow = Hostile::start().await;
    let rl: Vec<String> = (0..4)
        .map(|i| {
            let path = format!("/r/{i}");
            slow.on(&path, |_| trickle(SLOW, Duration::from_secs(1)));
            entry(
                &slow.url(&path),
                &described(std::str::from_utf8(SLOW).unwrap()),
            )
        })
        .collect();
    slow.xml("/rl.xml", urlset(&rl_md(), &rl));
    slow.source(&[slow.set("s", &[("resourcelist", slow.url("/rl.xml"))], false)]);
    // A guarded source: every request needs its token; one resource lives on a second host
    // (allowed), which must never see the token.
    let guarded = Hostile::start().await;
    let other = Hostile::start().await;
    let leaked = Arc::new(AtomicUsize::new(0));
    let l = leaked.clone();
    other.on("/x", move |h: &HeaderMap| {
        if h.contains_key("authorization") {
            l.fetch_add(1, Ordering::SeqCst);
        }
        ([("content-type", "text/plain")], "on the other host\n").into_response()
    });
    let guard = |body: String, ct: &'static str| {
        move |h: &HeaderMap| {
            if h.get("authorization").and_then(|v| v.to_str().ok()) == Some("Bearer s3cret") {
                ([("content-type", ct)], body.clone()).into_response()
            } else {
                StatusCode::UNAUTHORIZED.into_response()
            }
        }
    };
    let mut rl = vec![entry(&other.url("/x"), &described("on the other host\n"))];
    for i in 0..5 {
        let body = format!("guarded resource {i}\n");
        guarded.on(&format!("/r/{i}"), guard(body.clone(), "text/plain"));
        rl.push(entry(&guarded.url(&format!("/r/{i}")), &described(&body)));
    }
    guarded.on("/rl.xml", guard(urlset(&rl_md(), &rl), "application/xml"));
    let cap = urlset(
        r#"capability="capabilitylist""#,
        &[entry(
            &guarded.url("/rl.xml"),
            r#"capability="resourcelist""#,
        )],
    );
    guarded.on("/s/capabilitylist.xml", guard(cap, "application/xml"));
    // Two of our servers, with hubs that push to the harvester.
    let mut ours = Vec::new();
    for n in 0..2 {
        let (mut c, dir) = crate::hub::hub_config();
        let root = dir.path().join("root");
        add_file_set(&mut c, "papers", &root, None);
        let app = TestApp::start_with(c).await;
        let lines: Vec<String> = (0..EACH)
            .map(|i| {
                file_line(
                    &root,
                    "created",
                    &format!("r{i}.txt"),
                    &format!("ours {n} resource {i}\n"),
                )
            })
            .collect();
        app.ingest_ok("papers", &lines.join("\n")).await;
        ours.push((format!("ours{n}"), app, root, dir));
    }

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("harvest.toml");
    let mut toml = format!(
        "[state]\ndir = \"state\"\n[output]\ndir = \"mirror\"\n[push]\nlisten = \"127.0.0.1:{}\"\n\
         [follow]\ncheck_interval_secs = 1\n[fetch]\nconcurrency = 8\nper_host_concurrency = 2\nbackoff_initial_ms = 20\n\
         idle_timeout_secs = 60\n",
        free_port()
    );
    let mut add = |name: &str, url: String, extra: &str| {
        toml.push_str(&format!(
            "[[sources]]\nname = \"{name}\"\nurl = \"{url}\"\n{extra}"
        ))
    };
    for (name, src, _, _) in &statics {
        add(name, src.url("/.well-known/resourcesync"), "");
    }
    for (name, app, _, _) in &ours {
        add(name, app.url("/.well-known/resourcesync"), "");
    }
    add("slow", slow.url("/.well-known/resourcesync"), "");
    add(
        "closed",
        format!("http://127.0.0.1:{}/.well-known/resourcesync", free_port()),
        "",
    );
    add(
        "guarded",
        guarded.url("/s/capabilitylist.xml"),
        &format!(
            "token_env = \"AGGREGATE_TEST_GUARDED_TOKEN\"\nallow_hosts = [\"{}\"]\nweight = 3\n",
            other.base.trim_start_matches("http://")
        ),
    );
    // Relative state and output folders: the harvester runs in `dir`.
    std::fs::write(&f, toml).unwrap();
    std::env::set_var("AGGREGATE_TEST_GUARDED_TOKEN", "s3cret");
    let cfg = {
        let mut c = destination::config::HarvestConfig::load(Some(&f)).unwrap();
        c.state.dir = dir.path().join("state");
        c.output.dir = dir.path().join("mirror");
        c
    };
    let db = cfg.database_path();
    let wait =
        |what: &'static str, secs: u64, check: Box<dyn Fn(&destination::state::State) -> bool>| {
            let (db, cfg) = (db.clone(), cfg.clone());
            async move {
                let deadline = std::time::Instant::now() + Duration::from_secs(secs);
                loop {
                    if db.exists() && check(&destination::state::State::open(&db).unwrap()) {
                        return;
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "timed out waiting for {what}:\n{}",
                        destination::status(&cfg).unwrap_or_default()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };

    let started = std::time::Instant::now();
    let h = ChildHarvester::start_in(&f, dir.path());
    let names: Vec<String> = statics
        .iter()
        .map(|s| s.0.clone())
        .chain(ours.iter().map(|o| o.0.clone()))
        .collect();
    let all = names.clone();
    wait(
        "every static source, ours and the guarded one",
        60,
        Box::new(move |s| all.iter().all(|n| held(s, n) == EACH as u64) && held(s, "guarded") == 6),
    )
    .await;
    let took = started.elapsed();
    eprintln!(
        "{} sources baselined in {took:?} beside a trickling and a closed one",
        names.len() + 1
    );
    // The slow source is cut off after 60 s (fetch.idle_timeout_secs): waiting for it would
    // take the others past that; on their own they need seconds, even on a slow machine.
    assert!(
        took < Duration::from_secs(45),
        "the slow source (cut after 60 s) held up the others: {took:?}"
    );
    // Byte for byte, each under its own host folder.
    for (_, src, _, bodies) in &statics {
        let port = src.base.rsplit(':').next().unwrap();
        for (i, b) in bodies.iter().enumerate() {
            let p = dir.path().join(format!("mirror/127.0.0.1_{port}/r/{i}"));
            assert_eq!(&std::fs::read_to_string(&p).unwrap(), b, "{}", p.display());
        }
    }
    for (n, (_, app, _, _)) in ours.iter().enumerate() {
        let port = app
            .config
            .base_url()
            .rsplit(':')
            .next()
            .unwrap()
            .to_string();
        let p = dir
            .path()
            .join(format!("mirror/127.0.0.1_{port}/files/papers/r3.txt"));
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            format!("ours {n} resource 3\n"),
            "{}",
            p.display()
        );
    }
    // Politeness and the token, per server.
    for (name, _, c, _) in &statics {
        let most = c.most.load(Ordering::SeqCst);
        assert!(
            most <= 2,
            "{name} saw {most} requests in flight (per_host_concurrency = 2)"
        );
        assert_eq!(
            c.authorized.load(Ordering::SeqCst),
            0,
            "{name} saw the token"
        );
    }
    assert_eq!(
        leaked.load(Ordering::SeqCst),
        0,
        "the other host saw the token"
    );
    assert!(other.hits("/x") >= 1);

    // Changes: on the first ten static sources by their Change Lists (one update, one
    // create, one delete each), on ours by push.
    let ours_names: Vec<String> = ours.iter().map(|o| o.0.clone()).collect();
    wait(
        "active subscriptions at our two hubs",
        30,
        Box::new(move |s| {
            s.sets()
                .unwrap()
                .iter()
                .filter(|r| ours_names.contains(&r.source))
                .all(|r| {
                    s.subscription(r.id)
                        .unwrap()
                        .is_some_and(|sub| sub.state == destination::state::SubState::Active)
                })
        }),
    )
    .await;
    for (_, src, c, bodies) in statics.iter().take(POLLED) {
        let when = "2026-06-01T00:00:00Z";
        let updated = "updated resource 0\n";
        let created = "a new resource\n";
        // The Resource List says the same as the Change List (the audit reads it).
        let mut rl = vec![c.serve(src, "/r/0", updated), c.serve(src, "/new", created)];
        for (i, b) in bodies.iter().enumerate().skip(2) {
            rl.push(c.serve(src, &format!("/r/{i}"), b));
        }
        src.xml(
            "/rl.xml",
            urlset(
                r#"capability="resourcelist" at="2026-06-01T00:00:00Z""#,
                &rl,
            ),
        );
        src.xml(
            "/cl.xml",
            changelist(&[
                change(&src.url("/r/0"), "updated", when, Some(updated)),
                change(&src.url("/new"), "created", when, Some(created)),
                change(&src.url("/r/1"), "deleted", when, None),
            ]),
        );
    }
    for (n, (_, app, root, _)) in ours.iter().enumerate() {
        let lines: Vec<String> = (0..5)
            .map(|i| {
                file_line(
                    root,
                    "updated",
                    &format!("r{i}.txt"),
                    &format!("ours {n} second {i}\n"),
                )
            })
            .collect();
        app.ingest_ok("papers", &lines.join("\n")).await;
    }
    let ports: Vec<String> = statics
        .iter()
        .take(POLLED)
        .map(|s| s.1.base.rsplit(':').next().unwrap().to_string())
        .collect();
    let ours_ports: Vec<String> = ours
        .iter()
        .map(|o| {
            o.1.config
                .base_url()
                .rsplit(':')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    let mirror = dir.path().join("mirror");
    let (m, polled) = (mirror.clone(), ports.clone());
    wait(
        "every change, polled and pushed",
        30,
        Box::new(move |_| {
            let read = |rel: String| std::fs::read_to_string(m.join(rel)).ok();
            polled.iter().all(|p| {
                read(format!("127.0.0.1_{p}/r/0")).as_deref() == Some("updated resource 0\n")
                    && read(format!("127.0.0.1_{p}/new")).as_deref() == Some("a new resource\n")
                    && read(format!("127.0.0.1_{p}/r/1")).is_none()
            }) && ours_ports.iter().enumerate().all(|(n, p)| {
                (0..5).all(|i| {
                    read(format!("127.0.0.1_{p}/files/papers/r{i}.txt"))
                        == Some(format!("ours {n} second {i}\n"))
                })
            })
        }),
    )
    .await;
    // Ours came by push (the hub's delivery was recorded), not only by the checks.
    let s = destination::state::State::open(&db).unwrap();
    for r in s
        .sets()
        .unwrap()
        .iter()
        .filter(|r| r.source.starts_with("ours"))
    {
        assert!(
            r.last_push_at.is_some(),
            "no push recorded for {}",
            r.source
        );
    }
    drop(s);
    wait(
        "the closed source said in words",
        20,
        Box::new(|s| s.source_failing("closed").unwrap().is_some()),
    )
    .await;

    // Status from the command line: one line per source; the closed one says why in words.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(ChildServer::BIN)
            .current_dir(dir.path())
            .args(["harvest"])
            .args(args)
            .args(["--config"])
            .arg(&f)
            .output()
            .unwrap();
        (out.status, String::from_utf8_lossy(&out.stdout).to_string())
    };
    let (ok, status) = cli(&["status"]);
    assert!(ok.success(), "{status}");
    // An operator looks from a shell that lacks the sources' tokens.
    let out = std::process::Command::new(ChildServer::BIN)
        .current_dir(dir.path())
        .args(["harvest", "status", "--config"])
        .arg(&f)
        .env_remove("AGGREGATE_TEST_GUARDED_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("guarded"),
        "{}",
        output_text(&out)
    );
    eprintln!("{status}");
    let line = |name: &str| {
        status
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no line for {name}:\n{status}"))
            .to_string()
    };
    let closed = line("closed");
    assert!(
        closed.contains(" down ") && closed.contains("connection refused"),
        "{status}"
    );
    for name in &names {
        let l = line(name);
        assert!(l.contains(" up "), "{l}");
    }
    assert!(line("guarded").contains("held 6"), "{status}");
    // Its weight of 3 among sources of 1 (and the limit of open files, from this shell).
    let n = names.len() + 3; // the statics and ours, slow, closed, guarded
    let share = |w: f64| 100.0 * w / (n as f64 + 2.0);
    let shown = |l: &str| -> f64 {
        let after = l
            .split("share ")
            .nth(1)
            .unwrap_or_else(|| panic!("no share: {l}"));
        after.split('%').next().unwrap().parse().unwrap()
    };
    assert!(
        (shown(&line("guarded")) - share(3.0)).abs() < 0.1,
        "{status}"
    );
    assert!(
        (shown(&line("closed")) - share(1.0)).abs() < 0.1,
        "{status}"
    );
    assert!(
        status.starts_with("open files: limit ")
            && status.contains(&format!("this configuration has {n}\n")),
        "{status}"
    );
    line("slow");
    let (ok, detail) = cli(&["status", "--source", "closed"]);
    assert!(
        ok.success()
            && detail.contains("reachable:        NO")
            && detail.contains("connection refused"),
        "{detail}"
    );
    for name in ["s00", "s09", "s39", "ours0", "guarded"] {
        let (ok, report) = cli(&["audit", "--source", name]);
        assert!(
            ok.success() && report.contains("IN SYNC"),
            "{name}: {report}"
        );
    }
    let (ok, report) = cli(&["audit", "--source", "nope"]);
    assert!(!ok.success(), "{report}");

    // SIGTERM while the slow source still trickles.
    let (took, exit) = h.terminate();
    assert!(
        exit.success() && took < Duration::from_secs(5),
        "{exit} after {took:?}"
    );
    // Restarted: every source is checked again and nothing unchanged is fetched again.
    let hits = || -> Vec<usize> {
        statics
            .iter()
            .map(|(_, src, _, _)| {
                (0..EACH)
                    .map(|i| src.hits(&format!("/r/{i}")))
                    .sum::<usize>()
                    + src.hits("/new")
            })
            .chain([(0..5)
                .map(|i| guarded.hits(&format!("/r/{i}")))
                .sum::<usize>()
                + other.hits("/x")])
            .collect()
    };
    let before = hits();
    let restarted = resourcesync_hub::model::Timestamp::now();
    let h = ChildHarvester::start_in(&f, dir.path());
    let checked = names.clone();
    wait(
        "every source checked after the restart",
        30,
        Box::new(move |s| {
            s.sets()
                .unwrap()
                .iter()
                .filter(|r| checked.contains(&r.source))
                .all(|r| r.checked_at.is_some_and(|t| t > restarted))
        }),
    )
    .await;
    let (took, exit) = h.terminate();
    assert!(exit.success(), "{exit} after {took:?}");
    assert_eq!(hits(), before, "nothing fetched again");
}

/// Per authority, over every source: at most `fetch.per_host_concurrency` requests in flight
/// (two sources on one server share it), a 429 with `Retry-After` pauses that server only, and
/// the `User-Agent` names the program and the configured contact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_server_sees_a_polite_harvester() {
    use axum::body::{Body, Bytes};
    let shared = Hostile::start().await;
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let agents = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut lists = Vec::new();
    for set in ["x", "y"] {
        let mut rl = Vec::new();
        for i in 0..12 {
            let body = format!("{set} {i}\n");
            let (now, most, agents, b) = (now.clone(), most.clone(), agents.clone(), body.clone());
            shared.on(&format!("/{set}/{i}"), move |h: &HeaderMap| {
                agents.lock().unwrap().push(
                    h.get("user-agent")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string(),
                );
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                let (now, b) = (now.clone(), b.clone());
                // The request stays in flight for 100 ms, until its body is sent.
                let s = futures_util::stream::once(async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(Bytes::from(b))
                });
                ([("content-type", "text/plain")], Body::from_stream(s)).into_response()
            });
            rl.push(entry(
                &shared.url(&format!("/{set}/{i}")),
                &described(&body),
            ));
        }
        shared.xml(&format!("/{set}/rl.xml"), urlset(&rl_md(), &rl));
        lists.push(shared.set(
            set,
            &[("resourcelist", shared.url(&format!("/{set}/rl.xml")))],
            false,
        ));
    }
    shared.source(&lists);
    // A server that says 429 (Retry-After: 2) to its first resource request.
    let busy = Hostile::start().await;
    let asked = Arc::new(std::sync::Mutex::new(Vec::<std::time::Instant>::new()));
    let mut rl = Vec::new();
    for i in 0..6 {
        let body = format!("busy {i}\n");
        let (asked, b) = (asked.clone(), body.clone());
        busy.on(&format!("/r/{i}"), move |_| {
            let mut a = asked.lock().unwrap();
            a.push(std::time::Instant::now());
            if a.len() == 1 {
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("retry-after", "2")],
                    "slow down",
                )
                    .into_response()
            } else {
                // Slow enough that the 429 is read before a slot frees.
                let b = b.clone();
                let s = futures_util::stream::once(async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, std::io::Error>(Bytes::from(b))
                });
                ([("content-type", "text/plain")], Body::from_stream(s)).into_response()
            }
        });
        rl.push(entry(&busy.url(&format!("/r/{i}")), &described(&body)));
    }
    busy.xml("/rl.xml", urlset(&rl_md(), &rl));
    busy.source(&[busy.set("s", &[("resourcelist", busy.url("/rl.xml"))], false)]);

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = harvest_config(dir.path(), "http://unused.invalid/");
    cfg.push.enabled = false;
    // The 429'd resource is queued and fetched again at the next check.
    cfg.follow.check_interval_secs = 1;
    cfg.fetch.concurrency = 8;
    cfg.fetch.per_host_concurrency = 2;
    cfg.fetch.attempts = 1;
    cfg.fetch.user_agent = "mailto:ops@example.org".into();
    let mut x = source("x", shared.url("/x/capabilitylist.xml"));
    x.sets = vec!["x".into()];
    let mut y = source("y", shared.url("/y/capabilitylist.xml"));
    y.sets = vec!["y".into()];
    cfg.sources = vec![x, y, source("busy", busy.url("/.well-known/resourcesync"))];
    cfg.validate().unwrap();
    let h = TestHarvester::start(cfg.clone()).await;
    let done = |s: &destination::state::State, n: usize| {
        let sets = s.sets().unwrap();
        sets.len() == n
            && sets.iter().all(|r| r.baseline_done)
            && s.count_pending(sets[n - 1].id).unwrap() == 0
    };
    wait_state(&h, "every source baselined", 60, |s| {
        done(s, 3)
            && s.sets()
                .unwrap()
                .iter()
                .all(|r| s.count_held(r.id).unwrap() == if r.source == "busy" { 6 } else { 12 })
    })
    .await;
    h.stop().await;
    let most = most.load(Ordering::SeqCst);
    eprintln!("at most {most} requests in flight at the shared server");
    assert!(
        most <= 2,
        "{most} requests in flight at once (per_host_concurrency = 2)"
    );
    assert!(most == 2, "the two sources did run side by side");
    // After the 429, nothing new starts at that server for its Retry-After (the one request
    // in flight beside it aside).
    let a = asked.lock().unwrap();
    let within = a
        .iter()
        .filter(|t| **t > a[0] && **t - a[0] < Duration::from_millis(1900))
        .count();
    assert!(within <= 1, "{within} requests within 2 s of the 429");
    assert!(
        a.len() - 1 - within >= 3,
        "the rest came after the pause: {} of {}",
        a.len() - 1 - within,
        a.len()
    );
    assert!(a.len() >= 6, "{} requests", a.len());
    let agents = agents.lock().unwrap();
    assert!(
        agents
            .iter()
            .all(|u| u.starts_with("resourcesync-hub-harvest/")
                && u.ends_with("(mailto:ops@example.org)")),
        "{agents:?}"
    );
}

/// SIGHUP with one source removed and one added: the new one is baselined, the one kept goes
/// on without fetching anything again, the removed one is asked for nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_and_removes_sources_without_touching_the_others() {
    use crate::harvest::ChildHarvester;
    use crate::hostile::wait_child;
    let (a, _) = static_source("a", 5).await;
    let (b, _) = static_source("b", 5).await;
    let (c, _) = static_source("c", 5).await;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("harvest.toml");
    let write = |sources: &[(&str, &Hostile)], extra: &str| {
        let mut t = "[state]\ndir = \"state\"\n[output]\ndir = \"mirror\"\n[push]\nenabled = false\n[follow]\ncheck_interval_secs = 3600\n".to_string();
        for (name, src) in sources {
            t.push_str(&format!(
                "[[sources]]\nname = \"{name}\"\nurl = \"{}\"\n",
                src.url("/.well-known/resourcesync")
            ));
        }
        t.push_str(extra);
        std::fs::write(&f, t).unwrap();
    };
    write(&[("a", &a), ("b", &b)], "");
    let h = ChildHarvester::start(&f);
    wait_child(&f, "a and b baselined", 30, |s| {
        held(s, "a") == 5 && held(s, "b") == 5
    })
    .await;
    let hits = |src: &Hostile| (0..5).map(|i| src.hits(&format!("/r/{i}"))).sum::<usize>();
    let (a_before, b_before) = (hits(&a), hits(&b));
    write(&[("a", &a), ("c", &c)], "");
    let ok = std::process::Command::new("kill")
        .args(["-HUP", &h.child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    wait_child(&f, "c baselined after SIGHUP", 30, |s| held(s, "c") == 5).await;
    assert_eq!(hits(&a), a_before, "the kept source fetched nothing again");
    assert_eq!(
        hits(&b),
        b_before,
        "the removed source was asked for nothing more"
    );
    let log = h.log.lock().unwrap().clone();
    assert!(log.contains("SIGHUP: sources reloaded"), "{log}");
    let cfg = destination::config::HarvestConfig::load(Some(&f)).unwrap();
    let status = destination::status(&cfg).unwrap();
    let names: Vec<&str> = status
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        names.contains(&"a") && names.contains(&"c") && !names.contains(&"b"),
        "{status}"
    );
    // A source added with a set it does not offer stops itself, not the harvester.
    write(
        &[("a", &a), ("c", &c)],
        &format!(
            "[[sources]]\nname = \"bad\"\nurl = \"{}\"\nsets = [\"nope\"]\n",
            c.url("/.well-known/resourcesync")
        ),
    );
    let ok = std::process::Command::new("kill")
        .args(["-HUP", &h.child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    wait_child(&f, "the bad source's reason", 30, |s| {
        s.source_failing("bad").unwrap().is_some()
    })
    .await;
    let cfg = destination::config::HarvestConfig::load(Some(&f)).unwrap();
    let status = destination::status(&cfg).unwrap();
    let bad = status
        .lines()
        .find(|l| l.starts_with("bad "))
        .unwrap_or_default();
    assert!(bad.contains("does not offer"), "{status}");
    let (took, exit) = h.terminate();
    assert!(
        exit.success() && took < Duration::from_secs(5),
        "{exit} after {took:?}"
    );
    // Restarted (without the bad source, which at start stops the harvester): every source
    // is followed again, and nothing unchanged is fetched again.
    write(&[("a", &a), ("c", &c)], "");
    let (a_before, c_before) = (hits(&a), hits(&c));
    let restarted = resourcesync_hub::model::Timestamp::now();
    let h = ChildHarvester::start(&f);
    // Each set checked again after the restart (which comes after its baseline was found
    // done): anything fetched again would have been by then.
    wait_child(&f, "a and c checked after the restart", 30, |s| {
        s.sets()
            .unwrap()
            .iter()
            .filter(|r| r.source == "a" || r.source == "c")
            .all(|r| r.checked_at.is_some_and(|t| t > restarted))
    })
    .await;
    let (took, exit) = h.terminate();
    assert!(exit.success(), "{exit} after {took:?}");
    assert_eq!(
        (hits(&a), hits(&c)),
        (a_before, c_before),
        "nothing fetched again"
    );
}

/// A state made with the single `[source]` table is taken over by the `[[sources]]` table
/// that replaces it (nothing fetched again); a second source leading to the same set (its
/// Capability List given directly) is refused with a reason naming the first, not merged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_set_is_followed_by_one_source() {
    let (src, _) = static_source("a", 5).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = harvest_config(dir.path(), &src.url("/.well-known/resourcesync"));
    let mut cfg = {
        let mut c = cfg;
        c.push.enabled = false;
        c.follow.check_interval_secs = 3600;
        c
    };
    let h = TestHarvester::start(cfg.clone()).await;
    wait_state(&h, "the single source baselined", 30, |s| held(s, "") == 5).await;
    h.stop().await;
    let hits = || (0..5).map(|i| src.hits(&format!("/r/{i}"))).sum::<usize>();
    let before = hits();

    cfg.sources = vec![source("moved", src.url("/.well-known/resourcesync"))];
    cfg.validate().unwrap();
    let h = TestHarvester::start(cfg.clone()).await;
    wait_state(&h, "the set taken over", 30, |s| held(s, "moved") == 5).await;
    h.stop().await;
    assert_eq!(hits(), before, "nothing fetched again");

    // Another way to the same set: refused, naming the source that follows it (two sources
    // may share a URL when they follow different sets of it).
    cfg.sources
        .push(source("twin", src.url("/s/capabilitylist.xml")));
    cfg.validate().unwrap();
    let e = tokio::time::timeout(
        Duration::from_secs(30),
        destination::run(cfg.clone(), None, std::future::pending()),
    )
    .await
    .expect("the harvester stops at start")
    .unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("source twin") && e.contains("is followed by source moved already"),
        "{e}"
    );
    assert_eq!(hits(), before, "nothing fetched again");
    let s = destination::state::State::open(&cfg.database_path()).unwrap();
    assert_eq!(held(&s, "moved"), 5);
}

/// Sources that are down wait for their next try without a walk: with one walk in all
/// (`fetch.concurrency = 1`) and six sources on closed ports (each pausing a second and
/// more between tries), the one that is up is baselined at once, not after their pauses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_that_are_down_hold_no_walk() {
    let (src, _) = static_source("up", 5).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = harvest_config(dir.path(), "http://unused.invalid/");
    cfg.push.enabled = false;
    cfg.follow.check_interval_secs = 3600;
    cfg.fetch.concurrency = 1;
    for n in 0..6 {
        cfg.sources.push(source(
            &format!("down{n}"),
            format!("http://127.0.0.1:{}/.well-known/resourcesync", free_port()),
        ));
    }
    cfg.sources
        .push(source("up", src.url("/.well-known/resourcesync")));
    cfg.validate().unwrap();
    let started = std::time::Instant::now();
    let h = TestHarvester::start(cfg).await;
    wait_state(&h, "the source that is up baselined", 20, |s| {
        held(s, "up") == 5
    })
    .await;
    let took = started.elapsed();
    h.stop().await;
    // A down source's first pause is a second, and the six are listed before the one that
    // is up: holding the one walk through their pauses in turn, it would wait at least 6 s
    // (it takes under 0.2 s here; the bound leaves room for a slow machine).
    assert!(
        took < Duration::from_secs(4),
        "the sources that are down held the walk through their pauses: {took:?}"
    );
}

/// A huge source does not starve small ones: with one walk in all (`fetch.concurrency = 1`),
/// the source of 3,000 resources, listed first, passes its walk at a batch boundary to the
/// small sources that wait, which are all baselined while it still walks; it then finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_source_passes_its_walk_to_small_ones() {
    let (big, _) = static_source("big", 3000).await;
    let mut smalls = Vec::new();
    for i in 0..8 {
        smalls.push(static_source(&format!("small{i}"), 3).await.0);
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = harvest_config(dir.path(), "http://unused.invalid/");
    cfg.push.enabled = false;
    cfg.follow.check_interval_secs = 3600;
    cfg.fetch.concurrency = 1;
    cfg.sources
        .push(source("big", big.url("/.well-known/resourcesync")));
    for (i, s) in smalls.iter().enumerate() {
        cfg.sources.push(source(
            &format!("small{i}"),
            s.url("/.well-known/resourcesync"),
        ));
    }
    cfg.validate().unwrap();
    let h = TestHarvester::start(cfg).await;
    let big_first = Arc::new(std::sync::Mutex::new(None));
    let seen = big_first.clone();
    wait_state(&h, "every small source baselined", 60, move |s| {
        let done = (0..8).all(|i| held(s, &format!("small{i}")) == 3);
        if done {
            *seen.lock().unwrap() = Some(held(s, "big"));
        }
        done
    })
    .await;
    let big_then = big_first.lock().unwrap().unwrap();
    assert_eq!(
        big_then, 0,
        "the huge source finished its baseline before the small ones had theirs"
    );
    wait_state(&h, "the huge source baselined", 120, |s| {
        held(s, "big") == 3000
    })
    .await;
    h.stop().await;
}

/// A configuration that cannot fit the limit of open files is refused at start, in words
/// that name the limit: 1,000 sources under a hard limit of 1,024.
#[test]
fn too_many_sources_for_the_open_files_limit_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut toml =
        "[state]\ndir = \"state\"\n[output]\ndir = \"mirror\"\n[push]\nenabled = false\n[fetch]\nconcurrency = 8\n"
            .to_string();
    for i in 0..1000 {
        // Never read: the harvester stops before it reaches any source.
        toml.push_str(&format!(
            "[[sources]]\nname = \"s{i}\"\nurl = \"http://127.0.0.1:{}/.well-known/resourcesync\"\n",
            free_port()
        ));
    }
    let f = dir.path().join("harvest.toml");
    std::fs::write(&f, toml).unwrap();
    let mut h = crate::harvest::ChildHarvester::start_limited(&f, dir.path(), Some(1024));
    let code = h.child.wait().unwrap();
    // Its standard error is read to the end by a thread of its own.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !h.log.lock().unwrap().contains("open files") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = h.log.lock().unwrap().clone();
    assert!(!code.success(), "{text}");
    assert!(
        text.contains("1000 sources at fetch.concurrency 8 may need up to 1128 open files, and the limit of open files is 1024")
            && text.contains("it allows 896 sources"),
        "{text}"
    );
    assert!(
        !dir.path().join("state").exists()
            || std::fs::read_dir(dir.path().join("state")).unwrap().count() == 0,
        "nothing is started"
    );
}

/// SIGHUP with more sources than the limit of open files allows: the new configuration is not
/// applied, the log says why in words naming the limit, and the running source goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_past_the_open_files_limit_keeps_the_running_configuration() {
    use crate::harvest::ChildHarvester;
    use crate::hostile::wait_child;
    let (a, _) = static_source("a", 5).await;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("harvest.toml");
    let d = dir.path().display();
    let head = format!("[state]\ndir = \"{d}/state\"\n[output]\ndir = \"{d}/mirror\"\n[push]\nenabled = false\n[follow]\ncheck_interval_secs = 3600\n[fetch]\nconcurrency = 8\n");
    let one = format!(
        "{head}[[sources]]\nname = \"a\"\nurl = \"{}\"\n",
        a.url("/.well-known/resourcesync")
    );
    std::fs::write(&f, &one).unwrap();
    // 300 allows 300 - 64 - 8 x 8 = 172 sources.
    let h = ChildHarvester::start_limited(&f, dir.path(), Some(300));
    wait_child(&f, "a baselined", 30, |s| held(s, "a") == 5).await;
    let mut many = one.clone();
    for i in 0..199 {
        // Never read: the configuration is refused.
        many.push_str(&format!(
            "[[sources]]\nname = \"x{i}\"\nurl = \"http://127.0.0.1:{}/.well-known/resourcesync\"\n",
            free_port()
        ));
    }
    std::fs::write(&f, many).unwrap();
    let ok = std::process::Command::new("kill")
        .args(["-HUP", &h.child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let said = "200 sources at fetch.concurrency 8 may need up to 328 open files, and the limit of open files is 300";
    crate::support::wait_until("the refusal in the log", || async {
        h.log.lock().unwrap().contains(said)
    })
    .await;
    let log = h.log.lock().unwrap().clone();
    assert!(
        log.contains("it allows 172 sources") && !log.contains("SIGHUP: source started"),
        "{log}"
    );
    assert!(
        log.contains("SIGHUP: the configuration is not applied"),
        "{log}"
    );
    drop(h);
}
