//! The document walk: the farm's top-level tables into stages, `[defaults]` merged, shared outputs found, and the dependencies between stages resolved (cycles refused).

use super::*;

impl<'a> Src<'a> {
    pub(super) fn scope(&self, ctx: Ctx, dflt: bool) -> Scope<'_> {
        Scope {
            src: self,
            ctx,
            dflt,
        }
    }

    pub(super) fn document(&self, doc: &Spanned<DeTable<'_>>, path: &Path) -> Result<Loaded> {
        let top = self.scope(Ctx::Top, false);
        let mut farm_name: Option<At<String>> = None;
        let mut defaults = Fields::default();
        let mut stage_list: Option<&Spanned<DeValue<'_>>> = None;
        for (key, value) in doc.get_ref().iter() {
            match &**key.get_ref() {
                "farm" => {
                    let farm = self.scope(Ctx::Farm, false);
                    let table = top.table(value, "farm", "a table `[farm]`")?;
                    for (k, v) in table.iter() {
                        match &**k.get_ref() {
                            "name" => farm_name = Some(farm.string(v, "name")?),
                            other => return Err(farm.unknown(k.span().start, other, FARM_FIELDS)),
                        }
                    }
                }
                "defaults" => {
                    let table = top.table(value, "defaults", "a table `[defaults]`")?;
                    defaults = self
                        .scope(Ctx::Defaults, true)
                        .fields(table, DEFAULT_FIELDS)?;
                }
                "stage" => stage_list = Some(value),
                other => return Err(top.unknown(key.span().start, other, TOP_FIELDS)),
            }
        }

        let name = match farm_name {
            Some(n) => {
                if !valid_name(&n.v) {
                    return Err(self.scope(Ctx::Farm, false).fail(
                        n.pos,
                        "name",
                        Problem::BadName {
                            name: n.v,
                            what: "farm",
                        },
                    ));
                }
                n.v
            }
            None => {
                let stem = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if !valid_name(&stem) {
                    return Err(top.fail(0, "farm.name", Problem::BadFileStem { name: stem }));
                }
                stem
            }
        };

        let tables: Vec<(&DeTable<'_>, usize)> = match stage_list {
            None => Vec::new(),
            Some(list) => match list.get_ref() {
                DeValue::Array(items) => {
                    let mut tables = Vec::with_capacity(items.len());
                    for item in items.iter() {
                        match item.get_ref() {
                            DeValue::Table(t) => tables.push((t, item.span().start)),
                            other => {
                                return Err(top.fail(
                                    item.span().start,
                                    "stage",
                                    wrong_type(other, STAGES_EXPECTED),
                                ))
                            }
                        }
                    }
                    tables
                }
                other => {
                    return Err(top.fail(
                        list.span().start,
                        "stage",
                        wrong_type(other, STAGES_EXPECTED),
                    ))
                }
            },
        };
        if tables.is_empty() {
            let pos = stage_list.map(|l| l.span().start).unwrap_or(0);
            return Err(top.fail(pos, "stage", Problem::NoStages));
        }

        // Pass 1: every stage's fields and name, so dependencies can refer forward.
        let mut raw = Vec::with_capacity(tables.len());
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (number, (table, header)) in tables.iter().enumerate() {
            let label = stage_label(table, number + 1);
            let scope = self.scope(Ctx::Stage(label.clone()), false);
            let fields = scope.fields(table, STAGE_FIELDS.as_slice())?;
            let name = match &fields.name {
                Some(n) => n.clone(),
                None => {
                    return Err(scope.fail(*header, "name", Problem::MissingField { name: "name" }))
                }
            };
            if !valid_name(&name.v) {
                return Err(scope.fail(
                    name.pos,
                    "name",
                    Problem::BadName {
                        name: name.v,
                        what: "stage",
                    },
                ));
            }
            if let Some(first) = seen.get(&name.v) {
                return Err(scope.fail(
                    name.pos,
                    "name",
                    Problem::DuplicateStage {
                        name: name.v,
                        first_line: self.line_col(*first).0,
                    },
                ));
            }
            seen.insert(name.v.clone(), name.pos);
            raw.push((label, *header, fields.with_defaults(&defaults)));
        }

        // Pass 2: each stage on its own.
        let mut stages = Vec::with_capacity(raw.len());
        let mut deps = Vec::with_capacity(raw.len());
        let mut outputs_at = Vec::with_capacity(raw.len());
        for (label, header, fields) in raw {
            outputs_at.push(
                fields
                    .outputs
                    .as_ref()
                    .and_then(|o| o.first())
                    .map(|o| (o.pos, o.dflt)),
            );
            let scope = self.scope(Ctx::Stage(label), false);
            let (stage, dep) = scope.stage(fields, header)?;
            stages.push(stage);
            deps.push(dep);
        }

        // Pass 3: dependencies, which need every stage's name and task count.
        self.resolve_deps(&mut stages, &deps)?;
        let warnings = self.shared_outputs(&stages, &outputs_at);
        Ok(Loaded {
            name,
            stages,
            warnings,
        })
    }

    /// Stages that collect `outputs` from a folder their tasks share with
    /// other tasks running at the same time (no per-task `workdir`): one
    /// task's output is overwritten or half-written by another's before it
    /// is collected, silently.
    pub(super) fn shared_outputs(
        &self,
        stages: &[StageDef],
        outputs_at: &[Option<(usize, bool)>],
    ) -> Vec<FarmWarning> {
        // The folder a stage's tasks all run in, when they share one.
        let shared: Vec<Option<String>> = stages
            .iter()
            .map(|s| {
                if s.outputs.is_empty() {
                    return None;
                }
                match &s.workdir {
                    None => Some(String::new()),
                    Some(w) if w.parts.iter().all(|p| !per_task(p)) => Some(
                        w.parts
                            .iter()
                            .map(|p| match p {
                                Part::Lit(l) => l.clone(),
                                Part::Var(Var::Stage) => s.name.clone(),
                                Part::Var(v) => format!("{v:?}"),
                            })
                            .collect(),
                    ),
                    Some(_) => None,
                }
            })
            .collect();
        let reaches = |from: usize, to: usize| {
            let mut seen = vec![false; stages.len()];
            let mut todo = vec![from];
            while let Some(i) = todo.pop() {
                if i == to {
                    return true;
                }
                if !std::mem::replace(&mut seen[i], true) {
                    let s = &stages[i];
                    todo.extend(s.after.iter().chain(&s.after_each).map(|&t| t as usize));
                }
            }
            false
        };
        let mut out = Vec::new();
        for (i, s) in stages.iter().enumerate() {
            let (Some(folder), Some((pos, dflt))) = (&shared[i], outputs_at[i]) else {
                continue;
            };
            let fix =
                "give each task a folder of its own, e.g. `workdir = \"runs/{stage}/{index}\"`";
            let place = if folder.is_empty() {
                "the farm's folder (no `workdir`)".to_string()
            } else {
                format!("`{folder}`")
            };
            let message = if s.len() > 1 {
                format!(
                    "stage `{}` collects outputs from {place}, which its {} tasks share and may write at the same time, so outputs can come home mixed or empty; {fix}",
                    s.name,
                    s.len()
                )
            } else if let Some(j) = (0..i)
                .find(|&j| shared[j].as_ref() == Some(folder) && !reaches(i, j) && !reaches(j, i))
            {
                format!(
                    "stages `{}` and `{}` collect outputs from {place} and may run at the same time (neither is after the other), so outputs can come home mixed or empty; {fix}",
                    stages[j].name, s.name
                )
            } else {
                continue;
            };
            out.push(FarmWarning {
                file: self.file.to_string(),
                line: self.line_col(pos).0,
                field: if dflt {
                    "defaults.outputs".into()
                } else {
                    "stage.outputs".into()
                },
                message,
            });
        }
        out
    }

    pub(super) fn resolve_deps(&self, stages: &mut [StageDef], deps: &[Deps]) -> Result<()> {
        let names: Vec<String> = stages.iter().map(|s| s.name.clone()).collect();
        // Edges (target, position, field) per stage, for the cycle search.
        let mut edges: Vec<Vec<(usize, usize, &'static str)>> = vec![Vec::new(); stages.len()];
        for (i, dep) in deps.iter().enumerate() {
            let scope = self.scope(Ctx::Stage(format!("stage `{}`", names[i])), false);
            for (field, list) in [("after", &dep.after), ("after_each", &dep.after_each)] {
                for target in list {
                    let Some(t) = names.iter().position(|n| *n == target.v) else {
                        let others: Vec<&str> = names
                            .iter()
                            .filter(|n| **n != names[i])
                            .map(String::as_str)
                            .collect();
                        return Err(scope.fail(
                            target.pos,
                            field,
                            Problem::UnknownStage {
                                name: target.v.clone(),
                                stages: if others.is_empty() {
                                    "none other".to_string()
                                } else {
                                    others.join(", ")
                                },
                            },
                        ));
                    };
                    if t == i {
                        return Err(scope.fail(
                            target.pos,
                            field,
                            Problem::SelfDependency {
                                name: names[i].clone(),
                            },
                        ));
                    }
                    if field == "after_each" && stages[t].len() != stages[i].len() {
                        return Err(scope.fail(
                            target.pos,
                            field,
                            Problem::CountMismatch {
                                this: names[i].clone(),
                                this_count: stages[i].len(),
                                other: names[t].clone(),
                                other_count: stages[t].len(),
                            },
                        ));
                    }
                    let list = if field == "after" {
                        &mut stages[i].after
                    } else {
                        &mut stages[i].after_each
                    };
                    if !list.contains(&(t as u32)) {
                        list.push(t as u32);
                    }
                    edges[i].push((t, target.pos, field));
                }
            }
        }
        if let Some((cycle, pos, field)) = find_cycle(&edges) {
            let path = cycle
                .iter()
                .map(|&s| names[s].as_str())
                .collect::<Vec<_>>()
                .join(" -> ");
            let scope = self.scope(Ctx::Stage(format!("stage `{}`", names[cycle[0]])), false);
            return Err(scope.fail(pos, field, Problem::Cycle { path }));
        }
        Ok(())
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub(super) fn line_col(&self, pos: usize) -> (usize, usize) {
        line_col(self.text, pos)
    }
}

pub(super) const STAGES_EXPECTED: &str = "an array of tables, written `[[stage]]`";

/// The label used before a stage's name is known to be valid.
pub(super) fn stage_label(table: &DeTable<'_>, number: usize) -> String {
    match table.get("name").and_then(|v| v.get_ref().as_str()) {
        Some(name) => format!("stage `{name}`"),
        None => format!("stage #{number}"),
    }
}

/// Finds a cycle in the stage graph; returns its stages (first repeated at
/// the end), and where the first edge of the cycle was written.
pub(super) fn find_cycle(
    edges: &[Vec<(usize, usize, &'static str)>],
) -> Option<(Vec<usize>, usize, &'static str)> {
    const WHITE: u8 = 0;
    const GREY: u8 = 1;
    const BLACK: u8 = 2;
    let mut colour = vec![WHITE; edges.len()];
    for start in 0..edges.len() {
        if colour[start] != WHITE {
            continue;
        }
        // Iterative, so a long chain of stages cannot overflow the stack.
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        colour[start] = GREY;
        while let Some(top) = stack.last_mut() {
            let (node, next) = *top;
            if next == edges[node].len() {
                colour[node] = BLACK;
                stack.pop();
                continue;
            }
            top.1 += 1;
            let target = edges[node][next].0;
            match colour[target] {
                WHITE => {
                    colour[target] = GREY;
                    stack.push((target, 0));
                }
                GREY => {
                    let from = stack.iter().position(|(s, _)| *s == target)?;
                    let mut cycle: Vec<usize> = stack[from..].iter().map(|(s, _)| *s).collect();
                    cycle.push(target);
                    let (first, taken) = stack[from];
                    let (_, pos, field) = edges[first][taken - 1];
                    return Some((cycle, pos, field));
                }
                _ => {}
            }
        }
    }
    None
}

/// `path` against the current directory, without `.` components.
pub(super) fn absolute(path: &Path) -> Result<PathBuf> {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|source| FarmFileError::Cwd { source })?
            .join(path)
    };
    Ok(joined
        .components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect())
}

pub(super) fn utf8(file: &str, path: &Path) -> Result<String> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| FarmFileError::NotUtf8 {
            file: file.to_string(),
            path: path.to_path_buf(),
        })
}

/// A placeholder that differs from task to task of a stage.
pub(super) fn per_task(p: &Part) -> bool {
    matches!(p, Part::Var(Var::Index | Var::Sweep(_)))
}
