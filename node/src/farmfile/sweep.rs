//! Sweep variables: their sources (parameter files, lists, ranges) and how they combine into a stage's `Sweep`.

use mesh_protocol::farm::{Grown, Sweep, SweepMode, SweepVar, Values, STAGE_TASKS_MAX};
use toml::de::DeValue;
use toml::Spanned;

use super::error::{wrong_type, Problem, RangeProblem};
use super::locate::{At, Scope};
use super::Result;

/// Decimals beyond this would overflow the scaled `i64` range for ordinary magnitudes.
pub(super) const RANGE_DECIMALS_MAX: u32 = 9;

const SWEEP_FIELDS: &[&str] = &["lines", "list", "range", "from", "max"];

/// A grown variable's places per task of the stage it grows from, unless
/// its `max` says otherwise.
pub(super) const GROWN_MAX_DEFAULT: u32 = 1000;

/// A name a variable may have (a sweep's, or the environment's): a letter
/// or `_`, then letters, digits and `_`.
pub(super) fn valid_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
const BUILTINS: &[&str] = &["index", "stage", "farm", "out"];

#[derive(Clone, Debug)]
pub(super) struct RawVar {
    name: String,
    values: At<Values>,
    /// For a grown variable (`from = "stage"`): the stage, by name; its
    /// index in `Values::Grown` is set once every stage is known.
    pub(super) from: Option<At<String>>,
}

impl RawVar {
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// The grown variable's sweep variable, the stage named in `from`
    /// still to be resolved (see [`RawVar::from`]).
    pub(super) fn grown_var(&self) -> Option<SweepVar> {
        matches!(self.values.v, Values::Grown(_)).then(|| SweepVar {
            name: self.name.clone(),
            values: self.values.v.clone(),
        })
    }
}

