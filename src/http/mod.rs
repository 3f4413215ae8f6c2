//! HTTP handlers only: extract, call the domain, render. The router is assembled here.

mod admin;
mod console;
mod documents;
mod files;
mod hub;
mod inbox;
mod ingest;
mod oai;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use tower_http::compression::predicate::{NotForContentType, Predicate};
use tower_http::compression::{CompressionLayer, DefaultPredicate};
use tower_http::trace::TraceLayer;

use crate::config::Config;
use crate::hub::Hub;
use crate::notify::Notifier;
use crate::source::Source;

/// What every handler can reach: one `Arc`, because every request clones it several times
/// (each middleware and each `State` extractor), and a clone of the parts themselves cost a
/// dozen atomic increments and an allocation (the collectors' owner name) each time.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Shared) -> AppState {
        AppState(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The parts of [`AppState`].
pub struct Shared {
    pub config: Arc<Config>,
    /// What the server's parts share (store, metrics, URLs, build slots).
    pub ctx: Arc<crate::context::Context>,
    /// The documents' generator and page cache.
    pub source: Arc<Source>,
    pub hub: Arc<Hub>,
    /// The notification poller, when `notify.enabled`.
    pub notifier: Option<Arc<Notifier>>,
    /// The dumps, when `dumps.enabled`.
    pub dumps: Option<Arc<crate::dump::Dumps>>,
    /// The OAI-PMH collectors (`[collect.NAME]`).
    pub collectors: crate::collect::Collectors,
    /// The OAI-PMH repository at `/oai`, when `oai.enabled`.
    pub oai: Option<Arc<crate::oaipmh::Repository>>,
    /// The LDN inbox at `/inbox`, when `inbox.enabled`.
    pub inbox: Option<Arc<crate::inbox::Inbox>>,
    /// The console's session key, read from the store on first use.
    pub console_key: Arc<tokio::sync::OnceCell<[u8; 32]>>,
    /// Wrong admin tokens per client address (the console's sign-in, the admin API).
    pub guesses: Arc<crate::ui::Guesses>,
}

pub fn router(state: AppState) -> Router {
    let mut app = Router::new()
        .route("/", get(home))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/oai", get(oai::get).post(oai::post))
        .route(
            "/inbox",
            get(inbox::list).post(inbox::post).options(inbox::options),
        )
        .route("/inbox/{n}", get(inbox::item))
        .route("/readyz", get(readyz))
        .route(
            "/.well-known/resourcesync",
            get(documents::source_description),
        )
        .route(
            "/sets/{set}/capabilitylist.xml",
            get(documents::capability_list),
        )
        .route(
            "/sets/{set}/resourcelist.xml",
            get(documents::resource_list),
        )
        .route(
            "/sets/{set}/resourcelist/{part}",
            get(documents::resource_list_part),
        )
        .route("/sets/{set}/changelist.xml", get(documents::change_list))
        .route(
            "/sets/{set}/changelist/{no}",
            get(documents::change_list_no),
        )
        .route("/sets/{set}/activity.json", get(documents::activity))
        .route("/sets/{set}/activity/{no}", get(documents::activity_page))
        .route(
            "/sets/{set}/resourcedump.xml",
            get(documents::resource_dump),
        )
        .route(
            "/sets/{set}/resourcedump/{generation}/{name}",
            get(documents::resource_dump_file),
        )
        .route(
            "/sets/{set}/changedump.xml",
            get(documents::change_dump_index),
        )
        .route(
            "/sets/{set}/changedump/{no}",
            get(documents::change_dump_no),
        )
        .route(
            "/sets/{set}/changedump/{no}/{name}",
            get(documents::change_dump_file),
        )
        .route(
            "/api/v1/resource-sets/{set}/changes",
            post(ingest::post_changes)
                .layer(DefaultBodyLimit::max(state.config.ingest.max_body_bytes)),
        )
        .route(
            &state.config.hub.path,
            post(hub::post_hub).layer(DefaultBodyLimit::max(state.config.hub.max_body_bytes)),
        )
        .route(
            &format!("{}/{{*topic}}", state.config.hub.topic_path),
            get(hub::get_topic),
        )
        .route("/metrics", get(admin::metrics))
        .merge(admin::routes(&state))
        .merge(console::routes());
    // The callbacks of the collectors' subscriptions at ResourceSync sources' hubs.
    if let Some(cb) = state.collectors.callbacks() {
        app = app.nest_service(crate::collect::CALLBACKS, cb.router());
    }
    // Resource files of sets whose url_prefix lies under our own base URL.
    let base = state.config.base_url();
    for name in state.config.configured_sets() {
        let sc = state.config.set_config(name);
        if let (Some(path), Some(root)) = (sc.served_path(&base), sc.root_dir()) {
            tracing::info!(set = %name, path = %path, root = %root.display(), "serving resource files");
            // Absolute once, so that a file's path is (behind nginx it is sent by name).
            let root = Arc::new(std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf()));
            app = app.nest(
                &path,
                Router::new().route(
                    "/{*rel}",
                    get(move |st, rel, headers| files::serve(st, root.clone(), rel, headers)),
                ),
            );
        }
    }
    app.fallback(|| async {
        crate::error::AppError::NotFound(
            "no such document or endpoint: see / for the URL map".into(),
        )
    })
    .layer(axum::middleware::from_fn_with_state(
        state.clone(),
        json_errors,
    ))
    // What answers byte ranges (documents, resource files, dump files: `Accept-Ranges`) is
    // served as it is: its ranges and its strong ETag are of those bytes, a resumed download
    // needs them again, and the documents carry their own gzip form. ZIP packages neither:
    // compressing them again costs CPU for nothing.
    .layer(
        CompressionLayer::new().compress_when(
            DefaultPredicate::new()
                .and(NotForContentType::const_new("application/zip"))
                .and(
                    |_: StatusCode,
                     _: axum::http::Version,
                     h: &axum::http::HeaderMap,
                     _: &axum::http::Extensions| {
                        !h.contains_key(axum::http::header::ACCEPT_RANGES)
                    },
                ),
        ),
    )
    .layer(TraceLayer::new_for_http())
    .with_state(state)
}

