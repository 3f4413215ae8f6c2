//! The notifier's per-set state in the embedded store.

use rusqlite::params;

use crate::model::{SetName, Timestamp};
use crate::store::NotifyState;

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
