//! Dependencies between stages: `after` and `after_each` names resolved to stage positions, with unknown stages, mismatched counts and cycles reported where they were written.

use mesh_protocol::farm::StageDef;

use super::error::Problem;
use super::locate::{At, Ctx};
use super::{Result, Src};

/// A stage's dependency names, kept until every stage's task count is known.
pub(super) struct Deps {
    pub(super) after: Vec<At<String>>,
    pub(super) after_each: Vec<At<String>>,
}

impl Src<'_> {
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