/// What every answer but the console's pages carries: it may hold bytes this server did not
/// write (collected records, resource files, dump packages, topic payloads fetched by the hub,
/// a reason quoting a peer), so no browser may run them as this origin (where the console and
/// its session cookie live): a sandbox without scripts, nothing loaded, no type sniffing. The
/// console's own Content-Security-Policy (set by its layer, inside this one) is kept.
pub const INERT_CSP: &str = "sandbox; default-src 'none'; frame-ancestors 'none'";

fn make_inert(h: &mut axum::http::HeaderMap) {
    use axum::http::{header, HeaderValue};
    h.entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(HeaderValue::from_static(INERT_CSP));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
}

/// One error shape for the whole public API: every 4xx/5xx body that is not already JSON
/// (the framework's own 405, 413 and extractor rejections, empty bodies, file-server 404s)
/// becomes `{"error": "<reason>"}`. The hub's endpoint keeps WebSub's plain-text reasons.
/// Every 503 but a shed request is the store being unavailable: counted for `/metrics`.
/// Every answer is made inert in a browser ([`INERT_CSP`]).
/// (One middleware for all three: each layer costs every request a boxed future and a clone.)
async fn json_errors(
    State(st): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::header;
    // Kept for an error's reason; a Uri shares the request's bytes (no copy per request).
    let uri = req.uri().clone();
    let path = uri.path();
    let method = req.method().clone();
    let mut resp = next.run(req).await;
    make_inert(resp.headers_mut());
    let status = resp.status();
    if status == StatusCode::SERVICE_UNAVAILABLE
        && resp.extensions().get::<crate::error::Shed>().is_none()
    {
        st.hub.metrics().store_errors.inc();
    }
    // JSON errors already, and the console's pages (which say what went wrong as a page).
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json") || ct.starts_with("text/html"));
    if !(status.is_client_error() || status.is_server_error())
        || is_json
        || path == st.config.hub.path
    {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_string();
    let reason = match status {
        // The router adds the `Allow` header after this layer has run.
        StatusCode::METHOD_NOT_ALLOWED => {
            format!("{method} is not allowed on {path} (the Allow header lists what is)")
        }
        StatusCode::PAYLOAD_TOO_LARGE => {
            let limit = if path.starts_with("/api/v1/") {
                format!(
                    "{} bytes (ingest.max_body_bytes)",
                    st.config.ingest.max_body_bytes
                )
            } else {
                "the limit".into()
            };
            format!("the request body is larger than {limit}")
        }
        _ if text.is_empty() => status
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase(),
        _ => text,
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    axum::response::Response::from_parts(
        parts,
        axum::body::Body::from(serde_json::json!({ "error": reason }).to_string()),
    )
}

async fn readyz(State(st): State<AppState>) -> axum::response::Response {
    match st.ctx.store().ping().await {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(axum::http::header::RETRY_AFTER, "5")],
            format!("not ready: {e}\n"),
        )
            .into_response(),
    }
}

