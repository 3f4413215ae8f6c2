//! The application: open the store, register configured sets, start the workers and serve
//! until `shutdown` resolves. `main`, the tests and the examples all come in through `run`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::context::Context;
use crate::http::{self, AppState, Shared};
use crate::hub::Hub;
use crate::model::{SetName, Timestamp};
use crate::notify::Notifier;
use crate::source::Source;
use crate::store::Store;
use crate::workers;

/// Opens the configured store: the embedded database (creating the data directory on first
/// start) or Elasticsearch (creating or checking its indices). Fails with a message naming
/// what could not be reached.
pub async fn open_store(config: &Config) -> anyhow::Result<Store> {
    if config.store.backend == crate::config::Backend::Elasticsearch {
        let es = &config.store.elasticsearch;
        let (store, version) = Store::open_elasticsearch(es).await.with_context(|| {
            format!(
                "cannot open the Elasticsearch store at {} (store.elasticsearch)",
                es.server_url()
            )
        })?;
        tracing::info!(url = %es.server_url(), index = %es.index, %version, "Elasticsearch store opened");
        return Ok(store);
    }
    std::fs::create_dir_all(&config.server.data_dir).with_context(|| {
        format!(
            "cannot create data directory {}",
            config.server.data_dir.display()
        )
    })?;
    Ok(Store::open_embedded(&config.database_path())?)
}

/// Fills in `server.base_url` from the bound address when it was left empty.
pub fn resolve_base_url(config: &mut Config, addr: SocketAddr) {
    if config.server.base_url.is_empty() {
        config.server.base_url = format!("http://{addr}");
    }
}

/// Serves on `listener` until `shutdown` completes, then drains requests in flight (bounded by
/// `server.shutdown_grace_secs`) and stops the workers. Every task it starts is owned by one
/// tracker and awaited, and the hub is shut down (its lanes' outcomes written) on every way
/// out, a failure included.
pub async fn run(
    mut config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    workers::memory::configure();
    let addr = listener.local_addr()?;
    resolve_base_url(&mut config, addr);
    let config = Arc::new(config);
    let store = open_store(&config).await?;
    let now = Timestamp::now();
    for name in config.configured_sets() {
        let set = SetName::parse(name).map_err(anyhow::Error::msg)?;
        if store.ensure_set(&set, now).await? {
            tracing::info!(set = %set, "configured resource set registered");
        }
    }
    if store.sets().await?.is_empty() {
        for line in http::getting_started(&config).lines() {
            tracing::info!("{line}");
        }
    }
    let hub = Hub::start(&config, store.clone()).await?;
    let cancel = CancellationToken::new();
    let tasks = TaskTracker::new();
    let served = serve(
        config,
        store,
        hub.clone(),
        listener,
        shutdown,
        &tasks,
        cancel.clone(),
    )
    .await;
    cancel.cancel();
    tasks.close();
    tasks.wait().await;
    hub.shutdown().await;
    served
}

