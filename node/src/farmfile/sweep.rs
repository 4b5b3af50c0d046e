//! Sweeps: a stage's `sweep` table read into the values its tasks are expanded from (lines of a parameter file, lists, numeric ranges with steps and decimals).

use super::*;

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
            });
        }
        Ok(self.at(vars, v.span().start))
    }

    pub(super) fn lines(&self, v: &Spanned<DeValue<'_>>, field: &str) -> Result<Values> {
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

    pub(super) fn list(&self, v: &Spanned<DeValue<'_>>, field: &str) -> Result<Values> {
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
}

/// A decimal number as an integer mantissa and its number of decimals.
pub(super) fn parse_decimal(text: &str) -> Option<(i128, u32)> {
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
pub(super) fn parse_range(text: &str) -> std::result::Result<Values, Problem> {
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
        return Err(fail(RangeProblem::TooPrecise));
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
