//! Where a harvested record's file lives under its set's `resource_root_dir`: a path made from
//! the OAI identifier that can neither climb out of the folder nor collide with another
//! record's. Every byte but ASCII letters, digits, `-` and `_` is written `%XX` (so `.`, `/`,
//! `\` and `%` itself never appear as themselves: no `..`, no separator, and two identifiers
//! never give one name); the name ends in `.xml`; records spread over 256 folders by the first
//! byte of the identifier's SHA-256, so no folder holds millions of files. A name that would
//! be longer than a file system takes keeps its first part and ends with the identifier's
//! whole SHA-256 after a `~` (a byte the encoding never writes, so it cannot meet an
//! encoded name; an empty identifier, which no record has, gives `~.xml`).

use sha2::Digest as _;

/// The longest file name written (most file systems take 255 bytes).
const MAX_NAME: usize = 200;

/// The relative path of the record `identifier`'s file, like `3f/oai%3Arepo%3A123.xml`.
pub fn record_path(identifier: &str) -> String {
    let hash = sha2::Sha256::digest(identifier.as_bytes());
    let mut name = String::with_capacity(identifier.len() + 8);
    for b in identifier.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            name.push(b as char);
        } else {
            name.push_str(&format!("%{b:02X}"));
        }
    }
    if name.is_empty() {
        // Not a name a record has (its header needs an identifier), but never `.xml`.
        name.push('~');
    }
    if name.len() + 4 > MAX_NAME {
        let keep = MAX_NAME - 4 - 1 - 64;
        // Cut between escapes, never inside one.
        let cut = match name[..keep].rfind('%') {
            Some(p) if keep - p < 3 => p,
            _ => keep,
        };
        name.truncate(cut);
        name.push('~');
        name.push_str(&crate::digest::hex_digest(hash));
    }
    format!("{:02x}/{name}.xml", hash[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_give_names_that_neither_climb_nor_collide() {
        assert_eq!(
            record_path("oai:repo.example.org:123")
                .split_once('/')
                .unwrap()
                .1,
            "oai%3Arepo%2Eexample%2Eorg%3A123.xml"
        );
        for id in [
            "..",
            "../../etc/passwd",
            "/abs",
            "a/b",
            "a\\b",
            ".",
            "",
            "%2E%2E",
        ] {
            let p = record_path(id);
            let (dir, name) = p.split_once('/').unwrap();
            assert_eq!(dir.len(), 2, "{p}");
            assert!(
                !name.contains(['/', '\\']) && !name.starts_with('.'),
                "{id:?} gave {p}"
            );
            assert!(
                !p.split('/').any(|c| c == ".." || c == "."),
                "{id:?} gave {p}"
            );
        }
        let pairs = [
            ("a/b", "a%2Fb"),
            ("a.b", "a%2Eb"),
            ("A", "a"),
            ("é", "%C3%A9"),
        ];
        for (x, y) in pairs {
            assert_ne!(record_path(x), record_path(y), "{x:?} and {y:?}");
        }
    }

    #[test]
    fn a_long_identifier_gets_a_bounded_name_that_stays_its_own() {
        let long = "x".repeat(1000);
        let other = format!("{}y", "x".repeat(999));
        let (a, b) = (record_path(&long), record_path(&other));
        assert!(a.len() <= 3 + MAX_NAME && b.len() <= 3 + MAX_NAME, "{a}");
        assert_ne!(a, b);
        let escaped = ":".repeat(300);
        let c = record_path(&escaped);
        let name = c.split_once('/').unwrap().1;
        let kept = name.split_once('~').unwrap().0;
        assert!(
            kept.len().is_multiple_of(3) && kept.chars().all(|ch| "%3A".contains(ch)),
            "{kept}"
        );
    }
}
