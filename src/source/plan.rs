//! Planning: from the store's bookkeeping alone, what a document would be generated from
//! (its version, its part or lists, its neighbours), decided before any page is built.

use super::*;

impl Source {
    /// Works out, from the store's bookkeeping alone, what a document would be generated from.
    pub(super) async fn plan(&self, kind: &DocKind) -> Result<Plan, SourceError> {
        match kind {
            DocKind::SourceDescription => {
                let sets = self.sets(false).await?;
                let names: Vec<&str> = sets.iter().map(|s| s.name.as_str()).collect();
                let last = sets
                    .iter()
                    .map(|s| s.created_at)
                    .max()
                    .unwrap_or(Timestamp(0));
                Ok(Plan::new(
                    format!("sets:{}:{}", names.join(","), last.0),
                    last,
                ))
            }
            DocKind::CapabilityList(set) => {
                let created = self.known_set(set).await?;
                let extra = self.ctx.advertised(set);
                let changed = extra.iter().map(|e| e.2).max().unwrap_or(created);
                let extra: Vec<String> = extra
                    .into_iter()
                    .map(|(c, u, _)| format!("{c}={u}"))
                    .collect();
                Ok(Plan::new(
                    format!("{}:capabilitylist:{}", created.0, extra.join(",")),
                    created.max(changed),
                ))
            }
            DocKind::ResourceList(set) | DocKind::ResourceListPart(set, _) => {
                let created = self.known_set(set).await?.0;
                let latest_change = self
                    .store()
                    .changelists(set)
                    .await?
                    .iter()
                    .filter_map(|l| l.last_change)
                    .max();
                let parts: Vec<PartInfo> = self
                    .store()
                    .parts(set)
                    .await?
                    .into_iter()
                    .filter(|p| p.count > 0)
                    .collect();
                let indexed = parts.len() > 1;
                let part = match kind {
                    DocKind::ResourceListPart(_, no) => {
                        Some(parts.iter().find(|p| p.no == *no).cloned().ok_or_else(|| {
                            SourceError::NotFound(format!(
                                "set {set} has no Resource List part {no}"
                            ))
                        })?)
                    }
                    _ if indexed => None,
                    _ => Some(parts.first().cloned().unwrap_or(PartInfo {
                        no: 0,
                        count: 0,
                        last_seq: 0,
                        last_change: Timestamp(0),
                    })),
                };
                match part {
                    Some(p) => Ok(Plan {
                        // The last change's time too: adopting an external writer's
                        // resource documents changes a part without a change of its own.
                        version: format!(
                            "{created}:part:{}:{}:{}:{indexed}",
                            p.no, p.last_seq, p.last_change.0
                        ),
                        last_modified: p.last_change,
                        part: Some(p),
                        indexed,
                        parts,
                        lists: vec![],
                        latest_change,
                        nav: None,
                    }),
                    None => {
                        let nos: Vec<String> = parts.iter().map(|p| p.no.to_string()).collect();
                        let last = parts
                            .iter()
                            .map(|p| p.last_change)
                            .max()
                            .unwrap_or(Timestamp(0));
                        Ok(Plan {
                            version: format!("{created}:index:{}", nos.join(",")),
                            last_modified: last,
                            part: None,
                            indexed,
                            parts,
                            lists: vec![],
                            latest_change,
                            nav: None,
                        })
                    }
                }
            }
            DocKind::ChangeList(set) | DocKind::ChangeListNo(set, _) => {
                let created = self.known_set(set).await?.0;
                let lists = self.store().changelists(set).await?;
                let indexed = lists.len() > 1;
                let list = match kind {
                    DocKind::ChangeListNo(_, no) => {
                        Some(lists.iter().find(|l| l.no == *no).cloned().ok_or_else(|| {
                            SourceError::NotFound(format!("set {set} has no Change List {no}"))
                        })?)
                    }
                    _ if indexed => None,
                    _ => lists.first().cloned(),
                };
                // The index lists each list's interval only: it changes when a list is
                // closed or opened, not with every change.
                let version = match &list {
                    Some(l) => format!(
                        "{created}:list:{}:{:?}:{}:{}:{indexed}",
                        l.no, l.until, l.count, l.last_seq
                    ),
                    None => format!(
                        "{created}:clindex:{}",
                        lists
                            .iter()
                            .map(|l| format!("{}/{:?}/{:?}", l.no, l.from, l.until))
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                };
                let last_modified = match &list {
                    Some(l) => l.until.or(l.last_change).unwrap_or(l.from),
                    None => lists
                        .iter()
                        .map(|l| l.until.unwrap_or(l.from))
                        .max()
                        .unwrap_or(Timestamp(0)),
                };
                let lists = list
                    .into_iter()
                    .chain(if indexed { lists } else { vec![] })
                    .collect();
                Ok(Plan {
                    version,
                    last_modified,
                    part: None,
                    indexed,
                    parts: vec![],
                    lists,
                    latest_change: None,
                    nav: None,
                })
            }
            DocKind::Activity(set) | DocKind::ActivityPage(set, _) => {
                let created = self.known_set(set).await?;
                let lists = self.store().changelists(set).await?;
                // Pages are the lists that hold changes: every closed list, and the open
                // one once it has any (a page has at least one activity).
                let pages: Vec<&ChangeListInfo> = lists.iter().filter(|l| l.count > 0).collect();
                let changed = |l: &ChangeListInfo| l.until.or(l.last_change).unwrap_or(l.from);
                match kind {
                    DocKind::ActivityPage(_, no) => {
                        let at = pages.iter().position(|l| l.no == *no).ok_or_else(|| {
                            SourceError::NotFound(format!(
                                "set {set} has no activity page {no} (pages are its Change Lists that hold changes)"
                            ))
                        })?;
                        let l = pages[at];
                        let nav = Nav {
                            start: pages[..at].iter().map(|l| l.count).sum(),
                            total: l.count,
                            prev: at.checked_sub(1).map(|p| pages[p].no),
                            next: pages.get(at + 1).map(|n| n.no),
                        };
                        Ok(Plan {
                            // A closed list's page changes once more: when a later page
                            // first gets its `next`.
                            version: format!(
                                "{}:activitypage:{}:{:?}:{}:{}:{:?}:{:?}:{}",
                                created.0,
                                l.no,
                                l.until,
                                l.count,
                                l.last_seq,
                                nav.prev,
                                nav.next,
                                nav.start
                            ),
                            last_modified: changed(l),
                            lists: vec![l.clone()],
                            nav: Some(nav),
                            ..Plan::new(String::new(), created)
                        })
                    }
                    _ => {
                        let nav = Nav {
                            start: 0,
                            total: pages.iter().map(|l| l.count).sum(),
                            prev: pages.first().map(|l| l.no),
                            next: pages.last().map(|l| l.no),
                        };
                        Ok(Plan {
                            version: format!(
                                "{}:activity:{}:{:?}:{:?}",
                                created.0, nav.total, nav.prev, nav.next
                            ),
                            last_modified: pages.last().map_or(created, |l| changed(l)),
                            nav: Some(nav),
                            ..Plan::new(String::new(), created)
                        })
                    }
                }
            }
        }
    }
}

/// What a document is generated from (computed before deciding whether to regenerate).
pub(super) struct Plan {
    pub(super) version: String,
    pub(super) last_modified: Timestamp,
    pub(super) part: Option<PartInfo>,
    pub(super) indexed: bool,
    pub(super) parts: Vec<PartInfo>,
    pub(super) lists: Vec<ChangeListInfo>,
    /// Datetime of the newest change of the set visible when planning.
    pub(super) latest_change: Option<Timestamp>,
    /// Where an activity page lies (for the collection: its first and last pages).
    pub(super) nav: Option<Nav>,
}

/// An activity page's place in its collection: the activities before it and in it, its
/// neighbours. For the collection, `prev` and `next` are its first and last pages.
#[derive(Debug, Clone, Copy)]
pub(super) struct Nav {
    pub(super) start: u64,
    pub(super) total: u64,
    pub(super) prev: Option<u32>,
    pub(super) next: Option<u32>,
}

impl Plan {
    pub(super) fn new(version: String, last_modified: Timestamp) -> Plan {
        Plan {
            version,
            last_modified,
            part: None,
            indexed: false,
            parts: vec![],
            lists: vec![],
            latest_change: None,
            nav: None,
        }
    }
}
