//! What a newcomer meets first, walked as the README says: `serve --demo`, a harvester made
//! from `harvest config` with only its source changed, push arriving, and failures said in
//! words.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::harvest::{free_port, ChildHarvester};
use crate::support::*;

/// `harvest config` with `edit` applied to its text, written as `harvest.toml` in `dir`.
fn harvest_toml(dir: &Path, edit: impl Fn(String) -> String) -> std::path::PathBuf {
    let out = std::process::Command::new(ChildServer::BIN)
        .args(["harvest", "config"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = edit(String::from_utf8(out.stdout).unwrap());
    let path = dir.join("harvest.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Replaces the one line starting `key = ` (in the file's order, the first after `table`).
fn set_key(text: String, table: &str, key: &str, value: &str) -> String {
    let start = text.find(&format!("\n[{table}]\n")).unwrap();
    let at = start + text[start..].find(&format!("\n{key} = ")).unwrap() + 1;
    let end = at + text[at..].find('\n').unwrap();
    format!("{}{key} = {value}{}", &text[..at], &text[end..])
}

/// `harvest status` of the harvester configured by `config`.
fn status(config: &Path) -> String {
    let out = std::process::Command::new(ChildServer::BIN)
        .args(["harvest", "status", "--config"])
        .arg(config)
        .output()
        .unwrap();
    output_text(&out)
}

/// Polls `harvest status` until it contains `what`; panics with the status and log after
/// `secs`.
fn wait_status(config: &Path, h: &ChildHarvester, what: &str, secs: u64) -> Duration {
    let started = Instant::now();
    loop {
        let s = status(config);
        if s.contains(what) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(secs),
            "no {what:?} in harvest status after {secs} s:\n{s}\nlog:\n{}",
            h.log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The README's two steps on their defaults: the demo's hub verifies a harvester on the same
/// machine, a change ingested into the demo set is in the mirror by push within 5 s, and the
/// harvester's folders land beside its configuration file wherever it is started from.
#[test]
fn push_works_on_the_defaults() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let server = ChildServer::serve(&["--demo", "--data-dir", data.to_str().unwrap()], &[]);
    assert!(
        server
            .log()
            .contains("the hub calls back loopback addresses"),
        "{}",
        server.log()
    );
    let conf_dir = tmp.path().join("conf");
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&conf_dir).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    let config = harvest_toml(&conf_dir, |t| {
        let t = set_key(
            t,
            "source",
            "url",
            &format!("\"{}\"", server.url("/.well-known/resourcesync")),
        );
        // The callback port: a free one (the default 8900 may be taken on a test machine).
        set_key(
            t,
            "push",
            "listen",
            &format!("\"127.0.0.1:{}\"", free_port()),
        )
    });
    let h = ChildHarvester::start_in(&config, &elsewhere);
    wait_status(&config, &h, "subscription:     active", 60);
    let port = server.addr.rsplit(':').next().unwrap().to_string();
    let mirror_of = |rel: &str| conf_dir.join(format!("mirror/127.0.0.1_{port}/files/demo/{rel}"));
    wait_status(&config, &h, "baseline:         done", 60);
    assert!(
        mirror_of("papers/paper-001.txt").exists(),
        "beside the config file"
    );
    assert!(
        std::fs::read_dir(&elsewhere).unwrap().next().is_none(),
        "nothing in the working directory"
    );

    let body = "A paper ingested while the harvester runs.\n";
    let rel = "papers/paper-new.txt";
    std::fs::write(data.join("demo-files").join(rel), body).unwrap();
    let line = format!(
        r#"{{"change":"created","location":{{"type":"rel_path","value":"{rel}"}},"length":{},"md5":"{}","mime":"text/plain"}}"#,
        body.len(),
        md5_hex(body.as_bytes())
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ingested = Instant::now();
    let r = rt.block_on(async {
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .post(server.url("/api/v1/resource-sets/demo/changes"))
            .header("content-type", "application/x-ndjson")
            .body(line)
            .send()
            .await
            .unwrap()
    });
    assert_eq!(r.status(), 200);
    let file = mirror_of(rel);
    while !file.exists() {
        assert!(
            ingested.elapsed() < Duration::from_secs(5),
            "not in the mirror 5 s after the ingest:\n{}\nlog:\n{}",
            status(&config),
            h.log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("ingest -> mirror by push: {:?}", ingested.elapsed());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), body);
    assert!(status(&config).contains("subscription:     active"));
    let (took, exit) = h.terminate();
    assert!(
        exit.success() && took < Duration::from_secs(5),
        "{exit} after {took:?}"
    );
}

/// A source on a closed port: `harvest status` says "connection refused" within 20 s.
#[test]
fn a_closed_port_is_said_in_words() {
    let tmp = tempfile::tempdir().unwrap();
    let closed = free_port();
    let config = harvest_toml(tmp.path(), |t| {
        let t = set_key(
            t,
            "source",
            "url",
            &format!("\"http://127.0.0.1:{closed}/.well-known/resourcesync\""),
        );
        set_key(t, "push", "listen", "\"127.0.0.1:0\"")
    });
    let h = ChildHarvester::start(&config);
    let took = wait_status(&config, &h, "connection refused", 20);
    eprintln!("status says connection refused after {took:?}");
    let s = status(&config);
    assert!(s.contains("reachable:        NO"), "{s}");
    assert!(!s.contains("Some("), "{s}");
}

/// A set the source does not offer: the harvester stops at once, naming it and the sets the
/// source has.
#[test]
fn a_misspelled_set_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ChildServer::demo(tmp.path());
    let config = harvest_toml(tmp.path(), |t| {
        let t = set_key(
            t,
            "source",
            "url",
            &format!("\"{}\"", server.url("/.well-known/resourcesync")),
        );
        let t = set_key(t, "source", "sets", "[\"dmeo\"]");
        set_key(t, "push", "listen", "\"127.0.0.1:0\"")
    });
    let out = std::process::Command::new(ChildServer::BIN)
        .args(["harvest", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("\"dmeo\"") && err.contains("it offers: demo"),
        "{err}"
    );
}

/// Two harvesters and one callback: the second on the same `push.listen` stops at once and
/// says why; one that gives the first's URL as its `push.callback_url` never takes the
/// first's deliveries, and the first says what it saw.
#[test]
fn two_harvesters_never_share_a_callback() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ChildServer::demo(tmp.path());
    let listen = format!("127.0.0.1:{}", free_port());
    let harvester = |name: &str, edit: &dyn Fn(String) -> String| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        harvest_toml(&dir, |t| {
            let t = set_key(
                t,
                "source",
                "url",
                &format!("\"{}\"", server.url("/.well-known/resourcesync")),
            );
            edit(t)
        })
    };
    let first = harvester("first", &|t| {
        set_key(t, "push", "listen", &format!("\"{listen}\""))
    });
    let a = ChildHarvester::start(&first);
    wait_status(&first, &a, "subscription:     active", 60);

    let same_listen = harvester("second", &|t| {
        set_key(t, "push", "listen", &format!("\"{listen}\""))
    });
    let out = std::process::Command::new(ChildServer::BIN)
        .args(["harvest", "--config"])
        .arg(&same_listen)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("another harvester?"), "{err}");

    let same_url = harvester("third", &|t| {
        let t = set_key(t, "push", "listen", "\"127.0.0.1:0\"");
        set_key(t, "push", "callback_url", &format!("\"http://{listen}\""))
    });
    let c = ChildHarvester::start(&same_url);
    wait_status(&first, &a, "callback requests for another harvester", 30);
    assert!(
        status(&first).contains("subscription:     active"),
        "{}",
        status(&first)
    );
    assert!(
        !status(&same_url).contains("subscription:     active"),
        "{}",
        status(&same_url)
    );
    drop(c);
}

/// A hub that refuses the harvester's callback (loopback, not allowed there): the harvester
/// says so in its status, with the hub's reason, and keeps following by Change Lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_subscription_is_said_with_the_hubs_reason() {
    use crate::harvest::{harvest_config, set_done, wait_state, TestHarvester};
    let (mut c, dir) = test_config();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("a.txt"), "a\n").unwrap();
    add_file_set(&mut c, "papers", &root, None);
    // The hub's defaults: no loopback callbacks.
    assert!(c.hub.allow_networks.is_empty());
    let app = TestApp::start_with(c).await;
    app.ingest_ok(
        "papers",
        &change_line("created", "a.txt", &md5_hex(b"a\n"), 2),
    )
    .await;
    let h = TestHarvester::start(harvest_config(
        dir.path(),
        &app.url("/.well-known/resourcesync"),
    ))
    .await;
    wait_state(&h, "the baseline", 30, |s| set_done(s, 1)).await;
    let reason = |s: &resourcesync_hub::destination::state::State| {
        s.sets()
            .unwrap()
            .first()
            .and_then(|set| s.subscription(set.id).unwrap())
            .and_then(|sub| sub.reason)
    };
    wait_state(&h, "the hub's refusal recorded", 30, |s| {
        reason(s).is_some()
    })
    .await;
    let status = resourcesync_hub::destination::status(&h.cfg).unwrap();
    assert!(
        status.contains("no push because:  the hub")
            && status.contains("refused the subscription")
            && status.contains("hub.allow_networks"),
        "{status}"
    );
    h.stop().await;
    app.stop().await;
}
