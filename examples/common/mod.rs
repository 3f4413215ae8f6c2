//! What the benchmarks share: their command-line numbers and the peers' Python tools.
#![allow(dead_code)] // each benchmark uses part of it

use std::path::{Path, PathBuf};

/// The number after `name` on the command line, or `default`.
pub fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

/// A console script of PyPI `resync` (`resync-sync`, `resync-build`): the tests' Python
/// environment under target/ when present, else the one on PATH; when neither has it, the
/// benchmark stops saying how to get it (not with a bare "No such file or directory").
pub fn py_tool(name: &str) -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/tmp/pyenv/bin")
        .join(name);
    if venv.exists() {
        return venv;
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    if !on_path {
        eprintln!(
            "{name} is not installed: run `cargo test` once (it installs the tests' Python tools, \
             PyPI resync among them, under target/tmp/pyenv) or `pip install resync==2.0.1`"
        );
        std::process::exit(2);
    }
    name.into()
}

/// User + system CPU seconds of a process (`"self"` or a pid): for this process from
/// `getrusage` (microseconds), for another from `/proc` (clock ticks).
pub fn proc_cpu_secs(pid: &str) -> f64 {
    if pid == "self" {
        let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage fills the struct it is given (and it starts zeroed).
        let u = unsafe {
            libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr());
            u.assume_init()
        };
        let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
        return t(u.ru_utime) + t(u.ru_stime);
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// Waits (up to 2 s) until the server at `addr` answers `/healthz`.
pub async fn wait_healthz(client: &reqwest::Client, addr: impl std::fmt::Display) {
    for _ in 0..100 {
        if client
            .get(format!("http://{addr}/healthz"))
            .send()
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A `/proc/<pid>/status` size field (`"VmRSS:"`, `"VmHWM:"`) of a process, in MB.
pub fn proc_status_mb(pid: &str, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// One ingest line (NDJSON) for the file `rel` holding `body`.
pub fn ingest_line(rel: &str, body: &str, change: &str) -> String {
    use md5::{Digest, Md5};
    format!(
        r#"{{"change":"{change}","location":{{"type":"rel_path","value":"{rel}"}},"length":{},"md5":"{}","mime":"text/plain"}}"#,
        body.len(),
        resourcesync_hub::digest::hex_digest(Md5::digest(body.as_bytes()))
    )
}

/// The `p` quantile (0..1) of sorted figures (NaN for none).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// A free loopback port (free when asked: bind it soon).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// nginx (Debian package `nginx`) in the foreground, its files under `dir`, serving each
/// `(port, root)` as static files on 127.0.0.1 (sendfile, keep-alive, `gzip_static`; `.txt`
/// as text/plain, anything else as XML). Stop it with SIGTERM, which stops its workers too.
pub fn nginx(dir: &Path, servers: &[(u16, PathBuf)]) -> anyhow::Result<std::process::Child> {
    nginx_with(dir, servers, true)
}

/// [`nginx`], with `sendfile off` when `sendfile` is false: it then reads each file into a
/// buffer and writes that to the socket, as a server that cannot hand the kernel a file does.
pub fn nginx_with(
    dir: &Path,
    servers: &[(u16, PathBuf)],
    sendfile: bool,
) -> anyhow::Result<std::process::Child> {
    let bin = ["/usr/sbin/nginx", "nginx"]
        .into_iter()
        .find(|b| {
            std::process::Command::new(b)
                .arg("-v")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .ok_or_else(|| anyhow::anyhow!("nginx is not installed: apt-get install nginx"))?;
    let d = dir.display();
    let listen: String = servers
        .iter()
        .map(|(port, root)| {
            format!(
                "  server {{ listen 127.0.0.1:{port}; root {}; }}\n",
                root.display()
            )
        })
        .collect();
    let conf = format!(
        "daemon off;\nworker_processes auto;\nworker_rlimit_nofile 65536;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log;\n\
         events {{ worker_connections 16384; }}\n\
         http {{\n  access_log off;\n  sendfile {sendfile};\n  tcp_nopush on;\n  tcp_nodelay on;\n\
           keepalive_requests 1000000;\n  gzip_static on;\n  etag on;\n\
           types {{ application/xml xml; text/plain txt; }}\n  default_type application/xml;\n\
           client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;\n\
           uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n{listen}}}\n",
        sendfile = if sendfile { "on" } else { "off" }
    );
    std::fs::create_dir_all(dir.join("tmp"))?;
    std::fs::write(dir.join("nginx.conf"), conf)?;
    Ok(std::process::Command::new(bin)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .arg("-p")
        .arg(dir)
        .stderr(std::process::Stdio::null())
        .spawn()?)
}

/// nginx on 127.0.0.1:`port` in front of our server at `upstream` (`host:port`), with the
/// site configuration `docker/` ships (`server.accel_redirect = "/_rshub/"` on the server):
/// the server decides each answer, nginx sends the files. Tuned as [`nginx_with`] (sendfile,
/// keep-alive, as many workers as cores). `extra` is more http-level configuration (more
/// servers) in the same nginx. Stop it with SIGTERM.
pub fn nginx_front(
    dir: &Path,
    port: u16,
    upstream: &str,
    extra: &str,
) -> anyhow::Result<std::process::Child> {
    let site = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docker/nginx-rshub.conf"
    ))?;
    anyhow::ensure!(
        site.contains("server hub:8080;") && site.contains("listen 80;"),
        "docker/nginx-rshub.conf no longer names hub:8080 and port 80"
    );
    let site = site
        .replace("server hub:8080;", &format!("server {upstream};"))
        .replace("listen 80;", &format!("listen 127.0.0.1:{port};"));
    std::fs::create_dir_all(dir.join("tmp"))?;
    std::fs::write(dir.join("site.conf"), format!("{site}\n{extra}"))?;
    let d = dir.display();
    // Started by root, the workers would run as nobody, who may not read the data folder.
    // SAFETY: geteuid has no preconditions.
    let user = if unsafe { libc::geteuid() } == 0 {
        "user root root;\n"
    } else {
        ""
    };
    std::fs::write(
        dir.join("nginx.conf"),
        format!(
            "daemon off;\n{user}worker_processes auto;\nworker_rlimit_nofile 65536;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log;\n\
             events {{ worker_connections 16384; }}\n\
             http {{\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  tcp_nodelay on;\n\
               keepalive_requests 1000000;\n  include /etc/nginx/mime.types;\n\
               client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;\n\
               uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n  include {d}/site.conf;\n}}\n"
        ),
    )?;
    Ok(std::process::Command::new("/usr/sbin/nginx")
        .args(["-p", &d.to_string(), "-c"])
        .arg(dir.join("nginx.conf"))
        .stderr(std::process::Stdio::null())
        .spawn()?)
}

/// Milliseconds from each commit `(uri, when)` to the harvester's first record of applying
/// that URI after it (its state at `db` records a change once the file is in place), sorted.
pub fn push_latencies(
    db: &Path,
    commits: &[(String, resourcesync_hub::model::Timestamp)],
) -> anyhow::Result<Vec<f64>> {
    let conn = rusqlite::Connection::open(db)?;
    let mut lat = Vec::new();
    for (uri, at) in commits {
        let applied: Option<i64> = conn.query_row(
            "SELECT MIN(applied_at) FROM applied WHERE uri = ?1 AND applied_at >= ?2",
            rusqlite::params![uri, at.0 - 1_000_000],
            |r| r.get(0),
        )?;
        if let Some(a) = applied {
            lat.push(((a - at.0) as f64 / 1000.0).max(0.0));
        }
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    Ok(lat)
}

/// POSTs NDJSON change lines to an ingest URL; an error unless the server took them.
pub async fn post_ingest(
    client: &reqwest::Client,
    url: &str,
    ndjson: String,
) -> anyhow::Result<()> {
    let r = client
        .post(url)
        .header("content-type", "application/x-ndjson")
        .body(ndjson)
        .send()
        .await?;
    anyhow::ensure!(r.status().is_success(), "ingest: {}", r.text().await?);
    Ok(())
}

/// Our server's configuration for a benchmark: data under `data`, one set `bench` served from
/// `root`, its hub delivering to loopback.
pub fn bench_server_config(data: &Path, root: &Path) -> resourcesync_hub::config::Config {
    let mut c = resourcesync_hub::config::Config::defaults();
    c.server.data_dir = data.to_path_buf();
    c.hub.allow_networks = vec!["127.0.0.0/8".parse().expect("a network")];
    c.sets.insert(
        "bench".into(),
        resourcesync_hub::config::SetOverrides {
            resource_root_dir: Some(root.to_path_buf()),
            ..Default::default()
        },
    );
    c
}

/// Starts `cmd` (a benchmark's child: [`run_child_server`] or a peer that prints the same) with
/// its stdin and stdout piped, and reads its first line, `LISTENING <addr>`: the child and
/// its address. The child stops when its stdin is closed.
pub fn spawn_child(
    mut cmd: std::process::Command,
) -> anyhow::Result<(std::process::Child, String)> {
    use std::io::BufRead;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("LISTENING ")
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("the child said {line:?}"))?;
    Ok((child, addr))
}

/// Runs our server as a benchmark's child process: prints `LISTENING <addr>` for the parent,
/// and stops when the parent closes the child's stdin (however the parent ended).
pub async fn run_child_server(config: resourcesync_hub::config::Config) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("LISTENING {}", listener.local_addr()?);
    use std::io::Write;
    std::io::stdout().flush()?;
    let eof = tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    });
    resourcesync_hub::app::run(config, listener, async move {
        let _ = eof.await;
    })
    .await?;
    Ok(())
}
