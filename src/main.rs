//! The `resourcesync-hub` command: parse the CLI, load configuration, start tracing, and hand
//! over to `app::run` (serve) or `import::import_dir` (import).

use anyhow::Context as _;
use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use resourcesync_hub::config::{CliOverrides, Config, DEFAULTS_TOML};
use resourcesync_hub::{app, demo, import};

#[derive(Parser)]
#[command(
    name = "resourcesync-hub",
    version,
    about = "A ResourceSync source and change-notification hub"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server.
    Serve {
        #[command(flatten)]
        common: Common,
        /// Address to listen on, host:port (server.listen) [default: 127.0.0.1:8080].
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Serve a small demo set of real files (set "demo"), imported at start.
        #[arg(long)]
        demo: bool,
    },
    /// Scan a folder and record created/updated/deleted resources of a set in the store.
    Import {
        #[command(flatten)]
        common: Common,
        /// The folder to scan; files become rel_path locations relative to it.
        dir: PathBuf,
        /// The resource set to record the changes in.
        #[arg(long)]
        set: String,
    },
    /// Run the OAI-PMH collectors (`[collect.NAME]`) once and exit, for cron; `serve` runs
    /// them on their own schedule. Prints a line per collector; exit status 1 if one failed.
    Collect {
        #[command(flatten)]
        common: Common,
        /// One run each (required: collectors that keep running live inside `serve`).
        #[arg(long, required = true)]
        once: bool,
        /// Only this collector.
        name: Option<String>,
    },
    /// Print the commented default configuration.
    Config,
    /// The destination: baseline from a source, stay in sync by push, fill gaps from its
    /// Change Lists (`harvest --config harvest.toml`; `harvest config` prints the defaults).
    Harvest(HarvestArgs),
    /// Inspect and steer a running server's hub (its admin API).
    Admin(resourcesync_hub::admin_cli::AdminArgs),
}

#[derive(Args)]
struct HarvestArgs {
    /// The harvest configuration (TOML) layered over the defaults (`harvest config` prints them).
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<HarvestCommand>,
}

#[derive(Subcommand)]
enum HarvestCommand {
    /// Run the harvester until stopped (the default).
    Run,
    /// Position, lag behind the source, subscription and lease, pending and failed resources.
    Status {
        /// Only this source (a `[[sources]]` name).
        #[arg(long, value_name = "NAME")]
        source: Option<String>,
    },
    /// Compare the destination with the source's current Resource List: prints IN SYNC or the
    /// differences (exit status 1 when not in sync).
    Audit {
        /// Only this source (a `[[sources]]` name); default: every source.
        #[arg(long, value_name = "NAME")]
        source: Option<String>,
    },
    /// Print the commented default harvest configuration.
    Config {
        /// The source's URL to write in it (`source.url`; its Source Description).
        #[arg(long, value_name = "URL")]
        url: Option<String>,
    },
    /// Ingestion 3 output: write a new complete snapshot now (previous snapshot + the changes
    /// journaled since); prints what it wrote as JSON (a line per provider).
    Snapshot {
        /// Only this source's provider (of the `[[sources]]` names); default: every one.
        #[arg(long, value_name = "NAME")]
        source: Option<String>,
    },
    /// Ingestion 3 output: recreate the provider's record set as of a past time, written as a
    /// new harvest activity whose provenance names the snapshot it came from.
    Recreate {
        /// The time, as an RFC 3339 / W3C datetime (e.g. 2026-11-23T10:00:00Z).
        #[arg(long, value_name = "DATETIME")]
        at: String,
        /// The source whose provider is recreated (needed with several `[[sources]]`).
        #[arg(long, value_name = "NAME")]
        source: Option<String>,
    },
}

#[derive(Args)]
struct Common {
    /// A TOML configuration file layered over the compiled-in defaults (`resourcesync-hub
    /// config` prints them).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data directory for the embedded store (server.data_dir) [default: ./data].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Public base URL of every advertised document (server.base_url) [default:
    /// http://<listen>].
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
}

