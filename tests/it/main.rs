//! The integration tests: one binary, the real server in-process (see `support`).

mod accel;
mod activity;
mod admin;
mod aggregate;
mod causes;
mod subscriber;
mod support;

mod cli;
mod collect;
mod console;
mod delivery_auth;
mod documents;
mod dumps;
mod elastic;
mod external;
mod first_hour;
mod harvest;
mod hostile;
mod hub;
mod hub_crash;
mod ingest;
mod ingestion3;
mod layout;
mod multi;
mod notify;
mod oai;
mod oracle;
mod restart;
mod resync;
mod scale;
mod security;
mod shards;
mod steer;
mod store_contract;
mod strict;
