//! One page's walk over a set's change log, as pure decisions (the driver,
//! `Repository::list`, reads the store and writes the page): which changes the page takes,
//! where the list stands after each, and how the page ends. A change is taken when it is its
//! resource's newest before the list's bound and the list wants it (its sub-set); a page ends
//! full, at the end of the set's log, after reading twenty pages' worth of changes, or where a
//! kept page made again over the same stretch of the log ended before (so the pages after it
//! keep their keys).

/// A change of the log as the walk weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    /// Its place in the log: (datetime, id).
    pub at: (i64, i64),
    /// Its resource's newest change before the list's bound.
    pub newest: bool,
    /// In the list's sub-set (always, for a list of whole sets).
    pub wanted: bool,
}

/// How a chunk of the log leaves the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChunkEnd {
    /// Read on: the set's next chunk.
    More,
    /// The set's log is read to its end: the next set.
    SetDone,
    /// The page ends here: full, or read as far as one page may read; `exhausted`: the set's
    /// log ended with it.
    Full { exhausted: bool },
    /// The stretch of the page made again is over, with items: the page ends where it did.
    Stretch,
    /// The stretch is over with nothing taken: read on, the page no longer bound to it.
    StretchEmpty,
}

/// A page's walk: its size, the changes read so far, and where the page made again over the
/// same stretch ended (`stop_at`).
#[derive(Debug, Clone)]
pub(super) struct Scan {
    pub page_size: usize,
    pub scanned: usize,
    pub stop_at: Option<(i64, i64)>,
}

impl Scan {
    pub(super) fn new(page_size: usize) -> Scan {
        Scan {
            page_size,
            scanned: 0,
            stop_at: None,
        }
    }

    /// Walks `chunk` (the changes after `after`, in log order) for a page already holding
    /// `held` items: the indices of the changes taken, and how the chunk leaves the page.
    /// `after` moves to the last change read (to `stop_at` when the stretch ends the page);
    /// `last_chunk`: the store has none after this chunk.
    pub(super) fn chunk(
        &mut self,
        after: &mut Option<(i64, i64)>,
        chunk: &[Seen],
        held: usize,
        last_chunk: bool,
    ) -> (Vec<usize>, ChunkEnd) {
        let mut taken = Vec::new();
        let mut reached = false;
        for (i, c) in chunk.iter().enumerate() {
            if self.stop_at.is_some_and(|at| c.at > at) {
                reached = true;
                break;
            }
            self.scanned += 1;
            *after = Some(c.at);
            if c.wanted && c.newest {
                taken.push(i);
                if held + taken.len() >= self.page_size {
                    break;
                }
            }
        }
        let held = held + taken.len();
        if reached {
            if held == 0 {
                self.stop_at = None;
                return (taken, ChunkEnd::StretchEmpty);
            }
            *after = self.stop_at;
            return (taken, ChunkEnd::Stretch);
        }
        let exhausted = last_chunk && *after == chunk.last().map(|c| c.at);
        if held >= self.page_size || self.scanned >= 20 * self.page_size {
            return (taken, ChunkEnd::Full { exhausted });
        }
        if last_chunk {
            return (taken, ChunkEnd::SetDone);
        }
        (taken, ChunkEnd::More)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(at: i64, newest: bool, wanted: bool) -> Seen {
        Seen {
            at: (at, at),
            newest,
            wanted,
        }
    }

    /// Each way a chunk leaves a page: (page size, held before, stretch end, the chunk as
    /// (datetime = id, newest, wanted), last chunk) -> (taken, end, where the list stands).
    #[test]
    fn a_chunk_leaves_the_page_as_the_rules_say() {
        type Case = (
            &'static str,
            usize,
            usize,
            Option<i64>,
            Vec<(i64, bool, bool)>,
            bool,
            Vec<usize>,
            ChunkEnd,
            Option<i64>,
        );
        let cases: Vec<Case> = vec![
            (
                "full page",
                2,
                0,
                None,
                vec![(1, true, true), (2, true, true), (3, true, true)],
                false,
                vec![0, 1],
                ChunkEnd::Full { exhausted: false },
                Some(2),
            ),
            (
                "full at the log's end",
                2,
                0,
                None,
                vec![(1, true, true), (2, true, true)],
                true,
                vec![0, 1],
                ChunkEnd::Full { exhausted: true },
                Some(2),
            ),
            (
                "older changes passed over",
                2,
                0,
                None,
                vec![(1, false, true), (2, true, true), (3, false, true)],
                false,
                vec![1],
                ChunkEnd::More,
                Some(3),
            ),
            (
                "outside the sub-set",
                2,
                0,
                None,
                vec![(1, true, false), (2, true, true)],
                true,
                vec![1],
                ChunkEnd::SetDone,
                Some(2),
            ),
            (
                "items from an earlier set count",
                3,
                2,
                None,
                vec![(1, true, true), (2, true, true)],
                false,
                vec![0],
                ChunkEnd::Full { exhausted: false },
                Some(1),
            ),
            (
                "the stretch ends the page",
                5,
                0,
                Some(2),
                vec![(1, true, true), (2, true, true), (3, true, true)],
                false,
                vec![0, 1],
                ChunkEnd::Stretch,
                Some(2),
            ),
            (
                "an empty stretch reads on",
                5,
                0,
                Some(2),
                vec![(1, false, true), (2, false, true), (3, true, true)],
                false,
                vec![],
                ChunkEnd::StretchEmpty,
                Some(2),
            ),
            (
                "an empty last chunk",
                5,
                0,
                None,
                vec![],
                true,
                vec![],
                ChunkEnd::SetDone,
                None,
            ),
        ];
        for (what, size, held, stop, chunk, last, taken, end, after_then) in cases {
            let mut scan = Scan::new(size);
            scan.stop_at = stop.map(|s| (s, s));
            let chunk: Vec<Seen> = chunk.into_iter().map(|(a, n, w)| seen(a, n, w)).collect();
            let mut after = None;
            let (t, e) = scan.chunk(&mut after, &chunk, held, last);
            assert_eq!((t, e), (taken, end), "{what}");
            assert_eq!(
                after,
                after_then.map(|a| (a, a)),
                "{what}: where the list stands"
            );
            if e == ChunkEnd::StretchEmpty {
                assert_eq!(scan.stop_at, None, "{what}: no longer bound to the stretch");
            }
        }
    }

    /// A page reads at most twenty pages' worth of changes, counted across chunks (a window
    /// of superseded changes ends a page short, never an unbounded read).
    #[test]
    fn a_page_reads_at_most_twenty_pages_of_changes() {
        let old: Vec<Seen> = (0..45).map(|a| seen(a, false, true)).collect();
        let mut scan = Scan::new(2);
        let mut after = None;
        let (t, e) = scan.chunk(&mut after, &old, 0, false);
        assert!(t.is_empty());
        assert_eq!(e, ChunkEnd::Full { exhausted: false });
        let mut scan = Scan::new(2);
        assert_eq!(
            scan.chunk(&mut after, &old[..20], 0, false).1,
            ChunkEnd::More
        );
        assert_eq!(
            scan.chunk(&mut after, &old[20..39], 0, false).1,
            ChunkEnd::More
        );
        assert_eq!(
            scan.chunk(&mut after, &old[39..], 0, false).1,
            ChunkEnd::Full { exhausted: false },
            "40 read across chunks"
        );
    }
}
