//! Generation: a page written from the store as its plan says, spooled to the page cache's
//! files (the sitemaps and the activity streams alike, through [`PageWriter`]).

use super::*;

impl Source {
    /// The page of `kind` (cache key `key`) as `plan` says.
    pub(super) async fn generate(
        &self,
        kind: &DocKind,
        key: &str,
        plan: &Plan,
    ) -> Result<Gen<Pages>, SourceError> {
        // A Resource List's `at` is just after the newest change it reflects (L + 1µs) when
        // that is earlier than now. A change stamped before now but committed after this read
        // is dated after L (the store dates changes strictly increasingly), so it cannot fall
        // between the list and the Change List a destination reads next.
        let now = Timestamp::now();
        let at = plan
            .latest_change
            .map_or(now, |l| Timestamp(l.0 + 1).min(now));
        let out = match kind {
            DocKind::SourceDescription => {
                let describedby = &self.config().source.describedby;
                let oai = format!("{}?verb=Identify", self.urls().oai());
                let mut links: Vec<Ln> = (!describedby.is_empty())
                    .then(|| Ln {
                        rel: "describedby",
                        href: describedby,
                        mime: None,
                    })
                    .into_iter()
                    .collect();
                // The same sets over OAI-PMH (the repository's Identify).
                if self.config().oai.enabled {
                    links.push(Ln {
                        rel: "alternate",
                        href: &oai,
                        mime: Some("text/xml"),
                    });
                }
                let mut w = SitemapWriter::new(
                    Root::Urlset,
                    &Md {
                        capability: Some("description"),
                        ..Md::default()
                    },
                    &links,
                );
                for s in self.sets(false).await?.iter() {
                    let sc = self.set_config(&s.name);
                    let links: Vec<Ln> = sc
                        .describedby
                        .iter()
                        .map(|d| Ln {
                            rel: "describedby",
                            href: &d.href,
                            mime: d.mime.as_deref(),
                        })
                        .collect();
                    w.entry(
                        &self.urls().capability_list(&s.name),
                        None,
                        &Md {
                            capability: Some("capabilitylist"),
                            ..Md::default()
                        },
                        &links,
                    );
                }
                self.gen(w)?.boxed()
            }
            DocKind::CapabilityList(set) => {
                let sc = self.set_config(set);
                let sd = self.urls().source_description();
                let mut links: Vec<Ln> = sc
                    .describedby
                    .iter()
                    .map(|d| Ln {
                        rel: "describedby",
                        href: &d.href,
                        mime: d.mime.as_deref(),
                    })
                    .collect();
                links.push(Ln {
                    rel: "up",
                    href: &sd,
                    mime: None,
                });
                // The set's changes as IIIF Change Discovery activities, and its records
                // over OAI-PMH when it is served there.
                let activity = self.urls().activity(set);
                links.push(Ln {
                    rel: "alternate",
                    href: &activity,
                    mime: Some(activity::MEDIA_TYPE),
                });
                let oai = self
                    .config()
                    .oai_format(set.as_str())
                    .filter(|_| self.config().oai.enabled)
                    .map(|f| {
                        format!(
                            "{}?verb=ListRecords&metadataPrefix={}&set={set}",
                            self.urls().oai(),
                            f.metadata_prefix
                        )
                    });
                if let Some(oai) = &oai {
                    links.push(Ln {
                        rel: "alternate",
                        href: oai,
                        mime: Some("text/xml"),
                    });
                }
                let mut w = SitemapWriter::new(
                    Root::Urlset,
                    &Md {
                        capability: Some("capabilitylist"),
                        ..Md::default()
                    },
                    &links,
                );
                w.entry(
                    &self.urls().resource_list(set),
                    None,
                    &Md {
                        capability: Some("resourcelist"),
                        ..Md::default()
                    },
                    &[],
                );
                w.entry(
                    &self.urls().change_list(set),
                    None,
                    &Md {
                        capability: Some("changelist"),
                        ..Md::default()
                    },
                    &[],
                );
                for (capability, url, _) in self.ctx.advertised(set) {
                    w.entry(
                        &url,
                        None,
                        &Md {
                            capability: Some(capability),
                            ..Md::default()
                        },
                        &[],
                    );
                }
                if self.config().notify.enabled {
                    // The notification channels: the topic is the <loc>, the hub an rs:ln.
                    let hub = self.config().hub_url();
                    let hub_ln = [Ln {
                        rel: "hub",
                        href: &hub,
                        mime: None,
                    }];
                    let change = self.config().change_topic(set.as_str());
                    let framework = self.config().framework_topic(set.as_str());
                    w.entry(
                        &change,
                        None,
                        &Md {
                            capability: Some("change-notification"),
                            ..Md::default()
                        },
                        &hub_ln,
                    );
                    w.entry(
                        &framework,
                        None,
                        &Md {
                            capability: Some("framework-notification"),
                            ..Md::default()
                        },
                        &hub_ln,
                    );
                }
                self.gen(w)?.boxed()
            }
            DocKind::ResourceList(set) | DocKind::ResourceListPart(set, _) => {
                let up = self.urls().capability_list(set);
                match &plan.part {
                    None => {
                        let mut w = SitemapWriter::new(
                            Root::SitemapIndex,
                            &Md {
                                capability: Some("resourcelist"),
                                at: Some(at),
                                ..Md::default()
                            },
                            &[Ln {
                                rel: "up",
                                href: &up,
                                mime: None,
                            }],
                        );
                        for p in &plan.parts {
                            w.entry(
                                &self.urls().resource_list_part(set, p.no),
                                None,
                                &Md::default(),
                                &[],
                            );
                        }
                        self.gen(w)?.boxed()
                    }
                    Some(part) => self
                        .resource_list_part(set, part, plan.indexed, at, key)
                        .await?
                        .boxed(),
                }
            }
            DocKind::ChangeList(set) | DocKind::ChangeListNo(set, _) => {
                let up = self.urls().capability_list(set);
                match (kind, plan.indexed) {
                    (DocKind::ChangeList(_), true) => {
                        let lists = &plan.lists[..];
                        let mut w = SitemapWriter::new(
                            Root::SitemapIndex,
                            &Md {
                                capability: Some("changelist"),
                                from: lists.first().map(|l| l.from),
                                ..Md::default()
                            },
                            &[Ln {
                                rel: "up",
                                href: &up,
                                mime: None,
                            }],
                        );
                        for l in lists {
                            w.entry(
                                &self.urls().change_list_no(set, l.no),
                                None,
                                &Md {
                                    from: Some(l.from),
                                    until: l.until,
                                    ..Md::default()
                                },
                                &[],
                            );
                        }
                        self.gen(w)?.boxed()
                    }
                    _ => {
                        let list = plan.lists.first().ok_or_else(|| {
                            SourceError::NotFound(format!("set {set} has no Change List"))
                        })?;
                        self.change_list(set, list, plan.indexed).await?.boxed()
                    }
                }
            }
            DocKind::Activity(set) => {
                let nav = plan.nav.expect("an activity plan has its nav");
                let page = |no: Option<u32>| no.map(|n| self.urls().activity_page(set, n));
                let (first, last) = (page(nav.prev), page(nav.next));
                self.gen(activity::ActivityWriter::collection(
                    &self.urls().activity(set),
                    nav.total,
                    first.as_deref(),
                    last.as_deref(),
                ))?
                .boxed()
            }
            DocKind::ActivityPage(set, no) => {
                let list = plan
                    .lists
                    .first()
                    .expect("an activity page plan has its list");
                let nav = plan.nav.expect("an activity plan has its nav");
                self.activity_page(set, *no, list, nav).await?.boxed()
            }
        };
        Ok(out)
    }

