//! Long-running loops, each `async fn run(ctx, cancel)`, racing every sleep against shutdown.

pub mod adopt;
pub mod memory;
pub mod rollover;
