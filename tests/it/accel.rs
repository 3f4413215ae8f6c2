//! Behind nginx (Debian's, with `docker/nginx-rshub.conf`): with `server.accel_redirect`, the
//! server decides every answer and nginx sends the files' bytes; what a client gets through
//! nginx is what it gets from the server alone (status, validators, encoding, bytes), for
//! documents, resource files and dump files.

use std::path::Path;
use std::process::{Child, Command};

use reqwest::header;

use crate::support::*;

/// nginx on a free loopback port in front of `upstream`, with the site configuration the
/// `docker/` folder ships (its upstream and port replaced); stopped when dropped.
pub(crate) struct Nginx {
    child: Child,
    port: u16,
}

impl Drop for Nginx {
    /// SIGTERM, which stops the workers too (SIGKILL left them running, holding the test's
    /// output open).
    fn drop(&mut self) {
        // SAFETY: kill has no memory preconditions; the pid is our child's, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Nginx {
    fn start(dir: &Path, upstream: &str) -> Nginx {
        Nginx::start_with(dir, upstream, false)
    }

    /// With `files_gone`, nginx's internal location looks for the files where there are none:
    /// every file the server names is missing, as when a page is replaced between the
    /// server's answer and nginx's open, and every answer takes the fallback.
    fn start_with(dir: &Path, upstream: &str, files_gone: bool) -> Nginx {
        let port = crate::harvest::free_port();
        let site = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docker/nginx-rshub.conf"
        ))
        .unwrap();
        assert!(site.contains("server hub:8080;") && site.contains("listen 80;"));
        let mut site = site
            .replace("server hub:8080;", &format!("server {upstream};"))
            .replace("listen 80;", &format!("listen 127.0.0.1:{port};"));
        if files_gone {
            assert!(site.contains("alias /;"));
            site = site.replace("alias /;", "alias /nonexistent-rshub-test/;");
        }
        Nginx::run(dir, &site, port)
    }

    /// Static sites: each (port, folder) served as files on 127.0.0.1:port (what a publisher
    /// puts behind a web server).
    pub(crate) fn static_sites(dir: &Path, sites: &[(u16, &Path)]) -> Nginx {
        let site: String = sites
            .iter()
            .map(|(port, root)| {
                format!(
                    "server {{ listen 127.0.0.1:{port}; root {}; location / {{ try_files $uri $uri/index.html =404; }} }}\n",
                    root.display()
                )
            })
            .collect();
        Nginx::run(dir, &site, sites[0].0)
    }

    /// nginx with `site` (server blocks) under `dir`, once it listens on `port`.
    fn run(dir: &Path, site: &str, port: u16) -> Nginx {
        assert!(
            Path::new("/usr/sbin/nginx").exists(),
            "this test runs Debian's nginx: apt-get install nginx (.ci/run does)"
        );
        std::fs::create_dir_all(dir.join("tmp")).unwrap();
        std::fs::write(dir.join("site.conf"), site).unwrap();
        let d = dir.display();
        // Started by root, nginx's workers would run as nobody, who cannot read the test's
        // private temporary folders (in docker/, nginx reads the hub's volume as it is).
        // SAFETY: geteuid has no preconditions.
        let user = if unsafe { libc::geteuid() } == 0 {
            "user root root;\n"
        } else {
            ""
        };
        std::fs::write(
            dir.join("nginx.conf"),
            format!(
                "daemon off;\n{user}worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
                 events {{ worker_connections 256; }}\n\
                 http {{\n  access_log off;\n  include /etc/nginx/mime.types;\n\
                   client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;\n\
                   uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n  include {d}/site.conf;\n}}\n"
            ),
        )
        .unwrap();
        let child = Command::new("/usr/sbin/nginx")
            .args(["-p", &d.to_string(), "-c"])
            .arg(dir.join("nginx.conf"))
            .spawn()
            .expect("nginx starts");
        let n = Nginx { child, port };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return n;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!(
            "nginx did not listen: {}",
            std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
        );
    }
}

/// What a client sees of an answer.
#[derive(PartialEq, Eq)]
struct Seen {
    status: u16,
    etag: Option<String>,
    last_modified: Option<String>,
    content_type: Option<String>,
    content_encoding: Option<String>,
    content_range: Option<String>,
    /// The sandbox and no-sniffing that keep a file's bytes inert in a browser.
    inert: (Option<String>, Option<String>),
    body: Vec<u8>,
}

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} etag={:?} last-modified={:?} type={:?} encoding={:?} range={:?} inert={:?} body={} bytes md5 {}",
            self.status,
            self.etag,
            self.last_modified,
            self.content_type,
            self.content_encoding,
            self.content_range,
            self.inert,
            self.body.len(),
            md5_hex(&self.body)
        )
    }
}

