//! Value parsers for flags that take an address, a path, a duration or a name: blank input is refused before anything starts.
//!
//! A job script with an unset variable (`mesh join $FIRST_ADDR`, `mesh
//! cancel $FARM`) passes an empty string. Taken as given, an empty join
//! list started a mesh of one that ran farms alone, and an empty farm id
//! matched every farm as a prefix. clap turns these errors into exit 2
//! with the flag's name.

use std::path::PathBuf;
use std::time::Duration;

use mesh_node::mesh_node::Multiaddr;

const UNSET: &str = "an empty value (an unset variable in a script?)";

fn filled(s: &str, expected: &str) -> Result<(), String> {
    if s.trim().is_empty() {
        Err(format!("expected {expected}, got {UNSET}"))
    } else {
        Ok(())
    }
}

/// A path: not empty.
pub fn path(s: &str) -> Result<PathBuf, String> {
    filled(s, "a path")?;
    Ok(PathBuf::from(s))
}

/// A farm id, id prefix or name, a queue or account name: not blank
/// (an empty prefix would match every farm).
pub fn name(s: &str) -> Result<String, String> {
    filled(s, "a name")?;
    Ok(s.to_owned())
}

/// A duration such as `90s`, `5m` or `1h 30m`.
pub fn duration(s: &str) -> Result<Duration, String> {
    filled(s, "a duration such as 90s, 5m or 1h")?;
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("expected a duration such as 90s, 5m or 1h: {e}"))
}

/// How long a search may take to answer: a duration above zero, or `none`.
#[derive(Clone, Copy, Debug)]
pub struct SearchTime(Option<Duration>);

impl SearchTime {
    pub fn within(self) -> Option<Duration> {
        self.0
    }
}

/// `30s`, `10m`, or `none` for as long as it takes.
pub fn search_time(s: &str) -> Result<SearchTime, String> {
    if s.trim().eq_ignore_ascii_case("none") {
        return Ok(SearchTime(None));
    }
    positive_duration(s)
        .map(|d| SearchTime(Some(d)))
        .map_err(|e| format!("{e}, or `none`"))
}

/// A duration above zero, e.g. a deadline from now.
pub fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d.is_zero() {
        return Err(format!(
            "expected a duration above zero such as 6h or 2days, got `{}`",
            s.trim()
        ));
    }
    Ok(d)
}

/// A deadline: a duration from now (`6h`, `2days 4h`), a date and time
/// (`2026-12-04 18:00:00`, UTC; or RFC 3339 with its offset), or a weekday
/// and time (`friday 18:00`, `FRIDAY-18:00`: the next one, UTC), as the
/// time left until then. One in the past is refused, with the time now.
pub fn deadline(s: &str) -> Result<Duration, String> {
    filled(
        s,
        "a duration such as 6h, or a date and time such as 2026-12-04 18:00:00",
    )?;
    let t = s.trim();
    if let Ok(d) = humantime::parse_duration(t) {
        return positive_duration(t).map(|_| d);
    }
    if let Some(d) = weekday_deadline(t, chrono::Utc::now()) {
        return Ok(d);
    }
    let at = humantime::parse_rfc3339_weak(t)
        .or_else(|_| humantime::parse_rfc3339_weak(&format!("{t}:00")))
        .map_err(|_| {
            format!(
                "expected a duration such as 6h or 2days, a date and time such as \
                 2026-12-04 18:00:00 (UTC), or a weekday and time such as friday 18:00 \
                 (UTC), got `{t}`"
            )
        })?;
    let now = std::time::SystemTime::now();
    at.duration_since(now).map_err(|_| {
        format!(
            "the deadline {t} is in the past: it is {} UTC now",
            humantime::format_rfc3339_seconds(now)
        )
    })
}

/// `friday 18:00` (or `fri-18:00`, any case): the time until the next such
/// day and time after `now`, in UTC; None when `t` is not a weekday and a
/// time.
fn weekday_deadline(t: &str, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
    use chrono::Datelike;
    let (day, time) = match t.split_once([' ', '-']) {
        Some((d, rest)) => (d, rest.trim()),
        None => (t, "00:00"),
    };
    let weekday = day.parse::<chrono::Weekday>().ok()?;
    let at = chrono::NaiveTime::parse_from_str(time, "%H:%M")
        .or_else(|_| chrono::NaiveTime::parse_from_str(time, "%H:%M:%S"))
        .ok()?;
    let next = (0..=7)
        .map(|d| now.date_naive() + chrono::Days::new(d))
        .filter(|date| date.weekday() == weekday)
        .map(|date| date.and_time(at).and_utc())
        .find(|when| *when > now)
        .expect("a weekday comes round within 8 days");
    (next - now).to_std().ok()
}

