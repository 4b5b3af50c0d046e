//! The file as a whole: its top-level tables, the farm's name, and the passes that read, resolve and link its stages.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use mesh_protocol::farm::{stages_from, StageDef, Stages};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::error::{wrong_type, Problem};
use super::locate::{At, Ctx};
use super::parse::{Fields, DEFAULT_FIELDS, STAGE_FIELDS};
use super::warn::FarmWarning;
use super::{Result, Src};

const TOP_FIELDS: &[&str] = &["farm", "defaults", "stage"];
const FARM_FIELDS: &[&str] = &["name"];

/// A farm file's content, checked: what a `FarmDef` takes besides its folders.
pub(super) struct Loaded {
    pub(super) name: String,
    pub(super) stages: Stages,
    pub(super) warnings: Vec<FarmWarning>,
    /// The keyed and listed dependencies expanded: checked here, kept.
    pub(super) graph: mesh_protocol::graph::Graph,
}

impl Src<'_> {
    /// The whole file: `[farm]`, `[defaults]` and the `[[stage]]` list, then
    /// the stages in passes.
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
        let name = self.farm_name(farm_name, path)?;
        let tables = self.stage_tables(stage_list)?;

        // Pass 1: every stage's fields and name, so dependencies can refer forward.
        let raw = self.read_stages(&tables, &defaults)?;

        // Pass 2: each stage on its own; one with `after_each` and no sweep
        // takes the sweep of the first stage it pairs with, so it comes
        // after that one (a cycle of them is left to pass 3 to report).
        let source = self.sweep_sources(&raw)?;
        let order = sweep_order(&source);
        let mut slots: Vec<Option<Resolved>> = (0..raw.len()).map(|_| None).collect();
        let mut raw: Vec<Option<RawStage>> = raw.into_iter().map(Some).collect();
        for &i in &order {
            let (label, header, fields) = raw[i].take().expect("each stage once");
            let outputs = fields
                .outputs
                .as_ref()
                .and_then(|o| o.first())
                .map(|o| (o.pos, o.dflt));
            let command = fields.command.as_ref().map(|c| (c.pos, c.dflt));
            let inherited = source[i]
                .and_then(|s| slots[s].as_ref())
                .map(|(st, ..)| st.sweep.clone());
            let scope = self.scope(Ctx::Stage(label), false);
            let (stage, dep) = scope.stage(fields, header, inherited.as_ref())?;
            slots[i] = Some((stage, dep, outputs, command));
        }
        let mut stages = Vec::with_capacity(slots.len());
        let mut deps = Vec::with_capacity(slots.len());
        let mut outputs_at: Vec<_> = Vec::with_capacity(slots.len());
        let mut command_at = Vec::with_capacity(slots.len());
        for (stage, dep, outputs, command) in slots.into_iter().flatten() {
            stages.push(Arc::new(stage));
            deps.push(dep);
            outputs_at.push(outputs);
            command_at.push(command);
        }

        // The stages of the farm this file grows come first, their
        // dependencies resolved already.
        let n0 = self.before.len();
        if n0 > 0 {
            stages.splice(0..0, self.before.iter().cloned());
        }
        // Pass 3: dependencies, which need every stage's name and task count.
        self.resolve_deps(&mut stages, &deps)?;
        // The stages before kept as they are shared, the file's added.
        let mut all = self.before.clone();
        all.extend(stages.drain(n0..));
        let stages = all;
        let graph = mesh_protocol::graph::Graph::build_after(self.before_graph, &name, &stages)
            .map_err(|(s, n, e)| {
                let scope = self.scope(Ctx::Stage(format!("stage `{}`", stages[s].name)), false);
                // Only a new stage's can fail: those before built when they came.
                let pos = s
                    .checked_sub(n0)
                    .and_then(|k| deps.get(k)?.by.get(n))
                    .map_or(0, |b| b.pos);
                scope.fail(pos, "after", Problem::Graph(e))
            })?;
        // The stages there already were warned of when they came.
        let mut warnings = self.shared_outputs(&stages, n0, &outputs_at);
        let added: Vec<_> = stages_from(&stages, n0).cloned().collect();
        warnings.extend(self.missing_programs(&added, &command_at));
        Ok(Loaded {
            name,
            stages,
            warnings,
            graph,
        })
    }

    /// The farm's name: `[farm] name`, else the file's name without its
    /// extension.
    fn farm_name(&self, farm_name: Option<At<String>>, path: &Path) -> Result<String> {
        match farm_name {
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
                Ok(n.v)
            }
            None => {
                let stem = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if !valid_name(&stem) {
                    let top = self.scope(Ctx::Top, false);
                    return Err(top.fail(0, "farm.name", Problem::BadFileStem { name: stem }));
                }
                Ok(stem)
            }
        }
    }

    /// The `[[stage]]` tables, each with where it starts: at least one.
    fn stage_tables<'v, 'i>(
        &self,
        stage_list: Option<&'v Spanned<DeValue<'i>>>,
    ) -> Result<Vec<(&'v DeTable<'i>, usize)>> {
        let top = self.scope(Ctx::Top, false);
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
        Ok(tables)
    }

    /// Pass 1: each stage's fields over `defaults`, with a valid name no
    /// other stage has.
    fn read_stages(
        &self,
        tables: &[(&DeTable<'_>, usize)],
        defaults: &Fields,
    ) -> Result<Vec<RawStage>> {
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
            if self.before.iter().any(|s| s.name == name.v) {
                return Err(scope.fail(
                    name.pos,
                    "name",
                    Problem::Dependency(format!(
                        "stage `{}` is in the farm already: a farm grows by stages of new names",
                        name.v
                    )),
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
            raw.push((label, *header, fields.with_defaults(defaults)));
        }
        Ok(raw)
    }

    /// Per stage, the stage whose sweep it takes: the one it is grown from,
    /// else with `after_each` and no sweep of its own, the first it pairs
    /// with.
    fn sweep_sources(&self, raw: &[RawStage]) -> Result<Vec<Option<usize>>> {
        let names: Vec<String> = raw
            .iter()
            .map(|(_, _, f)| f.name.as_ref().map(|n| n.v.clone()).unwrap_or_default())
            .collect();
        // A stage grown from another's file takes that stage's sweep too.
        let mut source: Vec<Option<usize>> = Vec::with_capacity(raw.len());
        for (label, _, f) in raw {
            let grown = f.sweep.as_ref().and_then(|v| {
                v.v.iter()
                    .find_map(|v| v.from.as_ref().map(|s| (v.name(), s)))
            });
            source.push(match (&f.sweep, &f.after_each, grown) {
                (_, _, Some((var, from))) => match names.iter().position(|n| *n == from.v) {
                    Some(p) => Some(p),
                    None => {
                        let scope = self.scope(Ctx::Stage(label.clone()), false);
                        return Err(scope.fail(
                            from.pos,
                            &format!("sweep.{var}.from"),
                            Problem::UnknownStage {
                                name: from.v.clone(),
                                stages: names.join(", "),
                            },
                        ));
                    }
                },
                (None, Some(each), None) => each
                    .first()
                    .and_then(|e| names.iter().position(|n| *n == e.v)),
                _ => None,
            });
        }
        Ok(source)
    }
}

/// The order to resolve the stages in: each after the stage it takes its
/// sweep from (`source`), those in a cycle last, as they come.
fn sweep_order(source: &[Option<usize>]) -> Vec<usize> {
    let mut order: Vec<usize> = Vec::with_capacity(source.len());
    let mut placed = vec![false; source.len()];
    while order.len() < source.len() {
        let before = order.len();
        for i in 0..source.len() {
            if !placed[i] && source[i].is_none_or(|s| placed[s] || s == i) {
                placed[i] = true;
                order.push(i);
            }
        }
        if order.len() == before {
            order.extend((0..source.len()).filter(|&i| !placed[i]));
            break;
        }
    }
    order
}

/// A stage as pass 1 reads it: its label, where its table starts, and its
/// fields over the defaults.
type RawStage = (String, usize, Fields);

/// A stage resolved on its own, with where its first output and its
/// command were written (for warnings about them).
type Resolved = (
    StageDef,
    super::deps::Deps,
    Option<(usize, bool)>,
    Option<(usize, bool)>,
);

const STAGES_EXPECTED: &str = "an array of tables, written `[[stage]]`";

/// The label used before a stage's name is known to be valid.
fn stage_label(table: &DeTable<'_>, number: usize) -> String {
    match table.get("name").and_then(|v| v.get_ref().as_str()) {
        Some(name) => format!("stage `{name}`"),
        None => format!("stage #{number}"),
    }
}

/// Stage and farm names: they become folder names and task ids (`<stage>/<index>`).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && !name.chars().all(|c| c == '.')
}
