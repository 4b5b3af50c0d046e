//! TOML to raw fields: each `[[stage]]` and `[defaults]` table read into `Fields`, type-checked but not yet resolved.

use std::sync::LazyLock;

use mesh_protocol::farm::SweepMode;
use mesh_protocol::resources::{parse_amount, valid_resource_name, Amount, MEM};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::error::{wrong_type, Problem};
use super::locate::{At, Scope};
use super::sweep::{valid_var_name, RawVar};
use super::Result;

/// Every stage field: its identity, everything `[defaults]` may set, its dependencies.
pub(super) static STAGE_FIELDS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    let mut f = vec!["name", "key"];
    f.extend_from_slice(DEFAULT_FIELDS);
    f.extend_from_slice(&["after", "after_each"]);
    f
});
/// Stage fields that make sense for every stage: identity and dependencies do not.
pub(super) const DEFAULT_FIELDS: &[&str] = &[
    "command",
    "shell",
    "python",
    "sweep",
    "sweep_mode",
    "workdir",
    "inputs",
    "outputs",
    "env",
    "resources",
    "retries",
    "max_fails",
    "timeout",
    "expected",
    "success_codes",
];

#[derive(Clone, Debug)]
pub(super) enum RawCommand {
    Argv(Vec<At<String>>),
    Shell(At<String>),
    Python(Vec<At<String>>),
}

/// One stage's (or `[defaults]`') fields, type-checked but not yet resolved.
#[derive(Clone, Debug, Default)]
pub(super) struct Fields {
    pub(super) name: Option<At<String>>,
    /// What names a task for its content key, instead of its stage's name
    /// and its values (a template of its values).
    pub(super) key: Option<At<String>>,
    pub(super) command: Option<At<RawCommand>>,
    pub(super) sweep: Option<At<Vec<RawVar>>>,
    pub(super) sweep_mode: Option<At<SweepMode>>,
    pub(super) workdir: Option<At<String>>,
    pub(super) inputs: Option<Vec<At<String>>>,
    pub(super) outputs: Option<Vec<At<String>>>,
    pub(super) env: Vec<(At<String>, At<String>)>,
    pub(super) resources: Vec<(At<String>, At<Amount>)>,
    pub(super) retries: Option<At<u32>>,
    pub(super) max_fails: Option<At<u32>>,
    pub(super) timeout_ms: Option<At<u64>>,
    pub(super) expected_ms: Option<At<u64>>,
    pub(super) success_codes: Option<At<Vec<i32>>>,
    pub(super) after: Option<Vec<At<String>>>,
    pub(super) after_each: Option<Vec<At<String>>>,
    /// `after` entries written as tables: keyed or listed dependencies.
    pub(super) after_by: Vec<RawAfter>,
}

/// An `after` entry written as a table: `{ stage = "split", by = ["chrom"] }`
/// (keyed), `{ stage = "project", tasks = "{a} {b}", match = "img" }`
/// (listed), or `{ stage = "a" }` (the whole stage).
#[derive(Clone, Debug)]
pub(super) struct RawAfter {
    pub(super) stage: At<String>,
    /// Pairs of this stage's variable and the upstream's of the same value.
    pub(super) by: Option<Vec<(At<String>, At<String>)>>,
    pub(super) tasks: Option<At<String>>,
    pub(super) var: Option<At<String>>,
    pub(super) pos: usize,
}

