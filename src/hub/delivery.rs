//! Content distribution (WebSub §7): one lane per subscription delivering its queue in order,
//! retries on the configured schedule, and a writer that records outcomes in batches.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use reqwest::header::{
    HeaderName, HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST, LINK, RETRY_AFTER,
};
use reqwest::StatusCode;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::admin::AttemptRecord;
use super::auth::Link;
use super::partition::Grant;
use super::{random_unit, Hub};
use crate::model::websub::{
    write_signature, write_standard_signature, DeliveryAuth, Hold, Message, MessageId, Outcome,
    Subscription, SubscriptionId, Topic,
};
use crate::model::Timestamp;
use crate::store::Store;

enum LaneMsg {
    Job(Arc<Message>),
    /// The subscription was renewed or changed (secret, lease).
    Update(Box<Subscription>),
    /// An admin asked: queue these failed messages again, and stop waiting for a retry.
    RetryNow(Vec<Arc<Message>>),
    /// An admin asked: deliver the messages of the topic numbered after `.0` up to `.1` (a
    /// window of the log) again, next, in order, read from the log a batch at a time.
    Redeliver(MessageId, MessageId),
}

/// The handle of a subscription's delivery task. Dropping it ends the task.
pub(super) struct Lane {
    tx: mpsc::UnboundedSender<LaneMsg>,
    /// Jobs sent and not yet taken by the lane: past [`IN_FLIGHT`], a message is not sent
    /// but left in the log, and `missed` tells the lane to read it from there. The channel
    /// holds at most that many jobs (control messages are rare).
    in_channel: Arc<std::sync::atomic::AtomicUsize>,
    missed: Arc<std::sync::atomic::AtomicBool>,
    topic: Topic,
    expires_at: Timestamp,
    verified_at: Timestamp,
    held: Option<Hold>,
    max_per_sec: Option<f64>,
    auth: Option<DeliveryAuth>,
    /// The newest message handed to the lane: older ones are not queued twice.
    last: MessageId,
    pub(super) born: Instant,
    /// The partition lease the lane delivers under.
    pub(super) grant: Arc<Grant>,
}

impl Lane {
    /// `suspect`: deliver from the suspect pool until an attempt succeeds quickly (new and
    /// failing subscribers). The lane reads its queue from the message log after the
    /// subscription's cursor, [`LANE_BATCH`] messages at a time.
    pub(super) fn spawn(
        hub: &Arc<Hub>,
        sub: Subscription,
        suspect: bool,
        grant: Arc<Grant>,
    ) -> Lane {
        let (tx, rx) = mpsc::unbounded_channel();
        let span = tracing::info_span!("lane", subscription = sub.id, callback = %sub.callback);
        let in_channel = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let missed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let signals = Signals {
            in_channel: in_channel.clone(),
            missed: missed.clone(),
        };
        let lane = Lane {
            tx,
            in_channel,
            missed,
            topic: sub.topic.clone(),
            expires_at: sub.expires_at,
            verified_at: sub.verified_at,
            held: sub.held,
            max_per_sec: sub.max_per_sec,
            auth: sub.auth.clone(),
            last: sub.cursor,
            born: Instant::now(),
            grant: grant.clone(),
        };
        hub.tasks
            .spawn(supervised(hub.clone(), sub, rx, signals, suspect, grant).instrument(span));
        lane
    }

    /// Whether a message on `topic` published at `now` is for this subscription.
    pub(super) fn wants(&self, topic: &Topic, now: Timestamp) -> bool {
        &self.topic == topic && self.expires_at > now
    }

    /// Queues `m` unless the lane already has it; `true` when queued.
    pub(super) fn push(&mut self, m: Arc<Message>) -> bool {
        if m.id <= self.last {
            return false;
        }
        self.last = m.id;
        use std::sync::atomic::Ordering::SeqCst;
        if self.in_channel.load(SeqCst) >= IN_FLIGHT {
            // The lane is busy (a slow delivery): it reads this one from the log.
            self.missed.store(true, SeqCst);
        } else {
            self.in_channel.fetch_add(1, SeqCst);
            let _ = self.tx.send(LaneMsg::Job(m));
        }
        true
    }

    /// Whether `sub` is a newer verification than the lane's, or held or let go since.
    pub(super) fn renewed(&self, sub: &Subscription) -> bool {
        sub.verified_at != self.verified_at
            || sub.expires_at != self.expires_at
            || sub.held != self.held
            || sub.max_per_sec != self.max_per_sec
            || sub.auth != self.auth
    }

    pub(super) fn retry_now(&self, failed: Vec<Arc<Message>>) {
        let _ = self.tx.send(LaneMsg::RetryNow(failed));
    }

    pub(super) fn redeliver(&self, after: MessageId, through: MessageId) {
        let _ = self.tx.send(LaneMsg::Redeliver(after, through));
    }

    pub(super) fn update(&mut self, sub: Subscription) {
        self.expires_at = sub.expires_at;
        self.verified_at = sub.verified_at;
        self.held = sub.held;
        self.max_per_sec = sub.max_per_sec;
        self.auth = sub.auth.clone();
        let _ = self.tx.send(LaneMsg::Update(Box::new(sub)));
    }
}

/// Jobs in a lane's channel at most (see `Lane::in_channel`).
const IN_FLIGHT: usize = 64;

/// What a lane's handle tells its task besides messages.
struct Signals {
    in_channel: Arc<std::sync::atomic::AtomicUsize>,
    missed: Arc<std::sync::atomic::AtomicBool>,
}

/// How many messages a lane holds at most; the rest stay in the log and are read when the
/// queue runs low. A subscriber with 100,000 pending messages costs the hub this many.
pub(super) const LANE_BATCH: usize = 256;

