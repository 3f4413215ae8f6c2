//! resourcesync-hub: a ResourceSync source (ANSI/NISO Z39.99-2017) and a change-notification
//! push hub (WebSub), in one binary, with the destination (`harvest`) beside them.
//!
//! # Layout
//!
//! Floors, lowest first; a module uses only modules on floors below its own (checked by
//! `tests/it/layout.rs`):
//! 1. [`digest`] (hex digests), [`cause`] (an error and its causes in words), [`metrics`],
//!    [`admin_cli`] (talks to the admin API over HTTP), [`conn`] (accepted connections: no
//!    delay, let go when nothing moves, at most `server.max_connections` open), [`ui`] (what
//!    the two consoles share: page frame, assets, security headers, session cookies, the
//!    guessing throttle), `fuzz` (test builds only: inputs for the parsers' property tests);
//! 2. [`model`]; 3. [`config`]; 4. [`store`], [`sitemap`]; 5. [`source`], [`hub`], [`package`];
//! 6. [`notify`], [`ingest`], [`import`], [`workers`], [`destination`]; 7. [`error`], [`demo`],
//!    [`dump`], [`collect`], [`oaipmh`]; 8. [`http`]; 9. [`app`].
//!
//! - [`model`]: the seeds' document model: sets and their effective configuration, locations,
//!   resources, changes, change events; the WebSub records and signatures ([`model::websub`]);
//!   a collected record's identity (its path from its OAI identifier and back, its sets and
//!   origin from its links: [`model::origin`]).
//! - [`config`]: layered configuration (compiled-in commented defaults, `--config`, `RSHUB_*`, flags).
//! - [`store`]: the storage contract (the `SetStore` and `HubStore` traits, the pure planner of
//!   applying a change) and its backends (the embedded SQLite store; Elasticsearch, shareable by
//!   several processes), whose own types no module outside it names.
//! - [`sitemap`]: ResourceSync XML writing and reading, pure functions.
//! - [`package`]: the dump package format (manifest first, member names, what a manifest
//!   entry promises), its builder and its reading, for [`dump`] and [`destination`] alike.
//! - [`source`]: the pull side: every document (the ResourceSync documents, and each set's
//!   IIIF Change Discovery activity stream), generated from the store, kept with its gzip
//!   form in a page cache on disk (surviving restarts) and, for small pages, in memory.
//! - [`hub`]: the WebSub hub: requests, verification, signatures, address policy, delivery lanes
//!   (a state machine each: paced, held, authenticated per subscriber), and on a shared store
//!   the partitions that spread delivery over the processes.
//! - [`notify`]: the poller turning store changes into change and framework notifications.
//! - [`metrics`]: Prometheus metrics; [`admin_cli`]: the `admin` commands.
//! - [`ingest`]: the harvester's API: change events in, atomic batches into the store.
//! - [`import`]: the folder scanner behind `resourcesync-hub import`.
//! - [`collect`]: OAI-PMH repositories feeding resource sets (`[collect.NAME]`): runs inside
//!   `serve` (or `collect --once`), state and leases in the store, changes through [`ingest`].
//! - [`oaipmh`]: the OAI-PMH 2.0 repository at `/oai` over the sets of XML records (lists
//!   walked over the change log, signed stateless resumption tokens, `ListRecords` pages kept
//!   on disk in its own folder of the page cache's directory).
//! - [`http`]: axum handlers only (the console's pages among them, over the admin API's views);
//!   [`error`]: the one error-to-status table.
//! - [`workers`]: background loops (Change List rollover).
//! - [`app`]: `run(config, listener, shutdown)`, the one entry point of main, tests and examples.
//! - [`demo`]: the demo set behind `serve --demo`.
//! - [`dump`]: Resource Dumps and Change Dumps: ZIP packages built in the background from the
//!   sets' files, replaced atomically, announced by framework notifications.
//! - [`destination`]: the second wing, `resourcesync-hub harvest`: discovery, streaming baseline,
//!   push subscription with gap filling from the Change Lists, its own state database and outputs,
//!   behind one trust boundary (every request checked against the source's scope, every body
//!   bounded: [`destination::scope`], [`destination::fetch`]), and its console on its callback
//!   server (or an address of its own).
//!   It shares [`model`], [`sitemap`], [`package`], [`digest`], [`conn`] and one helper of [`config`] (relative paths
//!   taken beside the configuration file) and never uses the server's store, hub, source or
//!   notifier (the layout test checks that too).

pub mod admin_cli;
pub mod app;
pub mod cause;
pub mod collect;
pub mod config;
pub mod conn;
pub mod demo;
pub mod destination;
pub mod digest;
pub mod dump;
pub mod error;
#[cfg(test)]
pub mod fuzz;
pub mod http;
pub mod hub;
pub mod import;
pub mod ingest;
pub mod metrics;
pub mod model;
pub mod notify;
pub mod oaipmh;
pub mod package;
pub mod sitemap;
pub mod source;
pub mod store;
pub mod ui;
pub mod workers;