impl Common {
    fn overrides(&self, listen: Option<String>) -> CliOverrides {
        CliOverrides {
            config_file: self.config.clone(),
            listen,
            data_dir: self.data_dir.clone(),
            base_url: self.base_url.clone(),
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("info,tower_http=warn")),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    match rt.block_on(real_main(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Each cause once: an error whose words already hold its source's (a
            // `#[error("…: {0}")]`) is not followed by that source again, as `{e:#}` would.
            eprintln!("error: {}", resourcesync_hub::cause::chain(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn real_main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Config => {
            print!("{DEFAULTS_TOML}");
            Ok(())
        }
        Command::Admin(args) => resourcesync_hub::admin_cli::run(args).await,
        Command::Harvest(args) => harvest(args).await,
        Command::Serve {
            common,
            listen,
            demo: with_demo,
        } => {
            let mut config = Config::load(&common.overrides(listen))?;
            let listener = tokio::net::TcpListener::bind(&config.server.listen)
                .await
                .with_context(|| format!("cannot listen on {}", config.server.listen))?;
            app::resolve_base_url(&mut config, listener.local_addr()?);
            if with_demo {
                let dir = demo::prepare(&mut config)?;
                let store = app::open_store(&config).await?;
                let set = resourcesync_hub::model::SetName::parse(demo::DEMO_SET)
                    .map_err(anyhow::Error::msg)?;
                let r = import::import_dir(
                    &store,
                    &config.set_config(demo::DEMO_SET),
                    resourcesync_hub::context::list_policy(&config, &set),
                    &dir,
                    false,
                )
                .await?;
                tracing::info!(created = r.created, updated = r.updated, deleted = r.deleted, dir = %dir.display(), "demo set imported");
                let base = config.base_url();
                // The program as it was started (`target/release/resourcesync-hub` after `cargo
                // run`), so that the commands below run as printed before anything is installed.
                let me = std::env::args()
                    .next()
                    .unwrap_or_else(|| "resourcesync-hub".into());
                println!("Demo: open {base}/console/ (the console: sign in with the token below), {base}/ (the sets and their documents) or {base}/.well-known/resourcesync");
                println!(
                    "Admin API: {base}/admin/v1/openapi.json, with the token {}:
  {me} admin stats --url {base} --token {}",
                    // Shown once, on the terminal that started the demo, to sign in with.
                    config.admin.token.expose(),
                    config.admin.token.expose()
                );
                println!(
                    "Harvest it into ./mirror:
  {me} harvest config --url {base}/.well-known/resourcesync > harvest.toml
  {me} harvest --config harvest.toml"
                );
            }
            app::run(config, listener, app::shutdown_signal()).await
        }
        Command::Collect {
            common,
            once: _,
            name,
        } => collect_once(common, name).await,
        Command::Import { common, dir, set } => {
            let overrides = common.overrides(None);
            let config = Config::load(&overrides)?;
            let name = resourcesync_hub::model::SetName::parse(&set).map_err(anyhow::Error::msg)?;
            if !dir.is_dir() {
                anyhow::bail!("{} is not a directory", dir.display());
            }
            let dir = std::fs::canonicalize(&dir)?;
            announce_store(&config, &overrides)?;
            warn_unserved(&config, &set, &dir);
            let store = app::open_store(&config).await?;
            let report = import::import_dir(
                &store,
                &config.set_config(&set),
                resourcesync_hub::context::list_policy(&config, &name),
                &dir,
                std::io::stderr().is_terminal(),
            )
            .await?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
    }
}

/// `collect --once [NAME]`: every collector (or one) runs once, in this process.
async fn collect_once(common: Common, name: Option<String>) -> anyhow::Result<()> {
    let overrides = common.overrides(None);
    let mut config = Config::load(&overrides)?;
    if config.collect.is_empty() {
        anyhow::bail!("the configuration has no [collect.NAME] table: nothing to collect");
    }
    if let Some(n) = &name {
        if !config.collect.contains_key(n) {
            anyhow::bail!(
                "no collector {n:?}; the configuration has {}",
                config
                    .collect
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if config.server.base_url.is_empty() {
        config.server.base_url = format!("http://{}", config.server.listen);
    }
    let config = std::sync::Arc::new(config);
    let store = app::open_store(&config).await?;
    let now = resourcesync_hub::model::Timestamp::now();
    for n in config.collect.keys() {
        let set = resourcesync_hub::model::SetName::parse(n).map_err(anyhow::Error::msg)?;
        store.ensure_set(&set, now).await?;
    }
    let ctx = std::sync::Arc::new(resourcesync_hub::context::Context::new(
        config.clone(),
        store,
        Default::default(),
    ));
    let owner = format!("collect-once-{}", std::process::id());
    let collectors = resourcesync_hub::collect::Collectors::new(
        &config,
        ctx,
        std::sync::Arc::new(|_| {}),
        owner,
    )
    .await?;
    let cancel = tokio_util::sync::CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        app::shutdown_signal().await;
        stop.cancel();
    });
    let mut failed = 0;
    for (n, r) in collectors.once(name.as_deref(), &cancel).await {
        match r {
            Ok(words) => println!("{n}: {words}"),
            Err(why) => {
                failed += 1;
                println!("{n}: FAILED: {why}");
            }
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} collector(s) failed");
    }
    Ok(())
}

/// Says which store `import` writes to, and refuses to create a new embedded store from the
/// compiled-in `./data` default: an import run from the wrong folder would otherwise fill a
/// store nobody serves.
fn announce_store(config: &Config, overrides: &CliOverrides) -> anyhow::Result<()> {
    use resourcesync_hub::config::Backend;
    match config.store.backend {
        Backend::Elasticsearch => {
            let es = &config.store.elasticsearch;
            eprintln!(
                "import: writing to the Elasticsearch store at {} (indices {}-*)",
                es.server_url(),
                es.index
            );
        }
        Backend::Embedded => {
            let db = std::path::absolute(config.database_path())?;
            if db.exists() {
                eprintln!("import: writing to the embedded store {}", db.display());
            } else if let Some(origin) = Config::data_dir_origin(overrides) {
                eprintln!(
                    "import: creating a new embedded store {} (server.data_dir from {origin})",
                    db.display()
                );
            } else {
                anyhow::bail!(
                    "no store at {}: server.data_dir is the default {:?}, relative to the current directory. \
                     Give the server's configuration (--config FILE) or its data directory (--data-dir DIR); \
                     to start a new store here, pass --data-dir {} explicitly",
                    db.display(),
                    config.server.data_dir.display(),
                    config.server.data_dir.display()
                );
            }
        }
    }
    Ok(())
}

/// Tells the user when the server will not serve the imported files itself, with the
/// configuration to add.
fn warn_unserved(config: &Config, set: &str, dir: &std::path::Path) {
    let sc = config.set_config(set);
    let base = config.base_url();
    match (&sc.resource_root_dir, sc.served_path(&base)) {
        (None, _) => eprintln!(
            "import: note: set {set} has no resource_root_dir, so this server will not serve its files and the \
             URLs in its lists ({}…) lead nowhere. Add to the configuration:\n\n[sets.{set}]\nresource_root_dir = {:?}\n",
            sc.url_prefix,
            dir.display().to_string()
        ),
        (Some(_), None) => eprintln!(
            "import: note: set {set}'s url_prefix {} lies outside base_url {base}, so this server does not serve its \
             files: make them available at {} yourself, or set url_prefix under {base}/ in [sets.{set}]",
            sc.url_prefix, sc.url_prefix
        ),
        (Some(root), Some(_)) if root.as_path() != dir => eprintln!(
            "import: note: set {set} is served from its resource_root_dir {}, not from {}",
            root.display(),
            dir.display()
        ),
        _ => {}
    }
}

async fn harvest(args: HarvestArgs) -> anyhow::Result<()> {
    use resourcesync_hub::destination::{self, config::HarvestConfig};
    let command = args.command.unwrap_or(HarvestCommand::Run);
    if let HarvestCommand::Config { url } = &command {
        print!("{}", destination::config::defaults_for(url.as_deref()));
        return Ok(());
    }
    let cfg = HarvestConfig::load(args.config.as_deref())?;
    match command {
        HarvestCommand::Run => {
            destination::run_reloading(cfg, args.config.clone(), None, app::shutdown_signal()).await
        }
        HarvestCommand::Status { source } => {
            print!("{}", destination::status_of(&cfg, source.as_deref())?);
            Ok(())
        }
        HarvestCommand::Audit { source } => {
            let (report, in_sync) = destination::audit_of(&cfg, source.as_deref()).await?;
            print!("{report}");
            if !in_sync {
                std::process::exit(1);
            }
            Ok(())
        }
        HarvestCommand::Snapshot { source } => {
            println!("{}", destination::snapshot(&cfg, source.as_deref()).await?);
            Ok(())
        }
        HarvestCommand::Recreate { at, source } => {
            let at = resourcesync_hub::model::Timestamp::parse_zoned(&at, "--at")
                // The parser's error is words (a String): no cause to keep.
                .map_err(|e| anyhow::anyhow!("{e} (a datetime like 2026-11-23T10:00:00Z)"))?;
            println!(
                "{}",
                destination::recreate(&cfg, at, source.as_deref()).await?
            );
            Ok(())
        }
        HarvestCommand::Config { .. } => unreachable!(),
    }
}
