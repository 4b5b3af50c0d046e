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
}
