//! The inbox's notifications in the store: a counter document (`inbox/next`) handing out
//! numbers, and `keep` slot documents (`inbox/slot/N`), notification `seq` in slot
//! `seq % keep`. Both are the components' versioned documents, so both backends keep them and
//! several processes share them (a number is taken by a conditional write, retried when
//! another process took one first). A slot holds its notification's number: one whose slot
//! was reused reads as gone.

use serde::{Deserialize, Serialize};

use super::Outcome;
use crate::model::coar::Pattern;
use crate::store::{Store, StoreError};

/// A notification as the inbox keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Kept {
    pub seq: u64,
    /// When it was taken, in microseconds since the Unix epoch.
    pub received_us: i64,
    /// The declared sender's name.
    pub sender: String,
    pub pattern: Pattern,
    /// The notification as it was posted (parsed JSON).
    pub notification: serde_json::Value,
    pub outcome: Outcome,
    /// The answers sent to the sender's inbox (an offer's `Accept` and `Announce`, or its
    /// `Reject`), and how each went.
    #[serde(default)]
    pub replies: Vec<Reply>,
}

/// An answer to the sender, and how sending it went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    /// `Accept`, `Reject` or `Announce`.
    pub kind: String,
    /// Its own id (`urn:uuid:…`).
    pub id: String,
    /// `pending`, `sent` (the inbox answered 2xx) or `given_up`.
    pub state: String,
    pub attempts: u32,
    /// The last attempt's answer or error.
    pub last: Option<String>,
    /// The answer itself, kept until it is sent (a restart sends it then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc: Option<serde_json::Value>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Next {
    /// The number the next notification gets (numbers start at 1).
    next: u64,
}

const NEXT: &str = "inbox/next";

fn slot_key(slot: u64) -> String {
    format!("inbox/slot/{slot}")
}

fn corrupt(key: &str, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(format!(
        "the store's document {key} is not what this version wrote: {e}"
    ))
}

/// Tries of a conditional write before the request is refused as too busy.
const TRIES: usize = 50;

pub(super) struct Ring {
    store: Store,
    keep: u64,
}

impl Ring {
    pub fn new(store: Store, keep: u32) -> Ring {
        Ring {
            store,
            keep: u64::from(keep.max(1)),
        }
    }

    /// The number the next notification will get (1 when none was kept).
    pub async fn next(&self) -> Result<u64, StoreError> {
        Ok(match self.store.state(NEXT).await? {
            None => 1,
            Some((json, _)) => {
                serde_json::from_str::<Next>(&json)
                    .map_err(|e| corrupt(NEXT, e))?
                    .next
            }
        })
    }

    /// Keeps `k` under a new number, which it returns.
    pub async fn put(&self, k: &Kept) -> Result<u64, StoreError> {
        let mut seq = None;
        for _ in 0..TRIES {
            let (n, v) = match self.store.state(NEXT).await? {
                None => (1, None),
                Some((json, v)) => (
                    serde_json::from_str::<Next>(&json)
                        .map_err(|e| corrupt(NEXT, e))?
                        .next,
                    Some(v),
                ),
            };
            let json = serde_json::to_string(&Next { next: n + 1 }).expect("serializes");
            if self.store.save_state(NEXT, &json, v).await?.is_some() {
                seq = Some(n);
                break;
            }
        }
        let seq = seq.ok_or_else(|| {
            StoreError::Unavailable("the inbox's counter kept changing; try again".into())
        })?;
        let mut k = k.clone();
        k.seq = seq;
        self.write(&k).await?;
        Ok(seq)
    }

    /// Writes `k` into its slot, whatever the slot held.
    async fn write(&self, k: &Kept) -> Result<(), StoreError> {
        let key = slot_key(k.seq % self.keep);
        let json = serde_json::to_string(k).expect("serializes");
        for _ in 0..TRIES {
            let held = self.store.state(&key).await?;
            if let Some((old, _)) = &held {
                let old: Kept = serde_json::from_str(old).map_err(|e| corrupt(&key, e))?;
                // A newer notification took the slot meanwhile (the ring went round): this one
                // is gone already.
                if old.seq > k.seq {
                    return Ok(());
                }
            }
            let v = held.map(|(_, v)| v);
            if self.store.save_state(&key, &json, v).await?.is_some() {
                return Ok(());
            }
        }
        Err(StoreError::Unavailable(format!(
            "the inbox's slot {key} kept changing; try again"
        )))
    }

    async fn read(&self, key: &str) -> Result<Option<Kept>, StoreError> {
        match self.store.state(key).await? {
            None => Ok(None),
            Some((json, _)) => Ok(Some(
                serde_json::from_str(&json).map_err(|e| corrupt(key, e))?,
            )),
        }
    }

    /// Notification `seq`, unless its slot was reused (or it was never kept).
    pub async fn get(&self, seq: u64) -> Result<Option<Kept>, StoreError> {
        if seq == 0 {
            return Ok(None);
        }
        Ok(self
            .read(&slot_key(seq % self.keep))
            .await?
            .filter(|k| k.seq == seq))
    }

    /// Changes notification `seq` with `f` (unless it is gone).
    pub async fn update(&self, seq: u64, f: impl FnOnce(&mut Kept)) -> Result<(), StoreError> {
        let Some(mut k) = self.get(seq).await? else {
            return Ok(());
        };
        f(&mut k);
        self.write(&k).await
    }
}
