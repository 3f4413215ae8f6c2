//! The test harness: `TestApp` runs the real server in-process on 127.0.0.1:0 with its own
//! data directory, and can be stopped and started again on the same data.

use std::path::{Path, PathBuf};
use std::process::Command;

use resourcesync_hub::config::{Config, SetOverrides};
use resourcesync_hub::sitemap::{self, Document};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestApp {
    /// Where the server really listens (documents may advertise another base URL).
    pub addr: String,
    pub config: Config,
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<anyhow::Result<()>>>,
    _data: Option<tempfile::TempDir>,
}

/// A configuration on a fresh temporary data directory.
pub fn test_config() -> (Config, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Config::defaults();
    c.server.listen = "127.0.0.1:0".into();
    c.server.data_dir = dir.path().join("data");
    c.server.shutdown_grace_secs = 2;
    // Every request after a change sees it (the default rebuilds a changed page at most once
    // a second; `documents::a_page_under_steady_changes_is_rebuilt_at_most_once_per_interval`
    // covers that).
    c.source.rebuild_interval_ms = 0;
    (c, dir)
}

/// Adds a set whose files live in `root` and are served by the hub itself.
pub fn add_file_set(c: &mut Config, name: &str, root: &Path, max_items: Option<u32>) {
    c.sets.insert(
        name.into(),
        SetOverrides {
            resource_root_dir: Some(root.to_path_buf()),
            max_items_in_list: max_items,
            ..Default::default()
        },
    );
}

impl TestApp {
    pub async fn start() -> TestApp {
        let (c, dir) = test_config();
        let mut app = TestApp::start_with(c).await;
        app._data = Some(dir);
        app
    }

    /// Starts on a given configuration (its data directory is the caller's).
    pub async fn start_with(config: Config) -> TestApp {
        // `RUST_LOG=info cargo test -- --nocapture` shows the server's log.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let mut effective = config.clone();
        resourcesync_hub::app::resolve_base_url(&mut effective, listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(resourcesync_hub::app::run(config, listener, async move {
            let _ = rx.await;
        }));
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let app = TestApp {
            addr,
            config: effective,
            client,
            stop: Some(tx),
            handle: Some(handle),
            _data: None,
        };
        // Wait until it answers.
        for _ in 0..100 {
            if app.client.get(app.url("/healthz")).send().await.is_ok() {
                return app;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("server did not come up");
    }

    /// Stops the server and waits for it to finish; returns the temp dir to keep it alive.
    pub async fn stop(mut self) -> Option<tempfile::TempDir> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            h.await.unwrap().unwrap();
        }
        self._data.take()
    }

    /// A URL on the real listening address.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The request path of a URL the server advertises under its base URL (which may differ
    /// from the address it really listens on).
    pub fn path_of(&self, advertised: &str) -> String {
        let base = self.config.base_url();
        advertised
            .strip_prefix(&base)
            .unwrap_or_else(|| panic!("{advertised} is not under {base}"))
            .to_string()
    }

    pub async fn get_text(&self, path: &str) -> String {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "GET {path}");
        r.text().await.unwrap()
    }

    pub async fn get_doc(&self, path: &str) -> (String, Document) {
        let body = self.get_text(path).await;
        let doc = sitemap::parse(body.as_bytes()).unwrap_or_else(|e| panic!("{path}: {e}\n{body}"));
        (body, doc)
    }

    pub async fn ingest(&self, set: &str, ndjson: &str) -> reqwest::Response {
        self.client
            .post(self.url(&format!("/api/v1/resource-sets/{set}/changes")))
            .header("content-type", "application/x-ndjson")
            .body(ndjson.to_string())
            .send()
            .await
            .unwrap()
    }

    /// Ingests and insists on success; returns the report.
    pub async fn ingest_ok(&self, set: &str, ndjson: &str) -> serde_json::Value {
        let r = self.ingest(set, ndjson).await;
        let status = r.status();
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(status, 200, "ingest failed: {body}");
        body
    }
}

