//! The collector (issue 35, under way): OAI-PMH repositories feeding resource sets. So far the
//! protocol's reading ([`oai`]): pure functions over a response's bytes, each record checked on
//! its own so that a repository's bad input costs one record, never the page; and where a
//! record's file goes ([`path`]); what a record becomes in its set ([`map`]).

pub mod map;
pub mod oai;
pub mod path;