/// Seconds between refreshes: a positive number.
pub fn seconds(s: &str) -> Result<f64, String> {
    filled(s, "a number of seconds")?;
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "expected a positive number of seconds, e.g. 0.5, got `{s}`"
        )),
    }
}

/// One multiaddr, e.g. `/ip4/0.0.0.0/tcp/7070`.
pub fn multiaddr(s: &str) -> Result<Multiaddr, String> {
    filled(s, "a multiaddr such as /ip4/0.0.0.0/tcp/7070")?;
    parse_multiaddr(s)
}

fn parse_multiaddr(s: &str) -> Result<Multiaddr, String> {
    let a = s.trim();
    match a.parse::<Multiaddr>() {
        // The empty multiaddr parses, and names nothing to dial or bind.
        Ok(m) if !m.is_empty() => Ok(m),
        _ => Err(format!(
            "`{a}` is not a multiaddr (e.g. /ip4/10.0.0.5/tcp/7070, as `mesh node` prints it)"
        )),
    }
}

/// The peers `mesh join` may join through: one or more multiaddrs.
#[derive(Clone, Debug)]
pub struct Peers(pub Vec<Multiaddr>);

/// One address, or several comma-separated; no entry may be empty.
pub fn peers(s: &str) -> Result<Peers, String> {
    filled(
        s,
        "the address of a node of the mesh (e.g. /ip4/10.0.0.5/tcp/7070/p2p/12D3...)",
    )?;
    let mut out = Vec::new();
    for (i, a) in s.split(',').enumerate() {
        if a.trim().is_empty() {
            return Err(format!("entry {} of the list `{s}` is {UNSET}", i + 1));
        }
        out.push(parse_multiaddr(a)?);
    }
    Ok(Peers(out))
}

/// Node counts, in the order given.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeCounts(pub Vec<usize>);

/// Node counts: one, or several comma-separated (`4,8,16`), each at least 1.
pub fn node_counts(s: &str) -> Result<NodeCounts, String> {
    filled(s, "a number of nodes, or several such as 4,8,16")?;
    let mut out = Vec::new();
    for (i, n) in s.split(',').enumerate() {
        match n.trim().parse::<usize>() {
            Ok(v) if v > 0 => out.push(v),
            _ if n.trim().is_empty() => {
                return Err(format!("entry {} of the list `{s}` is {UNSET}", i + 1))
            }
            _ => {
                return Err(format!(
                    "expected a number of nodes from 1 up, or several such as 4,8,16, got `{}`",
                    n.trim()
                ))
            }
        }
    }
    Ok(NodeCounts(out))
}

/// Bytes per second; `None`: transfers take no time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bandwidth(pub Option<f64>);

/// A rate of a link: `125MB/s`, `1Gbit/s`, `10G` (bytes), `inf` (free),
/// in bytes per second (`None` for `inf`). Units are decimal (`MB`) or
/// binary (`MiB`); bits end in `bit`.
pub fn bandwidth(s: &str) -> Result<Bandwidth, String> {
    rate(s).map(Bandwidth)
}

fn rate(s: &str) -> Result<Option<f64>, String> {
    filled(s, "a bandwidth such as 125MB/s or 1Gbit/s")?;
    let t = s.trim();
    if t.eq_ignore_ascii_case("inf") {
        return Ok(None);
    }
    let bad = || {
        format!(
            "expected a bandwidth such as 125MB/s, 1Gbit/s, 10G or inf (transfers take no time), got `{t}`"
        )
    };
    let body = t.strip_suffix("/s").unwrap_or(t);
    let split = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == 'E'))
        .unwrap_or(body.len());
    let (num, unit) = body.split_at(split);
    let v: f64 = num.parse().map_err(|_| bad())?;
    let unit = unit.trim();
    let (unit, bits) = match unit.len().checked_sub(3).map(|i| unit.split_at(i)) {
        Some((u, b)) if b.eq_ignore_ascii_case("bit") => (u, true),
        _ => (unit.strip_suffix('B').unwrap_or(unit), false),
    };
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        "ki" => 1024.0,
        "mi" => 1024.0 * 1024.0,
        "gi" => 1024.0 * 1024.0 * 1024.0,
        "ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(bad()),
    };
    let bytes = v * scale / if bits { 8.0 } else { 1.0 };
    if bytes.is_finite() && bytes > 0.0 {
        Ok(Some(bytes))
    } else {
        Err(bad())
    }
}