async fn see(client: &reqwest::Client, url: &str, extra: &[(&str, &str)]) -> Seen {
    let mut rb = client.get(url);
    for (k, v) in extra {
        rb = rb.header(*k, *v);
    }
    let r = rb.send().await.unwrap();
    let h = |name: header::HeaderName| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let (etag, last_modified, content_type, content_encoding, content_range) = (
        h(header::ETAG),
        h(header::LAST_MODIFIED),
        h(header::CONTENT_TYPE),
        h(header::CONTENT_ENCODING),
        h(header::CONTENT_RANGE),
    );
    Seen {
        status: r.status().as_u16(),
        etag,
        last_modified,
        content_type,
        content_encoding,
        content_range,
        inert: (
            h(header::CONTENT_SECURITY_POLICY),
            h(header::X_CONTENT_TYPE_OPTIONS),
        ),
        body: r.bytes().await.unwrap().to_vec(),
    }
}

/// What a client sees at `proxied` (through nginx) with each case's headers equals what the
/// server alone answers at `direct` with the same headers and nginx's fallback header.
async fn same_as_alone(
    client: &reqwest::Client,
    direct: &str,
    proxied: &str,
    cases: &[Vec<(&str, &str)>],
    how: &str,
) {
    for extra in cases {
        let mut with_fallback = extra.clone();
        with_fallback.push(("x-rshub-no-accel", "1"));
        let want = see(client, direct, &with_fallback).await;
        let got = see(client, proxied, extra).await;
        assert_eq!(
            got, want,
            "{proxied} with {extra:?}: {how}, then the server alone"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_through_nginx_are_the_servers_own() {
    let (mut c, dir) = test_config();
    let root = dir.path().join("files");
    std::fs::create_dir_all(&root).unwrap();
    add_file_set(&mut c, "papers", &root, None);
    c.server.accel_redirect = "/_rshub/".into();
    c.dumps.enabled = true;
    c.dumps.check_interval_secs = 1;
    let app = TestApp::start_with(c).await;
    let mut lines = Vec::new();
    for (i, size) in [(0, 100usize), (1, 200_000)] {
        let body: String = (0..size).map(|n| (b'a' + (n % 26) as u8) as char).collect();
        lines.push(crate::harvest::file_line(
            &root,
            "created",
            &format!("p{i}.txt"),
            &body,
        ));
    }
    // Enough entries that the Resource List is large enough to be kept on disk.
    for i in 2..3000 {
        lines.push(crate::harvest::file_line(
            &root,
            "created",
            &format!("r/{i}.txt"),
            "x",
        ));
    }
    app.ingest_ok("papers", &lines.join("\n")).await;
    // The Resource Dump and one of its packages (dump files take the same way).
    let raw = reqwest::Client::builder().no_proxy().build().unwrap();
    let dump_doc = || async {
        raw.get(app.url("/sets/papers/resourcedump.xml"))
            .header("x-rshub-no-accel", "1")
            .send()
            .await
            .unwrap()
    };
    wait_until("the Resource Dump", || async {
        dump_doc().await.status() == 200
    })
    .await;
    let doc = dump_doc().await.text().await.unwrap();
    let package = doc
        .split("<loc>")
        .skip(1)
        .filter_map(|l| l.split("</loc>").next())
        .find(|l| l.ends_with(".zip"))
        .unwrap_or_else(|| panic!("a package in {doc}"))
        .to_string();
    let nginx = Nginx::start(&dir.path().join("nginx"), &app.addr);

    // Raw clients: no decompression, no redirects.
    let client = reqwest::Client::builder()
        .no_proxy()
        .no_gzip()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let prefix = app.path_of(&app.config.set_config("papers").url_prefix);
    let paths = [
        "/sets/papers/resourcelist.xml".to_string(),
        "/sets/papers/capabilitylist.xml".to_string(),
        format!("{prefix}p0.txt"),
        format!("{prefix}p1.txt"),
        "/sets/papers/resourcedump.xml".to_string(),
        app.path_of(&package),
    ];
    for path in &paths {
        // The server alone, sending the bytes itself (as for nginx's fallback).
        let direct = format!("http://{}{path}", app.addr);
        let proxied = format!("http://127.0.0.1:{}{path}", nginx.port);
        let alone = see(&client, &direct, &[("x-rshub-no-accel", "1")]).await;
        assert_eq!(alone.status, 200, "{path}");
        assert!(
            alone
                .inert
                .0
                .as_deref()
                .is_some_and(|c| c.starts_with("sandbox"))
                && alone.inert.1.as_deref() == Some("nosniff"),
            "{path} is not sandboxed: {alone:?}"
        );
        // Without the fallback header the server names the file instead of sending it.
        let r = client.get(&direct).send().await.unwrap();
        assert!(r.headers().contains_key("x-accel-redirect"), "{path}");
        assert!(r.bytes().await.unwrap().is_empty(), "{path}");
        let etag = alone.etag.clone().unwrap();
        let cases = [
            vec![],
            vec![("accept-encoding", "gzip")],
            vec![("if-none-match", etag.as_str())],
            vec![("range", "bytes=0-49")],
        ];
        same_as_alone(&client, &direct, &proxied, &cases, "through nginx").await;
    }
    // Ingest without a token answers loopback clients only. Through nginx every connection
    // is from loopback: the clients nginx names decide. One forwarded from elsewhere (a proxy
    // or CDN in front of nginx) is refused with the reason, even when it also claims to be
    // loopback; a local one still gets through.
    let ingest = format!(
        "http://127.0.0.1:{}/api/v1/resource-sets/papers/changes",
        nginx.port
    );
    for forwarded in ["203.0.113.5", "127.0.0.1, 203.0.113.5", ""] {
        let mut r = client
            .post(&ingest)
            .header("content-type", "application/x-ndjson")
            .body(lines[0].clone());
        if !forwarded.is_empty() {
            r = r.header("x-forwarded-for", forwarded);
        }
        let r = r.send().await.unwrap();
        if forwarded.is_empty() {
            assert_eq!(r.status(), 200, "a local client through nginx");
        } else {
            assert_eq!(r.status(), 403, "{forwarded}");
            let reason = r.text().await.unwrap();
            assert!(
                reason.contains("through a proxy for 203.0.113.5"),
                "{forwarded}: {reason}"
            );
        }
    }

    // A page rebuilt just after the server named its file to nginx (nginx opens it after the
    // answer): the named file is still there, so nginx sends it rather than falling back to
    // the server for the whole page.
    let named = || async {
        let r = client
            .get(format!("http://{}/sets/papers/resourcelist.xml", app.addr))
            .send()
            .await
            .unwrap();
        let target = r.headers()["x-accel-redirect"]
            .to_str()
            .unwrap()
            .to_string();
        Path::new(target.strip_prefix("/_rshub").unwrap()).to_path_buf()
    };
    let before = named().await;
    assert!(before.exists(), "{}", before.display());
    let changed = crate::harvest::file_line(&root, "updated", "p0.txt", "changed");
    app.ingest_ok("papers", &changed).await;
    wait_until("the Resource List rebuilt", || async {
        named().await != before
    })
    .await;
    assert!(
        before.exists(),
        "the file named a moment before the rebuild is gone: nginx would have fallen back"
    );

    // nginx sent the files itself: it never fell back to the server for want of one.
    let log = std::fs::read_to_string(dir.path().join("nginx/error.log")).unwrap_or_default();
    assert!(
        !log.contains("open()"),
        "nginx could not open a file: {log}"
    );
    // A client cannot pass for nginx's fallback: nginx drops the header on the way in, so
    // the server still names the file (the client cannot make the server send the bytes
    // itself, nor count as a fallback).
    let fallbacks = || async {
        let text = app.get_text("/metrics").await;
        text.lines()
            .find_map(|l| l.strip_prefix("rshub_accel_fallbacks_total "))
            .unwrap_or_else(|| panic!("no rshub_accel_fallbacks_total in {text}"))
            .parse::<u64>()
            .unwrap()
    };
    let n = fallbacks().await;
    let r = client
        .get(format!(
            "http://127.0.0.1:{}/sets/papers/resourcelist.xml",
            nginx.port
        ))
        .header("x-rshub-no-accel", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        fallbacks().await,
        n,
        "a client's X-Rshub-No-Accel reached the server"
    );
    drop(nginx);

    // A file gone by the time nginx opens it (a page replaced under load): nginx asks the
    // server again for the same path, and the answer is still the server's own. (The
    // fallback once asked for nginx's internal path and got 404s.)
    let gone = Nginx::start_with(&dir.path().join("nginx-gone"), &app.addr, true);
    for path in &paths {
        let through = format!("http://127.0.0.1:{}{path}", gone.port);
        let n = fallbacks().await;
        assert_eq!(
            client.get(&through).send().await.unwrap().status(),
            200,
            "{path}"
        );
        assert_eq!(
            fallbacks().await,
            n + 1,
            "{path}: the fallback is counted once"
        );
    }
    for path in &paths {
        let direct = format!("http://{}{path}", app.addr);
        let proxied = format!("http://127.0.0.1:{}{path}?", gone.port);
        let cases = [vec![], vec![("accept-encoding", "gzip")]];
        same_as_alone(
            &client,
            &direct,
            &proxied,
            &cases,
            "through nginx's fallback",
        )
        .await;
    }
    let log = std::fs::read_to_string(dir.path().join("nginx-gone/error.log")).unwrap_or_default();
    assert!(
        log.contains("open()"),
        "the fallback was not taken: nginx found the files: {log}"
    );
    drop(gone);
    app.stop().await;
}
