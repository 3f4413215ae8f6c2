//! The binary itself: `import` scans a folder, `serve` starts and stops on SIGTERM, bad
//! configuration fails with a clear message.

use std::process::Command;

use crate::support::ChildServer;

const BIN: &str = ChildServer::BIN;

fn import(dir: &std::path::Path, data: &std::path::Path) -> serde_json::Value {
    import_with_log(dir, data).0
}

/// Runs `import DIR --set docs --data-dir DATA`; the report and what it told the user.
fn import_with_log(dir: &std::path::Path, data: &std::path::Path) -> (serde_json::Value, String) {
    let out = Command::new(BIN)
        .args(["import"])
        .arg(dir)
        .args(["--set", "docs", "--data-dir"])
        .arg(data)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{log}");
    (serde_json::from_slice(&out.stdout).unwrap(), log)
}

#[test]
fn import_records_created_updated_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, data) = (tmp.path().join("docs"), tmp.path().join("data"));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    for i in 0..5 {
        std::fs::write(dir.join(format!("sub/f{i}.txt")), format!("file {i}")).unwrap();
    }
    let r = import(&dir, &data);
    assert_eq!(
        (r["created"].as_u64(), r["scanned"].as_u64()),
        (Some(5), Some(5)),
        "{r}"
    );
    let r = import(&dir, &data);
    assert_eq!(r["unchanged"], 5, "a second scan finds nothing new: {r}");

    std::fs::write(dir.join("sub/f1.txt"), "changed").unwrap();
    std::fs::remove_file(dir.join("sub/f2.txt")).unwrap();
    std::fs::write(dir.join("new.pdf"), "pdf").unwrap();
    let r = import(&dir, &data);
    assert_eq!(
        (
            r["created"].as_u64(),
            r["updated"].as_u64(),
            r["deleted"].as_u64(),
            r["unchanged"].as_u64()
        ),
        (Some(1), Some(1), Some(1), Some(3)),
        "{r}"
    );

    let out = Command::new(BIN)
        .args(["import", "/nonexistent/dir", "--set", "docs", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a directory"));
}

#[test]
fn serve_answers_and_stops_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ChildServer::serve(&["--demo", "--data-dir", tmp.path().to_str().unwrap()], &[]);
    let addr = server.addr.clone();
    let log = server.log();
    assert!(
        log.contains("answers only loopback clients"),
        "startup log warns about ingest: {log}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = reqwest::Client::builder().no_proxy().build().unwrap();
        assert_eq!(
            c.get(format!("http://{addr}/readyz"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
        let sd = c
            .get(format!("http://{addr}/.well-known/resourcesync"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(sd.contains("/sets/demo/capabilitylist.xml"), "{sd}");
        let rl = c
            .get(format!("http://{addr}/sets/demo/resourcelist.xml"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(rl.matches("<url>").count(), 24, "the demo set's 24 files");
        let file = c
            .get(format!("http://{addr}/files/demo/papers/paper-001.txt"))
            .send()
            .await
            .unwrap();
        assert_eq!(file.status(), 200);
    });
    let status = server.signal("TERM");
    assert!(status.success(), "graceful shutdown exits 0, got {status}");
}

#[test]
fn bad_configuration_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(BIN)
            .args(args)
            .arg("--data-dir")
            .arg(tmp.path())
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    assert!(run(&["serve", "--config", "/nonexistent.toml"], &[])
        .contains("/nonexistent.toml does not exist"));
    let e = run(
        &["serve", "--listen", "127.0.0.1:0"],
        &[("RSHUB_SET_DEFAULTS__MAX_ITEMS_IN_LIST", "60000")],
    );
    assert!(
        e.contains("max_items_in_list = 60000: must be between 1 and 50000"),
        "{e}"
    );
    let cfg = tmp.path().join("c.toml");
    std::fs::write(&cfg, "[sets.papers]\nurl_prefx = \"http://x/\"\n").unwrap();
    let e = run(&["serve", "--config", cfg.to_str().unwrap()], &[]);
    assert!(
        e.contains("url_prefx"),
        "unknown keys in a set are named: {e}"
    );
    let e = run(&["serve", "--listen", "nonsense"], &[]);
    assert!(e.contains("server.listen"), "{e}");
    // An admin token anyone could guess is refused at start.
    let e = run(
        &["serve", "--listen", "127.0.0.1:0"],
        &[("RSHUB_ADMIN_TOKEN", "letmein")],
    );
    assert!(
        e.contains("admin.token is shorter than 16 characters"),
        "{e}"
    );
    // Unknown keys and variables are refused by name, with the nearest known one.
    std::fs::write(
        &cfg,
        "[hub]\nallow_network = []\n[servr]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let e = run(&["serve", "--config", cfg.to_str().unwrap()], &[]);
    assert!(
        e.contains("unknown key `hub.allow_network`")
            && e.contains("did you mean `hub.allow_networks`?"),
        "{e}"
    );
    assert!(
        e.contains("unknown key `servr.listen`") && e.contains("did you mean `server.listen`?"),
        "{e}"
    );
    let e = run(
        &["serve", "--listen", "127.0.0.1:0"],
        &[("RSHUB_INGEST_TOKN", "x")],
    );
    assert!(
        e.contains(
            "unknown environment variable RSHUB_INGEST_TOKN; did you mean RSHUB_INGEST_TOKEN?"
        ),
        "{e}"
    );
    // A value of the wrong type: the key and its variable, once, no internal prefix.
    let e = run(
        &["serve", "--listen", "127.0.0.1:0"],
        &[("RSHUB_HUB_SIGNATURE_ALGORITHM", "md5")],
    );
    assert!(
        e.contains("hub.signature_algorithm: ")
            && e.contains("(environment variable RSHUB_HUB_SIGNATURE_ALGORITHM)"),
        "{e}"
    );
    assert!(
        !e.contains("default.") && e.matches("signature_algorithm").count() == 1,
        "{e}"
    );
}

/// `--listen` takes a host name too, and `RSHUB_SET_DEFAULTS_URL_PREFIX` reaches its key.
#[test]
fn listen_on_a_name_and_a_set_default_from_the_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ChildServer::serve_on(
        "localhost:0",
        &["--demo", "--data-dir", tmp.path().to_str().unwrap()],
        &[(
            "RSHUB_SET_DEFAULTS_URL_PREFIX",
            "https://mirror.example.org/{set}/",
        )],
    );
    let addr = server.addr.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rl = rt.block_on(async {
        let c = reqwest::Client::builder().no_proxy().build().unwrap();
        c.get(format!("http://{addr}/sets/demo/resourcelist.xml"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    assert!(rl.contains("<loc>https://mirror.example.org/demo/"), "{rl}");
}

#[test]
fn config_prints_the_commented_defaults() {
    let out = Command::new(BIN).arg("config").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[set_defaults]") && text.contains("max_items_in_list = 50000"));
}

/// `import` names the store it writes, never creates `./data` by default in whatever folder it
/// runs in, and says what to configure when the server will not serve the imported files.
#[test]
fn import_says_where_it_writes_and_what_is_not_served() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, data) = (tmp.path().join("docs"), tmp.path().join("data"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.txt"), "a").unwrap();
    let cwd = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&cwd).unwrap();
    let out = Command::new(BIN)
        .current_dir(&cwd)
        .args(["import"])
        .arg(&dir)
        .args(["--set", "docs"])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("no store at") && e.contains("--data-dir"),
        "{e}"
    );
    assert!(!cwd.join("data").exists(), "no ./data was created");

    let (_, log) = import_with_log(&dir, &data);
    assert!(
        log.contains("creating a new embedded store")
            && log.contains("rshub.sqlite")
            && log.contains("--data-dir"),
        "{log}"
    );
    assert!(
        log.contains("[sets.docs]")
            && log.contains(&format!(
                "resource_root_dir = {:?}",
                dir.canonicalize().unwrap().display().to_string()
            )),
        "{log}"
    );
    let (_, log) = import_with_log(&dir, &data);
    assert!(
        log.contains("writing to the embedded store") && log.contains(&data.display().to_string()),
        "{log}"
    );
}

/// Re-importing an unchanged folder records nothing, even after a harvester sent the same
/// files through the API (whose lastmod carries microseconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reimport_after_an_ingest_records_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, data) = (tmp.path().join("docs"), tmp.path().join("data"));
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..4 {
        std::fs::write(dir.join(format!("f{i}.txt")), format!("file {i}")).unwrap();
    }
    assert_eq!(import(&dir, &data)["created"], 4);
    let (mut c, _keep) = crate::support::test_config();
    c.server.data_dir = data.clone();
    let app = crate::support::TestApp::start_with(c).await;
    let same = |i: u32| {
        let body = format!("file {i}");
        format!(
            r#"{{"change":"updated","location":{{"type":"rel_path","value":"f{i}.txt"}},"length":{},"md5":"{}","mime":"text/plain"}}"#,
            body.len(),
            crate::support::md5_hex(body.as_bytes())
        )
    };
    app.ingest_ok("docs", &(0..4).map(same).collect::<Vec<_>>().join("\n"))
        .await;
    let before = app
        .get_text("/sets/docs/changelist.xml")
        .await
        .matches("<url>")
        .count();
    assert_eq!(before, 8);
    app.stop().await;
    let r = tokio::task::spawn_blocking(move || import(&dir, &data))
        .await
        .unwrap();
    assert_eq!(
        (r["updated"].as_u64(), r["unchanged"].as_u64()),
        (Some(0), Some(4)),
        "{r}"
    );
    let (mut c, _keep) = crate::support::test_config();
    c.server.data_dir = tmp.path().join("data");
    let app = crate::support::TestApp::start_with(c).await;
    assert_eq!(
        app.get_text("/sets/docs/changelist.xml")
            .await
            .matches("<url>")
            .count(),
        before,
        "no change recorded"
    );
    app.stop().await;
}

/// A server on an empty store says, in its log and on its home page, how to get a first set;
/// `serve --help` shows the defaults of its flags.
#[test]
fn an_empty_server_says_what_to_do_next() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ChildServer::serve(&["--data-dir", tmp.path().to_str().unwrap()], &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let home = rt.block_on(async {
        let c = reqwest::Client::builder().no_proxy().build().unwrap();
        c.get(server.url("/"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    for text in [server.log(), home] {
        assert!(
            text.contains("The store holds no resource set yet"),
            "{text}"
        );
        assert!(
            text.contains("resourcesync-hub import DIR --set NAME")
                && text.contains("serve --demo"),
            "{text}"
        );
        assert!(
            text.contains("/api/v1/resource-sets/NAME/changes"),
            "{text}"
        );
    }
    let out = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("[default: 127.0.0.1:8080]") && help.contains("[default: ./data]"),
        "{help}"
    );
}

/// The files under `dir`, at any depth (none when it does not exist).
fn files_under(dir: &std::path::Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                files_under(&p)
            } else {
                usize::from(!e.file_name().to_string_lossy().starts_with('.'))
            }
        })
        .sum()
}

/// The commands `serve --demo` prints after the README's first command run as printed, before
/// anything is installed: the admin API's, and a harvest of the demo into `./mirror`.
#[test]
fn the_commands_the_demo_prints_run_as_printed() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let server = ChildServer::demo(tmp.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(crate::support::wait_until(
        "the demo's commands printed",
        || async { server.stdout().contains("harvest --config") },
    ));
    let printed = server.stdout();
    let commands: Vec<&str> = printed
        .lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter(|l| l.starts_with(BIN))
        .collect();
    assert_eq!(
        commands.len(),
        3,
        "an admin and two harvest commands:\n{printed}"
    );
    let sh = |command: &str| {
        let out = Command::new("sh")
            .args(["-c", command])
            .current_dir(&work)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let stats = sh(commands[0]);
    assert!(
        stats.contains("demo"),
        "admin stats names the demo set: {stats}"
    );
    sh(commands[1]);
    assert!(work.join("harvest.toml").exists());
    let mut harvest = Command::new("sh")
        .args(["-c", &format!("exec {}", commands[2])])
        .current_dir(&work)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    rt.block_on(crate::support::wait_until(
        "the demo's 24 files in ./mirror",
        || async { files_under(&work.join("mirror")) >= 24 },
    ));
    assert_eq!(files_under(&work.join("mirror")), 24);
    let killed = Command::new("kill")
        .args(["-TERM", &harvest.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(
        harvest.wait().unwrap().success(),
        "the harvester stops on SIGTERM"
    );
}