/// A share from 0 up to, not including, 1 (`--jitter 0.2`).
pub fn share(s: &str) -> Result<f64, String> {
    filled(s, "a number from 0 to below 1, e.g. 0.2")?;
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..1.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected a number from 0 to below 1, e.g. 0.2, got `{s}`"
        )),
    }
}

/// A scale factor above zero (`--time-scale 0.01`).
pub fn factor(s: &str) -> Result<f64, String> {
    filled(s, "a number above 0, e.g. 0.01")?;
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("expected a number above 0, e.g. 0.01, got `{s}`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_values_are_refused_with_what_was_expected() {
        for s in ["", "  ", "\t"] {
            assert!(path(s).unwrap_err().contains("expected a path"));
            assert!(name(s).unwrap_err().contains("expected a name"));
            assert!(duration(s).unwrap_err().contains("expected a duration"));
            assert!(peers(s).unwrap_err().contains("address of a node"));
            assert!(multiaddr(s).unwrap_err().contains("expected a multiaddr"));
        }
    }

    #[test]
    fn a_weekday_deadline_is_the_next_such_day_and_time_in_utc() {
        use chrono::TimeZone;
        // Saturday 2026-11-28 19:30 UTC.
        let now = chrono::Utc
            .with_ymd_and_hms(2026, 11, 28, 19, 30, 0)
            .unwrap();
        let h = |d: Option<Duration>| d.unwrap().as_secs() as f64 / 3600.0;
        // Friday 2026-12-04 18:00: 5 days 22.5 hours on.
        for t in ["FRIDAY-18:00", "friday 18:00", "Fri-18:00:00"] {
            assert_eq!(h(weekday_deadline(t, now)), 142.5, "{t}");
        }
        // Today, later: today; today, earlier: a week on.
        assert_eq!(h(weekday_deadline("saturday 20:00", now)), 0.5);
        assert_eq!(h(weekday_deadline("sat-19:00", now)), 167.5);
        // Not a weekday and a time: not this form, and said with the forms.
        assert!(weekday_deadline("2026-12-04 18:00", now).is_none());
        assert!(weekday_deadline("friday 25:00", now).is_none());
        assert!(deadline("friday 25:00")
            .unwrap_err()
            .contains("a weekday and time such as friday 18:00"));
        assert!(deadline("FRIDAY-18:00").is_ok());
    }

    #[test]
    fn a_join_list_with_an_empty_entry_is_refused() {
        let e = peers("/ip4/127.0.0.1/tcp/1,,/ip4/127.0.0.1/tcp/2").unwrap_err();
        assert!(e.contains("entry 2"), "{e}");
        let e = peers("/ip4/127.0.0.1/tcp/1,").unwrap_err();
        assert!(e.contains("entry 2"), "{e}");
        let ok = peers("/ip4/127.0.0.1/tcp/1, /ip4/127.0.0.1/tcp/2").unwrap();
        assert_eq!(ok.0.len(), 2);
    }

    #[test]
    fn what_is_not_an_address_duration_or_period_is_named() {
        assert!(peers("10.0.0.5:7070")
            .unwrap_err()
            .contains("not a multiaddr"));
        assert!(multiaddr("/").unwrap_err().contains("not a multiaddr"));
        assert!(duration("soon").is_err());
        assert_eq!(duration(" 90s ").unwrap(), Duration::from_secs(90));
        for bad in ["0", "-1", "NaN", "inf", "x"] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(seconds("0.2").unwrap(), 0.2);
    }

    #[test]
    fn node_lists_bandwidths_and_shares() {
        assert_eq!(node_counts("4, 8,16").unwrap().0, vec![4, 8, 16]);
        assert_eq!(node_counts("3").unwrap().0, vec![3]);
        for bad in ["0", "4,,8", "x", "-1"] {
            assert!(node_counts(bad).is_err(), "{bad}");
        }
        assert_eq!(rate("125MB/s").unwrap(), Some(125e6));
        assert_eq!(rate("1Gbit/s").unwrap(), Some(125e6));
        assert_eq!(rate("10G").unwrap(), Some(10e9));
        assert_eq!(rate("1MiB/s").unwrap(), Some(1048576.0));
        assert_eq!(rate("500").unwrap(), Some(500.0));
        assert_eq!(bandwidth("inf").unwrap(), Bandwidth(None));
        for bad in ["0", "fast", "1Qb/s", "-5MB/s"] {
            assert!(bandwidth(bad).is_err(), "{bad}");
        }
        assert_eq!(share("0.2").unwrap(), 0.2);
        assert!(share("1").is_err());
        assert!(factor("0").is_err());
        assert_eq!(factor("0.01").unwrap(), 0.01);
    }
}
