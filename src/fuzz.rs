//! Inputs for the property tests of the parsers of network input (test builds only): any
//! bytes, and valid samples mangled the ways a careless or hostile peer mangles them (bytes
//! inserted, removed, repeated or flipped; markup that breaks XML; invalid UTF-8; a cut).
//! Each parser's module runs its own property over these: no panic, a clear error, output
//! bounded by its input.

use proptest::prelude::*;

/// Snippets that break markup, inserted at random places.
const NASTY: &[&[u8]] = &[
    b"<",
    b">",
    b"&",
    b"&#1;",
    b"&undefined;",
    b"]]>",
    b"<!--",
    b"--",
    b"<![CDATA[",
    b"<!DOCTYPE x [<!ENTITY e \"x\">]>",
    b"<?xml version=\"1.0\"?>",
    b"\xff\xfe",
    b"\xc3",
    b"\x00",
    b"\"",
    b"'",
    b"xmlns:p=\"\"",
    b"<p:x/>",
    b"</a>",
    b"\r\n",
    b"%00",
    b"\"}]",
    b"{\"",
];

#[derive(Debug, Clone)]
enum Mutation {
    Insert(u16, Vec<u8>),
    Nasty(u16, usize),
    Delete(u16, u16),
    Repeat(u16, u16, u8),
    Flip(u16, u8),
    Cut(u16),
}

/// A position in `len` from a fraction in 1/65536ths.
fn at(f: u16, len: usize) -> usize {
    (f as usize * (len + 1)) >> 16
}

impl Mutation {
    fn apply(&self, b: &mut Vec<u8>) {
        match self {
            Mutation::Insert(f, bytes) => {
                let i = at(*f, b.len());
                b.splice(i..i, bytes.iter().copied());
            }
            Mutation::Nasty(f, k) => {
                let i = at(*f, b.len());
                b.splice(i..i, NASTY[k % NASTY.len()].iter().copied());
            }
            Mutation::Delete(f, n) => {
                let i = at(*f, b.len());
                let j = (i + *n as usize % 64).min(b.len());
                b.drain(i..j);
            }
            Mutation::Repeat(f, n, times) => {
                let i = at(*f, b.len());
                let j = (i + *n as usize % 256).min(b.len());
                let piece = b[i..j].to_vec();
                for _ in 0..*times % 8 {
                    b.splice(j..j, piece.iter().copied());
                }
            }
            Mutation::Flip(f, x) => {
                if !b.is_empty() {
                    let i = at(*f, b.len() - 1);
                    b[i] ^= x | 1;
                }
            }
            Mutation::Cut(f) => {
                let i = at(*f, b.len());
                b.truncate(i);
            }
        }
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<u16>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(f, v)| Mutation::Insert(f, v)),
        (any::<u16>(), any::<usize>()).prop_map(|(f, k)| Mutation::Nasty(f, k)),
        (any::<u16>(), any::<u16>()).prop_map(|(f, n)| Mutation::Delete(f, n)),
        (any::<u16>(), any::<u16>(), any::<u8>()).prop_map(|(f, n, t)| Mutation::Repeat(f, n, t)),
        (any::<u16>(), any::<u8>()).prop_map(|(f, x)| Mutation::Flip(f, x)),
        any::<u16>().prop_map(Mutation::Cut),
    ]
}

/// One of `samples`, mangled by up to eight mutations.
pub fn mutated(samples: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let n = samples.len();
    (0..n, prop::collection::vec(mutation(), 0..8)).prop_map(move |(i, ms)| {
        let mut b = samples[i].clone();
        for m in &ms {
            m.apply(&mut b);
        }
        b
    })
}

/// Any bytes (up to 2 KiB), or a mangled sample: what a network peer can send.
pub fn peer_input(samples: &[&str]) -> impl Strategy<Value = Vec<u8>> {
    let samples: Vec<Vec<u8>> = samples.iter().map(|s| s.as_bytes().to_vec()).collect();
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..2048),
        4 => mutated(samples),
    ]
}

/// The cases each parser's property runs in `cargo test` (a few seconds in all).
pub fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 2048,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Any JSON value up to a few levels deep, its strings and keys drawn mostly from the
/// vocabulary of COAR Notify (so that a parser of notifications is taken deep), else random.
pub fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    const WORDS: &[&str] = &[
        "https://www.w3.org/ns/activitystreams",
        "https://coar-notify.net",
        "Offer",
        "Announce",
        "coar-notify:IngestAction",
        "coar-notify:ReviewAction",
        "Service",
        "https://repo.example.edu/item/1",
        "urn:uuid:0370c0fb-bb78-4a9b-87f5-bed307a509dd",
        "oai:repo:1",
        "",
    ];
    const KEYS: &[&str] = &[
        "@context",
        "id",
        "type",
        "origin",
        "target",
        "object",
        "actor",
        "inbox",
        "context",
        "inReplyTo",
        "ietf:cite-as",
        "ietf:item",
        "as:subject",
        "as:object",
    ];
    let leaf = prop_oneof![
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => any::<i64>().prop_map(Value::from),
        1 => ".{0,16}".prop_map(Value::String),
        4 => prop::sample::select(WORDS).prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 96, 8, |inner| {
        prop_oneof![
            1 => prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            3 => prop::collection::btree_map(
                prop_oneof![4 => prop::sample::select(KEYS).prop_map(String::from), 1 => ".{0,8}"],
                inner,
                0..9
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
