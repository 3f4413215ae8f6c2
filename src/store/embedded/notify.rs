//! The notifier's per-set state in the embedded store.

use rusqlite::{params, OptionalExtension};

use super::EmbeddedStore;
use crate::model::{SetName, Timestamp};
use crate::store::{NotifyState, StoreError};

pub(super) fn state_from_row(set: SetName, r: &rusqlite::Row) -> rusqlite::Result<NotifyState> {
    Ok(NotifyState {
        set,
        watermark: Timestamp(r.get(0)?),
        parts_seen: r.get(1)?,
        lists_seen: r.get(2)?,
        announced: r.get::<_, i64>(3)? != 0,
        version: r.get(4)?,
    })
}

/// Replaces the state if its version is still `expected`; `false` when someone else moved it.
pub(super) fn swap_state(
    tx: &rusqlite::Transaction,
    expected: i64,
    new: &NotifyState,
) -> rusqlite::Result<bool> {
    let n = tx.execute(
        "UPDATE notify_state SET watermark = ?2, parts_seen = ?3, lists_seen = ?4, announced = ?5, version = ?6 \
         WHERE set_name = ?1 AND version = ?7",
        params![
            new.set.as_str(),
            new.watermark.0,
            new.parts_seen,
            new.lists_seen,
            new.announced as i64,
            new.version,
            expected
        ],
    )?;
    Ok(n == 1)
}

impl EmbeddedStore {
    pub async fn notify_state(&self, set: &SetName) -> Result<Option<NotifyState>, StoreError> {
        let set = set.clone();
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT watermark, parts_seen, lists_seen, announced, version FROM notify_state WHERE set_name = ?1",
                [set.as_str()],
                |r| state_from_row(set.clone(), r),
            )
            .optional()?)
        })
        .await
    }

    /// Creates the state of a set the notifier has never seen (one that predates it).
    pub async fn notify_init(&self, state: NotifyState) -> Result<(), StoreError> {
        self.write(move |c| {
            c.execute(
                "INSERT OR IGNORE INTO notify_state (set_name, watermark, parts_seen, lists_seen, announced, version) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 0)",
                params![state.set.as_str(), state.watermark.0, state.parts_seen, state.lists_seen, state.announced as i64],
            )?;
            Ok(())
        })
        .await
    }
}
