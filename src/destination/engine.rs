//! The harvest engine embedded in another program: the server's ResourceSync collectors
//! follow their sources with it, each into an output of their own (the
//! server's store), its callbacks served on the server's own port.
//!
//! The engine is the one `harvest` runs: discovery, baseline from the Resource List or Dump,
//! subscriptions, Change Lists, gap filling, its trust boundary and bounds, its state (one
//! SQLite file for the process). What differs: sources start and stop one by one as their
//! owner asks (a collector held or let go), each with the output it is given; a source whose
//! configuration asks for what it does not offer stops itself and says why (`status`), the
//! others go on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::config::{HarvestConfig, NamedSource};
use super::output::Output;
use super::{follow, follow_source, Harvester, Housekeeping, Parts, Running};

/// The engine of a process: its parts and the sources running on them.
pub struct Engine {
    cfg: HarvestConfig,
    parts: Arc<Parts>,
    wakes: follow::Wakes,
    callback_base: String,
    running: Mutex<HashMap<String, (Running, Arc<tokio::sync::Notify>)>>,
}

impl Engine {
    /// Opens the engine configured by `cfg` (its `sources` are ignored: they are started one
    /// by one), and the routes of its callbacks, to be served at `callback_base`.
    /// `hosts`: the limits at each authority the engine's requests keep, with its host's.
    pub async fn open(
        cfg: HarvestConfig,
        callback_base: String,
        hosts: super::fetch::Hosts,
    ) -> anyhow::Result<(Engine, follow::Callbacks)> {
        let parts = Parts::open(&cfg, true, hosts)?;
        let wakes = follow::Wakes::default();
        let routes =
            follow::Callbacks(follow::router(parts.state.clone(), wakes.clone(), &cfg.push).await?);
        let mut cfg = cfg;
        cfg.sources = Vec::new();
        Ok((
            Engine {
                cfg,
                parts,
                wakes,
                callback_base,
                running: Default::default(),
            },
            routes,
        ))
    }

    /// The configuration of `source` as the engine runs it.
    fn config_of(&self, source: &NamedSource) -> HarvestConfig {
        let mut c = self.cfg.clone();
        c.sources = vec![source.clone()];
        c
    }

    /// Starts following `source` into `output`; one already running with the same
    /// configuration goes on untouched, one with another is restarted.
    pub fn start(&self, source: &NamedSource, output: Arc<dyn Output>) -> anyhow::Result<()> {
        let mut running = self.running.lock().expect("engine lock");
        if let Some((r, _)) = running.get(&source.name) {
            if &r.source == source && !r.stop.is_cancelled() {
                return Ok(());
            }
            r.stop.cancel();
        }
        let cfg = self.config_of(source);
        let h = Arc::new(Harvester::new(
            &cfg,
            source,
            self.callback_base.clone(),
            &self.parts,
            Some(output),
        )?);
        let keeping = Housekeeping {
            tracker: self.parts.tasks.clone(),
            busy: Default::default(),
        };
        let stop = self.parts.cancel.child_token();
        let (until, wakes) = (stop.clone(), self.wakes.clone());
        let asked = Arc::new(tokio::sync::Notify::new());
        let ask = asked.clone();
        self.parts.tasks.spawn(async move {
            let label = h.label().to_string();
            let r = tokio::select! {
                r = follow_source(h, wakes, keeping, false, ask) => r,
                _ = until.cancelled() => Ok(()),
            };
            if let Err(e) = r {
                tracing::error!(source = %label, error = %format!("{e:#}"), "the source stopped: its state failed");
            }
        });
        running.insert(
            source.name.clone(),
            (
                Running {
                    source: source.clone(),
                    stop,
                },
                asked,
            ),
        );
        Ok(())
    }

    /// Stops following `name` (its work ends at the step it waits on; what it applied is in
    /// the state, and its next start goes on from there).
    pub fn stop(&self, name: &str) {
        if let Some((r, _)) = self.running.lock().expect("engine lock").remove(name) {
            r.stop.cancel();
        }
    }

    /// Whether `name` is being followed here.
    pub fn is_running(&self, name: &str) -> bool {
        self.running
            .lock()
            .expect("engine lock")
            .get(name)
            .is_some_and(|(r, _)| !r.stop.is_cancelled())
    }

    /// Asks the source `name` to read its Change Lists now, as at its periodic check (once
    /// its baseline is done); whether it is followed here.
    pub fn check_now(&self, name: &str) -> bool {
        match self.running.lock().expect("engine lock").get(name) {
            Some((r, asked)) if !r.stop.is_cancelled() => {
                asked.notify_one();
                true
            }
            _ => false,
        }
    }

    /// `harvest status` of `source`: its sets, positions, queue, refusals and errors.
    pub async fn status(&self, source: &NamedSource) -> anyhow::Result<String> {
        let cfg = self.config_of(source);
        let name = source.name.clone();
        self.parts
            .state
            .run_any(move |s| super::report::status_in(&cfg, s, Some(&name)))
            .await
    }

    /// `harvest audit` of `source` against `output`: the report and whether it is in sync.
    pub async fn audit(
        &self,
        source: &NamedSource,
        output: Arc<dyn Output>,
    ) -> anyhow::Result<(String, bool)> {
        let cfg = self.config_of(source);
        super::report::audit_with(&self.parts, &cfg, Some(&source.name), Some(output)).await
    }

    /// Stops every source and waits for their work to end.
    pub async fn shutdown(&self) {
        self.parts.cancel.cancel();
        self.parts
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.parts.tasks.close();
        self.parts.tasks.wait().await;
    }
}
