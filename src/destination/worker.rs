//! What a fetch task does: claim the output file, fetch, verify against the list, hand to
//! the output, apply a resource's queued changes in order, run the exec hook.

use std::sync::Arc;
use std::time::Duration;

use super::fetch::Fetcher;
use super::output::{Item, Output};
use super::scope::short;
use super::state::{self, Change, ChangeType, Held, Pending, Standing, State};
use super::{NotApplied, Parts};
use crate::model::Timestamp;

/// A file of the output claimed for a URI being written (see [`Work::claim_many`]); let go when
/// dropped.
pub(super) struct Claim(pub(super) Option<(Arc<Parts>, String)>);

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some((parts, path)) = &self.0 {
            parts.in_flight.lock().expect("in-flight lock").remove(path);
        }
    }
}

/// What a source's fetch tasks need: built once per source, shared by its tasks through one
/// `Arc` (the process's [`Parts`] behind it).
pub(super) struct Work {
    pub(super) parts: Arc<Parts>,
    pub(super) fetcher: Fetcher,
    pub(super) output: Arc<dyn Output>,
    /// `output.exec`: the hook run for each applied change.
    pub(super) exec: String,
    /// `fetch.backoff_initial_ms`, `fetch.backoff_max_ms`: the pause before a failed resource
    /// is tried again grows from the first by 4× per try, up to ten times the second.
    pub(super) backoff: (u64, u64),
}

impl Work {
    /// When a resource that failed its try number `tries` + 1 is tried again: the pause grows
    /// from `fetch.backoff_initial_ms` by 4× per try, up to ten times `fetch.backoff_max_ms`.
    pub(super) fn next_try(&self, tries: u32) -> Timestamp {
        let (first, max) = self.backoff;
        let pause_ms = first
            .saturating_mul(4u64.saturating_pow(tries + 1))
            .min(max.saturating_mul(10));
        Timestamp(
            Timestamp::now()
                .0
                .saturating_add((pause_ms as i64).saturating_mul(1000)),
        )
    }

    /// Claims the files `uris` get in the output (outputs that name files after URIs): a URI
    /// whose file would be the file of another resource (held, or being written now), or
    /// would need a folder where another's file is (or the other way round), is refused,
    /// never written over it. A claim holds while its guard lives; it becomes durable when
    /// the resource is recorded as held. In their order (of two with one file, the first
    /// keeps it), with one read of the state for all. Each is claimed in memory first and
    /// then checked against the claims recorded: a claim recorded meanwhile was in memory
    /// until then, so one of the two checks sees it. Both checks are [`state::conflict`].
    pub(super) async fn claim_many(&self, uris: &[&str]) -> Vec<Result<Claim, NotApplied>> {
        let (out, check) = self.claim_in_memory(uris);
        if check.is_empty() {
            return out;
        }
        let items: Vec<ClaimItem> = check.iter().map(|(_, i)| i.clone()).collect();
        let found = self
            .parts
            .state
            .run(move |s| recorded_conflicts(s, &items))
            .await;
        settle(out, &check, found)
    }

    /// [`Work::claim_many`] for code on the blocking pool (unpacking a dump package).
    pub(super) fn claim_many_blocking(&self, uris: &[&str]) -> Vec<Result<Claim, NotApplied>> {
        let (out, check) = self.claim_in_memory(uris);
        if check.is_empty() {
            return out;
        }
        let items: Vec<ClaimItem> = check.iter().map(|(_, i)| i.clone()).collect();
        let found = recorded_conflicts(self.parts.state.in_blocking_task(), &items);
        settle(out, &check, found)
    }

    /// The first half of a claim: in memory, against the files being written now. Answers
    /// each URI's claim so far, and those still to check against the claims recorded.
    fn claim_in_memory(&self, uris: &[&str]) -> (Claims, Vec<(usize, ClaimItem)>) {
        let mut out: Vec<Result<Claim, NotApplied>> = Vec::with_capacity(uris.len());
        let mut check = Vec::new();
        let mut writing = self.parts.in_flight.lock().expect("in-flight lock");
        for uri in uris {
            let (root, path) = match self.output.target(uri) {
                Err(e) => {
                    out.push(Err(NotApplied::Refused(format!("{e:#}"))));
                    continue;
                }
                Ok(None) => {
                    out.push(Ok(Claim(None)));
                    continue;
                }
                Ok(Some((root, t))) => (root.display().to_string(), t.display().to_string()),
            };
            let Ok(other) = state::conflict(&mut *writing, &root, &path, uri);
            if let Some(other) = other {
                out.push(Err(refused_for(&other)));
                continue;
            }
            writing.insert(path.clone(), uri.to_string());
            check.push((out.len(), (root, path.clone(), uri.to_string())));
            out.push(Ok(Claim(Some((self.parts.clone(), path)))));
        }
        (out, check)
    }