impl Scope<'_> {
    pub(super) fn sweep(&self, v: &Spanned<DeValue<'_>>) -> Result<At<Vec<RawVar>>> {
        let table = self.table(
            v,
            "sweep",
            "a table of sweep variables, e.g. `sweep.x = { range = \"1..10\" }`",
        )?;
        let mut vars = Vec::with_capacity(table.len());
        for (key, spec) in table.iter() {
            let name: &str = key.get_ref();
            let field = format!("sweep.{name}");
            if !valid_var_name(name) {
                return Err(self.fail(
                    key.span().start,
                    &field,
                    Problem::BadVarName {
                        name: name.to_string(),
                    },
                ));
            }
            if BUILTINS.contains(&name) {
                return Err(self.fail(
                    key.span().start,
                    &field,
                    Problem::BuiltinVar {
                        name: name.to_string(),
                    },
                ));
            }
            let entries = self.table(
                spec,
                &field,
                "a table: `{ lines = \"file\" }`, `{ list = [...] }` or `{ range = \"a..b\" }`",
            )?;
            let mut source: Option<(&'static str, &Spanned<DeValue<'_>>)> = None;
            let (mut from, mut max) = (None, None);
            for (sk, sv) in entries.iter() {
                let kind = match SWEEP_FIELDS.iter().find(|f| **f == &**sk.get_ref()) {
                    Some(kind) => *kind,
                    None => {
                        return Err(self.unknown_in(
                            sk.span().start,
                            &format!("{field}."),
                            sk.get_ref(),
                            SWEEP_FIELDS,
                        ))
                    }
                };
                match kind {
                    "from" => {
                        from = Some(self.string(sv, &format!("{field}.from"))?);
                        continue;
                    }
                    "max" => {
                        let expected = "a whole number of lines, at least 1";
                        let m = self.integer(sv, &format!("{field}.max"), expected)?;
                        let Some(n) = u32::try_from(m.v).ok().filter(|n| *n > 0) else {
                            return Err(self.fail(
                                m.pos,
                                &format!("{field}.max"),
                                Problem::OutOfRange {
                                    value: m.v.to_string(),
                                    expected,
                                },
                            ));
                        };
                        max = Some(n);
                        continue;
                    }
                    _ => {}
                }
                if let Some((first, _)) = source {
                    return Err(self.fail(
                        sk.span().start,
                        &field,
                        Problem::TwoSweepSources {
                            first,
                            second: kind,
                        },
                    ));
                }
                source = Some((kind, sv));
            }
            let Some((kind, sv)) = source else {
                return Err(self.fail(spec.span().start, &field, Problem::NoSweepSource));
            };
            if from.is_none() && max.is_some() {
                return Err(self.fail(spec.span().start, &field, Problem::MaxWithoutFrom));
            }
            if let Some(stage) = &from {
                if kind != "lines" {
                    return Err(self.fail(stage.pos, &field, Problem::GrownNeedsLines));
                }
                let file = self.string(sv, &format!("{field}.lines"))?;
                if !mesh_protocol::farm::path_stays_inside(&file.v) || file.v.is_empty() {
                    return Err(self.fail(file.pos, &format!("{field}.lines"), Problem::GrownFile));
                }
                vars.push(RawVar {
                    name: name.to_string(),
                    values: self.at(
                        Values::Grown(Grown {
                            from: u32::MAX,
                            file: file.v,
                            per: max.unwrap_or(GROWN_MAX_DEFAULT),
                        }),
                        key.span().start,
                    ),
                    from,
                });
                continue;
            }
            let values = match kind {
                "lines" => self.lines(sv, &field)?,
                "list" => self.list(sv, &field)?,
                _ => {
                    let text = self.string(sv, &field)?;
                    parse_range(&text.v).map_err(|problem| self.fail(text.pos, &field, problem))?
                }
            };
            vars.push(RawVar {
                name: name.to_string(),
                values: self.at(values, key.span().start),
                from: None,
            });
        }
        Ok(self.at(vars, v.span().start))
    }

    fn lines(&self, v: &Spanned<DeValue<'_>>, field: &str) -> Result<Values> {
        let path = self.string(v, field)?;
        let full = self.src.root.join(&path.v);
        let text = std::fs::read_to_string(&full).map_err(|source| {
            self.fail(
                path.pos,
                field,
                Problem::ParamsRead {
                    path: path.v.clone(),
                    looked: full.display().to_string(),
                    source,
                },
            )
        })?;
        let values = Values::lines(&text);
        if values.is_empty() {
            return Err(self.fail(path.pos, field, Problem::ParamsEmpty { path: path.v }));
        }
        if values.len() > STAGE_TASKS_MAX {
            return Err(self.fail(path.pos, field, Problem::TooManyTasks));
        }
        Ok(values)
    }

    fn list(&self, v: &Spanned<DeValue<'_>>, field: &str) -> Result<Values> {
        const EXPECTED: &str = "a string, integer, float or boolean";
        let DeValue::Array(items) = v.get_ref() else {
            return Err(self.fail(
                v.span().start,
                field,
                wrong_type(v.get_ref(), "an array of values"),
            ));
        };
        if items.is_empty() {
            return Err(self.fail(v.span().start, field, Problem::EmptyList));
        }
        let mut values = Vec::with_capacity(items.len());
        for item in items.iter() {
            let text = match item.get_ref() {
                DeValue::String(s) => s.to_string(),
                DeValue::Integer(_) => self.integer(item, field, EXPECTED)?.v.to_string(),
                // The float as written, so `0.10` stays `0.10` in paths and arguments.
                DeValue::Float(f) => f.as_str().trim_start_matches('+').to_string(),
                DeValue::Boolean(b) => b.to_string(),
                other => {
                    return Err(self.fail(item.span().start, field, wrong_type(other, EXPECTED)))
                }
            };
            values.push(text);
        }
        Ok(Values::List(values))
    }

    /// A stage's sweep from its merged variables and mode: zipped variables
    /// must have as many values as each other, and the tasks stay within
    /// `STAGE_TASKS_MAX`.
    pub(super) fn stage_sweep(
        &self,
        vars: Option<&At<Vec<RawVar>>>,
        mode: Option<&At<SweepMode>>,
    ) -> Result<Sweep> {
        let mode = mode.map(|m| m.v).unwrap_or(SweepMode::Product);
        Ok(match vars {
            None => Sweep::single(),
            Some(vars) => {
                if mode == SweepMode::Zip {
                    if let Some((first, rest)) = vars.v.split_first() {
                        for var in rest {
                            if var.values.v.len() != first.values.v.len() {
                                return Err(self.fail_at(
                                    &var.values,
                                    &format!("sweep.{}", var.name),
                                    Problem::ZipUnequal {
                                        first: first.name.clone(),
                                        first_len: first.values.v.len(),
                                        other: var.name.clone(),
                                        other_len: var.values.v.len(),
                                    },
                                ));
                            }
                        }
                    }
                }
                let sweep = Sweep {
                    vars: vars
                        .v
                        .iter()
                        .map(|var| SweepVar {
                            name: var.name.clone(),
                            values: var.values.v.clone(),
                        })
                        .collect(),
                    mode,
                };
                if sweep.len() > STAGE_TASKS_MAX {
                    return Err(self.fail_at(vars, "sweep", Problem::TooManyTasks));
                }
                sweep
            }
        })
    }
}

/// A decimal number as an integer mantissa and its number of decimals.
fn parse_decimal(text: &str) -> Option<(i128, u32)> {
    let t = text.trim();
    let (neg, digits) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    if digits.contains('.') && frac.is_empty() {
        return None;
    }
    let decimals = u32::try_from(frac.len()).ok()?;
    let mantissa: i128 = format!("{whole}{frac}").parse().ok()?;
    Some((if neg { -mantissa } else { mantissa }, decimals))
}