impl Fields {
    /// Fills what the stage leaves out from `[defaults]`; for `env` and
    /// `resources` the merge is per key, so a stage can add one resource
    /// without repeating the others.
    pub(super) fn with_defaults(mut self, d: &Fields) -> Fields {
        fn keyed<T: Clone>(
            own: Vec<(At<String>, T)>,
            d: &[(At<String>, T)],
        ) -> Vec<(At<String>, T)> {
            let mut merged: Vec<(At<String>, T)> = d
                .iter()
                .filter(|(k, _)| !own.iter().any(|(o, _)| o.v == k.v))
                .cloned()
                .collect();
            merged.extend(own);
            merged
        }
        self.command = self.command.or_else(|| d.command.clone());
        self.sweep = self.sweep.or_else(|| d.sweep.clone());
        self.sweep_mode = self.sweep_mode.or_else(|| d.sweep_mode.clone());
        self.workdir = self.workdir.or_else(|| d.workdir.clone());
        self.inputs = self.inputs.or_else(|| d.inputs.clone());
        self.outputs = self.outputs.or_else(|| d.outputs.clone());
        self.env = keyed(self.env, &d.env);
        self.resources = keyed(self.resources, &d.resources);
        self.retries = self.retries.or_else(|| d.retries.clone());
        self.max_fails = self.max_fails.or_else(|| d.max_fails.clone());
        self.timeout_ms = self.timeout_ms.or_else(|| d.timeout_ms.clone());
        self.expected_ms = self.expected_ms.or_else(|| d.expected_ms.clone());
        self.success_codes = self.success_codes.or_else(|| d.success_codes.clone());
        self
    }
}

