//! One stage's merged fields resolved into a `StageDef`: command and env templates, paths kept inside the farm folder, inputs that exist, output globs, resources.

use mesh_protocol::farm::{
    path_stays_inside, CommandTemplate, Part, StageDef, Sweep, Template, Var, MAX_FAILS_DEFAULT,
};
use mesh_protocol::resources::{Amount, Resources, CPU};

use super::deps::Deps;
use super::error::Problem;
use super::locate::{At, Scope};
use super::parse::{Fields, RawCommand};
use super::Result;

impl Scope<'_> {
    /// Resolves a merged stage: sweep, templates, paths and resources.
    /// `inherited`: the sweep of the stage it pairs with element-wise, for
    /// a stage with `after_each` and no sweep of its own.
    pub(super) fn stage(
        &self,
        f: Fields,
        header: usize,
        inherited: Option<&Sweep>,
    ) -> Result<(StageDef, Deps)> {
        let Some(name) = f.name else {
            return Err(self.fail(header, "name", Problem::MissingField { name: "name" }));
        };
        let Some(command) = f.command else {
            return Err(self.fail(header, "command", Problem::MissingCommand));
        };

        let grown = f
            .sweep
            .as_ref()
            .and_then(|vars| vars.v.iter().find(|v| v.from.is_some()).map(|g| (vars, g)));
        let sweep = match (f.sweep.as_ref(), inherited, grown) {
            (_, Some(base), Some((vars, g))) => {
                let from = g.from.clone().expect("found by it").v;
                if vars.v.len() > 1 {
                    return Err(self.fail_at(vars, "sweep", Problem::GrownNotAlone { from }));
                }
                if base.grown().is_some() {
                    return Err(self.fail_at(
                        vars,
                        &format!("sweep.{}.from", g.name()),
                        Problem::Dependency(format!(
                            "stage `{from}` is grown itself: a stage grows only from one whose tasks are known before the farm runs"
                        )),
                    ));
                }
                let mut sweep = base.clone();
                sweep.vars.extend(g.grown_var());
                if sweep.len() > mesh_protocol::farm::STAGE_TASKS_MAX {
                    return Err(self.fail_at(vars, "sweep", Problem::TooManyTasks));
                }
                sweep
            }
            (None, Some(s), None) => s.clone(),
            _ => self.stage_sweep(f.sweep.as_ref(), f.sweep_mode.as_ref())?,
        };
        let grown_from = grown.and_then(|(_, g)| g.from.clone());
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
            RawCommand::Python(args) => CommandTemplate::Python(
                args.iter()
                    .map(|a| self.template(a, "python", &var_names))
                    .collect::<Result<_>>()?,
            ),
        };
        let workdir = match &f.workdir {
            Some(w) => Some(self.path_template(w, "workdir", &sweep)?),
            None => None,
        };
        let key = match &f.key {
            Some(k) => Some(self.template(k, "key", &var_names)?),
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
            deps: Vec::new(),
            name: name.v,
            key,
            command,
            sweep,
            workdir,
            inputs,
            outputs,
            env,
            resources,
            retries: f.retries.map(|r| r.v).unwrap_or(0),
            max_fails: f.max_fails.map(|m| m.v).unwrap_or(MAX_FAILS_DEFAULT),
            timeout_ms: f.timeout_ms.map(|t| t.v),
            expected_ms: f.expected_ms.map(|t| t.v),
            success_codes: f.success_codes.map(|c| c.v).unwrap_or_else(|| vec![0]),
            after: Vec::new(),
            after_each: Vec::new(),
        };
        let deps = Deps {
            after: f.after.unwrap_or_default(),
            after_each: f.after_each.unwrap_or_default(),
            by: f.after_by,
            grown: grown_from,
        };
        Ok((stage, deps))
    }

    fn template(&self, text: &At<String>, field: &str, vars: &[&str]) -> Result<Template> {
        Template::parse(&text.v, vars).map_err(|e| self.fail_at(text, field, Problem::Template(e)))
    }

    /// A template naming a path inside the farm (workdir, inputs, outputs):
    /// neither its text nor any value substituted into it may leave the folder.
    fn path_template(&self, text: &At<String>, field: &str, sweep: &Sweep) -> Result<Template> {
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
