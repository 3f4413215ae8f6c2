//! Growing pauses between tries, the one schedule of every retry loop (the hub's operator
//! webhook and lane restarts, the workers' supervisor, the OAI-PMH client, the harvester's
//! fetches and discovery): a first pause, doubled at each try, at most a maximum; spread by
//! jitter where many clients could line up. Pure: the caller sleeps.

use std::time::Duration;

/// The pauses of one retry loop: `first`, then doubled each time, at most `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            next: first.min(max),
            max,
        }
    }

    /// The pause before the next try; the one after it is twice as long (at most `max`).
    pub fn pause(&mut self) -> Duration {
        let now = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        now
    }

    /// The pause before try `n` (1 for the first retry) of a loop that keeps no state:
    /// `first × 2^(n−1)`, at most `max`.
    pub fn nth(first: Duration, max: Duration, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(63);
        first
            .checked_mul(1u32 << doublings.min(31))
            .and_then(|d| d.checked_mul(1u32 << doublings.saturating_sub(31).min(31)))
            .unwrap_or(Duration::MAX)
            .min(max)
    }
}

/// `d` spread over `[d/2, 3d/2)` by `unit` (a random number in `[0, 1)`): the retries of many
/// clients that failed together do not come back together.
pub fn jittered(d: Duration, unit: f64) -> Duration {
    d.mul_f64(0.5 + unit.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn pauses_double_up_to_the_maximum() {
        let table: &[(Duration, Duration, &[u64])] = &[
            (S, 8 * S, &[1, 2, 4, 8, 8, 8]),
            (S, 5 * S, &[1, 2, 4, 5, 5]),
            (3 * S, 2 * S, &[2, 2]),
            (Duration::ZERO, S, &[0, 0]),
        ];
        for (first, max, want) in table {
            let mut b = Backoff::new(*first, *max);
            let got: Vec<u64> = want.iter().map(|_| b.pause().as_secs()).collect();
            assert_eq!(&got, want, "first {first:?}, max {max:?}");
        }
    }

    #[test]
    fn the_nth_pause_needs_no_state_and_never_overflows() {
        let table: &[(Duration, Duration, u32, Duration)] = &[
            (S, 64 * S, 0, S),
            (S, 64 * S, 1, S),
            (S, 64 * S, 3, 4 * S),
            (2 * S, 64 * S, 6, 64 * S),
            (2 * S, 64 * S, 7, 64 * S),
            (S, Duration::MAX, 40, S * (1 << 31) * (1 << 8)),
            (S, Duration::MAX, u32::MAX, S * (1 << 31) * (1 << 31)),
            (
                Duration::from_secs(u64::MAX / 4),
                Duration::MAX,
                5,
                Duration::MAX,
            ),
            (Duration::from_millis(500), Duration::MAX, 3, 2 * S),
        ];
        for (first, max, n, want) in table {
            assert_eq!(
                Backoff::nth(*first, *max, *n),
                *want,
                "{first:?} {max:?} {n}"
            );
        }
    }

    #[test]
    fn jitter_stays_within_half_either_side() {
        assert_eq!(jittered(2 * S, 0.0), S);
        assert_eq!(jittered(2 * S, 0.5), 2 * S);
        assert!(jittered(2 * S, 0.999) < 3 * S);
        assert_eq!(
            jittered(2 * S, 7.0),
            3 * S,
            "a unit out of range is clamped"
        );
    }
}
