//! Distributions of durations and latencies, written as short strings in scenarios.
//!
//! Syntax (an amount is a duration such as `250ms`, `20s`, `5m` or `1h 30m`,
//! or a bare number of virtual milliseconds):
//!
//! | text                   | meaning                                                    |
//! |------------------------|------------------------------------------------------------|
//! | `12` or `fixed:12`     | always 12                                                  |
//! | `uniform:5..20`        | an integer from 5 to 20, both included, equally likely     |
//! | `uniform:5m..20m`      | the same from 5 to 20 minutes, in whole milliseconds       |
//! | `zipf:1.2`             | k with probability ∝ k^-1.2 for k in 1..=1000              |
//! | `zipf:1.2,5000`        | the same over 1..=5000                                     |
//! | `bimodal:10,500,0.1`   | 500 with probability 0.1, otherwise 10                     |
//! | `exp:40`               | exponential with mean 40, rounded down                     |

use std::fmt;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::RngExt;

/// A parsed distribution; cheap to clone (a zipf table is shared).
#[derive(Clone, Debug, PartialEq)]
pub enum Dist {
    Fixed(u64),
    Uniform(u64, u64),
    /// Cumulative probabilities of 1..=n.
    Zipf {
        s: f64,
        cdf: Arc<Vec<f64>>,
    },
    Bimodal {
        short: u64,
        long: u64,
        p_long: f64,
    },
    Exp(f64),
}

/// Why a distribution string was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistError(pub String);

impl fmt::Display for DistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DistError {}

/// Parses a duration (or latency) distribution; see the module docs for the syntax.
pub fn parse_durations(text: &str) -> Result<Dist, DistError> {
    let t = text.trim();
    let err = |why: &str| {
        DistError(format!(
            "bad distribution {t:?}: {why} (expected e.g. `10`, `uniform:5..20`, `zipf:1.2`, \
             `zipf:1.2,5000`, `bimodal:10,500,0.1` or `exp:40`; an amount is a duration \
             such as `250ms`, `20s`, `5m` or `1h 30m`, or a bare number of ms)"
        ))
    };
    let int = |s: &str, what: &str| -> Result<u64, DistError> {
        amount_ms(s).ok_or_else(|| {
            err(&format!(
                "{what} {:?} is neither a duration nor a whole number of ms",
                s.trim()
            ))
        })
    };
    let float = |s: &str, what: &str| -> Result<f64, DistError> {
        match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(err(&format!("{what} {:?} is not a number", s.trim()))),
        }
    };
    let Some((kind, args)) = t.split_once(':') else {
        return Ok(Dist::Fixed(int(t, "the amount")?));
    };
    match kind.trim() {
        "fixed" => Ok(Dist::Fixed(int(args, "the amount")?)),
        "uniform" => {
            let (a, b) = args
                .split_once("..")
                .ok_or_else(|| err("uniform needs `low..high`"))?;
            let (a, b) = (int(a, "low")?, int(b, "high")?);
            if a > b {
                return Err(err("low is above high"));
            }
            Ok(Dist::Uniform(a, b))
        }
        "zipf" => {
            let mut parts = args.split(',');
            let s = float(parts.next().unwrap_or(""), "the exponent")?;
            let n = match parts.next() {
                Some(n) => int(n, "the largest value")?,
                None => 1000,
            };
            if parts.next().is_some() {
                return Err(err("zipf takes an exponent and at most a largest value"));
            }
            if s <= 0.0 {
                return Err(err("the exponent must be above 0"));
            }
            if !(1..=10_000_000).contains(&n) {
                return Err(err("the largest value must be from 1 to 10000000"));
            }
            let mut cdf = Vec::with_capacity(n as usize);
            let mut sum = 0.0;
            for k in 1..=n {
                sum += (k as f64).powf(-s);
                cdf.push(sum);
            }
            for c in &mut cdf {
                *c /= sum;
            }
            Ok(Dist::Zipf {
                s,
                cdf: Arc::new(cdf),
            })
        }
        "bimodal" => {
            let parts: Vec<&str> = args.split(',').collect();
            let [a, b, p] = parts[..] else {
                return Err(err("bimodal needs `short,long,p_long`"));
            };
            let p = float(p, "the probability")?;
            if !(0.0..=1.0).contains(&p) {
                return Err(err("the probability must be from 0 to 1"));
            }
            Ok(Dist::Bimodal {
                short: int(a, "short")?,
                long: int(b, "long")?,
                p_long: p,
            })
        }
        "exp" => {
            let m = match amount_ms(args) {
                Some(ms) if has_unit(args) => ms as f64,
                _ => float(args, "the mean")?,
            };
            if m < 0.0 {
                return Err(err("the mean must not be negative"));
            }
            Ok(Dist::Exp(m))
        }
        other => Err(err(&format!("unknown kind {other:?}"))),
    }
}