/// Polls `check` every 20 ms until it holds; panics naming `what` after 60 s (it usually holds
/// within a second: the bound is for a slow or loaded machine).
pub async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits until `count()` reaches `total`, for as long as it keeps moving: panics naming `what`
/// when it has not grown for 120 s (a stall, not a slow machine: on a loaded 2-core runner a
/// large backlog can take minutes, and a fixed deadline turned slowness into failures).
pub async fn wait_for_count(what: &str, total: usize, mut count: impl FnMut() -> usize) {
    let stall = std::time::Duration::from_secs(120);
    let (mut seen, mut moved) = (count(), std::time::Instant::now());
    while seen < total {
        assert!(
            moved.elapsed() < stall,
            "{what}: stuck at {seen} of {total} for {} s",
            stall.as_secs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let now = count();
        if now > seen {
            (seen, moved) = (now, std::time::Instant::now());
        }
    }
}

/// One NDJSON change line for a rel_path resource.
pub fn change_line(change: &str, rel: &str, md5: &str, length: u64) -> String {
    if change == "deleted" {
        return format!(
            r#"{{"change":"deleted","location":{{"type":"rel_path","value":"{rel}"}}}}"#
        );
    }
    format!(
        r#"{{"change":"{change}","location":{{"type":"rel_path","value":"{rel}"}},"length":{length},"md5":"{md5}","mime":"text/plain","lastmod":"2024-01-01T00:00:00Z"}}"#
    )
}

pub fn md5_hex(data: &[u8]) -> String {
    use md5::{Digest, Md5};
    resourcesync_hub::digest::hex_digest(Md5::digest(data))
}

/// The tests' Python tools: a virtual environment under `target/` with the packages pinned in
/// `tests/requirements.txt`, created on first use (and brought up to date when that file
/// changes) by `tests/tools/pyenv.py`, under a file lock so that concurrent test processes
/// wait for one install. Needs only a `python3` on PATH.
pub struct PyEnv {
    dir: PathBuf,
}

impl PyEnv {
    pub fn get() -> &'static PyEnv {
        static ENV: std::sync::OnceLock<PyEnv> = std::sync::OnceLock::new();
        ENV.get_or_init(|| {
            let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
            let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
            std::fs::create_dir_all(tmp).unwrap();
            let dir = tmp.join("pyenv");
            let lock = std::fs::File::create(tmp.join("pyenv.lock")).unwrap();
            lock.lock().expect("lock the Python environment");
            let out = Command::new("python3")
                .arg(repo.join("tests/tools/pyenv.py"))
                .arg(&dir)
                .arg(repo.join("tests/requirements.txt"))
                .output()
                .expect("python3 on PATH (the tests need Python 3 for their tools)");
            assert!(
                out.status.success(),
                "setting up the tests' Python environment in {} failed:\n{}{}",
                dir.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            PyEnv { dir }
        })
    }

    /// The environment's interpreter.
    pub fn python(&self) -> PathBuf {
        self.bin("python")
    }

    /// A console script installed in the environment (`resync-sync`, ...).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("bin").join(name)
    }
}

/// The tests' JavaScript tools (`tests/tools/node`): the packages its lock file pins, installed
/// with `npm ci` into a folder under `target/` on first use (and again when the lock file
/// changes), under a file lock, with the tools beside them. Needs only `node` and `npm`.
pub struct NodeEnv {
    dir: PathBuf,
}

impl NodeEnv {
    pub fn get() -> &'static NodeEnv {
        static ENV: std::sync::OnceLock<NodeEnv> = std::sync::OnceLock::new();
        ENV.get_or_init(|| {
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/node");
            let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
            std::fs::create_dir_all(tmp).unwrap();
            let dir = tmp.join("nodeenv");
            let lock = std::fs::File::create(tmp.join("nodeenv.lock")).unwrap();
            lock.lock().expect("lock the JavaScript environment");
            let wanted = std::fs::read(src.join("package-lock.json")).unwrap();
            let stamp = dir.join("installed-from.json");
            if std::fs::read(&stamp).ok().as_ref() != Some(&wanted) {
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).unwrap();
                for f in ["package.json", "package-lock.json"] {
                    std::fs::copy(src.join(f), dir.join(f)).unwrap();
                }
                let out = Command::new("npm")
                    .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                    .current_dir(&dir)
                    .output()
                    .expect("npm on PATH (the tests need Node.js for their JavaScript tools)");
                assert!(
                    out.status.success(),
                    "installing the tests' JavaScript tools in {} failed:\n{}{}",
                    dir.display(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                std::fs::write(&stamp, &wanted).unwrap();
            }
            // The tools beside their packages (an ES module finds its imports from where it is).
            for e in std::fs::read_dir(&src).unwrap() {
                let p = e.unwrap().path();
                if p.extension().is_some_and(|x| x == "mjs") {
                    std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
                }
            }
            NodeEnv { dir }
        })
    }

