//! An error in words: the error and every cause under it on one line, as logs, statuses and
//! answers to admins print it ("writing the batch: database or disk is full"). The one chain
//! printer of the crate, for the server and the destination alike.

/// An error with its causes: `outer: inner: innermost`. A cause whose words the line already
/// holds is left out, so an error that prints its source in its own message (as many do)
/// does not say it twice.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let m = s.to_string();
        if !m.is_empty() && !out.contains(&m) {
            out.push_str(": ");
            out.push_str(&m);
        }
        src = s.source();
    }
    out
}

/// The words of a panic's payload.
pub fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// `fut`'s output, or the words of the panic that ended it (for the supervisors that restart
/// a delivery lane or a worker instead of losing it silently).
pub async fn caught<T>(fut: impl std::future::Future<Output = T>) -> Result<T, String> {
    use futures_util::FutureExt as _;
    std::panic::AssertUnwindSafe(fut)
        .catch_unwind()
        .await
        .map_err(|p| panic_text(&*p))
}

/// An outsider's text (an identifier, a token, a URL, a reason a peer gave) as state, logs and
/// answers keep it: at most `max` bytes (cut at a character), then how long it was in all.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &s[..end], s.len())
}

/// [`cut`] to [`OUTSIDER_TEXT`] bytes.
pub fn outsider(s: &str) -> String {
    cut(s, OUTSIDER_TEXT)
}

/// How much of an outsider's text is kept: enough to recognise it, never enough to grow a
/// log, a state row or an answer by what a peer chooses to send.
pub const OUTSIDER_TEXT: usize = 300;

#[cfg(test)]
mod tests {
    use super::{chain, cut};

    #[test]
    fn outsiders_text_is_cut_with_its_length() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("abcdefgh", 4), "abcd… (8 bytes in all)");
        // Never inside a character.
        assert_eq!(cut("ééé", 3), "é… (6 bytes in all)");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("writing the batch")]
    struct Outer(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("reading: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn every_cause_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full");
        assert_eq!(chain(&Outer(io())), "writing the batch: disk full");
        assert_eq!(chain(&Repeats(io())), "reading: disk full");
        let a = anyhow::Error::new(Outer(io())).context("ingest into set papers");
        assert_eq!(
            chain(a.as_ref()),
            "ingest into set papers: writing the batch: disk full"
        );
    }
}
