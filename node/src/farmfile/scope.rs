//! Reading one table's fields (strings, integers, durations, resources, env, templates, a whole stage), each checked where it was written, so an error names its line, stage and field.

use super::*;

impl Scope<'_> {
    pub(super) fn fail(&self, pos: usize, field: &str, problem: Problem) -> FarmFileError {
        self.fail_from(pos, self.dflt, field, problem)
    }

    pub(super) fn fail_at<T>(&self, at: &At<T>, field: &str, problem: Problem) -> FarmFileError {
        self.fail_from(at.pos, at.dflt, field, problem)
    }

    /// `dflt` says the value was written in `[defaults]`: the line points
    /// there, so the field is named as a defaults field while the context
    /// still says which stage it broke.
    pub(super) fn fail_from(
        &self,
        pos: usize,
        dflt: bool,
        field: &str,
        problem: Problem,
    ) -> FarmFileError {
        let (line, col) = self.src.line_col(pos);
        let (context, field) = match &self.ctx {
            Ctx::Top => (String::new(), field.to_string()),
            Ctx::Farm => ("[farm]".to_string(), format!("farm.{field}")),
            Ctx::Defaults => ("[defaults]".to_string(), format!("defaults.{field}")),
            Ctx::Stage(label) if dflt => (
                format!("{label} (value from [defaults])"),
                format!("defaults.{field}"),
            ),
            Ctx::Stage(label) => (label.clone(), format!("stage.{field}")),
        };
        FarmFileError::Invalid(Box::new(Invalid {
            file: self.src.file.to_string(),
            line,
            col,
            context,
            field: Some(field),
            problem,
        }))
    }

    pub(super) fn unknown(
        &self,
        pos: usize,
        name: &str,
        allowed: &'static [&'static str],
    ) -> FarmFileError {
        self.unknown_in(pos, "", name, allowed)
    }

    pub(super) fn unknown_in(
        &self,
        pos: usize,
        prefix: &str,
        name: &str,
        allowed: &'static [&'static str],
    ) -> FarmFileError {
        self.fail(
            pos,
            &format!("{prefix}{name}"),
            Problem::UnknownField {
                name: name.to_string(),
                allowed,
            },
        )
    }

    pub(super) fn at<T>(&self, v: T, pos: usize) -> At<T> {
        At {
            v,
            pos,
            dflt: self.dflt,
        }
    }

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

    pub(super) fn strings(
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
                "command" | "shell" => {
                    if f.command.is_some() {
                        return Err(self.fail(kpos, k, Problem::CommandAndShell));
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
                "retries" => {
                    let n = self.integer(v, k, "a non-negative integer")?;
                    let retries = u32::try_from(n.v).map_err(|_| {
                        self.fail(
                            vpos,
                            k,
                            Problem::OutOfRange {
                                value: n.v.to_string(),
                                expected: "a non-negative integer",
                            },
                        )
                    })?;
                    f.retries = Some(self.at(retries, vpos));
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
                "after" | "after_each" => {
                    let names = match v.get_ref() {
                        DeValue::String(s) => vec![self.at(s.to_string(), vpos)],
                        _ => self.strings(v, k, "a stage name or an array of stage names")?,
                    };
                    if k == "after" {
                        f.after = Some(names);
                    } else {
                        f.after_each = Some(names);
                    }
                }
                // `allowed` only lists the fields matched above.
                _ => return Err(self.unknown(kpos, k, allowed)),
            }
        }
        Ok(f)
    }

    pub(super) fn env(&self, v: &Spanned<DeValue<'_>>) -> Result<Vec<(At<String>, At<String>)>> {
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

    pub(super) fn resources(
        &self,
        v: &Spanned<DeValue<'_>>,
    ) -> Result<Vec<(At<String>, At<Amount>)>> {
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
            let amount = parse_amount(name, &text).map_err(|source| {
                self.fail(
                    vpos,
                    &field,
                    Problem::Amount {
                        name: name.to_string(),
                        source,
                    },
                )
            })?;
            out.push((self.at(name.to_string(), kpos), self.at(amount, vpos)));
        }
        Ok(out)
    }

    /// A positive duration: `"10m"` or a number of seconds.
    pub(super) fn duration(&self, v: &Spanned<DeValue<'_>>, field: &str) -> Result<At<u64>> {
        const EXPECTED: &str = "a duration such as \"10m\", or a number of seconds";
        let pos = v.span().start;
        let ms = match v.get_ref() {
            DeValue::String(s) => {
                let d = humantime::parse_duration(s).map_err(|source| {
                    self.fail(
                        pos,
                        field,
                        Problem::Timeout {
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
                    .map_err(|_| self.fail(pos, field, Problem::ZeroTimeout))?;
                secs.saturating_mul(1000)
            }
            other => return Err(self.fail(pos, field, wrong_type(other, EXPECTED))),
        };
        if ms == 0 {
            return Err(self.fail(pos, field, Problem::ZeroTimeout));
        }
        Ok(self.at(ms, pos))
    }

    /// Resolves a merged stage: sweep, templates, paths and resources.
    pub(super) fn stage(&self, f: Fields, header: usize) -> Result<(StageDef, Deps)> {
        let Some(name) = f.name else {
            return Err(self.fail(header, "name", Problem::MissingField { name: "name" }));
        };
        let Some(command) = f.command else {
            return Err(self.fail(header, "command", Problem::MissingCommand));
        };

        let mode = f
            .sweep_mode
            .as_ref()
            .map(|m| m.v)
            .unwrap_or(SweepMode::Product);
        let sweep = match &f.sweep {
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
        };
        let var_names: Vec<&str> = sweep.vars.iter().map(|v| v.name.as_str()).collect();

        let command = match &command.v {
            RawCommand::Argv(args) => CommandTemplate::Argv(
                args.iter()
                    .map(|a| self.template(a, "command", &var_names))
                    .collect::<Result<_>>()?,
            ),
            RawCommand::Shell(line) => {
                CommandTemplate::Shell(self.template(line, "shell", &var_names)?)
            }
        };
        let workdir = match &f.workdir {
            Some(w) => Some(self.path_template(w, "workdir", &sweep)?),
            None => None,
        };
        let mut inputs = Vec::new();
        for input in f.inputs.iter().flatten() {
            let t = self.path_template(input, "inputs", &sweep)?;
            if t.is_static() {
                let full = self.src.root.join(&input.v);
                if !full.is_file() {
                    return Err(self.fail_at(
                        input,
                        "inputs",
                        Problem::InputMissing {
                            path: input.v.clone(),
                            looked: full.display().to_string(),
                        },
                    ));
                }
            }
            inputs.push(t);
        }
        let mut outputs = Vec::new();
        for output in f.outputs.iter().flatten() {
            let t = self.path_template(output, "outputs", &sweep)?;
            let pattern = t.literal_text();
            if let Err(source) = glob::Pattern::new(&pattern) {
                return Err(self.fail_at(output, "outputs", Problem::BadGlob { pattern, source }));
            }
            outputs.push(t);
        }
        let mut env = Vec::with_capacity(f.env.len());
        for (key, value) in &f.env {
            env.push((
                key.v.clone(),
                self.template(value, &format!("env.{}", key.v), &var_names)?,
            ));
        }
        let mut resources =
            Resources::from_pairs(f.resources.iter().map(|(k, a)| (k.v.clone(), a.v)));
        // A task takes one core unless it says otherwise (`cpu = 0` opts out).
        if !f.resources.iter().any(|(k, _)| k.v == CPU) {
            resources.set(CPU, Amount::units(1));
        }

        let stage = StageDef {
            name: name.v,
            command,
            sweep,
            workdir,
            inputs,
            outputs,
            env,
            resources,
            retries: f.retries.map(|r| r.v).unwrap_or(0),
            timeout_ms: f.timeout_ms.map(|t| t.v),
            expected_ms: f.expected_ms.map(|t| t.v),
            success_codes: f.success_codes.map(|c| c.v).unwrap_or_else(|| vec![0]),
            after: Vec::new(),
            after_each: Vec::new(),
        };
        let deps = Deps {
            after: f.after.unwrap_or_default(),
            after_each: f.after_each.unwrap_or_default(),
        };
        Ok((stage, deps))
    }

    pub(super) fn template(
        &self,
        text: &At<String>,
        field: &str,
        vars: &[&str],
    ) -> Result<Template> {
        Template::parse(&text.v, vars).map_err(|e| self.fail_at(text, field, Problem::Template(e)))
    }

    /// A template naming a path inside the farm (workdir, inputs, outputs):
    /// neither its text nor any value substituted into it may leave the folder.
    pub(super) fn path_template(
        &self,
        text: &At<String>,
        field: &str,
        sweep: &Sweep,
    ) -> Result<Template> {
        let names: Vec<&str> = sweep.vars.iter().map(|v| v.name.as_str()).collect();
        let t = self.template(text, field, &names)?;
        if t.parts.iter().any(|p| matches!(p, Part::Var(Var::Out))) {
            return Err(self.fail_at(text, field, Problem::OutInPath));
        }
        if text.v.trim().is_empty() {
            return Err(self.fail_at(text, field, Problem::EmptyPath));
        }
        if !path_stays_inside(&t.literal_text()) {
            return Err(self.fail_at(
                text,
                field,
                Problem::PathEscapes {
                    path: text.v.clone(),
                },
            ));
        }
        let mut used: Vec<usize> = t.sweep_vars().collect();
        used.sort_unstable();
        used.dedup();
        for i in used {
            let var = &sweep.vars[i];
            let mut bad: Option<String> = None;
            var.values.for_each(|value| {
                if bad.is_none()
                    && (value.is_empty() || value.starts_with('/') || value.contains(".."))
                {
                    bad = Some(value.to_string());
                }
            });
            if let Some(value) = bad {
                return Err(self.fail_at(
                    text,
                    field,
                    Problem::ValueEscapes {
                        var: var.name.clone(),
                        value,
                    },
                ));
            }
        }
        Ok(t)
    }
}

/// Serde's wording, so messages read like those of other TOML tools.
pub(super) fn wrong_type(found: &DeValue<'_>, expected: &'static str) -> Problem {
    let found = match found {
        DeValue::String(s) => format!("string {:?}", &**s),
        DeValue::Integer(i) => format!("integer `{i}`"),
        DeValue::Float(f) => format!("float `{}`", f.as_str()),
        DeValue::Boolean(b) => format!("boolean `{b}`"),
        DeValue::Datetime(d) => format!("datetime `{d}`"),
        DeValue::Array(_) => "array".to_string(),
        DeValue::Table(_) => "table".to_string(),
    };
    Problem::WrongType { found, expected }
}

/// Stage and farm names: they become folder names and task ids (`<stage>/<index>`).
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && !name.chars().all(|c| c == '.')
}

pub(super) fn valid_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