    /// A page's generation, with room in front of its entries for the head its writer has
    /// now (a head made again at the end must not be longer).
    pub(super) fn gen<W: PageWriter>(&self, w: W) -> Result<Gen<W>, SourceError> {
        Ok(Gen {
            spool: self.disk.spool(w.head().len())?,
            w,
            bytes: 0,
            base: None,
        })
    }

    pub(super) async fn change_list(
        &self,
        set: &SetName,
        list: &ChangeListInfo,
        indexed: bool,
    ) -> Result<Gen<SitemapWriter>, SourceError> {
        let up = self.urls().capability_list(set);
        let index = self.urls().change_list(set);
        let mut links = vec![Ln {
            rel: "up",
            href: &up,
            mime: None,
        }];
        if indexed {
            links.push(Ln {
                rel: "index",
                href: &index,
                mime: None,
            });
        }
        let md = Md {
            capability: Some("changelist"),
            from: Some(list.from),
            until: list.until,
            ..Md::default()
        };
        let gen = self.gen(SitemapWriter::new(Root::Urlset, &md, &links))?;
        let gen = self.write_changes(gen, set, list, write_change).await?;
        if gen.bytes > SITEMAP_MAX_BYTES {
            tracing::warn!(set = %set, list = list.no, bytes = gen.bytes, "change list exceeds the sitemap size limit");
        }
        Ok(gen)
    }