impl Scope<'_> {
    pub(super) fn table<'v, 'i>(
        &self,
        v: &'v Spanned<DeValue<'i>>,
        field: &str,
        expected: &'static str,
    ) -> Result<&'v DeTable<'i>> {
        match v.get_ref() {
            DeValue::Table(t) => Ok(t),
            other => Err(self.fail(v.span().start, field, wrong_type(other, expected))),
        }
    }

    pub(super) fn string(&self, v: &Spanned<DeValue<'_>>, field: &str) -> Result<At<String>> {
        match v.get_ref() {
            DeValue::String(s) => Ok(self.at(s.to_string(), v.span().start)),
            other => Err(self.fail(v.span().start, field, wrong_type(other, "a string"))),
        }
    }

    fn strings(
        &self,
        v: &Spanned<DeValue<'_>>,
        field: &str,
        expected: &'static str,
    ) -> Result<Vec<At<String>>> {
        match v.get_ref() {
            DeValue::Array(items) => items
                .iter()
                .map(|item| match item.get_ref() {
                    DeValue::String(s) => Ok(self.at(s.to_string(), item.span().start)),
                    other => {
                        Err(self.fail(item.span().start, field, wrong_type(other, "a string")))
                    }
                })
                .collect(),
            other => Err(self.fail(v.span().start, field, wrong_type(other, expected))),
        }
    }

    pub(super) fn integer(
        &self,
        v: &Spanned<DeValue<'_>>,
        field: &str,
        expected: &'static str,
    ) -> Result<At<i64>> {
        match v.get_ref() {
            DeValue::Integer(i) => match i64::from_str_radix(i.as_str(), i.radix()) {
                Ok(n) => Ok(self.at(n, v.span().start)),
                Err(_) => Err(self.fail(
                    v.span().start,
                    field,
                    Problem::OutOfRange {
                        value: i.to_string(),
                        expected,
                    },
                )),
            },
            other => Err(self.fail(v.span().start, field, wrong_type(other, expected))),
        }
    }

    /// A count: an integer from 0 to `u32::MAX`.
    fn count(
        &self,
        v: &Spanned<DeValue<'_>>,
        field: &str,
        expected: &'static str,
    ) -> Result<At<u32>> {
        let n = self.integer(v, field, expected)?;
        let count = u32::try_from(n.v).map_err(|_| {
            self.fail(
                n.pos,
                field,
                Problem::OutOfRange {
                    value: n.v.to_string(),
                    expected,
                },
            )
        })?;
        Ok(self.at(count, n.pos))
    }

    /// Reads the fields of a `[[stage]]` or `[defaults]` table, checking types only.
    pub(super) fn fields(
        &self,
        table: &DeTable<'_>,
        allowed: &'static [&'static str],
    ) -> Result<Fields> {
        let mut f = Fields::default();
        for (key, v) in table.iter() {
            let k: &str = key.get_ref();
            let kpos = key.span().start;
            let vpos = v.span().start;
            if !allowed.contains(&k) {
                if STAGE_FIELDS.contains(&k) {
                    return Err(self.fail(
                        kpos,
                        k,
                        Problem::PerStageOnly {
                            name: k.to_string(),
                        },
                    ));
                }
                return Err(self.unknown(kpos, k, allowed));
            }
            match k {
                "name" => f.name = Some(self.string(v, k)?),
                "key" => f.key = Some(self.string(v, k)?),
                "command" | "shell" | "python" => {
                    if let Some(first) = &f.command {
                        let first = match first.v {
                            RawCommand::Argv(_) => "command",
                            RawCommand::Shell(_) => "shell",
                            RawCommand::Python(_) => "python",
                        };
                        let second = match k {
                            "command" => "command",
                            "shell" => "shell",
                            _ => "python",
                        };
                        return Err(self.fail(kpos, k, Problem::CommandAndShell { first, second }));
                    }
                    let cmd = if k == "command" {
                        let argv = self.strings(
                            v,
                            k,
                            "an array of strings (use `shell` for a shell command line)",
                        )?;
                        if argv.is_empty() {
                            return Err(self.fail(vpos, k, Problem::EmptyCommand));
                        }
                        RawCommand::Argv(argv)
                    } else if k == "python" {
                        let argv = self.strings(
                            v,
                            k,
                            "an array of strings: a Python interpreter, a script and its arguments",
                        )?;
                        if argv.len() < 2 {
                            return Err(self.fail(vpos, k, Problem::PythonScript));
                        }
                        RawCommand::Python(argv)
                    } else {
                        let line = self.string(v, k)?;
                        if line.v.trim().is_empty() {
                            return Err(self.fail(vpos, k, Problem::EmptyCommand));
                        }
                        RawCommand::Shell(line)
                    };
                    f.command = Some(self.at(cmd, kpos));
                }
                "sweep" => f.sweep = Some(self.sweep(v)?),
                "sweep_mode" => {
                    let s = self.string(v, k)?;
                    let mode = match s.v.as_str() {
                        "product" => SweepMode::Product,
                        "zip" => SweepMode::Zip,
                        _ => return Err(self.fail(vpos, k, Problem::SweepMode { value: s.v })),
                    };
                    f.sweep_mode = Some(self.at(mode, vpos));
                }
                "workdir" => f.workdir = Some(self.string(v, k)?),
                "inputs" => f.inputs = Some(self.strings(v, k, "an array of file paths")?),
                "outputs" => {
                    f.outputs =
                        Some(self.strings(v, k, "an array of file paths or glob patterns")?)
                }
                "env" => f.env = self.env(v)?,
                "resources" => f.resources = self.resources(v)?,
                "retries" => f.retries = Some(self.count(v, k, "a non-negative integer")?),
                "max_fails" => {
                    f.max_fails = Some(self.count(
                        v,
                        k,
                        "a number of failed attempts (0 turns stopping off)",
                    )?)
                }
                "timeout" => f.timeout_ms = Some(self.duration(v, "timeout")?),
                "expected" => f.expected_ms = Some(self.duration(v, "expected")?),
                "success_codes" => {
                    let DeValue::Array(items) = v.get_ref() else {
                        return Err(self.fail(
                            vpos,
                            k,
                            wrong_type(v.get_ref(), "an array of exit codes"),
                        ));
                    };
                    let mut codes = Vec::with_capacity(items.len());
                    for item in items.iter() {
                        let n = self.integer(item, k, "an exit code (0 to 255)")?;
                        match i32::try_from(n.v) {
                            Ok(c) if (0..=255).contains(&c) => codes.push(c),
                            _ => {
                                return Err(self.fail(
                                    n.pos,
                                    k,
                                    Problem::OutOfRange {
                                        value: n.v.to_string(),
                                        expected: "an exit code (0 to 255)",
                                    },
                                ))
                            }
                        }
                    }
                    if codes.is_empty() {
                        return Err(self.fail(vpos, k, Problem::NoSuccessCodes));
                    }
                    f.success_codes = Some(self.at(codes, vpos));
                }
                "after" => {
                    let (names, by) = self.after(v)?;
                    f.after = Some(names);
                    f.after_by = by;
                }
                "after_each" => {
                    let names = match v.get_ref() {
                        DeValue::String(s) => vec![self.at(s.to_string(), vpos)],
                        _ => self.strings(v, k, "a stage name or an array of stage names")?,
                    };
                    f.after_each = Some(names);
                }
                // `allowed` only lists the fields matched above.
                _ => return Err(self.unknown(kpos, k, allowed)),
            }
        }
        Ok(f)
    }

    /// `after`: a stage name, or an array of stage names and tables.
    fn after(&self, v: &Spanned<DeValue<'_>>) -> Result<(Vec<At<String>>, Vec<RawAfter>)> {
        const EXPECTED: &str = "a stage name, or an array of stage names and tables such as { stage = \"split\", by = [\"chrom\"] }";
        let items = match v.get_ref() {
            DeValue::String(s) => {
                return Ok((vec![self.at(s.to_string(), v.span().start)], vec![]))
            }
            DeValue::Array(items) => items,
            other => return Err(self.fail(v.span().start, "after", wrong_type(other, EXPECTED))),
        };
        let (mut names, mut by) = (Vec::new(), Vec::new());
        for item in items.iter() {
            let pos = item.span().start;
            let table = match item.get_ref() {
                DeValue::String(s) => {
                    names.push(self.at(s.to_string(), pos));
                    continue;
                }
                DeValue::Table(t) => t,
                other => return Err(self.fail(pos, "after", wrong_type(other, EXPECTED))),
            };
            let mut raw = RawAfter {
                stage: self.at(String::new(), pos),
                by: None,
                tasks: None,
                var: None,
                pos,
            };
            let mut stage = None;
            for (key, value) in table.iter() {
                let field = format!("after.{}", key.get_ref());
                match key.get_ref().as_ref() {
                    "stage" => stage = Some(self.string(value, &field)?),
                    "tasks" => raw.tasks = Some(self.string(value, &field)?),
                    "match" => raw.var = Some(self.string(value, &field)?),
                    "by" => {
                        raw.by = Some(match value.get_ref() {
                            DeValue::Table(t) => t
                                .iter()
                                .map(|(k, up)| {
                                    let down = self.at(k.get_ref().to_string(), k.span().start);
                                    Ok((down, self.string(up, &field)?))
                                })
                                .collect::<Result<_>>()?,
                            _ => self
                                .strings(value, &field, "an array of sweep variable names, or a table of this stage's variable = the other stage's")?
                                .into_iter()
                                .map(|n| (n.clone(), n))
                                .collect(),
                        })
                    }
                    _ => {
                        return Err(self.unknown(
                            key.span().start,
                            key.get_ref(),
                            &["stage", "by", "tasks", "match"],
                        ))
                    }
                }
            }
            let Some(stage) = stage else {
                return Err(self.fail(pos, "after", Problem::MissingField { name: "stage" }));
            };
            raw.stage = stage;
            match (&raw.by, &raw.tasks, &raw.var) {
                (None, None, None) => names.push(raw.stage),
                (Some(_), Some(t), _) => return Err(self.fail(
                    t.pos,
                    "after.tasks",
                    Problem::Dependency(
                        "`by` and `tasks` are two ways of choosing the tasks waited for; give one"
                            .into(),
                    ),
                )),
                (_, None, Some(m)) => {
                    return Err(self.fail(
                        m.pos,
                        "after.match",
                        Problem::Dependency(
                            "`match` says what the words of `tasks` are; give `tasks` too".into(),
                        ),
                    ))
                }
                _ => by.push(raw),
            }
        }
        Ok((names, by))
    }

    fn env(&self, v: &Spanned<DeValue<'_>>) -> Result<Vec<(At<String>, At<String>)>> {
        let table = self.table(v, "env", "a table of environment variables")?;
        let mut env = Vec::with_capacity(table.len());
        for (key, value) in table.iter() {
            let name: &str = key.get_ref();
            let field = format!("env.{name}");
            let kpos = key.span().start;
            if !valid_var_name(name) {
                return Err(self.fail(
                    kpos,
                    &field,
                    Problem::EnvName {
                        name: name.to_string(),
                    },
                ));
            }
            if name.starts_with("MESH_") {
                return Err(self.fail(
                    kpos,
                    &field,
                    Problem::EnvReserved {
                        name: name.to_string(),
                    },
                ));
            }
            let text = match value.get_ref() {
                DeValue::String(s) => self.at(s.to_string(), value.span().start),
                DeValue::Integer(_) => {
                    let n = self.integer(value, &field, "a string")?;
                    self.at(n.v.to_string(), n.pos)
                }
                other => {
                    return Err(self.fail(
                        value.span().start,
                        &field,
                        wrong_type(other, "a string"),
                    ))
                }
            };
            env.push((self.at(name.to_string(), kpos), text));
        }
        Ok(env)
    }

    fn resources(&self, v: &Spanned<DeValue<'_>>) -> Result<Vec<(At<String>, At<Amount>)>> {
        const EXPECTED: &str = "a number, or a string such as \"512MiB\"";
        let table = self.table(
            v,
            "resources",
            "a table of resource amounts, e.g. `{ cpu = 2, mem = \"4GiB\" }`",
        )?;
        let mut out = Vec::with_capacity(table.len());
        for (key, value) in table.iter() {
            let name: &str = key.get_ref();
            let field = format!("resources.{name}");
            let kpos = key.span().start;
            let vpos = value.span().start;
            if !valid_resource_name(name) {
                return Err(self.fail(
                    kpos,
                    &field,
                    Problem::ResourceName {
                        name: name.to_string(),
                    },
                ));
            }
            let text = match value.get_ref() {
                DeValue::String(s) => s.to_string(),
                DeValue::Integer(_) => self.integer(value, &field, EXPECTED)?.v.to_string(),
                DeValue::Float(f) => match f.as_str().parse::<f64>() {
                    // Display prints the shortest exact form: 0.5 -> "0.5", 2.0 -> "2".
                    Ok(x) if x.is_finite() => x.to_string(),
                    _ => f.as_str().to_string(),
                },
                other => return Err(self.fail(vpos, &field, wrong_type(other, EXPECTED))),
            };
            // `mem = 256` is 256 bytes, which no task means: the author
            // thought in MiB or GiB. Zero stays allowed, as it drops a
            // default whatever the unit.
            if name == MEM && is_bare_number(&text) && text.trim().parse::<f64>() != Ok(0.0) {
                return Err(self.fail(
                    vpos,
                    &field,
                    Problem::MemWithoutUnit {
                        value: text.trim().to_string(),
                    },
                ));
            }
            let amount = parse_amount(name, &text)
                .map_err(|e| self.fail(vpos, &field, Problem::Amount(e)))?;
            out.push((self.at(name.to_string(), kpos), self.at(amount, vpos)));
        }
        Ok(out)
    }

    /// A positive duration: `"10m"`, or a number of seconds (`90` or `"90"`).
    fn duration(&self, v: &Spanned<DeValue<'_>>, field: &str) -> Result<At<u64>> {
        const EXPECTED: &str = "a duration such as \"10m\", or a number of seconds";
        let pos = v.span().start;
        let ms = match v.get_ref() {
            // Digits alone are seconds, as the integer is: `"5"` and `5`
            // mean the same, as the message for a bad duration promises.
            DeValue::String(s)
                if !s.trim().is_empty() && s.trim().bytes().all(|b| b.is_ascii_digit()) =>
            {
                let secs = s.trim().parse::<u64>().unwrap_or(u64::MAX);
                secs.saturating_mul(1000)
            }
            DeValue::String(s) => {
                let d = humantime::parse_duration(s).map_err(|source| {
                    self.fail(
                        pos,
                        field,
                        Problem::Duration {
                            text: s.to_string(),
                            source,
                        },
                    )
                })?;
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
            }
            DeValue::Integer(_) => {
                let secs = self.integer(v, field, EXPECTED)?;
                let secs = u64::try_from(secs.v)
                    .map_err(|_| self.fail(pos, field, Problem::ZeroDuration))?;
                secs.saturating_mul(1000)
            }
            other => return Err(self.fail(pos, field, wrong_type(other, EXPECTED))),
        };
        if ms == 0 {
            return Err(self.fail(pos, field, Problem::ZeroDuration));
        }
        Ok(self.at(ms, pos))
    }
}

/// Digits and dots alone: a number written without a unit.
fn is_bare_number(text: &str) -> bool {
    let t = text.trim();
    t.bytes().any(|b| b.is_ascii_digit()) && t.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}
