//! resourcesync-hub: a ResourceSync source (ANSI/NISO Z39.99-2017) and a change-notification
//! push hub (WebSub), in one binary, with the destination (`harvest`) beside them.
//!
//! # Layout
//!
//! The one map of the code, its floors (a module uses only modules on floors below its own,
//! checked by `tests/it/layout.rs`, which also checks the map's floors) and where a change
//! belongs: `docs/architecture.md`.

pub mod admin_cli;
pub mod app;
pub mod backoff;
pub mod cause;
pub mod collect;
pub mod config;
pub mod conn;
pub mod context;
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
pub mod inbox;
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