/// Reads `a..b` or `a..b:step` (inclusive of `b` when a step lands on it).
fn parse_range(text: &str) -> std::result::Result<Values, Problem> {
    let fail = |problem| Problem::Range {
        text: text.to_string(),
        problem,
    };
    let (span, step) = match text.split_once(':') {
        Some((span, step)) => (span, Some(step)),
        None => (text, None),
    };
    let (start, end) = span
        .split_once("..")
        .ok_or_else(|| fail(RangeProblem::Malformed))?;
    let start = parse_decimal(start).ok_or_else(|| fail(RangeProblem::Malformed))?;
    let end = parse_decimal(end).ok_or_else(|| fail(RangeProblem::Malformed))?;
    let step = match step {
        Some(s) => Some(parse_decimal(s).ok_or_else(|| fail(RangeProblem::Malformed))?),
        None => None,
    };
    let decimals = start.1.max(end.1).max(step.map(|s| s.1).unwrap_or(0));
    if decimals > RANGE_DECIMALS_MAX {
        return Err(fail(RangeProblem::TooPrecise {
            max: RANGE_DECIMALS_MAX,
        }));
    }
    if decimals > 0 && step.is_none() {
        return Err(fail(RangeProblem::DecimalNeedsStep));
    }
    let scale = |(m, d): (i128, u32)| m.checked_mul(10i128.pow(decimals - d));
    let too_large = || fail(RangeProblem::TooLarge);
    let a = scale(start).ok_or_else(too_large)?;
    let b = scale(end).ok_or_else(too_large)?;
    let s = match step {
        Some(step) => scale(step).ok_or_else(too_large)?,
        None => 1,
    };
    if s <= 0 {
        return Err(fail(RangeProblem::BadStep));
    }
    if b < a {
        return Err(fail(RangeProblem::Empty));
    }
    let count = (b - a) / s + 1;
    if count > i128::from(STAGE_TASKS_MAX) {
        return Err(Problem::TooManyTasks);
    }
    let last = a + (count - 1) * s;
    let fits = |x: i128| i64::try_from(x).is_ok();
    if !fits(a) || !fits(s) || !fits(last) {
        return Err(too_large());
    }
    Ok(Values::Range {
        start: a as i64,
        step: s as i64,
        count: count as u64,
        decimals,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_read_steps_negatives_and_decimals() {
        let range = |text: &str| match parse_range(text) {
            Ok(v) => (0..v.len()).map(|i| v.get(i)).collect::<Vec<_>>(),
            Err(e) => panic!("{text}: {e}"),
        };
        assert_eq!(range("1..100").len(), 100);
        assert_eq!(range("1..100")[99], "100");
        assert_eq!(range("0..100:10").len(), 11);
        assert_eq!(range("0..10:3"), ["0", "3", "6", "9"]);
        assert_eq!(range("-5..5").len(), 11);
        assert_eq!(range("-5..5")[0], "-5");
        assert_eq!(range("7..7"), ["7"]);
        assert_eq!(range(" 1 .. 3 "), ["1", "2", "3"]);
        assert_eq!(
            parse_range("0.0..1.0:0.25").ok(),
            Some(Values::Range {
                start: 0,
                step: 25,
                count: 5,
                decimals: 2
            })
        );
        assert_eq!(
            range("0.0..1.0:0.25"),
            ["0.00", "0.25", "0.50", "0.75", "1.00"]
        );
        assert_eq!(range("-1.5..0.5:1"), ["-1.5", "-0.5", "0.5"]);
        assert_eq!(range("0..1:0.3"), ["0.0", "0.3", "0.6", "0.9"]);

        let problem = |text: &str| match parse_range(text) {
            Err(Problem::Range { problem, .. }) => problem,
            other => panic!("{text}: expected a range problem, got {other:?}"),
        };
        assert_eq!(problem("1-10"), RangeProblem::Malformed);
        assert_eq!(problem("1..x"), RangeProblem::Malformed);
        assert_eq!(problem("1...5"), RangeProblem::Malformed);
        assert_eq!(problem("1."), RangeProblem::Malformed);
        assert_eq!(problem("10..1"), RangeProblem::Empty);
        assert_eq!(problem("0..10:0"), RangeProblem::BadStep);
        assert_eq!(problem("0..10:-1"), RangeProblem::BadStep);
        assert_eq!(problem("0..1.5"), RangeProblem::DecimalNeedsStep);
        assert_eq!(
            problem("0..1:0.0000000001"),
            RangeProblem::TooPrecise {
                max: RANGE_DECIMALS_MAX
            }
        );
        assert_eq!(
            problem("99999999999999999999..99999999999999999999"),
            RangeProblem::TooLarge
        );
        assert!(matches!(
            parse_range("0..9999999999999"),
            Err(Problem::TooManyTasks)
        ));
    }
}