    /// Fetches, checks length and md5 against `c`, and hands the file to the output.
    pub(super) async fn fetch_verify_put(
        &self,
        set: &str,
        c: &Change,
        claim: Claim,
    ) -> Result<(Held, Claim), NotApplied> {
        let path = self
            .output
            .download_path(&c.uri)
            .map_err(|e| NotApplied::Refused(format!("{e:#}")))?;
        let d = self.fetcher.download(&c.uri, &path, c.length).await?;
        if let Err(e) = c.check(d.length, &d.md5) {
            let _ = std::fs::remove_file(&d.path);
            return Err(NotApplied::Failed(format!("{}: {e}", short(&c.uri))));
        }
        let output = self.output.clone();
        let (set, uri, md5, path, mime) = (
            set.to_string(),
            c.uri.clone(),
            d.md5.clone(),
            d.path.clone(),
            d.mime.clone(),
        );
        let length = d.length;
        let lastmod = c.lastmod.or(Some(c.datetime));
        let put = move || {
            let r = output.put(
                &Item {
                    set: &set,
                    uri: &uri,
                    md5: &md5,
                    length,
                    mime: mime.as_deref(),
                    lastmod,
                },
                &path,
            );
            if r.is_err() {
                let _ = std::fs::remove_file(&path);
            }
            r
        };
        // A rename, like the download's own writes, is done here: the trip to the blocking
        // pool and back cost more than the rename (a tenth of a small file's CPU).
        let placed = if self.output.put_is_quick() {
            put()
        } else {
            tokio::task::spawn_blocking(put)
                .await
                .map_err(|e| NotApplied::Failed(e.to_string()))?
        }
        .map_err(|e| NotApplied::Failed(format!("{e:#}")))?;
        Ok((
            Held {
                md5: Some(d.md5),
                length: Some(d.length),
                path: placed,
                lastmod: c.lastmod.or(Some(c.datetime)),
            },
            claim,
        ))
    }
}

impl Work {
    /// One resource's queued changes, in order. The last change decides the content: the
    /// earlier ones are applied with it (each logged once, the hook run for each). A refusal
    /// (outside the scope, a file another resource has) takes them out of the queue.
    pub(super) async fn apply_queue(
        &self,
        set: &str,
        set_id: i64,
        queue: Vec<Pending>,
        claim: Option<Result<Claim, NotApplied>>,
        max_tries: u32,
        skip: bool,
    ) -> anyhow::Result<()> {
        let last = queue.last().expect("a non-empty queue").clone();
        // The file's claim lives until the change is recorded as applied.
        let mut kept = None;
        let result: Result<Option<Held>, NotApplied> = if last.change.change == ChangeType::Deleted
        {
            let (output, set_s, uri) = (
                self.output.clone(),
                set.to_string(),
                last.change.uri.clone(),
            );
            tokio::task::spawn_blocking(move || output.delete(&set_s, &uri))
                .await?
                .map(|_| None)
                .map_err(|e| NotApplied::Failed(format!("{e:#}")))
        } else {
            match claim {
                Some(Ok(claim)) => {
                    self.fetch_verify_put(set, &last.change, claim)
                        .await
                        .map(|(held, c)| {
                            kept = Some(c);
                            Some(held)
                        })
                }
                Some(Err(e)) => Err(e),
                None => Err(NotApplied::Failed(
                    "no claim for a resource to fetch".into(),
                )),
            }
        };
        let result = match result {
            Ok(held) => {
                let mut hook = Ok(());
                for p in &queue {
                    hook = self.run_hook(set, &p.change, held.as_ref()).await;
                    if hook.is_err() {
                        break;
                    }
                }
                hook.map(|_| held).map_err(NotApplied::Failed)
            }
            Err(e) => Err(e),
        };
        // The outcome is written off the async threads (a commit may wait for a checkpoint).
        let write = |f: Outcome| self.parts.state.run_any(f);
        match result {
            Ok(held) => {
                let q = queue.clone();
                write(Box::new(move |s| {
                    for p in &q {
                        s.applied(set_id, p, held.as_ref())?;
                    }
                    Ok(None)
                }))
                .await?;
                drop(kept);
            }
            Err(NotApplied::Refused(why)) => {
                let (q, w) = (queue.clone(), why.clone());
                write(Box::new(move |s| {
                    for p in &q {
                        s.refuse_change(set_id, p, &w)?;
                    }
                    Ok(None)
                }))
                .await?;
                tracing::warn!(set, uri = %short(&last.change.uri), reason = %why, "refused (listed in harvest status; not fetched, not waited for)");
            }
            Err(NotApplied::Failed(e)) => {
                let not_before = self.next_try(last.tries);
                let (q, err) = (queue.clone(), e.clone());
                let p = write(Box::new(move |s| {
                    let (last, earlier) = q.split_last().expect("a non-empty queue");
                    let p = s.attempt_failed(last, &err, max_tries, skip, not_before)?;
                    // Earlier changes of the resource share the outcome of the last one.
                    for c in earlier {
                        s.attempt_failed(c, &err, max_tries, skip, not_before)?;
                    }
                    Ok(Some(p))
                }))
                .await?
                .expect("the failed change's record");
                let uri = short(&last.change.uri);
                if p.standing == Standing::Skipped {
                    tracing::warn!(set, uri = %uri, tries = p.tries, error = %e, "giving up on a change (fetch.skip_failed): the position moves past it");
                } else if p.standing == Standing::Failed {
                    tracing::warn!(set, uri = %uri, tries = p.tries, error = %e, "change failed; it holds the position and is retried at every check");
                } else {
                    tracing::info!(set, uri = %uri, tries = p.tries, error = %e, "change not applied yet; retried");
                }
            }
        }
        Ok(())
    }

