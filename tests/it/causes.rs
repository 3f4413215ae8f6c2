//! Errors an operator must act on reach the log and the answer or status with their cause, in
//! words: a full disk under the embedded store, a locked state database, a TLS failure and a
//! DNS failure. The disk and the DNS are made to fail for real, in a mount namespace of the
//! process under test (`unshare`, util-linux): a small tmpfs as its data folder, and a
//! `resolv.conf` naming a loopback resolver where nothing listens (no query leaves the
//! machine).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{change_line, md5_hex, ChildServer};

/// `unshare` of the process under test: its own user and mount namespace, in which `setup`
/// (shell) runs before the program is exec'd (so the child's pid is the program's).
fn in_namespace(setup: &str, program: &str) -> Command {
    let mut c = Command::new("unshare");
    c.args(["--user", "--map-root-user", "--mount", "sh", "-c"])
        .arg(format!("{setup} && exec \"$0\" \"$@\""))
        .arg(program);
    c
}

#[tokio::test]
async fn a_full_disk_under_the_embedded_store_is_a_503_and_the_log_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let cfg = tmp.path().join("server.toml");
    std::fs::write(
        &cfg,
        "[ingest]\ntoken = \"w\"\n[sets.papers]\nurl_prefix = \"http://example.org/papers/\"\n",
    )
    .unwrap();
    let mut cmd = in_namespace(
        &format!(
            "mount -t tmpfs -o size=600k tmpfs {}",
            data.to_str().unwrap()
        ),
        ChildServer::BIN,
    );
    cmd.args(["serve", "--config", cfg.to_str().unwrap(), "--data-dir"])
        .arg(&data);
    let server = ChildServer::spawn(cmd);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    // Batches of changes until the disk is full; every batch before is kept.
    let mut accepted = 0;
    let refused = loop {
        assert!(accepted < 2000, "600 KB never filled up");
        let batch: Vec<String> = (0..50)
            .map(|i| {
                let n = accepted * 50 + i;
                let rel = format!(
                    "{}/paper-{n}-with-a-longer-name-to-fill-pages.xml",
                    "x".repeat(40)
                );
                change_line("created", &rel, &md5_hex(rel.as_bytes()), 100)
            })
            .collect();
        let r = client
            .post(server.url("/api/v1/resource-sets/papers/changes"))
            .bearer_auth("w")
            .header("content-type", "application/x-ndjson")
            .body(batch.join("\n"))
            .send()
            .await
            .unwrap();
        if r.status() != 200 {
            break r;
        }
        accepted += 1;
    };
    assert_eq!(refused.status(), 503, "a full disk may pass: 503");
    assert!(refused.headers().contains_key("retry-after"));
    let body = refused.text().await.unwrap();
    assert!(
        !body.contains("database"),
        "nothing internal in a 5xx body: {body}"
    );
    // The log has the cause, with what was being done.
    let log = server.wait_for_log("database or disk is full").await;
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("embedded store: database or disk is full")),
        "{log}"
    );
    assert!(accepted > 0, "some batches fitted");
}

/// A harvester's state database held by another program: `harvest status` waits its busy
/// timeout, then says which file and why.
#[test]
fn a_locked_state_database_is_named_with_its_cause() {
    let tmp = tempfile::tempdir().unwrap();
    let f = harvest_toml(tmp.path(), "http://127.0.0.1:9/.well-known/resourcesync");
    let status = || {
        Command::new(ChildServer::BIN)
            .current_dir(tmp.path())
            .args(["harvest", "status", "--config"])
            .arg(&f)
            .output()
            .unwrap()
    };
    // A state as a harvester leaves it; then another program holds it.
    let db = tmp.path().join("state/harvest.sqlite");
    drop(resourcesync_hub::destination::state::State::open(&db).unwrap());
    assert!(status().status.success());
    let holder = rusqlite::Connection::open(&db).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let out = status();
    let text = crate::support::output_text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("harvest state") && text.contains("database is locked"),
        "{text}"
    );
    holder.execute_batch("ROLLBACK").unwrap();
}

/// A harvester configuration in `dir` with one source, `a`, at `url` (no push).
fn harvest_toml(dir: &Path, url: &str) -> PathBuf {
    let f = dir.join("harvest.toml");
    std::fs::write(
        &f,
        format!(
            "[state]\ndir = \"state\"\n[output]\ndir = \"mirror\"\n[push]\nenabled = false\n\
             [[sources]]\nname = \"a\"\nurl = \"{url}\"\n"
        ),
    )
    .unwrap();
    f
}

/// The harvester's log until it says it cannot read the source (60 s at most), and then
/// `harvest status --source` of it: each should say why in words.
fn probe(setup: Option<&str>, url: &str) -> (String, String) {
    use std::io::{BufRead, BufReader};
    let tmp = tempfile::tempdir().unwrap();
    let f = harvest_toml(tmp.path(), url);
    let harvest = |args: &[&str]| {
        let mut cmd = match setup {
            Some(s) => in_namespace(s, ChildServer::BIN),
            None => Command::new(ChildServer::BIN),
        };
        cmd.current_dir(tmp.path())
            .arg("harvest")
            .args(args)
            .arg("--config")
            .arg(&f);
        cmd
    };
    let mut child = harvest(&[])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut log = String::new();
    while !log.contains("cannot read the source yet") {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                log.push_str(&line);
                log.push('\n');
            }
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        log.contains("cannot read the source yet"),
        "the harvester never said it cannot read the source:\n{log}"
    );
    let status =
        crate::support::output_text(&harvest(&["status", "--source", "a"]).output().unwrap());
    (status, log)
}

#[test]
fn a_tls_failure_is_named_with_its_cause() {
    // An https:// URL at a server that speaks plain HTTP (a common slip).
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = plain.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in plain.incoming() {
            let Ok(mut s) = s else { break };
            use std::io::{Read, Write};
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        }
    });
    let (status, log) = probe(
        None,
        &format!("https://127.0.0.1:{port}/.well-known/resourcesync"),
    );
    for text in [&status, &log] {
        assert!(
            // rustls's words for an answer that is not TLS.
            text.contains("received corrupt message of type InvalidContentType"),
            "no TLS cause in:\n{text}"
        );
    }
    assert!(status.contains("reachable:        NO"), "{status}");
}

#[test]
fn a_dns_failure_is_named_with_its_cause() {
    // The harvester's resolver is a loopback address where nothing listens: the name cannot
    // be looked up, and no query leaves the machine.
    let tmp = tempfile::tempdir().unwrap();
    let resolv = tmp.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
    )
    .unwrap();
    let setup = format!("mount --bind {} /etc/resolv.conf", resolv.to_str().unwrap());
    let (status, log) = probe(
        Some(&setup),
        "http://source.rshub-test.example/.well-known/resourcesync",
    );
    for text in [&status, &log] {
        assert!(
            text.contains("cannot resolve the host name"),
            "no DNS cause in:\n{text}"
        );
    }
    assert!(status.contains("reachable:        NO"), "{status}");
}
