//! Turns at walking lists, shared fairly by the sources of one harvester.
//!
//! At most `fetch.concurrency` sources walk a list (discovery, a baseline's Resource List) at
//! once: descriptors follow the work, not the number of sources. A turn used to be held for a
//! whole baseline, so a few sources of millions of resources kept thousands of small ones
//! waiting for hours. Now a walk *passes* at each batch boundary: the work it did is charged to
//! its source (resources over the source's `weight`), and if a source that has had less waits,
//! the turn goes to it and the walk waits for its next one (weighted fair queueing over
//! sources, the source with the least work per weight served first). A source that arrives,
//! or comes back after a pause, starts at the clock (the charge of the last turn given), so
//! neither a newcomer nor a long-idle source can take every turn for long.
//!
//! Push deliveries and Change List checks take no turn: they never wait behind baselines.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The turns of one process. Cheap to clone (shared).
#[derive(Clone)]
pub(crate) struct Turns(Arc<Mutex<Inner>>);

struct Inner {
    /// Turns not held by anyone.
    free: usize,
    /// Work per weight charged to each source so far (its virtual time).
    served: HashMap<String, f64>,
    /// The charge of the last turn given.
    clock: f64,
    /// Who waits, the least charged first (then the first come).
    waiting: BTreeMap<(u64, u64), Waiter>,
    seq: u64,
}

struct Waiter {
    source: String,
    weight: f64,
    tx: oneshot::Sender<Turn>,
}

/// A source's turn at walking; given to the next waiter when dropped.
pub(crate) struct Turn {
    turns: Turns,
    source: String,
    weight: f64,
    /// Whether dropping it gives it on (not when it was handed over already).
    armed: bool,
}

/// A charge as an ordered key (thousandths of a resource).
fn key(charge: f64) -> u64 {
    (charge.max(0.0) * 1000.0) as u64
}

impl Turns {
    pub(crate) fn new(n: usize) -> Turns {
        Turns(Arc::new(Mutex::new(Inner {
            free: n.max(1),
            served: HashMap::new(),
            clock: 0.0,
            waiting: BTreeMap::new(),
            seq: 0,
        })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().expect("turns lock")
    }

    /// Waits for a turn of `source` (its `weight`: its share when sources contend).
    pub(crate) async fn take(&self, source: &str, weight: f64) -> Turn {
        let rx = {
            let mut i = self.lock();
            let clock = i.clock;
            let charge = i.served.entry(source.to_string()).or_insert(0.0);
            *charge = charge.max(clock);
            let charge = *charge;
            if i.free > 0 && i.waiting.is_empty() {
                i.free -= 1;
                return Turn {
                    turns: self.clone(),
                    source: source.to_string(),
                    weight,
                    armed: true,
                };
            }
            i.wait(source, weight, charge)
        };
        rx.await
            .expect("a waiter's sender is only dropped once it has sent")
    }

    /// Gives a turn to the least charged waiter (or keeps it free).
    fn give(&self) {
        loop {
            let w = {
                let mut i = self.lock();
                let Some(((k, _), w)) = i.waiting.pop_first() else {
                    i.free += 1;
                    return;
                };
                i.clock = i.clock.max(k as f64 / 1000.0);
                w
            };
            let t = Turn {
                turns: self.clone(),
                source: w.source,
                weight: w.weight,
                armed: true,
            };
            match w.tx.send(t) {
                Ok(()) => return,
                // It stopped waiting (its source was stopped): the next one.
                Err(mut t) => t.armed = false,
            }
        }
    }
}

impl Inner {
    fn wait(&mut self, source: &str, weight: f64, charge: f64) -> oneshot::Receiver<Turn> {
        let (tx, rx) = oneshot::channel();
        self.seq += 1;
        let seq = self.seq;
        self.waiting.insert(
            (key(charge), seq),
            Waiter {
                source: source.to_string(),
                weight,
                tx,
            },
        );
        rx
    }
}

impl Turn {
    /// A batch boundary of the walk: `work` resources are charged to the source; when a
    /// source charged less waits, the turn goes to it and this waits for its next one.
    pub(crate) async fn pass(&mut self, work: u64) {
        let rx = {
            let mut i = self.turns.lock();
            let charge = i.served.entry(self.source.clone()).or_insert(0.0);
            *charge += work as f64 / self.weight;
            let charge = *charge;
            match i.waiting.first_key_value() {
                Some(((k, _), _)) if *k < key(charge) => {}
                _ => return,
            }
            i.wait(&self.source, self.weight, charge)
        };
        self.armed = false;
        self.turns.give();
        *self = rx
            .await
            .expect("a waiter's sender is only dropped once it has sent");
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if self.armed {
            self.armed = false;
            self.turns.give();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that passes with less charged waiting hands its turn over; the small source
    /// that arrives while a big one walks goes first.
    #[tokio::test]
    async fn the_least_charged_source_goes_first() {
        let turns = Turns::new(1);
        let mut big = turns.take("big", 1.0).await;
        big.pass(256).await; // nobody waits: keeps it
        let t2 = turns.clone();
        let small = tokio::spawn(async move {
            let t = t2.take("small", 1.0).await;
            drop(t);
            "small"
        });
        // Wait until the small one waits.
        while turns.lock().waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        let t3 = turns.clone();
        let big_again = tokio::spawn(async move {
            big.pass(256).await; // the small one (charged 256, the clock) waits: hands over
            drop(big);
            "big"
        });
        assert_eq!(small.await.unwrap(), "small");
        assert_eq!(big_again.await.unwrap(), "big");
        assert_eq!(t3.lock().free, 1, "every turn is back");
    }

    /// A waiter that stops waiting does not take a turn with it.
    #[tokio::test]
    async fn a_cancelled_waiter_loses_no_turn() {
        let turns = Turns::new(1);
        let held = turns.take("a", 1.0).await;
        let t2 = turns.clone();
        let waiting = tokio::spawn(async move { t2.take("b", 1.0).await });
        while turns.lock().waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        waiting.abort();
        let _ = waiting.await;
        drop(held);
        let _again = turns.take("c", 1.0).await;
        assert_eq!(turns.lock().free, 0);
    }

    /// With weights 3 and 1 contending for one turn, the heavier gets three passes for one.
    #[tokio::test]
    async fn weights_share_the_turns() {
        let turns = Turns::new(1);
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, weight) in [("heavy", 3.0), ("light", 1.0)] {
            let (turns, order) = (turns.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let mut t = turns.take(name, weight).await;
                for _ in 0..8 {
                    order.lock().unwrap().push(name);
                    t.pass(100).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap();
        let first: Vec<_> = order.iter().take(8).collect();
        let heavy = first.iter().filter(|n| **n == &"heavy").count();
        assert!(
            heavy >= 5,
            "of the first 8 passes, heavy had {heavy}: {order:?}"
        );
    }
}