    /// The activity page of Change List `no`: its changes as activities, oldest first.
    pub(super) async fn activity_page(
        &self,
        set: &SetName,
        no: u32,
        list: &ChangeListInfo,
        nav: Nav,
    ) -> Result<Gen<activity::ActivityWriter>, SourceError> {
        let page = |n: Option<u32>| n.map(|n| self.urls().activity_page(set, n));
        let (prev, next) = (page(nav.prev), page(nav.next));
        let gen = self.gen(activity::ActivityWriter::page(
            &self.urls().activity_page(set, no),
            &self.urls().activity(set),
            nav.start,
            prev.as_deref(),
            next.as_deref(),
        ))?;
        self.write_changes(gen, set, list, |w, sc, c, loc| {
            loc.clear();
            c.key.to_url(&sc.url_prefix, loc);
            w.activity(c.change, loc, c.datetime);
        })
        .await
    }

    /// Writes the changes of Change List `list` into `gen` with `row`, a store page at a time
    /// (the Change List's entries, the activity page's activities).
    pub(super) async fn write_changes<W: PageWriter>(
        &self,
        mut gen: Gen<W>,
        set: &SetName,
        list: &ChangeListInfo,
        row: fn(&mut W, &SetConfig, &Change, &mut String),
    ) -> Result<Gen<W>, SourceError> {
        let sc = Arc::new(self.set_config(set));
        let mut cursor = None;
        loop {
            let page = self
                .store()
                .changes(
                    set,
                    list.from,
                    list.until,
                    cursor,
                    self.config().source.store_page_size,
                )
                .await?;
            let (items, next) = (page.items, page.next);
            let sc = sc.clone();
            gen = gen
                .write_rows(move |w| {
                    let mut loc = String::new();
                    for c in &items {
                        row(w, &sc, c, &mut loc);
                    }
                })
                .await?;
            match next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        Ok(gen)
    }
}

/// What the page cache needs of a document's writer: a head, the entries taken as they
/// accumulate, a tail (the sitemaps, the activity streams).
pub(super) trait PageWriter: Send + 'static {
    fn head(&self) -> &str;
    fn take_entries(&mut self) -> String;
    fn tail(&self) -> String;
    fn entries(&self) -> usize;
}

impl PageWriter for SitemapWriter {
    fn head(&self) -> &str {
        SitemapWriter::head(self)
    }
    fn take_entries(&mut self) -> String {
        SitemapWriter::take_entries(self)
    }
    fn tail(&self) -> String {
        SitemapWriter::tail(self)
    }
    fn entries(&self) -> usize {
        SitemapWriter::entries(self)
    }
}

impl PageWriter for activity::ActivityWriter {
    fn head(&self) -> &str {
        activity::ActivityWriter::head(self)
    }
    fn take_entries(&mut self) -> String {
        activity::ActivityWriter::take_entries(self)
    }
    fn tail(&self) -> String {
        activity::ActivityWriter::tail(self)
    }
    fn entries(&self) -> usize {
        activity::ActivityWriter::entries(self)
    }
}

/// Any page's writer, once its entries are written.
pub(super) type Pages = Box<dyn PageWriter>;

impl PageWriter for Pages {
    fn head(&self) -> &str {
        (**self).head()
    }
    fn take_entries(&mut self) -> String {
        (**self).take_entries()
    }
    fn tail(&self) -> String {
        (**self).tail()
    }
    fn entries(&self) -> usize {
        (**self).entries()
    }
}

/// A page being generated: the writer, and the spool its entries are moved to as they
/// accumulate, so a 50 MB page is never held in memory.
pub(super) struct Gen<W> {
    pub(super) w: W,
    pub(super) spool: Spool,
    /// Entry bytes moved to the spool so far.
    pub(super) bytes: u64,
    /// Where each entry lies, for the next build (Resource List parts).
    pub(super) base: Option<Base>,
}

impl<W: PageWriter> Gen<W> {
    pub(super) fn boxed(self) -> Gen<Pages> {
        Gen {
            w: Box::new(self.w),
            spool: self.spool,
            bytes: self.bytes,
            base: self.base,
        }
    }

    /// Moves the entries written so far to the spool.
    pub(super) fn spool_entries(&mut self) -> std::io::Result<()> {
        let entries = self.w.take_entries();
        self.bytes += entries.len() as u64;
        self.spool.write(entries.as_bytes())
    }

    /// Formats one batch of rows and spools it, on the blocking pool.
    pub(super) async fn write_rows(
        self,
        f: impl FnOnce(&mut W) + Send + 'static,
    ) -> Result<Gen<W>, SourceError> {
        blocking(move || {
            let mut g = self;
            f(&mut g.w);
            g.spool_entries()?;
            Ok(g)
        })
        .await
    }
}