/// Bodies a lane reads from the log at once (at least one message): a backlog of large
/// notifications for many dead subscribers must not be read into memory once per lane.
pub(super) const LANE_BYTES: usize = 4 << 20;

/// Log reads of lanes under way at once, hub-wide: with [`LANE_BYTES`], bounds what
/// catching-up lanes hold in memory while reading.
pub(super) const LOG_READS: usize = 4;

struct Job {
    message: Arc<Message>,
    /// Failed attempts so far.
    attempts: u32,
    /// Not before this instant (tokio time, so that tests can pause it).
    due: Option<Instant>,
}

impl Job {
    fn new(message: Arc<Message>) -> Job {
        Job {
            message,
            attempts: 0,
            due: None,
        }
    }
}

/// What one attempt came to.
enum Attempt {
    Delivered(u16),
    Gone,
    Failed {
        status: Option<u16>,
        error: String,
        retry_after: Option<Duration>,
    },
}

/// Where a lane's queue stands against the log.
struct Window {
    /// The newest message queued (or delivered): what is at or below it is not queued again.
    through: MessageId,
    /// Messages after `through` may be in the log but not in the queue: read them from there.
    behind: bool,
    /// Average body size of the last batch read from the log.
    avg_bytes: usize,
}

/// What a lane does next, decided by [`LaneState::next`] from its queue, its retry state
/// and the clock; [`run_lane`] does it.
#[derive(Debug)]
enum Step {
    /// Read up to `want` messages after `after` from the log: the queue's next, or with
    /// `replay` the redelivery window's.
    Read {
        after: MessageId,
        want: usize,
        replay: bool,
    },
    /// Nothing queued, or the subscription is held: wait for a message.
    Idle,
    /// The head is due at this instant: wait for it (or a message).
    Wait(Instant),
    /// The lease has ended: the queue is dropped (and that recorded).
    Expired,
    /// Deliver the head.
    Send(Arc<Message>),
}

/// A lane's state, without I/O: its subscription, its queue (a bounded window of its log),
/// the retry state of the head and whether the subscriber is suspect.
struct LaneState {
    sub: Subscription,
    queue: VecDeque<Job>,
    w: Window,
    /// The retry state of the message at the head when the lane started (after a restart or a
    /// takeover), applied to the first message read.
    resume: Option<(u32, Option<Timestamp>)>,
    /// Deliver from the suspect pool (new, failing or slow subscribers).
    suspect: bool,
    /// A redelivery window still to read from the log: after `.0`, up to `.1`.
    replay: VecDeque<(MessageId, MessageId)>,
    /// Messages of the redelivery window read and not yet delivered: they go first.
    replayed: VecDeque<Job>,
    /// No attempt before this instant: the subscriber's rate limit, or its slowdown.
    not_before: Option<Instant>,
    /// The wait between attempts that answers 429, 502, 503 and 504 have asked for (doubled by
    /// each, halved by each success).
    slowdown: Duration,
    /// The subscription was replaced by an update not yet looked at by the lane's link.
    updated: bool,
}

/// The first slowdown after a 429, 502, 503 or 504, and the most it grows to.
const SLOWDOWN_MIN: Duration = Duration::from_millis(100);
const SLOWDOWN_MAX: Duration = Duration::from_secs(60);

impl LaneState {
    fn new(sub: Subscription, suspect: bool) -> LaneState {
        LaneState {
            w: Window {
                through: sub.cursor,
                behind: true,
                avg_bytes: 64 << 10,
            },
            resume: (sub.attempts > 0).then_some((sub.attempts, sub.next_attempt_at)),
            queue: VecDeque::new(),
            sub,
            suspect,
            replay: VecDeque::new(),
            replayed: VecDeque::new(),
            not_before: None,
            slowdown: Duration::ZERO,
            updated: false,
        }
    }

    /// Applies a message from the lane's handle.
    fn absorb(&mut self, msg: LaneMsg, signals: &Signals) {
        match msg {
            LaneMsg::Job(message) => {
                signals
                    .in_channel
                    .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                // A message skipped before this one (the channel was full) is in the log: from
                // here on the lane reads from there, so the order holds.
                self.note_missed(signals);
                if message.id <= self.w.through {
                    // Read from the log already.
                } else if self.w.behind || self.queue.len() >= LANE_BATCH {
                    // Left in the log; read back when the queue runs low.
                    self.w.behind = true;
                } else {
                    self.w.through = message.id;
                    self.queue.push_back(Job::new(message));
                }
            }
            LaneMsg::Update(s) => {
                // The store's run of failures may lag this lane's own (outcomes are written
                // in batches): the lane's start stands unless the store saw a success since.
                let since = self.sub.failing_since;
                self.sub = *s;
                self.updated = true;
                if self.sub.failing_since.is_some() {
                    self.sub.failing_since = since.or(self.sub.failing_since);
                }
            }
            LaneMsg::RetryNow(failed) => {
                if let Some(head) = self.queue.front_mut() {
                    head.due = None;
                }
                self.queue.extend(failed.into_iter().map(Job::new));
            }
            LaneMsg::Redeliver(after, through) => {
                // Next, in order, ahead of the rest of the queue (nothing is in flight while a
                // lane absorbs: the head, if waiting for a retry, keeps its state behind them).
                // A window asked for during another one follows it.
                if through > after {
                    self.replay.push_back((after, through));
                }
            }
        }
    }