/// An amount: a bare whole number of milliseconds, or a duration with
/// its unit (`250ms`, `20s`, `5m`, `1h 30m`), in whole milliseconds.
fn amount_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Ok(ms) = s.parse::<u64>() {
        return Some(ms);
    }
    let d = humantime::parse_duration(s).ok()?;
    u64::try_from(d.as_millis()).ok()
}

fn has_unit(s: &str) -> bool {
    s.trim().ends_with(|c: char| c.is_ascii_alphabetic())
}

impl Dist {
    /// One draw.
    pub fn sample(&self, rng: &mut SmallRng) -> u64 {
        match self {
            Dist::Fixed(v) => *v,
            Dist::Uniform(a, b) => rng.random_range(*a..=*b),
            Dist::Zipf { cdf, .. } => {
                let u: f64 = rng.random::<f64>();
                cdf.partition_point(|&c| c < u).min(cdf.len() - 1) as u64 + 1
            }
            Dist::Bimodal {
                short,
                long,
                p_long,
            } => {
                if rng.random::<f64>() < *p_long {
                    *long
                } else {
                    *short
                }
            }
            Dist::Exp(m) => {
                let u: f64 = rng.random::<f64>();
                (-(1.0 - u).ln() * m) as u64
            }
        }
    }

    /// The mean of a draw.
    pub fn mean(&self) -> f64 {
        match self {
            Dist::Fixed(v) => *v as f64,
            Dist::Uniform(a, b) => (*a + *b) as f64 / 2.0,
            Dist::Zipf { cdf, .. } => {
                let mut before = 0.0;
                let mut sum = 0.0;
                for (k, &c) in cdf.iter().enumerate() {
                    sum += (k + 1) as f64 * (c - before);
                    before = c;
                }
                sum
            }
            Dist::Bimodal {
                short,
                long,
                p_long,
            } => *long as f64 * p_long + *short as f64 * (1.0 - p_long),
            Dist::Exp(m) => *m,
        }
    }

    /// The largest value a draw can take (for exp, a practical bound).
    pub fn max(&self) -> u64 {
        match self {
            Dist::Fixed(v) => *v,
            Dist::Uniform(_, b) => *b,
            Dist::Zipf { cdf, .. } => cdf.len() as u64,
            Dist::Bimodal { short, long, .. } => *short.max(long),
            Dist::Exp(m) => (m * 40.0) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn parses_every_kind_and_explains_errors() {
        assert_eq!(parse_durations("12").unwrap(), Dist::Fixed(12));
        assert_eq!(parse_durations("fixed:3").unwrap(), Dist::Fixed(3));
        assert_eq!(
            parse_durations("uniform:5..20").unwrap(),
            Dist::Uniform(5, 20)
        );
        assert!(matches!(
            parse_durations("bimodal:10,500,0.1").unwrap(),
            Dist::Bimodal {
                short: 10,
                long: 500,
                ..
            }
        ));
        assert_eq!(parse_durations("zipf:1.2,50").unwrap().max(), 50);
        assert_eq!(
            parse_durations("uniform:5m..20m").unwrap().mean(),
            750_000.0
        );
        assert_eq!(parse_durations("bimodal:10,500,0.1").unwrap().mean(), 59.0);
        let z = parse_durations("zipf:1,2").unwrap().mean();
        assert!((z - 4.0 / 3.0).abs() < 1e-9, "{z}");
        assert_eq!(
            parse_durations("uniform:5m..20m").unwrap(),
            Dist::Uniform(300_000, 1_200_000)
        );
        assert_eq!(parse_durations("1h 30m").unwrap(), Dist::Fixed(5_400_000));
        assert_eq!(parse_durations("fixed:250ms").unwrap(), Dist::Fixed(250));
        assert_eq!(parse_durations("exp:2s").unwrap(), Dist::Exp(2000.0));
        assert_eq!(parse_durations("exp:2.5").unwrap(), Dist::Exp(2.5));
        assert!(matches!(
            parse_durations("bimodal:10s,5m,0.1").unwrap(),
            Dist::Bimodal {
                short: 10_000,
                long: 300_000,
                ..
            }
        ));
        for bad in [
            "",
            "uniform:9..2",
            "uniform:20m..5m",
            "uniform:5q..20m",
            "zipf:0",
            "bimodal:1,2",
            "gauss:3",
            "x",
        ] {
            let e = parse_durations(bad).unwrap_err().to_string();
            assert!(e.contains("expected e.g."), "{bad}: {e}");
        }
    }

    #[test]
    fn zipf_favours_short_durations() {
        let d = parse_durations("zipf:1.2").unwrap();
        let mut rng = SmallRng::seed_from_u64(1);
        let v: Vec<u64> = (0..10_000).map(|_| d.sample(&mut rng)).collect();
        let ones = v.iter().filter(|&&x| x == 1).count();
        assert!(ones > 1500, "P(1) is about 0.23, got {ones} of 10000");
        assert!(v.iter().all(|&x| (1..=1000).contains(&x)));
    }
}
