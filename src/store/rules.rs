//! What every backend shares and the dispatch above them (`store/hub.rs`) does not own: how a
//! batch of delivery outcomes folds into each subscription's state, how that state reads, and
//! the set rules that adopting external writers' documents needs. Below both the backends and
//! the dispatch, so neither imports the other for them.

use std::collections::HashMap;

use super::ListPolicy;
use crate::model::websub::{HoldReason, MessageId, Outcome, SubState, SubscriptionId};
use crate::model::{Location, ResourceKey, SetName, Timestamp};

/// How a set names its resources and cuts its lists (from the configuration).
pub trait SetRules: Send + Sync {
    fn key(&self, set: &SetName, location: &Location) -> Result<ResourceKey, String>;
    fn policy(&self, set: &SetName) -> ListPolicy;
}

/// A subscription's state after a batch of outcomes, folded in order (every backend writes
/// one update per subscription per batch from this).
#[derive(Default, Debug)]
pub(crate) struct Fold {
    pub cursor: MessageId,
    pub attempts: u32,
    pub next_at: Option<i64>,
    pub delivered: i64,
    pub failed: i64,
    pub success: Option<(i64, u16)>,
    pub failure: Option<(i64, Option<u16>, String)>,
    /// `(message, attempts, status, error, at)` of deliveries that failed for good.
    pub failures: Vec<(MessageId, u32, Option<u16>, String, i64)>,
    /// How the run of failures moves: see [`Fold::failing_since`].
    pub streak: Streak,
}

/// How a batch moves a subscription's `failing_since`.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Streak {
    /// A delivery succeeded in the batch: the stored start is dropped.
    pub reset: bool,
    /// The first failure of the batch after its last success (or of the whole batch).
    pub first_failure: Option<i64>,
}

impl Fold {
    /// The subscription's `failing_since` after the batch, given the stored one.
    pub fn failing_since(&self, stored: Option<i64>) -> Option<i64> {
        if self.streak.reset {
            self.streak.first_failure
        } else {
            stored.or(self.streak.first_failure)
        }
    }

    fn failed_at(&mut self, at: i64) {
        self.streak.first_failure.get_or_insert(at);
    }
}

/// Folds outcomes per subscription, in the order the subscriptions first appear.
pub(crate) fn fold(outcomes: Vec<Outcome>) -> Vec<(SubscriptionId, Fold)> {
    let mut folds: Vec<(SubscriptionId, Fold)> = Vec::new();
    let mut index: HashMap<SubscriptionId, usize> = HashMap::new();
    for o in outcomes {
        let sub = match &o {
            Outcome::Delivered { sub, .. }
            | Outcome::Retry { sub, .. }
            | Outcome::Failed { sub, .. }
            | Outcome::Skipped { sub, .. } => *sub,
        };
        let i = *index.entry(sub).or_insert_with(|| {
            folds.push((sub, Fold::default()));
            folds.len() - 1
        });
        let f = &mut folds[i].1;
        match o {
            Outcome::Delivered {
                message,
                at,
                status,
                ..
            } => {
                f.cursor = f.cursor.max(message);
                (f.attempts, f.next_at) = (0, None);
                f.delivered += 1;
                f.success = Some((at.0, status));
                f.streak = Streak {
                    reset: true,
                    first_failure: None,
                };
            }
            Outcome::Retry {
                attempts,
                at,
                next_at,
                status,
                error,
                ..
            } => {
                (f.attempts, f.next_at) = (attempts, Some(next_at.0));
                f.failed_at(at.0);
                f.failure = Some((at.0, status, error));
            }
            Outcome::Failed {
                message,
                attempts,
                at,
                status,
                error,
                ..
            } => {
                f.cursor = f.cursor.max(message);
                (f.attempts, f.next_at) = (0, None);
                f.failed += 1;
                f.failures
                    .push((message, attempts, status, error.clone(), at.0));
                f.failed_at(at.0);
                f.failure = Some((at.0, status, error));
            }
            Outcome::Skipped { through, .. } => {
                f.cursor = f.cursor.max(through);
                (f.attempts, f.next_at) = (0, None);
            }
        }
    }
    folds
}

/// A subscription's state as the admin API reports it: expired once the lease is over,
/// paused or disabled while held, failing while the head is in retry or the last attempt
/// failed, else active.
pub(crate) fn sub_state(
    expires_at: i64,
    held: Option<HoldReason>,
    attempts: u32,
    last_failure_at: Option<i64>,
    last_success_at: Option<i64>,
    now: Timestamp,
) -> SubState {
    if expires_at <= now.0 {
        SubState::Expired
    } else if held == Some(HoldReason::Paused) {
        SubState::Paused
    } else if held == Some(HoldReason::Disabled) {
        SubState::Disabled
    } else if attempts > 0 || last_failure_at.unwrap_or(0) > last_success_at.unwrap_or(0) {
        SubState::Failing
    } else {
        SubState::Active
    }
}