    /// The `output.exec` hook for one applied change, its JSON on standard input.
    pub(super) async fn run_hook(
        &self,
        set: &str,
        c: &Change,
        held: Option<&Held>,
    ) -> Result<(), String> {
        if self.exec.is_empty() {
            return Ok(());
        }
        let json = serde_json::json!({
            "set": set, "uri": c.uri, "change": c.change.as_str(), "datetime": c.datetime.to_string(),
            "md5": held.and_then(|h| h.md5.clone()), "length": held.and_then(|h| h.length),
            "path": held.map(|h| h.path.clone()),
        })
        .to_string();
        let cmd = self.exec.clone();
        let out = tokio::time::timeout(Duration::from_secs(600), async move {
            use tokio::io::AsyncWriteExt;
            let mut child = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(&cmd)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::inherit())
                .stderr(std::process::Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("exec {cmd:?}: {e}"))?;
            let mut stdin = child.stdin.take().expect("piped");
            // One write: a line under PIPE_BUF reaches a hook that appends it to a file whole.
            let _ = stdin.write_all(format!("{json}\n").as_bytes()).await;
            drop(stdin);
            let status = child
                .wait()
                .await
                .map_err(|e| format!("exec {cmd:?}: {e}"))?;
            if status.success() {
                Ok(())
            } else {
                Err(format!("exec {cmd:?} exited with {status}"))
            }
        })
        .await;
        out.unwrap_or_else(|_| Err("exec hook timed out after 600 s".into()))
    }
}

/// Each URI's claim, or why it has none.
type Claims = Vec<Result<Claim, NotApplied>>;

/// A file to check against the claims recorded: (output folder, path, URI).
type ClaimItem = (String, String, String);

fn recorded_conflicts(
    state: &State,
    items: &[ClaimItem],
) -> Result<Vec<Option<String>>, state::StateError> {
    let items: Vec<(&str, &str, &str)> = items
        .iter()
        .map(|(root, path, uri)| (root.as_str(), path.as_str(), uri.as_str()))
        .collect();
    state.claim_conflicts(&items)
}

/// The second half of a claim: a claim recorded by another resource wins (dropping the claim
/// in memory takes it out again); a state that cannot be read fails them all.
fn settle(
    mut out: Vec<Result<Claim, NotApplied>>,
    check: &[(usize, ClaimItem)],
    found: Result<Vec<Option<String>>, state::StateError>,
) -> Vec<Result<Claim, NotApplied>> {
    match found {
        Ok(found) => {
            for ((i, _), other) in check.iter().zip(found) {
                if let Some(other) = other {
                    out[*i] = Err(refused_for(&other));
                }
            }
        }
        Err(e) => {
            for (i, _) in check {
                out[*i] = Err(NotApplied::Failed(e.to_string()));
            }
        }
    }
    out
}

fn refused_for(other: &str) -> NotApplied {
    NotApplied::Refused(format!(
        "its file in the output would be the file (or a folder) of {}",
        short(other)
    ))
}

/// What one change's outcome writes to the state (the failed change's record, if any).
type Outcome = Box<dyn FnOnce(&State) -> anyhow::Result<Option<Pending>> + Send>;
