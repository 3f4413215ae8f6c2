//! A secret (a token, a key, a WebSub secret): usable where it is needed, never printed. Its
//! `Debug` says `[redacted]` and it has no `Display`, so no derived `Debug` of a structure that
//! holds one (a configuration, an admin's change) and no format string can put it in a log
//! line, an error or an answer; [`Secret::expose`] is the one way to its text, said where used.

use serde::{Deserialize, Serialize};

#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// The secret's text, for the one place that sends or checks it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "[redacted]"
        })
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Secret {
        Secret(s.to_string())
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Secret {
        Secret(s)
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn a_secret_is_never_printed() {
        #[derive(Debug)]
        #[allow(dead_code)]
        struct Holder {
            token: Secret,
            none: Secret,
        }
        let h = Holder {
            token: "hunter2".into(),
            none: Secret::default(),
        };
        let shown = format!("{h:?} {h:#?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("[redacted]"),
            "{shown}"
        );
        assert_eq!(h.token.expose(), "hunter2");
        let json = serde_json::to_string(&h.token).unwrap();
        assert_eq!(json, "\"hunter2\"");
        assert_eq!(serde_json::from_str::<Secret>(&json).unwrap(), h.token);
    }
}
