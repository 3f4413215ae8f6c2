//! `Timestamp`: UTC instants at microsecond precision, parsed from ISO 8601 / RFC 3339 and the
//! seeds' `yyyy-MM-dd'T'HH:mm:ssZ` (`+0000` offsets), written as W3C Datetime with `Z`.

use std::fmt;

use chrono::{DateTime, Datelike, NaiveDateTime, Timelike, Utc};

/// Microseconds since the Unix epoch, UTC. Ordered, cheap to store, and exactly round-trips.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub fn now() -> Timestamp {
        Timestamp(Utc::now().timestamp_micros())
    }

    pub fn from_secs(secs: i64) -> Timestamp {
        Timestamp(secs * 1_000_000)
    }

    /// A file time (such as a modification time) as a timestamp; `None` before the epoch.
    pub fn from_system_time(t: std::time::SystemTime) -> Option<Timestamp> {
        t.duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| Timestamp(d.as_micros() as i64))
    }

    pub fn micros(self) -> i64 {
        self.0
    }

    pub fn plus_secs(self, secs: u64) -> Timestamp {
        Timestamp(
            self.0
                .saturating_add((secs as i64).saturating_mul(1_000_000)),
        )
    }

    /// Parses RFC 3339 (`2024-01-02T03:04:05Z`, `…+01:00`, fractions), the seeds' format with
    /// a `+0000` style offset, and a bare date-time without zone, read as UTC.
    /// Years outside 0001–9999 are refused: W3C Datetime (and `xsd:dateTime` as documents
    /// carry it) has four-digit years.
    pub fn parse(s: &str) -> Result<Timestamp, String> {
        let t = Timestamp::parse_any(s)?;
        let year = DateTime::<Utc>::from_timestamp_micros(t.0).map(|d| d.year());
        match year {
            Some(1..=9999) => Ok(t),
            _ => Err(format!(
                "{} lies outside the years 0001 to 9999",
                super::location::excerpt(s.trim())
            )),
        }
    }

    /// As [`Timestamp::parse`], but a date-time without a zone (`Z` or an offset) is refused:
    /// what our own API accepts says which instant it means. `field` names it in the error.
    pub fn parse_zoned(s: &str, field: &str) -> Result<Timestamp, String> {
        let t = s.trim();
        let zoned = DateTime::parse_from_rfc3339(t).is_ok()
            || DateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S%.f%z").is_ok();
        if !zoned && NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S%.f").is_ok() {
            return Err(format!(
                "{field} {} has no time zone: add Z (UTC) or an offset such as +01:00",
                super::location::excerpt(t)
            ));
        }
        Timestamp::parse(s).map_err(|e| format!("{field} {e}"))
    }

    fn parse_any(s: &str) -> Result<Timestamp, String> {
        let s = s.trim();
        if let Ok(t) = DateTime::parse_from_rfc3339(s) {
            return Ok(Timestamp(t.timestamp_micros()));
        }
        if let Ok(t) = DateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f%z") {
            return Ok(Timestamp(t.timestamp_micros()));
        }
        if let Ok(t) = NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f") {
            return Ok(Timestamp(t.and_utc().timestamp_micros()));
        }
        Err(format!(
            "{} is not a date-time like 2024-01-31T12:00:00Z",
            super::location::excerpt(s)
        ))
    }

    /// Writes `YYYY-MM-DDThh:mm:ssZ`, with `.ffffff` only when the instant has a fraction.
    pub fn write_w3c(self, out: &mut String) {
        use std::fmt::Write;
        let dt = DateTime::<Utc>::from_timestamp_micros(self.0).unwrap_or_default();
        let _ = write!(
            out,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            dt.year(),
            dt.month(),
            dt.day(),
            dt.hour(),
            dt.minute(),
            dt.second()
        );
        let frac = self.0.rem_euclid(1_000_000);
        if frac != 0 {
            let _ = write!(out, ".{frac:06}");
        }
        out.push('Z');
    }

    pub fn to_http_date(self) -> String {
        // httpdate (hyper's) formats IMF-fixdate without chrono's general formatter: this is
        // on every response with a validator.
        httpdate::fmt_http_date(
            std::time::UNIX_EPOCH + std::time::Duration::from_micros(self.0.max(0) as u64),
        )
    }

    pub fn parse_http_date(s: &str) -> Option<Timestamp> {
        DateTime::parse_from_rfc2822(s)
            .ok()
            .map(|t| Timestamp(t.timestamp_micros()))
    }

    /// How long a peer's `Retry-After` asks to wait: delay-seconds or an HTTP date (a date
    /// in the past is no wait). `None` for anything else.
    pub fn retry_after(v: &str) -> Option<std::time::Duration> {
        let v = v.trim();
        if let Ok(secs) = v.parse::<u64>() {
            return Some(std::time::Duration::from_secs(secs));
        }
        let at = Timestamp::parse_http_date(v)?;
        Some(std::time::Duration::from_micros(
            (at.0 - Timestamp::now().0).max(0) as u64,
        ))
    }

    /// Whole seconds, rounding down (HTTP dates have no fractions).
    pub fn floor_secs(self) -> Timestamp {
        Timestamp(self.0 - self.0.rem_euclid(1_000_000))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::with_capacity(27);
        self.write_w3c(&mut s);
        f.write_str(&s)
    }
}

impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Timestamp::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Deserializers for fields of our own API that must carry a zone (see
/// [`Timestamp::parse_zoned`]).
pub mod zoned {
    use super::Timestamp;
    use serde::Deserialize;

    fn named<'de, D: serde::Deserializer<'de>>(
        d: D,
        field: &str,
    ) -> Result<Option<Timestamp>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) => Timestamp::parse_zoned(&s, field)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }

    pub fn datetime<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
        named(d, "datetime")
    }

    pub fn lastmod<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
        named(d, "lastmod")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn retry_after_takes_seconds_and_dates() {
        use super::Timestamp;
        use std::time::Duration;
        assert_eq!(
            Timestamp::retry_after("120"),
            Some(Duration::from_secs(120))
        );
        let later =
            Timestamp::from_secs(Timestamp::now().micros() / 1_000_000 + 300).to_http_date();
        let d = Timestamp::retry_after(&later).unwrap();
        assert!(
            d > Duration::from_secs(290) && d <= Duration::from_secs(300),
            "{d:?}"
        );
        let past = Timestamp::from_secs(1_000_000).to_http_date();
        assert_eq!(Timestamp::retry_after(&past), Some(Duration::ZERO));
        assert_eq!(Timestamp::retry_after("soon"), None);
    }

    use super::*;

    #[test]
    fn parses_iso_and_seed_formats() {
        let z = Timestamp::parse("2016-03-01T12:30:00Z").unwrap();
        assert_eq!(Timestamp::parse("2016-03-01T12:30:00+0000").unwrap(), z);
        assert_eq!(Timestamp::parse("2016-03-01T13:30:00+01:00").unwrap(), z);
        assert_eq!(Timestamp::parse("2016-03-01T12:30:00").unwrap(), z);
        assert_eq!(z.to_string(), "2016-03-01T12:30:00Z");
        assert!(Timestamp::parse("2016-03-01").is_err());
        assert!(Timestamp::parse_zoned("2016-03-01T12:30:00", "datetime")
            .unwrap_err()
            .contains("has no time zone"));
        assert_eq!(
            Timestamp::parse_zoned("2016-03-01T12:30:00Z", "datetime"),
            Ok(z)
        );
        assert!(Timestamp::parse("yesterday")
            .unwrap_err()
            .contains("yesterday"));
    }

    #[test]
    fn fractions_round_trip() {
        let t = Timestamp::parse("2016-03-01T12:30:00.000250Z").unwrap();
        assert_eq!(t.to_string(), "2016-03-01T12:30:00.000250Z");
        assert_eq!(Timestamp::parse(&t.to_string()).unwrap(), t);
        assert_eq!(t.to_http_date(), "Tue, 01 Mar 2016 12:30:00 GMT");
        assert_eq!(
            Timestamp::parse_http_date(&t.to_http_date()),
            Some(t.floor_secs())
        );
    }
}
