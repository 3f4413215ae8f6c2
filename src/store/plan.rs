//! The rules of applying a change, written once for every backend: whether it is recorded,
//! at which datetime, whether the open Change List closes first, and what happens to its
//! resource (into which Resource List part, a new part or not). Pure: a backend reads what
//! the rules need (the open list's totals, the last part, the resource as the batch left it),
//! asks [`plan`], and persists the answer in its own way.

use super::{entry_bytes_estimate, ApplyError, ApplyOutcome, ListPolicy, OpenTotals};
use crate::model::{ChangeType, NewChange, Timestamp};

/// The last Resource List part of a set, where new resources go: its number, resources and
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LastPart {
    pub no: u32,
    pub count: u64,
    pub bytes: u64,
}

/// What to do with one change of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Valid, but there is nothing to do; the reason goes in the outcome's `ignored`.
    Ignore(&'static str),
    Record(Planned),
}

/// A change to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Planned {
    /// Close the open Change List first (full, too large, or too old); the next one starts
    /// at the closed list's [`OpenTotals::close_time`].
    pub roll: bool,
    /// The datetime the change is recorded at.
    pub datetime: Timestamp,
    /// Its entry's estimated size in a sitemap.
    pub entry_bytes: u64,
    pub effect: Effect,
}

/// What a recorded change does to its resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Remove it from its part, which loses one resource and `bytes`.
    Delete { part: u32, bytes: u64 },
    /// Rewrite it in its part, whose bytes change by `dbytes`.
    Update { part: u32, dbytes: i64 },
    /// Put a new resource into part `part`: the last part when it has room, else a new last
    /// part (`new_part`) that the backend creates first.
    Create { part: u32, new_part: bool },
}

impl Effect {
    /// The part of the change's resource (the one it leaves, for a deletion).
    pub(crate) fn part(self) -> u32 {
        match self {
            Effect::Delete { part, .. }
            | Effect::Update { part, .. }
            | Effect::Create { part, .. } => part,
        }
    }
}

/// Plans change number `index` of a batch. `existing`: its resource's part and bytes as the
/// batch so far left them (`None`: no such resource); `newest`: the datetime of its resource's
/// newest recorded change, deletions included (earlier changes of the batch too): a change is
/// never dated before it (it is recorded at that datetime, after it by id), so that a
/// resource's changes in (datetime, id) order, as every list and notification gives them,
/// end in the state the store holds; `open`: the open Change List's totals;
/// `last`: the set's last Resource List part; `notified`: up to when change notifications
/// have been sent. A change that cannot be applied is [`ApplyError::Rejected`]. A creation or
/// update without `lastmod` gets its datetime as `lastmod` (a destination needs one to audit):
/// the one it came with, or else the time of recording, before a roll may date it later.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan(
    index: usize,
    c: &mut NewChange,
    existing: Option<(u32, u64)>,
    newest: Option<i64>,
    open: &OpenTotals,
    last: Option<LastPart>,
    notified: Option<i64>,
    policy: &ListPolicy,
    now: Timestamp,
) -> Result<Step, ApplyError> {
    if c.change == ChangeType::Deleted && existing.is_none() {
        return Ok(Step::Ignore(
            "deleted: no such resource in the set, nothing recorded",
        ));
    }
    let mut datetime = policy
        .change_datetime(c.datetime, open, notified, now)
        .map_err(|reason| ApplyError::Rejected { index, reason })?;
    if let Some(n) = newest.filter(|n| *n > datetime.0) {
        // Dated before its resource's newest change: recorded at it (after it by id), or the
        // lists would replay this change before that one and end in the other state.
        datetime = Timestamp(n);
    }
    if c.change != ChangeType::Deleted && c.meta.lastmod.is_none() {
        c.meta.lastmod = Some(datetime);
    }
    let entry_bytes = entry_bytes_estimate(c);
    let roll = policy.must_roll(open, entry_bytes, now);
    if roll {
        // Only moves it when this change is dated before the newest entry of the list being
        // closed: it belongs to the next list, so it cannot be earlier than its start.
        datetime = Timestamp(datetime.0.max(open.close_time(now)));
    }
    let effect = match (c.change, existing) {
        (ChangeType::Deleted, Some((part, bytes))) => Effect::Delete { part, bytes },
        (_, Some((part, bytes))) => Effect::Update {
            part,
            dbytes: entry_bytes as i64 - bytes as i64,
        },
        (_, None) => match last {
            Some(lp) if policy.part_has_room(lp.count, lp.bytes, entry_bytes) => Effect::Create {
                part: lp.no,
                new_part: false,
            },
            _ => Effect::Create {
                part: last.map_or(1, |lp| lp.no + 1),
                new_part: true,
            },
        },
    };
    Ok(Step::Record(Planned {
        roll,
        datetime,
        entry_bytes,
        effect,
    }))
}

