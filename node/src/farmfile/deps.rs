//! Dependencies between stages: `after` and `after_each` names resolved to stage positions, with unknown stages, mismatched counts and cycles reported where they were written.

use mesh_protocol::farm::{StageDef, Template};
use mesh_protocol::graph::{Dep, DepOn};
use std::sync::Arc;

use super::error::Problem;
use super::locate::{At, Ctx, Scope};
use super::parse::RawAfter;
use super::{Result, Src};

/// A stage's dependency names, kept until every stage's task count is known.
pub(super) struct Deps {
    pub(super) after: Vec<At<String>>,
    pub(super) after_each: Vec<At<String>>,
    /// Keyed and listed dependencies, in the order written.
    pub(super) by: Vec<RawAfter>,
    /// The stage a grown sweep variable grows from (`from = "stage"`).
    pub(super) grown: Option<At<String>>,
}

/// The position of sweep variable `name` in `stage`, or an error saying
/// which variables it has.
fn var_of(scope: &Scope<'_>, stage: &StageDef, name: &At<String>, field: &str) -> Result<u32> {
    match stage.sweep.vars.iter().position(|v| v.name == name.v) {
        Some(p) => Ok(p as u32),
        None => {
            let known: Vec<&str> = stage.sweep.vars.iter().map(|v| v.name.as_str()).collect();
            Err(scope.fail(
                name.pos,
                field,
                Problem::Dependency(format!(
                    "stage `{}` has no sweep variable `{}` (its variables: {})",
                    stage.name,
                    name.v,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )),
            ))
        }
    }
}