    /// Runs one of the tools on `args`; its standard output parsed as JSON (panics with its
    /// standard error when it fails).
    pub fn tool_json(&self, tool: &str, args: &[&std::ffi::OsStr]) -> serde_json::Value {
        let out = Command::new("node")
            .arg(self.dir.join(tool))
            .args(args)
            .output()
            .expect("node on PATH");
        assert!(
            out.status.success(),
            "{tool} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// Runs one of `tests/tools/` with the environment's Python on `args`; its standard output
/// parsed as JSON (panics with its standard error when it fails).
pub fn py_tool_json(tool: &str, args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let out = Command::new(PyEnv::get().python())
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/tools")
                .join(tool),
        )
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{tool}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{tool} printed no JSON: {e}"))
}

/// Validates documents against the sitemaps.org and ResourceSync XSDs in `tests/schemas`
/// (`tests/tools/validate_rs_xml.py`); panics with its report otherwise.
pub fn assert_valid(docs: &[(&str, &str)]) {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for (i, (name, body)) in docs.iter().enumerate() {
        let p = dir
            .path()
            .join(format!("{i:03}-{}.xml", name.replace(['/', ':'], "_")));
        std::fs::write(&p, body).unwrap();
        paths.push(p);
    }
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/validate_rs_xml.py");
    let out = Command::new(PyEnv::get().python())
        .arg(&tool)
        .args(&paths)
        .output()
        .expect("run validate_rs_xml.py");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schema validation failed:\n{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        report.lines().filter(|l| l.ends_with(": VALID")).count(),
        docs.len(),
        "{report}"
    );
}

/// The real binary as a child process (`serve` on 127.0.0.1:0), its log drained in the
/// background so it never blocks on a full pipe.
pub struct ChildServer {
    pub child: std::process::Child,
    pub addr: String,
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
    /// What it printed on its standard output.
    pub out: std::sync::Arc<std::sync::Mutex<String>>,
}

impl ChildServer {
    pub const BIN: &'static str = env!("CARGO_BIN_EXE_resourcesync-hub");

    /// Starts `serve --listen 127.0.0.1:0 <args>` and waits for its "listening" log line.
    pub fn serve(args: &[&str], envs: &[(&str, &str)]) -> ChildServer {
        ChildServer::serve_on("127.0.0.1:0", args, envs)
    }

    /// Starts `serve --listen <listen> <args>`.
    pub fn serve_on(listen: &str, args: &[&str], envs: &[(&str, &str)]) -> ChildServer {
        let mut cmd = Command::new(Self::BIN);
        cmd.args(["serve", "--listen", listen])
            .args(args)
            .envs(envs.iter().copied());
        ChildServer::spawn(cmd)
    }

    /// Starts `cmd` (a `serve` command, perhaps behind a wrapper that execs it) listening on
    /// 127.0.0.1:0 unless it says otherwise, and waits for its "listening" log line.
    pub fn spawn(mut cmd: Command) -> ChildServer {
        use std::io::{BufRead, BufReader};
        if !cmd.get_args().any(|a| a == "--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        if !cmd.get_envs().any(|(k, _)| k == "RUST_LOG") {
            cmd.env("RUST_LOG", "info");
        }
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (stdout, sink) = (child.stdout.take().unwrap(), out.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut o = sink.lock().unwrap();
                o.push_str(&line);
                o.push('\n');
            }
        });
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if !sent {
                    if let Some(i) = line.find("addr=") {
                        let _ = tx.send(
                            line[i + 5..]
                                .split_whitespace()
                                .next()
                                .unwrap_or("")
                                .to_string(),
                        );
                        sent = true;
                    }
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no listening line in:\n{}", log.lock().unwrap()));
        ChildServer {
            child,
            addr,
            log,
            out,
        }
    }

    /// What it printed on its standard output so far.
    pub fn stdout(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// `serve --demo` with its data in `<dir>/data`.
    pub fn demo(dir: &Path) -> ChildServer {
        ChildServer::serve(
            &["--demo", "--data-dir", dir.join("data").to_str().unwrap()],
            &[],
        )
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits (60 s at most) until the log has `what`, and returns the log.
    pub async fn wait_for_log(&self, what: &str) -> String {
        wait_until(&format!("{what:?} in the log"), || async {
            self.log().contains(what)
        })
        .await;
        self.log()
    }

    /// Sends a signal that does not end the process (`"STOP"`, `"CONT"`).
    pub fn send(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// Whether the process is stopped (SIGSTOP has taken effect: state `T` in /proc).
    pub fn is_stopped(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .ok()
            .and_then(|s| {
                // The state follows the command name, which is in parentheses.
                let rest = &s[s.rfind(')')? + 1..];
                rest.split_whitespace().next().map(|st| st == "T")
            })
            .unwrap_or(false)
    }

    /// Sends a signal (`"TERM"`, `"KILL"`) and waits for the process to end.
    pub fn signal(mut self, sig: &str) -> std::process::ExitStatus {
        self.send(sig);
        self.child.wait().unwrap()
    }

    /// `serve --config <cfg>` with its data in `<dir>/<name>`, logging at info (one of
    /// several processes on one store).
    pub fn serve_one_of(dir: &Path, name: &str, cfg: &Path) -> ChildServer {
        ChildServer::serve(
            &[
                "--config",
                cfg.to_str().unwrap(),
                "--data-dir",
                dir.join(name).to_str().unwrap(),
            ],
            &[(
                "RUST_LOG",
                "info,hyper=warn,reqwest=warn,elasticsearch=warn",
            )],
        )
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The store of the server processes on the Elasticsearch at `url`, opened from the test.
pub async fn elastic_store(url: &str) -> resourcesync_hub::store::Store {
    let mut c = Config::defaults();
    c.store.backend = resourcesync_hub::config::Backend::Elasticsearch;
    c.store.elasticsearch.url = url.to_string();
    resourcesync_hub::app::open_store(&c).await.unwrap()
}

/// Points `c` at a fresh osmem-server clone (the Elasticsearch backend).
pub async fn use_elasticsearch(c: &mut Config) {
    c.store.backend = resourcesync_hub::config::Backend::Elasticsearch;
    c.store.elasticsearch.url = Osmem::clone_url().await;
}

/// osmem-server (PyPI), the in-memory OpenSearch-compatible server: started once per test
/// process on 127.0.0.1:0 (it exits when our end of its stdin closes, i.e. with us); each test
/// gets its own copy-on-write clone.
pub struct Osmem;

impl Osmem {
    fn root() -> &'static str {
        static ROOT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        ROOT.get_or_init(|| {
            use std::io::{BufRead, BufReader};
            let bin = Command::new(PyEnv::get().python())
                .args([
                    "-c",
                    "import osmem_server;print(osmem_server.resolve_binary())",
                ])
                .output()
                .expect("the tests' python runs");
            assert!(
                bin.status.success(),
                "osmem-server is in the tests' Python environment: {}",
                String::from_utf8_lossy(&bin.stderr)
            );
            let bin = String::from_utf8_lossy(&bin.stdout).trim().to_string();
            let mut child = Command::new(bin)
                .args(["-addr", "127.0.0.1:0"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("osmem-server starts");
            let mut line = String::new();
            BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            // Keep its stdin open for the life of the test process.
            std::mem::forget(child);
            v["url"].as_str().unwrap().to_string()
        })
    }

    /// A fresh clone's URL.
    pub async fn clone_url() -> String {
        let root = Self::root().to_string();
        let v: serde_json::Value = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .post(format!("{root}/_osmem/clones"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["url"].as_str().unwrap().to_string()
    }
}

/// A command's standard output and error, one after the other (for messages and asserts).
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The body of a GET that must succeed.
pub async fn get_text(client: &reqwest::Client, url: &str) -> String {
    let r = client.get(url).send().await.unwrap();
    assert!(r.status().is_success(), "GET {url}: {}", r.status());
    r.text().await.unwrap()
}

/// Signs in to a console at `login_url` (its `/console/login`) with `token`: a client that does
/// not follow redirects, and the session cookie (`name=value`) to send with it.
pub async fn console_session(login_url: &str, token: &str) -> (reqwest::Client, String) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = client
        .post(login_url)
        .form(&[("token", token)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "signing in to {login_url}");
    let cookie = r.headers()["set-cookie"].to_str().unwrap();
    let session = cookie.split(';').next().unwrap().to_string();
    (client, session)
}

/// The first ```sh block of the guide `doc` (a path from the repository's root, such as
/// `docs/source.md`) after the line containing `marker`.
pub fn doc_sh_block(doc: &str, marker: &str) -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(doc))
        .unwrap_or_else(|e| panic!("{doc}: {e}"));
    let at = readme
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker:?} in {doc}"));
    readme[at..]
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or_else(|| panic!("no sh block after {marker:?}"))
        .to_string()
}

/// POSTs `body` as `application/json`; the status and the JSON answer (`null` when it is not
/// JSON).
pub async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
) -> (reqwest::StatusCode, serde_json::Value) {
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

/// An admin API request with bearer `token` (and a JSON body when given): its status and its
/// body as JSON (a string when it is not JSON).
pub async fn admin_call(
    app: &TestApp,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut rb = app
        .client
        .request(method, app.url(path))
        .header("authorization", format!("Bearer {token}"));
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let r = rb.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// `VmRSS` or `VmHWM` (the peak) of a process, in MB.
pub fn proc_mb(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim_start_matches(':').split_whitespace().next())
        .map(|kb| kb.parse::<f64>().unwrap() / 1024.0)
        .unwrap()
}

/// The console page at `path`, signed in with `token` (it must answer 200).
pub async fn console_page(app: &TestApp, token: &str, path: &str) -> String {
    let cookie = console_cookie(app, token).await;
    let r = reqwest::Client::new()
        .get(app.url(path))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{path}");
    r.text().await.unwrap()
}

/// Signs in to the hub's console with `token`: the session cookie (`name=value`).
pub async fn console_cookie(app: &TestApp, token: &str) -> String {
    console_session(&app.url("/console/login"), token).await.1
}