/// [`plan`] for a backend applying a batch: an ignored change is noted in `out`, and `None`
/// says there is nothing to record.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_into(
    out: &mut ApplyOutcome,
    index: usize,
    c: &mut NewChange,
    existing: Option<(u32, u64)>,
    newest: Option<i64>,
    open: &OpenTotals,
    last: Option<LastPart>,
    notified: Option<i64>,
    policy: &ListPolicy,
    now: Timestamp,
) -> Result<Option<Planned>, ApplyError> {
    Ok(
        match plan(
            index, c, existing, newest, open, last, notified, policy, now,
        )? {
            Step::Ignore(why) => {
                out.ignored.push((index, why.into()));
                None
            }
            Step::Record(p) => Some(p),
        },
    )
}

impl LastPart {
    /// The last part after `effect` (a new part becomes the last).
    pub(crate) fn after(
        last: Option<LastPart>,
        effect: Effect,
        entry_bytes: u64,
    ) -> Option<LastPart> {
        match (last, effect) {
            (
                _,
                Effect::Create {
                    part,
                    new_part: true,
                },
            ) => Some(LastPart {
                no: part,
                count: 1,
                bytes: entry_bytes,
            }),
            (Some(lp), Effect::Create { part, .. }) if lp.no == part => Some(LastPart {
                count: lp.count + 1,
                bytes: lp.bytes + entry_bytes,
                ..lp
            }),
            (Some(lp), Effect::Update { part, dbytes }) if lp.no == part => Some(LastPart {
                bytes: (lp.bytes as i64 + dbytes).max(0) as u64,
                ..lp
            }),
            (Some(lp), Effect::Delete { part, bytes }) if lp.no == part => Some(LastPart {
                count: lp.count.saturating_sub(1),
                bytes: lp.bytes.saturating_sub(bytes),
                ..lp
            }),
            (last, _) => last,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Location, LocationType, ResourceKey, ResourceMeta};

    const NOW: Timestamp = Timestamp(1_000_000_000_000);

    fn policy() -> ListPolicy {
        ListPolicy {
            max_items: 3,
            max_bytes: 1_000_000,
            rollover_secs: 0,
            max_future_skew_secs: 60,
        }
    }

    fn change(kind: ChangeType, datetime: Option<i64>) -> NewChange {
        NewChange {
            key: ResourceKey("a.txt".into()),
            location: Location {
                kind: LocationType::RelPath,
                value: "a.txt".into(),
            },
            change: kind,
            datetime: datetime.map(Timestamp),
            meta: ResourceMeta::default(),
        }
    }

    fn open(from: i64, count: u64, max_dt: Option<i64>) -> OpenTotals {
        OpenTotals {
            from,
            count,
            bytes: 0,
            max_dt,
        }
    }

    fn last(no: u32, count: u64) -> Option<LastPart> {
        Some(LastPart {
            no,
            count,
            bytes: 0,
        })
    }

    const SEC: i64 = 1_000_000;

    /// Every rule, one row each: what the change is, what the set holds, what is planned.
    #[test]
    fn a_change_is_never_dated_before_its_resources_newest() {
        let c = |dt| {
            let mut c = change(ChangeType::Deleted, Some(dt));
            plan(
                0,
                &mut c,
                Some((1, 10)),
                Some(NOW.0 - 5),
                &open(0, 0, None),
                last(1, 1),
                None,
                &policy(),
                NOW,
            )
        };
        // Dated before the resource's newest change: recorded at it.
        assert!(matches!(c(NOW.0 - 9), Ok(Step::Record(p)) if p.datetime.0 == NOW.0 - 5));
        // After it: as given.
        assert!(matches!(c(NOW.0 - 2), Ok(Step::Record(p)) if p.datetime.0 == NOW.0 - 2));
    }

    #[test]
    fn each_rule_in_a_row() {
        use ChangeType::*;
        let t = NOW.0 - 10 * SEC;
        // (what, kind, datetime, existing, open, last, notified, expected)
        type Row = (
            &'static str,
            ChangeType,
            Option<i64>,
            Option<(u32, u64)>,
            OpenTotals,
            Option<LastPart>,
            Option<i64>,
            Result<(bool, i64, Option<Effect>), &'static str>,
        );
        let eb = |kind| entry_bytes_estimate(&change(kind, None)) as i64;
        let rows: Vec<Row> = vec![
            (
                "a deletion of nothing is ignored",
                Deleted,
                Some(t),
                None,
                open(0, 0, None),
                last(1, 0),
                None,
                Ok((false, 0, None)),
            ),
            (
                "a deletion leaves its part",
                Deleted,
                Some(t),
                Some((2, 500)),
                open(0, 0, None),
                last(3, 1),
                None,
                Ok((
                    false,
                    t,
                    Some(Effect::Delete {
                        part: 2,
                        bytes: 500,
                    }),
                )),
            ),
            (
                "an update stays in its part",
                Updated,
                Some(t),
                Some((1, 500)),
                open(0, 0, None),
                last(3, 1),
                None,
                Ok((
                    false,
                    t,
                    Some(Effect::Update {
                        part: 1,
                        dbytes: eb(Updated) - 500,
                    }),
                )),
            ),
            (
                "a creation joins the last part with room",
                Created,
                Some(t),
                None,
                open(0, 0, None),
                last(2, 1),
                None,
                Ok((
                    false,
                    t,
                    Some(Effect::Create {
                        part: 2,
                        new_part: false,
                    }),
                )),
            ),
            (
                "a full last part gets a successor",
                Created,
                Some(t),
                None,
                open(0, 0, None),
                last(2, 3),
                None,
                Ok((
                    false,
                    t,
                    Some(Effect::Create {
                        part: 3,
                        new_part: true,
                    }),
                )),
            ),
            (
                "the first resource opens part 1",
                Created,
                Some(t),
                None,
                open(0, 0, None),
                None,
                None,
                Ok((
                    false,
                    t,
                    Some(Effect::Create {
                        part: 1,
                        new_part: true,
                    }),
                )),
            ),
            (
                "undated: after everything recorded",
                Created,
                None,
                None,
                open(0, 1, Some(NOW.0 + 5)),
                last(1, 1),
                None,
                Ok((
                    false,
                    NOW.0 + 6,
                    Some(Effect::Create {
                        part: 1,
                        new_part: false,
                    }),
                )),
            ),
            (
                "undated: the time of applying",
                Created,
                None,
                None,
                open(0, 1, Some(t)),
                last(1, 1),
                None,
                Ok((
                    false,
                    NOW.0,
                    Some(Effect::Create {
                        part: 1,
                        new_part: false,
                    }),
                )),
            ),
            (
                "a full open list closes first",
                Created,
                Some(t),
                None,
                open(0, 3, Some(t + SEC)),
                last(1, 1),
                None,
                Ok((
                    true,
                    NOW.0,
                    Some(Effect::Create {
                        part: 1,
                        new_part: false,
                    }),
                )),
            ),
            (
                "far in the future: refused",
                Created,
                Some(NOW.0 + 61 * SEC),
                None,
                open(0, 0, None),
                last(1, 0),
                None,
                Err("in the future"),
            ),
            (
                "before the open list: refused",
                Created,
                Some(t),
                None,
                open(t + 1, 0, None),
                last(1, 0),
                None,
                Err("precedes the open Change List"),
            ),
            (
                "before what was notified: refused",
                Created,
                Some(t),
                None,
                open(0, 0, None),
                last(1, 0),
                Some(t + 1),
                Err("change notifications for this set have been sent"),
            ),
        ];
        for (what, kind, dt, existing, open, last, notified, expected) in rows {
            let mut c = change(kind, dt);
            let got = plan(
                7,
                &mut c,
                existing,
                None,
                &open,
                last,
                notified,
                &policy(),
                NOW,
            );
            match (got, expected) {
                (Ok(Step::Ignore(_)), Ok((_, _, None))) => {}
                (Ok(Step::Record(p)), Ok((roll, datetime, Some(effect)))) => {
                    assert_eq!(
                        (p.roll, p.datetime.0, p.effect),
                        (roll, datetime, effect),
                        "{what}"
                    );
                    assert_eq!(p.entry_bytes as i64, eb(kind), "{what}");
                    if kind != Deleted {
                        // Its own datetime, even when a roll records it later.
                        let own = dt.map_or(p.datetime, Timestamp);
                        assert_eq!(c.meta.lastmod, Some(own), "{what}: lastmod filled");
                    }
                }
                (Err(ApplyError::Rejected { index, reason }), Err(words)) => {
                    assert_eq!(index, 7, "{what}");
                    assert!(reason.contains(words), "{what}: {reason}");
                }
                (got, expected) => panic!("{what}: got {got:?}, expected {expected:?}"),
            }
        }
    }

    /// The last part follows what was planned into it.
    #[test]
    fn the_last_part_follows_the_effects() {
        let lp = LastPart {
            no: 2,
            count: 2,
            bytes: 900,
        };
        let after = |e| LastPart::after(Some(lp), e, 400);
        assert_eq!(
            after(Effect::Create {
                part: 2,
                new_part: false
            }),
            Some(LastPart {
                count: 3,
                bytes: 1300,
                ..lp
            })
        );
        assert_eq!(
            after(Effect::Create {
                part: 3,
                new_part: true
            }),
            Some(LastPart {
                no: 3,
                count: 1,
                bytes: 400
            })
        );
        assert_eq!(
            after(Effect::Update {
                part: 2,
                dbytes: -100
            }),
            Some(LastPart { bytes: 800, ..lp })
        );
        assert_eq!(
            after(Effect::Delete {
                part: 2,
                bytes: 500
            }),
            Some(LastPart {
                count: 1,
                bytes: 400,
                ..lp
            })
        );
        assert_eq!(
            after(Effect::Delete {
                part: 1,
                bytes: 500
            }),
            Some(lp),
            "another part's"
        );
    }
}