    /// A message was left in the log because the channel was full: read from there.
    fn note_missed(&mut self, signals: &Signals) {
        if signals
            .missed
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            self.w.behind = true;
        }
    }

    fn next(&self, now: Instant, ts: Timestamp) -> Step {
        if self.sub.held.is_some() {
            // Paused or disabled: the queue waits (in the log past what is held here).
            return Step::Idle;
        }
        if let Some(&(after, _)) = self.replay.front() {
            if self.replayed.len() < LANE_BATCH / 2 {
                return Step::Read {
                    after,
                    want: LANE_BATCH - self.replayed.len(),
                    replay: true,
                };
            }
        }
        if self.w.behind
            && self.queue.len() < LANE_BATCH / 2
            && self
                .queue
                .iter()
                .map(|j| j.message.body.len())
                .sum::<usize>()
                < LANE_BYTES / 2
        {
            // As many as the last read's average size fits in LANE_BYTES (the embedded store
            // bounds the bytes itself; this bounds them on Elasticsearch).
            let want =
                (LANE_BYTES / self.w.avg_bytes.max(1)).clamp(1, LANE_BATCH - self.queue.len());
            return Step::Read {
                after: self.w.through,
                want,
                replay: false,
            };
        }
        let Some(head) = self.replayed.front().or(self.queue.front()) else {
            return Step::Idle;
        };
        if let Some(due) = head.due.filter(|d| *d > now) {
            return Step::Wait(due);
        }
        if let Some(at) = self.not_before.filter(|t| *t > now) {
            // Rate-limited or slowed down: the queue waits, in order, in the log.
            return Step::Wait(at);
        }
        if self.sub.expires_at <= ts {
            return Step::Expired;
        }
        Step::Send(head.message.clone())
    }

    /// Queues what was read from the log after the window.
    fn read(&mut self, batch: Vec<Arc<Message>>) {
        self.w.behind = !batch.is_empty();
        if !batch.is_empty() {
            self.w.avg_bytes = batch.iter().map(|m| m.body.len()).sum::<usize>() / batch.len();
        }
        for message in batch {
            self.w.through = message.id;
            self.queue.push_back(Job::new(message));
        }
        if let (Some((attempts, next)), Some(head)) = (self.resume.take(), self.queue.front_mut()) {
            head.attempts = attempts;
            head.due = next.map(|nb| {
                let wait = (nb.micros() - Timestamp::now().micros()).max(0) as u64;
                Instant::now() + Duration::from_micros(wait)
            });
        }
    }

    /// Queues what was read of the first redelivery window.
    fn replayed(&mut self, batch: Vec<Arc<Message>>) {
        let Some((_, through)) = self.replay.pop_front() else {
            return;
        };
        let mut after = None;
        for m in batch.into_iter().take_while(|m| m.id <= through) {
            after = Some(m.id);
            self.replayed.push_back(Job::new(m));
        }
        if let Some(a) = after.filter(|a| *a < through) {
            self.replay.push_front((a, through));
        }
    }

    /// The job delivered next: the redelivery window's first.
    fn head_mut(&mut self) -> Option<&mut Job> {
        match self.replayed.front_mut() {
            Some(j) => Some(j),
            None => self.queue.front_mut(),
        }
    }

    fn pop_head(&mut self) {
        if self.replayed.pop_front().is_none() {
            self.queue.pop_front();
        }
    }

    /// Spaces the next attempt after this one: at least 1/`max_per_sec` (the subscription's
    /// own limit, else the hub's), and the slowdown that overload answers ask for.
    fn pace(&mut self, attempt: &Attempt, settings: &super::HubSettings) {
        match attempt {
            Attempt::Failed {
                status: Some(429 | 502 | 503 | 504),
                ..
            } => self.slowdown = (self.slowdown * 2).clamp(SLOWDOWN_MIN, SLOWDOWN_MAX),
            Attempt::Delivered(_) => {
                self.slowdown /= 2;
                if self.slowdown < SLOWDOWN_MIN / 8 {
                    self.slowdown = Duration::ZERO;
                }
            }
            _ => {}
        }
        let limit = self
            .sub
            .max_per_sec
            .or(settings.max_per_sec)
            .filter(|n| *n > 0.0)
            .map_or(Duration::ZERO, |n| Duration::from_secs_f64(1.0 / n));
        // From the end of this attempt: however long the network takes, the subscriber never
        // gets two deliveries closer than this.
        let gap = limit.max(self.slowdown);
        self.not_before = (!gap.is_zero()).then(|| Instant::now() + gap);
    }

    /// Drops the queue: the lease ended before it was delivered.
    fn expire(&mut self) -> Outcome {
        tracing::info!(
            skipped = self.queue.len() + self.replayed.len(),
            "lease ended; queued deliveries dropped"
        );
        self.queue.clear();
        self.replayed.clear();
        self.replay.clear();
        Outcome::Skipped {
            sub: self.sub.id,
            through: self.w.through,
        }
    }

    /// What the attempt at the head came to: the outcome to record (none for 410 Gone, which
    /// ends the subscription) and the entry for the attempt log. Moves the queue on.
    fn settle(
        &mut self,
        attempt: Attempt,
        took: Duration,
        settings: &super::HubSettings,
    ) -> (Option<Outcome>, AttemptRecord) {
        self.suspect = !matches!(attempt, Attempt::Delivered(_)) || took > settings.slow_delivery;
        self.pace(&attempt, settings);
        let sub = self.sub.id;
        let (attempts, message, topic, webhook) = {
            let job = self.head_mut().expect("a job at the head");
            (
                job.attempts + 1,
                job.message.id,
                job.message.topic.clone(),
                webhook_id(&job.message),
            )
        };
        let at = Timestamp::now();
        let mut record = AttemptRecord {
            at,
            subscription_id: sub,
            topic,
            message_id: message,
            webhook_id: webhook,
            outcome: "delivered",
            status: None,
            error: None,
            duration_ms: took.as_secs_f64() * 1e3,
        };
        let outcome = match attempt {
            Attempt::Delivered(status) => {
                record.status = Some(status);
                self.sub.failing_since = None;
                self.pop_head();
                Some(Outcome::Delivered {
                    sub,
                    message,
                    attempts,
                    at,
                    status,
                })
            }
            Attempt::Gone => {
                (record.outcome, record.status) = ("gone", Some(410));
                tracing::info!("callback answered 410 Gone: subscription removed");
                None
            }
            Attempt::Failed {
                status,
                error,
                retry_after,
            } => {
                self.sub.failing_since.get_or_insert(at);
                let wait = settings.retry_delay(attempts, retry_after, random_unit());
                record.outcome = if wait.is_some() { "retry" } else { "given_up" };
                (record.status, record.error) = (status, Some(error.clone()));
                match wait {
                    Some(wait) => {
                        tracing::info!(message, attempts, status = status.map_or(0, |s| s as u64), %error, retry_in_secs = wait.as_secs_f64(), "delivery failed; will retry");
                        let job = self.head_mut().expect("a job at the head");
                        job.attempts = attempts;
                        job.due = Some(Instant::now() + wait);
                        Some(Outcome::Retry {
                            sub,
                            message,
                            attempts,
                            at,
                            next_at: Timestamp(at.micros() + wait.as_micros() as i64),
                            status,
                            error,
                        })
                    }
                    None => {
                        tracing::warn!(message, attempts, status = status.map_or(0, |s| s as u64), %error, "delivery failed; retry schedule exhausted");
                        self.pop_head();
                        Some(Outcome::Failed {
                            sub,
                            message,
                            attempts,
                            at,
                            status,
                            error,
                        })
                    }
                }
            }
        };
        (outcome, record)
    }
}

