//! A run by kind: what the collector reads (given, or discovered at its first run), then the
//! run of that kind: OAI-PMH ([`super::run`]), ResourceSync (followed by the harvest engine),
//! or a sitemap or activity stream ([`super::listing`]).

use tokio_util::sync::CancellationToken;

use super::run::{Collector, Report, RunError};
use super::state::Saved;
use crate::config::CollectKind;
use crate::model::Timestamp;

impl Collector {
    /// One run of whatever the source is (discovered first when its kind is not given).
    pub async fn run(
        &self,
        saved: &mut Saved,
        cancel: &CancellationToken,
    ) -> Result<Report, RunError> {
        saved.last_started = Some(Timestamp::now().to_string());
        let (kind, url) = self.resolve(saved).await?;
        match kind {
            CollectKind::OaiPmh => self.run_oai(saved, cancel).await,
            CollectKind::Resourcesync => self.follow(&url).await,
            kind => super::listing::run(self, kind, &url, saved, cancel).await,
        }
    }
}