/// Starts the workers on `tasks` and serves until `shutdown` (or a failure).
async fn serve(
    config: Arc<Config>,
    store: Store,
    hub: Arc<Hub>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    tasks: &TaskTracker,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    let store_is_shared = store.is_shared();
    let ctx = Arc::new(Context::new(config.clone(), store, hub.metrics().clone()));
    let source = Arc::new(Source::open(ctx.clone())?);
    if config.ingest.token.is_empty() {
        tracing::warn!("ingest.token is not set: the ingest API answers only loopback clients");
        if !config.server.accel_redirect.is_empty() {
            tracing::warn!(
                "behind nginx every connection comes from loopback: without ingest.token, ingest \
                 trusts nginx's X-Forwarded-For to name the client (a proxy that sets none lets \
                 every client ingest); set ingest.token"
            );
        }
    }
    // Each loop of the server under a supervisor: one that ends unexpectedly is logged,
    // counted and started again, never lost while the process lives on.
    let restarted = hub.metrics().workers_restarted.clone();
    let (s, c) = (ctx.clone(), cancel.clone());
    tasks.spawn(workers::supervise(
        "rollover",
        restarted.clone(),
        cancel.clone(),
        move || workers::rollover::run(s.clone(), c.clone()),
    ));
    tasks.spawn(workers::memory::run(Duration::from_secs(5), cancel.clone()));
    let notifier = config
        .notify
        .enabled
        .then(|| Notifier::new(config.clone(), ctx.clone(), hub.clone()));
    if let Some(n) = &notifier {
        let (n, c) = (n.clone(), cancel.clone());
        tasks.spawn(workers::supervise(
            "notifier",
            restarted.clone(),
            cancel.clone(),
            move || n.clone().run(c.clone()),
        ));
    }
    // External writers' documents are adopted by a worker of their own (only a shared store
    // has external writers), which hands what it adopted to the notifier.
    if store_is_shared {
        let (poke, s, h, c) = (notifier.clone(), ctx.clone(), hub.clone(), cancel.clone());
        tasks.spawn(workers::supervise(
            "adoption",
            restarted.clone(),
            cancel.clone(),
            move || {
                let poke = poke.clone();
                workers::adopt::run(
                    s.clone(),
                    h.clone(),
                    move |n| {
                        if let Some(p) = &poke {
                            p.poke(n)
                        }
                    },
                    c.clone(),
                )
            },
        ));
    }

    let poke = notifier.clone();
    let collectors = crate::collect::Collectors::new(
        &config,
        ctx.clone(),
        Arc::new(move |n| {
            if let Some(p) = &poke {
                p.poke(n)
            }
        }),
        hub.owner().to_string(),
    )
    .await?;
    collectors.spawn(tasks, cancel.clone(), restarted.clone());
    {
        // The harvest engine's sources stop with the process, their state saved.
        let (c, stop) = (collectors.clone(), cancel.clone());
        tasks.spawn(async move {
            stop.cancelled().await;
            c.shutdown().await;
        });
    }

    if config.admin.token.is_empty() {
        tracing::warn!("admin.token is not set: the admin API (/admin/v1) is disabled");
    }
    if config.hub.publisher_token.is_empty() {
        tracing::info!("hub.publisher_token is not set: fat pings (POSTed payloads) are refused");
    }
    let dumps = if config.dumps.enabled {
        Some(crate::dump::Dumps::open(
            config.clone(),
            ctx.clone(),
            hub.clone(),
        )?)
    } else {
        None
    };
    if let Some(d) = &dumps {
        // What earlier runs built is offered before the first request.
        d.restore().await;
        let (d, c) = (d.clone(), cancel.clone());
        tasks.spawn(workers::supervise(
            "dumps",
            restarted.clone(),
            cancel.clone(),
            move || d.clone().run(c.clone()),
        ));
    }
    let open_connections = hub.metrics().open_connections.clone();
    let oai = config
        .oai
        .enabled
        .then(|| Arc::new(crate::oaipmh::Repository::new(ctx.clone())));
    let inbox = if config.inbox.enabled {
        Some(Arc::new(crate::inbox::Inbox::new(
            ctx.clone(),
            hub.clients(),
            collectors.clone(),
            tasks.clone(),
            cancel.clone(),
        )?))
    } else {
        None
    };
    if let Some(i) = &inbox {
        let (i, c) = (i.clone(), cancel.clone());
        tasks.spawn(async move {
            tokio::select! {
                _ = i.resume() => {}
                _ = c.cancelled() => {}
            }
        });
    }
    let app = http::router(AppState::new(Shared {
        config: config.clone(),
        ctx,
        source,
        hub,
        notifier,
        dumps,
        collectors,
        oai,
        inbox,
        console_key: Default::default(),
        guesses: Arc::new(crate::ui::Guesses::per_minute(
            config.admin.wrong_tokens_per_minute,
        )),
    }));
    tracing::info!(%addr, base_url = %config.base_url(), data_dir = %config.server.data_dir.display(), "resourcesync-hub listening");

    let grace = Duration::from_secs(config.server.shutdown_grace_secs);
    let stop = cancel.clone();
    // TCP_NODELAY on each connection, one on which nothing moves is let go, and no more than
    // `server.max_connections` are open at once.
    let listener = crate::conn::Listener::new(
        listener,
        Duration::from_secs(config.server.idle_timeout_secs),
    )
    .with_limit(config.server.max_connections, open_connections);
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<crate::conn::Remote>(),
    )
    .with_graceful_shutdown(async move {
        tokio::select! {
            _ = shutdown => tracing::info!("shutting down"),
            _ = stop.cancelled() => {}
        }
        stop.cancel();
    });
    // The server is not on the tracker: past the grace period it is abandoned, not awaited.
    let mut server = tokio::spawn(async move { server.await });
    tokio::select! {
        res = &mut server => res??,
        _ = cancel.cancelled() => match tokio::time::timeout(grace, &mut server).await {
            Ok(res) => res??,
            Err(_) => {
                tracing::warn!(?grace, "requests still in flight after the grace period; stopping anyway");
                server.abort();
            }
        },
    }
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
