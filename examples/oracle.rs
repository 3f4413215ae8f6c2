//! The oracle for long runs: random operations against the real server, every read surface
//! compared with a model of the rules (`tests/oracle/`; the suite runs it for about a minute).
//!
//!     cargo build --release && cargo run --release --example oracle -- --minutes 60
//!     cargo run --release --example oracle -- --seed 1234 --cases 1      # replay a failure
//!     cargo run --release --example oracle -- --elastic http://127.0.0.1:9200 --minutes 10
//!
//! Options: `--cases N` (default: as many as fit), `--seed S`, `--minutes M` (default 10),
//! `--ops N` (operations per case at most, default 32), `--elastic URL` (an Elasticsearch or
//! OpenSearch to run on instead of the embedded store; each case gets its own indices),
//! `--without windows,notifications,baselines,walks` (surfaces left out; by default all
//! compared; `walks`: walks begun before writes and finished after them).

#[path = "../tests/oracle/mod.rs"]
mod model;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let num = |name: &str, default: u64| {
        arg(name).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number, not {v:?}"))
        })
    };
    let minutes = num("--minutes", 10);
    let cases = num("--cases", u32::MAX as u64) as u32;
    let ops = num("--ops", 32) as usize;
    let seed = arg("--seed").map(|s| s.parse().expect("--seed takes a number"));
    let without = arg("--without").unwrap_or_default();
    let scope = model::Scope {
        windows: !without.contains("windows"),
        notifications: !without.contains("notifications"),
        baselines: !without.contains("baselines"),
        walks: !without.contains("walks"),
    };
    // The server binary beside this example (`cargo build --release` builds it): cases run
    // it in a process of its own and kill it; without it they run the server in-process.
    let bin = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.join("resourcesync-hub")))
        .filter(|b| b.exists());
    match bin {
        Some(b) => {
            println!("the server: {} (killed now and then)", b.display());
            model::use_binary(b);
        }
        None => println!(
            "the server runs in this process (no kills): build the binary beside this example to include them"
        ),
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(minutes * 60);
    let started = std::time::Instant::now();
    match model::explore(cases, ops, scope, arg("--elastic"), seed, Some(deadline)) {
        Ok(n) => println!(
            "{n} cases agreed with the model in {:.0} s",
            started.elapsed().as_secs_f64()
        ),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