/// Drives a lane: does what [`LaneState::next`] says until the handle is dropped, the hub
/// stops or the partition is lost.
/// How long a lane that ended unexpectedly waits before it starts again (its `n`th restart).
fn restart_wait(n: u32) -> Duration {
    crate::backoff::Backoff::nth(Duration::from_secs(1), Duration::from_secs(64), n + 1)
}

/// A lane that never dies silently: one that ends unexpectedly (a defect) is logged, counted
/// (`rshub_lanes_restarted_total`), shown on its subscription in the admin API, and started
/// again from the log after a growing pause, with the subscription as the store has it now.
/// Its channel survives, so nothing sent to it is lost (and the log holds every message).
async fn supervised(
    hub: Arc<Hub>,
    mut sub: Subscription,
    mut rx: mpsc::UnboundedReceiver<LaneMsg>,
    signals: Signals,
    mut suspect: bool,
    grant: Arc<Grant>,
) {
    let id = sub.id;
    let mut restarts = 0;
    loop {
        let Err(reason) = crate::cause::caught(run_lane(
            hub.clone(),
            sub,
            &mut rx,
            &signals,
            suspect,
            grant.clone(),
        ))
        .await
        else {
            return;
        };
        restarts += 1;
        hub.metrics.lanes_restarted.inc();
        tracing::error!(subscription = id, reason = %reason, restarts, "a delivery lane ended unexpectedly: starting it again");
        hub.lane_failures.lock().expect("the lane failures").insert(
            id,
            super::LaneFailure {
                restarts,
                last_at: Timestamp::now().to_string(),
                last_reason: crate::cause::cut(&reason, 400),
            },
        );
        tokio::select! {
            _ = hub.cancel.cancelled() => return,
            _ = tokio::time::sleep(restart_wait(restarts)) => {}
        }
        sub = loop {
            match hub.store.hub_detail(id, Timestamp::now()).await {
                Ok(Some((s, _))) => break s,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(subscription = id, error = %e, "reading the subscription to restart its lane failed; trying again");
                    tokio::select! {
                        _ = hub.cancel.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                    }
                }
            }
        };
        suspect = true;
    }
}

async fn run_lane(
    hub: Arc<Hub>,
    sub: Subscription,
    rx: &mut mpsc::UnboundedReceiver<LaneMsg>,
    signals: &Signals,
    suspect: bool,
    grant: Arc<Grant>,
) {
    // A subscription's callback never changes (a new callback is a new subscription).
    let target = target(&hub, &sub);
    let mut link = Link::new(&hub.clients, &sub);
    let mut st = LaneState::new(sub, suspect);
    loop {
        loop {
            match rx.try_recv() {
                Ok(m) => st.absorb(m, signals),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => return,
            }
        }
        if std::mem::take(&mut st.updated) {
            // Its delivery auth may have changed (a new client, no token).
            link.update(&hub.clients, &st.sub);
        }
        st.note_missed(signals);
        let wake = match st.next(Instant::now(), Timestamp::now()) {
            Step::Read {
                after,
                want,
                replay,
            } => {
                let read = {
                    let _slot = hub.log_reads.acquire().await;
                    hub.store
                        .hub_messages_after(Some(&st.sub.topic), after, want, LANE_BYTES)
                        .await
                };
                match read {
                    Ok(batch) if replay => {
                        st.replayed(hub.shared(batch));
                        continue;
                    }
                    Ok(batch) => {
                        st.read(hub.shared(batch));
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, replay, "reading the subscription's queue from the log failed; retrying");
                        Some(Instant::now() + Duration::from_secs(1))
                    }
                }
            }
            Step::Idle => None,
            Step::Wait(due) => Some(due),
            Step::Expired => {
                let o = st.expire();
                if !hub.record(o, &grant).await {
                    return;
                }
                continue;
            }
            Step::Send(message) => {
                // A delivery under way is finished even when the hub stops (it is bounded by
                // hub.request_timeout_secs): cut off, it would be made again by whoever
                // delivers next. Isolation: a proven subscriber takes a slot of the healthy
                // pool; a new, failing or slow one a slot of its host's budget and then of the
                // suspect pool, so hung callbacks (however many, on however few hosts) never
                // hold a healthy subscriber's slot.
                let attempt = {
                    let host = st.suspect.then(|| hub.host_permits(&target));
                    let _host = match &host {
                        Some(h) => Some(tokio::select! {
                            biased;
                            _ = hub.cancel.cancelled() => return,
                            p = h.acquire() => p,
                        }),
                        None => None,
                    };
                    let pool = if st.suspect {
                        &hub.suspect_permits
                    } else {
                        &hub.permits
                    };
                    let _permit = tokio::select! {
                        biased;
                        _ = hub.cancel.cancelled() => return,
                        p = pool.acquire() => p,
                    };
                    // Fencing: nothing is sent without a lease known to hold (a process paused
                    // past its lease finds it lapsed here, before sending anything more).
                    if !grant.valid() {
                        None
                    } else {
                        let t0 = std::time::Instant::now();
                        let a = deliver(&hub, &mut link, &st.sub, &target, &message).await;
                        Some((a, t0.elapsed()))
                    }
                };
                let Some((attempt, took)) = attempt else {
                    if grant.is_lost() {
                        return;
                    }
                    // The renewal is late: wait for it (or for the partition to be dropped).
                    tokio::select! {
                        biased;
                        _ = hub.cancel.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                    continue;
                };
                let (outcome, record) = st.settle(attempt, took, &hub.settings);
                let error = record.error.clone();
                hub.log_attempt(record);
                let Some(outcome) = outcome else {
                    hub.remove_gone(st.sub.id).await;
                    return;
                };
                // The next message goes out once this outcome is durable: a crash repeats at
                // most the one delivery in flight.
                if !hub.record(outcome, &grant).await || hub.cancel.is_cancelled() {
                    return;
                }
                if st.sub.failing_since.is_some()
                    && hub.steering.due_for_disable(&st.sub, Timestamp::now())
                {
                    let error = error.unwrap_or_default();
                    match hub.disable(&st.sub, &error).await {
                        Ok(Some(sub)) => st.sub = sub,
                        Ok(None) => return,
                        Err(e) => {
                            tracing::warn!(error = %e, "disabling the failing subscription failed; will try after its next attempt")
                        }
                    }
                }
                continue;
            }
        };
        tokio::select! {
            biased;
            _ = hub.cancel.cancelled() => return,
            m = rx.recv() => match m {
                Some(m) => st.absorb(m, signals),
                None => return,
            },
            _ = sleep_until_or_forever(wake) => {}
        }
    }
}

