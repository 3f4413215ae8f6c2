//! The store contract, as one suite every backend must pass (the embedded store here; the
//! Elasticsearch backend joins it when it lands).

use resourcesync_hub::model::{ChangeType, Location, NewChange, ResourceMeta, SetName, Timestamp};
use resourcesync_hub::store::{ApplyError, ListPolicy, Store};

fn policy(max_items: u32) -> ListPolicy {
    ListPolicy {
        max_items,
        max_bytes: 50 << 20,
        rollover_secs: 0,
        max_future_skew_secs: 60,
    }
}

fn change(kind: ChangeType, url: &str, length: u64, datetime: Option<Timestamp>) -> NewChange {
    let location = Location::url(url);
    NewChange {
        key: resourcesync_hub::model::ResourceKey(format!("url:{url}")),
        location,
        change: kind,
        datetime,
        meta: if kind == ChangeType::Deleted {
            ResourceMeta::default()
        } else {
            ResourceMeta {
                length: Some(length),
                ..Default::default()
            }
        },
    }
}

/// The suite. `store` must be empty.
pub async fn contract_suite(store: Store) {
    let set = SetName::parse("contract").unwrap();
    let other = SetName::parse("other").unwrap();
    let t0 = Timestamp::now();
    assert!(store.ensure_set(&set, t0).await.unwrap());
    assert!(
        !store.ensure_set(&set, t0).await.unwrap(),
        "ensure_set is idempotent"
    );
    assert_eq!(store.counts(&set).await.unwrap().resources, 0);
    assert!(store.latest_change(&set).await.unwrap().is_none());

    // Collected records' other names: written in one call, a later write of one replacing it.
    let a = |x: &str, y: &str| (x.to_string(), y.to_string());
    store
        .put_aliases(
            "c1",
            &[a("https://l/1", "oai:r:1"), a("https://h/1", "oai:r:1")],
        )
        .await
        .unwrap();
    store
        .put_aliases("c2", &[a("https://l/1", "oai:s:9")])
        .await
        .unwrap();
    store.put_aliases("c2", &[]).await.unwrap();
    assert_eq!(
        store.find_alias("https://h/1").await.unwrap(),
        Some(a("c1", "oai:r:1"))
    );
    assert_eq!(
        store.find_alias("https://l/1").await.unwrap(),
        Some(a("c2", "oai:s:9"))
    );
    assert_eq!(store.find_alias("https://l/2").await.unwrap(), None);

    // 7 creates with max 3 per list: parts [3, 3, 1], lists closed at 3 and 6.
    let batch: Vec<_> = (0..7)
        .map(|i| change(ChangeType::Created, &format!("http://x/{i}"), i, None))
        .collect();
    let out = store
        .apply(&set, batch, policy(3), Timestamp::now())
        .await
        .unwrap();
    assert_eq!(out.applied.len(), 7);
    assert_eq!(out.closed_lists, [1, 2]);
    let parts = store.parts(&set).await.unwrap();
    assert_eq!(parts.iter().map(|p| p.count).collect::<Vec<_>>(), [3, 3, 1]);

    // Keyset paging over one part and over the whole set, in a stable order.
    let p2 = store
        .resources(&set, Some(parts[1].no), None, 2)
        .await
        .unwrap();
    assert_eq!(p2.items.len(), 2);
    let p2b = store
        .resources(&set, Some(parts[1].no), p2.next.clone(), 2)
        .await
        .unwrap();
    assert_eq!(p2b.items.len(), 1);
    assert!(p2b.next.is_none());
    let urls: Vec<_> = p2
        .items
        .iter()
        .chain(&p2b.items)
        .map(|r| r.location.value.clone())
        .collect();
    assert_eq!(urls, ["http://x/3", "http://x/4", "http://x/5"]);
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let page = store.resources(&set, None, cursor, 3).await.unwrap();
        all.extend(page.items);
        match page.next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(all.len(), 7);

    // Update keeps its part, delete shrinks it, a new resource joins the last part.
    let before = store.parts(&set).await.unwrap();
    store
        .apply(
            &set,
            vec![
                change(ChangeType::Updated, "http://x/1", 100, None),
                change(ChangeType::Deleted, "http://x/4", 0, None),
            ],
            policy(3),
            Timestamp::now(),
        )
        .await
        .unwrap();
    let after = store.parts(&set).await.unwrap();
    assert_eq!(after.iter().map(|p| p.count).collect::<Vec<_>>(), [3, 2, 1]);
    assert!(after[0].last_seq > before[0].last_seq && after[1].last_seq > before[1].last_seq);
    assert_eq!(
        after[2].last_seq, before[2].last_seq,
        "an untouched part keeps its validator"
    );
    let r1 = store
        .resource(
            &set,
            &resourcesync_hub::model::ResourceKey("url:http://x/1".into()),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r1.meta.length, Some(100));

    // Changes: ordered by (datetime, id), paged, bounded by [from, until).
    let lists = store.changelists(&set).await.unwrap();
    assert_eq!(
        lists.len(),
        3,
        "9 changes, 3 per list: the third is full but still open"
    );
    assert!(lists[..2].iter().all(|l| l.until.is_some()) && lists[2].until.is_none());
    for w in lists.windows(2) {
        assert_eq!(w[0].until, Some(w[1].from), "consecutive intervals");
    }
    let mut total = 0;
    for l in &lists {
        let mut cursor = None;
        let mut prev: Option<(Timestamp, i64)> = None;
        let mut n = 0;
        loop {
            let page = store
                .changes(&set, l.from, l.until, cursor, 2)
                .await
                .unwrap();
            for c in &page.items {
                assert!(c.datetime >= l.from && l.until.is_none_or(|u| c.datetime < u));
                if let Some(p) = prev {
                    assert!(p < (c.datetime, c.id), "ordered by (datetime, id)");
                }
                prev = Some((c.datetime, c.id));
                n += 1;
            }
            match page.next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(n as u64, l.count, "list {} holds what it counts", l.no);
        total += n;
    }
    assert_eq!(total, 9);
    assert_eq!(store.counts(&set).await.unwrap().changes, 9);
    let latest = store.latest_change(&set).await.unwrap().unwrap();
    assert_eq!(latest.change, ChangeType::Deleted);
    assert_eq!(latest.location.value, "http://x/4");

    // Many changes sharing one datetime keep their order and page cleanly.
    let same = Timestamp::now();
    let batch: Vec<_> = (0..5)
        .map(|i| change(ChangeType::Created, &format!("http://y/{i}"), i, Some(same)))
        .collect();
    store.apply(&other, batch, policy(50), same).await.unwrap();
    let mut got = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .changes(&other, Timestamp(0), None, cursor, 2)
            .await
            .unwrap();
        got.extend(page.items.into_iter().map(|c| c.location.value));
        match page.next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(
        got,
        (0..5).map(|i| format!("http://y/{i}")).collect::<Vec<_>>()
    );

    // A rejected change rolls the whole batch back.
    let counts = store.counts(&set).await.unwrap();
    let far = Timestamp::now().plus_secs(3600);
    let err = store
        .apply(
            &set,
            vec![
                change(ChangeType::Created, "http://x/new", 1, None),
                change(ChangeType::Created, "http://x/late", 1, Some(far)),
            ],
            policy(3),
            Timestamp::now(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, ApplyError::Rejected { index: 1, .. }),
        "{err:?}"
    );
    assert_eq!(store.counts(&set).await.unwrap(), counts);

    // Period rollover closes a non-empty open list only.
    let p = ListPolicy {
        rollover_secs: 1,
        ..policy(50)
    };
    let later = Timestamp::now().plus_secs(5);
    assert!(store
        .rollover_if_due(&set, p, later)
        .await
        .unwrap()
        .is_some());
    assert!(
        store
            .rollover_if_due(&set, p, later.plus_secs(5))
            .await
            .unwrap()
            .is_none(),
        "empty open list stays"
    );
    assert_eq!(store.sets().await.unwrap().len(), 2);

    // A set created by a backlog batch: its first Change List starts at the batch's earliest
    // datetime; later changes still may not precede it.
    let backlog = SetName::parse("backlog").unwrap();
    let (d1, d2) = (
        Timestamp::parse("2020-05-01T00:00:00Z").unwrap(),
        Timestamp::parse("2019-03-01T00:00:00Z").unwrap(),
    );
    let batch = vec![
        change(ChangeType::Created, "http://x/b1", 1, Some(d1)),
        change(ChangeType::Created, "http://x/b2", 2, Some(d2)),
    ];
    let out = store
        .apply(&backlog, batch, policy(50), Timestamp::now())
        .await
        .unwrap();
    assert!(out.set_created);
    assert_eq!(store.changelists(&backlog).await.unwrap()[0].from, d2);
    let early = vec![change(
        ChangeType::Updated,
        "http://x/b1",
        3,
        Some(Timestamp(d2.0 - 1)),
    )];
    assert!(matches!(
        store
            .apply(&backlog, early, policy(50), Timestamp::now())
            .await,
        Err(ApplyError::Rejected { index: 0, .. })
    ));
}

/// What the store has recorded, told apart from what the changes' datetimes say: a change
/// dated back into a stretch already read is found by its record, however it is dated.
async fn recorded_contract(store: &Store) {
    let set = SetName::parse("recorded").unwrap();
    let t = Timestamp::now();
    let batch = (0..3)
        .map(|i| {
            change(
                ChangeType::Created,
                &format!("http://x/r{i}"),
                i,
                Some(Timestamp(t.0 + i as i64)),
            )
        })
        .collect();
    store.apply(&set, batch, policy(50), t).await.unwrap();
    let mark = loop {
        // Elasticsearch vouches for a mark once search sees every change up to it.
        if let Some(m) = store.recorded_through(&set).await.unwrap() {
            break m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let far = Timestamp(t.0 + 60_000_000);
    assert_eq!(
        store
            .earliest_recorded_after(&set, mark, far)
            .await
            .unwrap(),
        None
    );
    // Dated between the first two, recorded after the mark.
    let back = vec![change(
        ChangeType::Updated,
        "http://x/r0",
        9,
        Some(Timestamp(t.0 + 1)),
    )];
    store
        .apply(&set, back, policy(50), Timestamp::now())
        .await
        .unwrap();
    let found = loop {
        match store
            .earliest_recorded_after(&set, mark, far)
            .await
            .unwrap()
        {
            Some(d) if d.0 == i64::MIN => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await
            }
            other => break other,
        }
    };
    assert_eq!(found, Some(Timestamp(t.0 + 1)));
    // Not before `until`.
    assert_eq!(
        store
            .earliest_recorded_after(&set, mark, Timestamp(t.0 + 1))
            .await
            .unwrap(),
        None
    );
}

/// A subscription's secrets across a rotation: a re-subscription with another secret keeps
/// the previous one (until the given time), one with the same secret or none changes nothing.
async fn secret_rotation_contract(store: &Store) {
    use resourcesync_hub::model::websub::{
        Callback, Intent, IntentMode, Resolution, SignatureAlg, Topic,
    };
    let now = Timestamp::now();
    let intent = |secret: Option<&str>| Intent {
        id: 0,
        mode: IntentMode::Subscribe,
        topic: Topic::parse("http://example.org/t").unwrap(),
        callback: Callback::parse("http://example.org/cb").unwrap(),
        lease_secs: 3600,
        secret: secret.map(str::to_string),
        alg: SignatureAlg::Sha256,
        reason: None,
        requested_at: now,
        verify_token: None,
    };
    let resolve = |secret: Option<&'static str>, until: i64| {
        let store = store.clone();
        async move {
            let mut i = intent(secret);
            i.id = store.hub_add_intent(i.clone()).await.unwrap();
            store
                .hub_resolve(
                    i,
                    Resolution::Subscribed {
                        verified_at: now,
                        keep_old_secret_until: Timestamp(until),
                    },
                )
                .await
                .unwrap()
                .unwrap()
        }
    };
    let s = resolve(Some("one"), 10).await;
    assert_eq!(
        (s.secret.as_deref(), s.previous_secret),
        (Some("one"), None)
    );
    let s = resolve(Some("two"), 20).await;
    assert_eq!(s.secret.as_deref(), Some("two"));
    assert_eq!(s.previous_secret, Some(("one".to_string(), Timestamp(20))));
    let s = resolve(Some("two"), 30).await;
    assert_eq!(
        s.previous_secret,
        Some(("one".to_string(), Timestamp(20))),
        "the same secret again changes nothing"
    );
    let stored = store.hub_subscriptions().await.unwrap();
    assert_eq!(
        stored[0].previous_secret,
        Some(("one".to_string(), Timestamp(20))),
        "as read back"
    );

    // An admin's changes: a rotation, a rate limit and delivery auth, set, read back, cleared.
    use resourcesync_hub::model::websub::{DeliveryAuth, SubscriptionChange};
    let id = stored[0].id;
    let change = |c: SubscriptionChange| {
        let store = store.clone();
        async move { store.hub_change(id, c).await.unwrap().unwrap() }
    };
    let s = change(SubscriptionChange {
        secret: Some(("three".into(), Timestamp(40))),
        ..Default::default()
    })
    .await;
    assert_eq!(
        (s.secret.as_deref(), s.previous_secret),
        (Some("three"), Some(("two".to_string(), Timestamp(40))))
    );
    let auth = DeliveryAuth::Oauth2 {
        token_url: "https://auth.example.org/token".into(),
        client_id: "c".into(),
        client_secret: "s".into(),
        scope: None,
    };
    let s = change(SubscriptionChange {
        max_per_sec: Some(Some(2.5)),
        auth: Some(Some(auth.clone())),
        ..Default::default()
    })
    .await;
    assert_eq!((s.max_per_sec, s.auth.as_ref()), (Some(2.5), Some(&auth)));
    let read = store.hub_subscriptions().await.unwrap()[0].clone();
    assert_eq!(
        (read.max_per_sec, read.auth),
        (Some(2.5), Some(auth)),
        "as read back"
    );
    assert_eq!(read.secret.as_deref(), Some("three"), "left as it was");
    let s = change(SubscriptionChange {
        max_per_sec: Some(None),
        auth: Some(None),
        ..Default::default()
    })
    .await;
    assert_eq!((s.max_per_sec, s.auth), (None, None));
    assert!(store
        .hub_change(id + 1_000_000, SubscriptionChange::default())
        .await
        .unwrap()
        .is_none());
}

/// Holding deliveries and the run of failures: failures start it (the first one's time
/// stands), a success ends it; a hold is kept and read back, a disable (`only_if_unheld`) never
/// overrides a pause, letting go clears the run; the state and totals say so. Leaves no
/// subscription behind.
async fn hold_contract(store: &Store) {
    use resourcesync_hub::model::websub::{Hold, HoldReason, Outcome, SubState};
    let id = store.hub_subscriptions().await.unwrap()[0].id;
    let retry = |at: i64| Outcome::Retry {
        sub: id,
        message: 1,
        attempts: 1,
        at: Timestamp(at),
        next_at: Timestamp(at + 1),
        status: Some(500),
        error: "callback answered 500".into(),
    };
    let record = |o: Vec<Outcome>| {
        let store = store.clone();
        async move {
            let fenced = store
                .hub_record(o, &std::collections::HashMap::new())
                .await
                .unwrap();
            assert!(fenced.is_empty());
            store.hub_subscriptions().await.unwrap()[0].clone()
        }
    };
    assert_eq!(
        record(vec![retry(100)]).await.failing_since,
        Some(Timestamp(100))
    );
    assert_eq!(
        record(vec![retry(200)]).await.failing_since,
        Some(Timestamp(100)),
        "the run's first failure stands"
    );
    let delivered = Outcome::Delivered {
        sub: id,
        message: 1,
        attempts: 2,
        at: Timestamp(300),
        status: 200,
    };
    assert_eq!(record(vec![delivered.clone()]).await.failing_since, None);
    assert_eq!(
        record(vec![retry(400), delivered, retry(600)])
            .await
            .failing_since,
        Some(Timestamp(600)),
        "a batch with a success in it: the run starts after it"
    );

    let now = Timestamp::now();
    let state = || {
        let store = store.clone();
        async move {
            let (_, st) = store.hub_detail(id, now).await.unwrap().unwrap();
            let t = store.hub_totals(now).await.unwrap();
            (st.state.unwrap(), t.paused, t.disabled)
        }
    };
    let paused = Hold {
        reason: HoldReason::Paused,
        since: Timestamp(700),
    };
    let s = store
        .hub_hold(id, Some(paused), false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.held, Some(paused));
    assert_eq!(state().await, (SubState::Paused, 1, 0));
    let disabled = Hold {
        reason: HoldReason::Disabled,
        since: Timestamp(800),
    };
    let s = store
        .hub_hold(id, Some(disabled), true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.held, Some(paused), "a disable never overrides a pause");
    assert_eq!(
        store.hub_subscriptions().await.unwrap()[0].held,
        Some(paused),
        "as read back"
    );
    let s = store.hub_hold(id, None, false).await.unwrap().unwrap();
    assert_eq!(
        (s.held, s.failing_since),
        (None, None),
        "let go, the run starts afresh"
    );
    let s = store
        .hub_hold(id, Some(disabled), true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.held, Some(disabled));
    assert_eq!(state().await, (SubState::Disabled, 0, 1));
    assert!(store
        .hub_hold(id + 1_000_000, None, false)
        .await
        .unwrap()
        .is_none());
    store.hub_remove_subscription(id).await.unwrap();
}

/// The notifier reads the changes due, then publishes them with its new watermark: a change
/// recorded in between, dated before that watermark (the rules accepted it: it was after the
/// old one), would never be notified. The embedded store refuses the move (the notifier steps
/// again and reads it).
#[tokio::test]
async fn a_change_recorded_while_the_notifier_publishes_is_never_passed_over() {
    use resourcesync_hub::store::NotifyState;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_embedded(&dir.path().join("db.sqlite")).unwrap();
    let set = SetName::parse("raced").unwrap();
    let t = Timestamp::now();
    let first = vec![change(ChangeType::Created, "http://x/a", 1, Some(t))];
    store.apply(&set, first, policy(50), t).await.unwrap();
    let state = store.notify_state(&set).await.unwrap().unwrap();
    // A notifier step: read what is due, publish it moving the watermark just after `t`.
    let step = || async {
        let due = store
            .changes(&set, state.watermark, None, None, 10)
            .await
            .unwrap();
        let next = NotifyState {
            watermark: Timestamp(t.0 + 1),
            version: state.version + 1,
            covers: Some(due.items.len() as u64),
            ..state.clone()
        };
        (due.items.len(), next)
    };
    // The notifier's read: one change, so its new watermark is just after it.
    let (due, next) = step().await;
    assert_eq!(due, 1);
    // Meanwhile a writer dates a change equal to it: after the watermark, accepted.
    let equal = vec![change(ChangeType::Created, "http://x/b", 2, Some(t))];
    store
        .apply(&set, equal, policy(50), Timestamp::now())
        .await
        .unwrap();
    let moved = store
        .hub_publish(Vec::new(), Some((state.version, next)), Timestamp::now())
        .await;
    assert!(
        matches!(moved, Err(resourcesync_hub::store::StoreError::Conflict(_))),
        "the watermark moved past a change it never notified: {moved:?}"
    );
    // Read again, both go out.
    let (due, next) = step().await;
    assert_eq!(due, 2);
    store
        .hub_publish(Vec::new(), Some((state.version, next)), Timestamp::now())
        .await
        .unwrap();
}

#[tokio::test]
async fn embedded_store_fulfils_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_embedded(&dir.path().join("db.sqlite")).unwrap();
    secret_rotation_contract(&store).await;
    hold_contract(&store).await;
    contract_suite(store.clone()).await;
    recorded_contract(&store).await;
}

#[tokio::test]
async fn elasticsearch_store_fulfils_the_contract() {
    let mut cfg = resourcesync_hub::config::Config::defaults()
        .store
        .elasticsearch;
    cfg.url = crate::support::Osmem::clone_url().await;
    let (store, _version) = Store::open_elasticsearch(&cfg).await.unwrap();
    secret_rotation_contract(&store).await;
    hold_contract(&store).await;
    contract_suite(store.clone()).await;
    recorded_contract(&store).await;
}