impl Src<'_> {
    /// `deps` are those of the last of `stages`: the stages before them
    /// are those of the farm this file grows, resolved when they came, and
    /// looked at here only as what the new ones name (an open farm grown
    /// by thousands of batches copied every name at each growth).
    pub(super) fn resolve_deps(&self, stages: &mut [Arc<StageDef>], deps: &[Deps]) -> Result<()> {
        let n0 = stages.len() - deps.len();
        // Edges (target, position, field) per stage, for the cycle search.
        let mut edges: Vec<Vec<(usize, usize, &'static str)>> = vec![Vec::new(); stages.len()];
        for (k, dep) in deps.iter().enumerate() {
            let i = n0 + k;
            if dep.after.is_empty() && dep.after_each.is_empty() && dep.by.is_empty() {
                continue;
            }
            let scope = self.scope(Ctx::Stage(format!("stage `{}`", stages[i].name)), false);
            let by_names: Vec<At<String>> = dep.by.iter().map(|b| b.stage.clone()).collect();
            for (field, list) in [
                ("after", &dep.after),
                ("after_each", &dep.after_each),
                ("after.stage", &by_names),
            ] {
                for (n, target) in list.iter().enumerate() {
                    // From the end: names are the farm's own, and a growth's
                    // stages mostly wait for the latest (an open farm's calls).
                    let Some(t) = stages.iter().rposition(|s| s.name == target.v) else {
                        let others: Vec<&str> = stages
                            .iter()
                            .filter(|s| s.name != stages[i].name)
                            .map(|s| s.name.as_str())
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
                                name: stages[i].name.clone(),
                            },
                        ));
                    }
                    if field == "after_each" && stages[t].len() != stages[i].len() {
                        return Err(scope.fail(
                            target.pos,
                            field,
                            Problem::CountMismatch {
                                this: stages[i].name.clone(),
                                this_count: stages[i].len(),
                                other: stages[t].name.clone(),
                                other_count: stages[t].len(),
                            },
                        ));
                    }
                    if field == "after.stage" {
                        let on = dep_on(&scope, &stages[i], &stages[t], &dep.by[n])?;
                        Arc::make_mut(&mut stages[i]).deps.push(Dep {
                            stage: t as u32,
                            on,
                        });
                        edges[i].push((t, target.pos, "after"));
                        continue;
                    }
                    let st = Arc::make_mut(&mut stages[i]);
                    let list = if field == "after" {
                        &mut st.after
                    } else {
                        &mut st.after_each
                    };
                    if !list.contains(&(t as u32)) {
                        list.push(t as u32);
                    }
                    edges[i].push((t, target.pos, field));
                }
            }
        }
        self.resolve_grown(stages, deps, &mut edges)?;
        if let Some((cycle, pos, field)) = find_cycle(&edges) {
            let path = cycle
                .iter()
                .map(|&s| stages[s].name.as_str())
                .collect::<Vec<_>>()
                .join(" -> ");
            let scope = self.scope(
                Ctx::Stage(format!("stage `{}`", stages[cycle[0]].name)),
                false,
            );
            return Err(scope.fail(pos, field, Problem::Cycle { path }));
        }
        Ok(())
    }

    /// Each grown stage waits, task by task, for the task it grows from;
    /// that stage keeps outputs, and every stage grown from it reads the
    /// same file.
    fn resolve_grown(
        &self,
        stages: &mut [Arc<StageDef>],
        deps: &[Deps],
        edges: &mut [Vec<(usize, usize, &'static str)>],
    ) -> Result<()> {
        let n0 = stages.len() - deps.len();
        for (k, dep) in deps.iter().enumerate() {
            let i = n0 + k;
            let Some(from) = &dep.grown else {
                continue;
            };
            let scope = self.scope(Ctx::Stage(format!("stage `{}`", stages[i].name)), false);
            let var = stages[i]
                .sweep
                .vars
                .last()
                .map(|v| v.name.clone())
                .unwrap_or_default();
            let field = format!("sweep.{var}.from");
            // The loader gave the stage the sweep of the stage it names, so
            // that stage is known here.
            let Some(t) = stages.iter().position(|s| s.name == from.v) else {
                return Err(scope.fail(
                    from.pos,
                    &field,
                    Problem::Dependency(format!("no stage `{}`", from.v)),
                ));
            };
            if t == i {
                return Err(scope.fail(
                    from.pos,
                    &field,
                    Problem::SelfDependency {
                        name: stages[i].name.clone(),
                    },
                ));
            }
            let (file, per) = {
                let Some(mesh_protocol::farm::Values::Grown(g)) = Arc::make_mut(&mut stages[i])
                    .sweep
                    .vars
                    .last_mut()
                    .map(|v| &mut v.values)
                else {
                    continue;
                };
                g.from = t as u32;
                (g.file.clone(), g.per)
            };
            if stages[t].outputs.is_empty() {
                return Err(scope.fail(
                    from.pos,
                    &field,
                    Problem::GrownFromNoOutputs {
                        from: stages[t].name.clone(),
                        file,
                    },
                ));
            }
            let other = stages.iter().enumerate().find_map(|(j, s)| {
                let g = s.sweep.grown()?;
                (j != i && g.from == t as u32 && g.file != file).then(|| (j, g.file.clone()))
            });
            if let Some((j, other_file)) = other {
                return Err(scope.fail(
                    from.pos,
                    &field,
                    Problem::GrownTwoFiles {
                        from: stages[t].name.clone(),
                        other: stages[j].name.clone(),
                        other_file,
                    },
                ));
            }
            Arc::make_mut(&mut stages[i]).deps.push(Dep {
                stage: t as u32,
                on: DepOn::Grown { per },
            });
            edges[i].push((t, from.pos, "sweep"));
        }
        Ok(())
    }
}

/// How a keyed or listed `after` entry chooses the tasks of `up` that
/// each task of `this` waits for.
fn dep_on(scope: &Scope<'_>, this: &StageDef, up: &StageDef, raw: &RawAfter) -> Result<DepOn> {
    if let Some(tasks) = &raw.tasks {
        let vars: Vec<&str> = this.sweep.vars.iter().map(|v| v.name.as_str()).collect();
        let t = Template::parse(&tasks.v, &vars)
            .map_err(|e| scope.fail_at(tasks, "after.tasks", Problem::Template(e)))?;
        let var = match &raw.var {
            Some(m) => Some(var_of(scope, up, m, "after.match")?),
            None => None,
        };
        return Ok(DepOn::Listed { tasks: t, var });
    }
    let pairs = raw.by.as_deref().unwrap_or_default();
    if pairs.is_empty() {
        return Err(scope.fail(
            raw.pos,
            "after.by",
            Problem::Dependency("`by` names no sweep variable to match on".into()),
        ));
    }
    let mut down = Vec::with_capacity(pairs.len());
    let mut upv = Vec::with_capacity(pairs.len());
    for (d, u) in pairs {
        down.push(var_of(scope, this, d, "after.by")?);
        upv.push(var_of(scope, up, u, "after.by")?);
    }
    Ok(DepOn::Keyed { down, up: upv })
}

/// Finds a cycle in the stage graph; returns its stages (first repeated at
/// the end), and where the first edge of the cycle was written.
fn find_cycle(
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