/// A plain-text map of the server for people who open it in a browser. Advertises the hub.
async fn home(State(st): State<AppState>) -> axum::response::Response {
    let urls = st.ctx.urls();
    let hub_url = st.config.hub_url();
    let mut s = format!(
        "resourcesync-hub {}\n\nSource Description: {}\nWebSub hub (POST):  {hub_url}\n",
        env!("CARGO_PKG_VERSION"),
        urls.source_description()
    );
    if let Ok(sets) = st.ctx.store().sets().await {
        if sets.is_empty() {
            s.push('\n');
            s.push_str(&getting_started(&st.config));
        }
        for set in sets {
            let n = &set.name;
            s.push_str(&format!(
                "\nset {n}\n  capability list: {}\n  resource list:   {}\n  change list:     {}\n  activity stream: {} (IIIF Change Discovery)\n  ingest (POST):   {}\n",
                urls.capability_list(n),
                urls.resource_list(n),
                urls.change_list(n),
                urls.activity(n),
                urls.ingest(n)
            ));
            if st.config.notify.enabled {
                s.push_str(&format!(
                    "  change notifications (WebSub topic):    {}\n  framework notifications (WebSub topic): {}\n",
                    st.config.change_topic(n.as_str()),
                    st.config.framework_topic(n.as_str())
                ));
            }
        }
    }
    if let Some(repo) = &st.oai {
        if let Ok(sets) = repo.sets().await {
            if !sets.is_empty() {
                let names: Vec<&str> = sets.iter().map(|s| s.name.as_str()).collect();
                s.push_str(&format!(
                    "\nOAI-PMH repository: {}?verb=Identify (sets: {})\n",
                    urls.oai(),
                    names.join(", ")
                ));
            }
        }
    }
    for e in st.collectors.entries() {
        let c = e.collector.config();
        let last = match e.collector.status().await {
            Ok((saved, _)) => saved
                .last_outcome
                .map(|o| {
                    format!(
                        "last run ended {}: {o}",
                        saved.last_ended.unwrap_or_default()
                    )
                })
                .unwrap_or_else(|| "no run has ended yet".into()),
            Err(err) => format!("state unreadable: {}", crate::cause::chain(&err)),
        };
        s.push_str(&format!(
            "
collector {} (OAI-PMH {} metadataPrefix={}{}): {last}
",
            e.collector.name,
            c.url,
            c.metadata_prefix,
            c.set
                .as_deref()
                .map(|s| format!(" set={s}"))
                .unwrap_or_default()
        ));
    }
    let mut r = (
        [(
            axum::http::header::LINK,
            format!("<{hub_url}>; rel=\"hub\""),
        )],
        s,
    )
        .into_response();
    if let Some(l) = inbox::link(&st) {
        r.headers_mut().append(axum::http::header::LINK, l);
    }
    r
}

/// What to do on an empty store: the three ways to get a first resource set.
pub fn getting_started(config: &Config) -> String {
    let ingest = format!("{}/api/v1/resource-sets/NAME/changes", config.base_url());
    format!(
        "The store holds no resource set yet. To add one:\n\
         - send change events: curl -H 'Content-Type: application/x-ndjson' --data-binary @changes.ndjson {ingest}\n\
         - import a folder:    resourcesync-hub import DIR --set NAME --data-dir {}  (then serve its files: [sets.NAME] resource_root_dir = \"DIR\")\n\
         - or try the demo:    resourcesync-hub serve --demo\n\
         See docs/source.md, \"Feeding it: ingest and import\".\n",
        config.server.data_dir.display()
    )
}

/// The token of an `Authorization: Bearer <token>` header.
pub use crate::conn::client_ip;

pub fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
}

/// The peer address, for the loopback-only ingest rule.
pub type Peer = axum::extract::ConnectInfo<crate::conn::Remote>;
