//! The notifier's per-set state in the embedded store.

use rusqlite::{params, OptionalExtension};

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
        covers: None,
    })
}

/// Replaces the state if its version is still `expected`; `false` when someone else moved it.
pub(super) fn swap_state(
    tx: &rusqlite::Transaction,
    expected: i64,
    new: &NotifyState,
) -> rusqlite::Result<bool> {
    if let Some(covers) = new.covers {
        // Every change dated between the old watermark and the new went out with this state
        // (the store writes one transaction at a time: no change lands after this look).
        let old: Option<i64> = tx
            .query_row(
                "SELECT watermark FROM notify_state WHERE set_name = ?1 AND version = ?2",
                params![new.set.as_str(), expected],
                |r| r.get(0),
            )
            .optional()?;
        let Some(old) = old else {
            return Ok(false);
        };
        let held: i64 = tx.query_row(
            "SELECT count(*) FROM changes WHERE set_name = ?1 AND datetime >= ?2 AND datetime < ?3",
            params![new.set.as_str(), old, new.watermark.0],
            |r| r.get(0),
        )?;
        if held as u64 != covers {
            return Ok(false);
        }
    }
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
