//! The integration tests: one binary, the real server in-process (see `support`).

mod support;

mod cli;
mod documents;
mod ingest;
mod resync;
mod restart;
mod scale;
mod store_contract;