async fn sleep_until_or_forever(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Hub {
    /// The delivery slots of a callback's host (shared by all its subscriptions).
    fn host_permits(&self, target: &Result<url::Url, String>) -> Arc<Semaphore> {
        let host = target
            .as_ref()
            .ok()
            .and_then(|u| u.host_str().map(str::to_ascii_lowercase))
            .unwrap_or_default();
        let mut m = self.host_permits.lock().expect("host permits");
        // Hosts no lane uses any more are forgotten (the map stays as small as the live set).
        if m.len() > 4096 {
            m.retain(|_, s| {
                Arc::strong_count(s) > 1 || s.available_permits() < self.settings.max_per_host
            });
        }
        m.entry(host)
            .or_insert_with(|| Arc::new(Semaphore::new(self.settings.max_per_host)))
            .clone()
    }

    /// Hands an outcome to the writer and waits until it is durable; `false` when it was not
    /// written: the partition was lost (another process's epoch is in the store) or the hub
    /// is stopping. Lanes wait for the writer, which groups what they hand it.
    async fn record(&self, outcome: Outcome, grant: &Grant) -> bool {
        let (done, written) = oneshot::channel();
        let r = Recording {
            outcome,
            epoch: grant.epoch,
            done,
        };
        if self.outcomes.send(r).await.is_err() {
            return false;
        }
        match written.await {
            Ok(Recorded::Durable) => true,
            Ok(Recorded::Fenced) => {
                if !grant.is_lost() {
                    tracing::warn!(
                        partition = grant.partition,
                        epoch = grant.epoch,
                        "another process took this partition over: its lanes stop here"
                    );
                }
                grant.lose();
                false
            }
            Err(_) => false,
        }
    }

    /// 410 Gone: the subscription ends (WebSub §7).
    async fn remove_gone(&self, id: i64) {
        if let Err(e) = self.store.hub_remove_subscription(id).await {
            tracing::error!(subscription = id, error = %e, "could not remove a gone subscription");
        }
        self.lanes().remove(&id);
    }

    /// Hands a verified subscription to its lane, starting one for a new subscription.
    pub(super) fn lane_update(
        self: &Arc<Self>,
        sub: Subscription,
        lanes: &mut std::collections::HashMap<i64, Lane>,
    ) {
        match lanes.get_mut(&sub.id) {
            Some(lane) => lane.update(sub),
            None => {
                let Some(grant) = self.sharing.grant_for(sub.id) else {
                    return; // the partition's owner picks it up from the store
                };
                let id = sub.id;
                // A new subscriber proves itself in the suspect pool first.
                lanes.insert(id, Lane::spawn(self, sub, true, grant));
            }
        }
    }
}

/// The message's id for receivers to dedupe on (the Standard Webhooks `webhook-id`): the
/// same on every retry, repeat and redelivery of a message, different between messages. The
/// publication time goes with the store's sequence number, so that a store made anew (its
/// numbers starting again) never gives a new message an id a receiver has seen.
pub fn webhook_id(m: &Message) -> String {
    let mut s = String::new();
    write_webhook_id(&mut s, m).expect("a String takes any text");
    s
}

fn write_webhook_id(out: &mut impl std::fmt::Write, m: &Message) -> std::fmt::Result {
    write!(out, "msg_{}_{}", m.published_at.0, m.id)
}

/// The callback URL, parsed and checked against the address policy once per subscription.
fn target(hub: &Hub, sub: &Subscription) -> Result<url::Url, String> {
    let url = sub.callback.url();
    hub.clients
        .policy()
        .check_url(&url, "callback")
        .map(|()| url)
}

async fn deliver(
    hub: &Hub,
    link: &mut Link,
    sub: &Subscription,
    target: &Result<url::Url, String>,
    m: &Message,
) -> Attempt {
    let failed = |error: String| Attempt::Failed {
        status: None,
        error,
        retry_after: None,
    };
    let url = match target {
        Ok(u) => u.clone(),
        Err(e) => return failed(e.clone()),
    };
    let client = match &link.client {
        Ok(c) => c.clone(),
        Err(e) => return failed(e.clone()),
    };
    // The target was checked against the policy once for the lane; behind a proxy (which
    // resolves names itself) its addresses are checked before each request.
    if hub.clients.policy().is_proxied() {
        if let Err(e) = hub
            .clients
            .policy()
            .check_before_sending(&url, "callback")
            .await
        {
            return failed(e);
        }
    }
    let token = match link.bearer(&hub.clients, false).await {
        Ok(t) => t,
        Err(e) => return failed(e),
    };
    let mut sent = match request(hub, &url, sub, m, token.as_deref()) {
        Ok(r) => client.execute(r).await,
        Err(e) => return failed(e),
    };
    if link.uses_oauth2() && matches!(&sent, Ok(r) if r.status() == StatusCode::UNAUTHORIZED) {
        // The token was revoked or expired early: one fresh token, one more try.
        match link.bearer(&hub.clients, true).await {
            Ok(t) => match request(hub, &url, sub, m, t.as_deref()) {
                Ok(r) => sent = client.execute(r).await,
                Err(e) => return failed(e),
            },
            Err(e) => return failed(e),
        }
    }
    settle_response(hub, sent).await
}

/// The delivery headers that are not in `http`'s list, named once (a name given as a string is
/// parsed and copied for every request).
const X_HUB_SIGNATURE: HeaderName = HeaderName::from_static("x-hub-signature");
const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
const WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
const WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");

/// A delivery request, signed at this attempt, with the bearer token when there is one. Made
/// whole here, headers in a map sized for them: this runs for every delivery, and reqwest's
/// builder grew the map and copied each value. The values made for this delivery (Host,
/// Content-Length, id, signatures, timestamp) are written into one buffer and share it, so
/// reqwest's copies of the map only count references instead of allocating for each.
fn request(
    hub: &Hub,
    url: &url::Url,
    sub: &Subscription,
    m: &Message,
    token: Option<&str>,
) -> Result<reqwest::Request, String> {
    use std::fmt::Write as _;
    let value = |s: String| {
        HeaderValue::try_from(s).map_err(|e| format!("a delivery header cannot be sent: {e}"))
    };
    // The next value written into `buf`, split off it.
    let take = |buf: &mut BytesMut| {
        HeaderValue::from_maybe_shared(buf.split().freeze())
            .map_err(|e| format!("a delivery header cannot be sent: {e}"))
    };
    let mut req = reqwest::Request::new(reqwest::Method::POST, url.clone());
    // Sized for what goes in: Content-Type, `Link`, Host, Content-Length, the id, reqwest's
    // `accept` and `user-agent`, the signatures and the token, and one spare (hyper's client
    // asks for an entry, and a full map grows). A map that grows is copied, and reqwest copies
    // this one before hyper adds what is missing (Host, Content-Length) to the copy.
    let signed = sub.secret.is_some();
    let count = 7
        + usize::from(signed) * (1 + 2 * usize::from(hub.settings.standard_webhooks))
        + usize::from(token.is_some());
    *req.headers_mut() = reqwest::header::HeaderMap::with_capacity(count + 1);
    let h = req.headers_mut();
    h.insert(CONTENT_TYPE, value(m.content_type.clone())?);
    h.insert(
        LINK,
        value(format!(
            "<{}>; rel=\"hub\", <{}>; rel=\"self\"",
            hub.settings.hub_url, m.topic
        ))?,
    );
    // Host (≤ 260) + Content-Length (≤ 20) + id (≤ 45) + `X-Hub-Signature` (≤ 135) +
    // timestamp (≤ 20) + two `v1,` signatures (95).
    let mut buf = BytesMut::with_capacity(600);
    let written = "a delivery header value is written into memory";
    // Host as hyper's client would write it (the host, and the port unless the scheme's own)
    // and Content-Length, which it keeps when they are there.
    buf.extend_from_slice(url[url::Position::BeforeHost..url::Position::AfterPort].as_bytes());
    h.insert(HOST, take(&mut buf)?);
    write!(buf, "{}", m.body.len()).expect(written);
    h.insert(CONTENT_LENGTH, take(&mut buf)?);
    write_webhook_id(&mut buf, m).expect(written);
    let id = take(&mut buf)?;
    if let Some(secret) = &sub.secret {
        write_signature(&mut buf, sub.alg, secret.as_bytes(), &m.body).expect(written);
        h.insert(X_HUB_SIGNATURE, take(&mut buf)?);
        // Signed the Standard Webhooks way too (unless switched off), over this attempt's
        // time (a retry is signed anew, so a receiver's tolerance of a few minutes never
        // refuses a late retry).
        if hub.settings.standard_webhooks {
            let now = Timestamp::now();
            let at = now.0.div_euclid(1_000_000);
            write!(buf, "{at}").expect(written);
            h.insert(WEBHOOK_TIMESTAMP, take(&mut buf)?);
            let id = id.to_str().expect("the id is ASCII");
            let sign = |buf: &mut BytesMut, s: &str| {
                write_standard_signature(buf, s.as_bytes(), id, at, &m.body).expect(written)
            };
            sign(&mut buf, secret);
            // During a rotation's grace period the previous secret signs too (receivers
            // accept any one of the space-separated signatures).
            if let Some((old, until)) = &sub.previous_secret {
                if now < *until {
                    buf.extend_from_slice(b" ");
                    sign(&mut buf, old);
                }
            }
            h.insert(WEBHOOK_SIGNATURE, take(&mut buf)?);
        }
    }
    h.insert(WEBHOOK_ID, id);
    if let Some(t) = token {
        let mut v = value(format!("Bearer {t}"))?;
        v.set_sensitive(true);
        h.insert(AUTHORIZATION, v);
    }
    *req.body_mut() = Some(m.body.clone().into());
    Ok(req)
}

/// What a delivery's answer (or failure to get one) comes to.
async fn settle_response(hub: &Hub, sent: reqwest::Result<reqwest::Response>) -> Attempt {
    match sent {
        Ok(resp) if hub.clients.policy().check_peer(&resp).is_err() => Attempt::Failed {
            status: None,
            error: hub.clients.policy().check_peer(&resp).unwrap_err(),
            retry_after: None,
        },
        Ok(mut resp) => {
            let status = resp.status();
            let retry_after = resp
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(Timestamp::retry_after);
            // Read (and ignore) a little of the body so the connection can be reused.
            let mut read = 0usize;
            while read < 64 * 1024 {
                match resp.chunk().await {
                    Ok(Some(c)) => read += c.len(),
                    _ => break,
                }
            }
            if status.is_success() {
                Attempt::Delivered(status.as_u16())
            } else if status == StatusCode::GONE {
                Attempt::Gone
            } else {
                Attempt::Failed {
                    status: Some(status.as_u16()),
                    error: format!("callback answered {status}"),
                    retry_after,
                }
            }
        }
        Err(e) => Attempt::Failed {
            status: None,
            error: crate::cause::chain(&e),
            retry_after: None,
        },
    }
}

/// GETs a topic for a thin ping: its Content-Type (kept exactly) and body.
pub(super) async fn fetch(
    client: &reqwest::Client,
    policy: &super::AddressPolicy,
    topic: &Topic,
    max_bytes: usize,
) -> Result<(String, Bytes), String> {
    let url = topic.url();
    policy.check_before_sending(&url, "hub.topic").await?;
    let mut resp = client
        .get(url)
        .send()
        .await
        .map_err(|e| crate::cause::chain(&e))?;
    policy.check_peer(&resp)?;
    if !resp.status().is_success() {
        return Err(format!("topic answered {}", resp.status()));
    }
    let ct = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream")
        .to_string();
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| crate::cause::chain(&e))? {
        if body.len() + chunk.len() > max_bytes {
            return Err(format!(
                "topic body is larger than hub.max_body_bytes ({max_bytes})"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((ct, Bytes::from(body)))
}

/// An outcome on its way to the store: the lane's epoch (fencing, on a shared store) and
/// whom to tell once it is written.
pub(super) struct Recording {
    outcome: Outcome,
    epoch: u64,
    done: oneshot::Sender<Recorded>,
}

enum Recorded {
    Durable,
    /// Not written: a newer owner of the subscription's partition wrote it.
    Fenced,
}

/// Records outcomes until stopped, then drains. No waiting to gather: while one write is under
/// way the lanes' next outcomes queue up, and the next write takes all of them (group commit),
/// so the store sees fewer, larger writes the busier the lanes are.
pub(super) async fn run_writer(
    store: Store,
    mut rx: mpsc::Receiver<Recording>,
    stop: CancellationToken,
    metrics: Arc<crate::metrics::Metrics>,
) {
    loop {
        let first = tokio::select! {
            biased;
            m = rx.recv() => match m { Some(m) => m, None => return },
            _ = stop.cancelled() => match rx.try_recv() { Ok(m) => m, Err(_) => return },
        };
        let mut batch = vec![first];
        // What is queued now, then what the tasks already woken add: each yield lets the lanes
        // whose answers have arrived hand their outcomes over, and stops as soon as one adds
        // nothing (no timer: a quiet hub writes at once).
        let mut yields = 0;
        loop {
            let before = batch.len();
            while batch.len() < 20_000 {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            if batch.len() >= 20_000 || yields == 4 || (yields > 0 && batch.len() == before) {
                break;
            }
            yields += 1;
            tokio::task::yield_now().await;
        }
        let outcomes: Vec<Outcome> = batch.iter().map(|r| r.outcome.clone()).collect();
        let epochs: HashMap<SubscriptionId, u64> = batch
            .iter()
            .map(|r| (r.outcome.subscription(), r.epoch))
            .collect();
        let fenced = loop {
            match store.hub_record(outcomes.clone(), &epochs).await {
                Ok(fenced) => break fenced,
                Err(e) => {
                    metrics.store_errors.inc();
                    tracing::error!(error = %e, outcomes = batch.len(), "recording delivery outcomes failed; retrying");
                    if stop.is_cancelled() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        for r in batch {
            let answer = if fenced.contains(&r.outcome.subscription()) {
                Recorded::Fenced
            } else {
                Recorded::Durable
            };
            let _ = r.done.send(answer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_is_caught_with_its_words_and_restarts_slow_down() {
        use crate::cause::caught;
        assert_eq!(caught(async { 7 }).await, Ok(7));
        let n = 18446744073709551615u64;
        let e = caught(async move {
            if n > 0 {
                panic!("overflow when adding durations ({n})");
            }
        })
        .await
        .unwrap_err();
        assert!(e.contains("overflow when adding durations"), "{e}");
        let waits: Vec<u64> = (1..=9).map(|n| restart_wait(n).as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 64, 64, 64, 64]);
    }

    fn sub(expires_in_secs: i64) -> Subscription {
        let now = Timestamp::now();
        Subscription {
            id: 7,
            topic: Topic::parse("http://h.test/t").unwrap(),
            callback: crate::model::websub::Callback::parse("http://cb.test/x").unwrap(),
            secret: None,
            previous_secret: None,
            alg: crate::model::websub::SignatureAlg::Sha256,
            lease_secs: 60,
            lease_start: now,
            expires_at: Timestamp(now.micros() + expires_in_secs * 1_000_000),
            verified_at: now,
            created_at: now,
            cursor: 0,
            attempts: 0,
            next_attempt_at: None,
            failing_since: None,
            held: None,
            max_per_sec: None,
            auth: None,
        }
    }

    fn msg(id: MessageId) -> Arc<Message> {
        Arc::new(Message {
            id,
            topic: Topic::parse("http://h.test/t").unwrap(),
            content_type: "application/xml".into(),
            body: Bytes::from(format!("<m{id}/>")),
            published_at: Timestamp::now(),
        })
    }

    fn signals() -> Signals {
        Signals {
            in_channel: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            missed: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    fn head(st: &LaneState) -> Option<MessageId> {
        match st.next(Instant::now(), Timestamp::now()) {
            Step::Send(m) => Some(m.id),
            _ => None,
        }
    }

    fn settings() -> super::super::HubSettings {
        let mut c = crate::config::Config::defaults();
        c.hub.retry_schedule_secs = vec![60];
        c.hub.retry_jitter = 0.0;
        super::super::HubSettings::from_config(&c)
    }

    #[test]
    fn a_lane_reads_its_log_then_sends_in_order_and_retries_the_head() {
        let mut st = LaneState::new(sub(3600), false);
        assert!(matches!(
            st.next(Instant::now(), Timestamp::now()),
            Step::Read {
                after: 0,
                replay: false,
                ..
            }
        ));
        st.read(vec![msg(1), msg(2)]);
        assert!(
            matches!(
                st.next(Instant::now(), Timestamp::now()),
                Step::Read { replay: false, .. }
            ),
            "it reads on until the log has no more"
        );
        st.read(vec![]);
        assert_eq!(head(&st), Some(1));
        let failed = Attempt::Failed {
            status: Some(500),
            error: "no".into(),
            retry_after: None,
        };
        let (o, rec) = st.settle(failed, Duration::from_millis(1), &settings());
        assert!(matches!(
            o,
            Some(Outcome::Retry {
                message: 1,
                attempts: 1,
                ..
            })
        ));
        assert_eq!(rec.outcome, "retry");
        assert!(st.suspect, "a failure makes the subscriber suspect");
        assert!(
            matches!(st.next(Instant::now(), Timestamp::now()), Step::Wait(_)),
            "the head waits for its retry; nothing overtakes it"
        );
        let (o, _) = st.settle(
            Attempt::Delivered(200),
            Duration::from_millis(1),
            &settings(),
        );
        assert!(matches!(
            o,
            Some(Outcome::Delivered {
                message: 1,
                attempts: 2,
                ..
            })
        ));
        assert_eq!(head(&st), Some(2));
        assert!(!st.suspect);
    }

    #[test]
    fn a_redelivery_window_goes_first_in_order_and_the_head_keeps_its_retry() {
        let mut st = LaneState::new(sub(3600), false);
        st.read(vec![msg(10), msg(11)]);
        st.read(vec![]);
        let failed = Attempt::Failed {
            status: None,
            error: "refused".into(),
            retry_after: None,
        };
        let _ = st.settle(failed, Duration::from_millis(1), &settings());
        st.absorb(LaneMsg::Redeliver(2, 5), &signals());
        match st.next(Instant::now(), Timestamp::now()) {
            Step::Read {
                after,
                replay: true,
                ..
            } => assert_eq!(after, 2),
            other => panic!("expected a read of the window, got {other:?}"),
        }
        // The log hands back more than the window: only 3..=5 are queued.
        st.replayed(vec![msg(3), msg(4), msg(5), msg(6)]);
        assert!(st.replay.is_empty(), "the window is read");
        for want in [3, 4, 5] {
            assert_eq!(head(&st), Some(want));
            let (o, _) = st.settle(Attempt::Delivered(200), Duration::ZERO, &settings());
            assert!(matches!(o, Some(Outcome::Delivered { message, .. }) if message == want));
        }
        assert!(
            matches!(st.next(Instant::now(), Timestamp::now()), Step::Wait(_)),
            "then message 10, still waiting for its retry"
        );
    }

    #[test]
    fn a_second_window_follows_the_first() {
        let mut st = LaneState::new(sub(3600), false);
        st.read(vec![]);
        st.absorb(LaneMsg::Redeliver(0, 2), &signals());
        st.replayed(vec![msg(1)]);
        // Asked again before the first is read to its end: both are delivered, in turn.
        st.absorb(LaneMsg::Redeliver(0, 2), &signals());
        let mut sent = Vec::new();
        loop {
            match st.next(Instant::now(), Timestamp::now()) {
                Step::Read {
                    after,
                    replay: true,
                    ..
                } => {
                    let batch = (after + 1..=2).map(msg).collect();
                    st.replayed(batch);
                }
                Step::Send(m) => {
                    sent.push(m.id);
                    let _ = st.settle(Attempt::Delivered(200), Duration::ZERO, &settings());
                }
                _ => break,
            }
        }
        assert_eq!(sent, [1, 2, 1, 2]);
    }

    #[test]
    fn a_lapsed_lease_drops_the_queue_and_the_window() {
        let mut st = LaneState::new(sub(-1), false);
        st.read(vec![msg(1), msg(2)]);
        st.read(vec![]);
        st.absorb(LaneMsg::Redeliver(0, 1), &signals());
        st.replayed(vec![msg(1)]);
        assert!(matches!(
            st.next(Instant::now(), Timestamp::now()),
            Step::Expired
        ));
        assert!(matches!(st.expire(), Outcome::Skipped { through: 2, .. }));
        assert!(matches!(
            st.next(Instant::now(), Timestamp::now()),
            Step::Idle
        ));
    }
}
