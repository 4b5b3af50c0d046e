//! Run-time fan-out where tasks run: the lines of the file a task writes for a stage grown from it, counted when it ends, and read by each task it grew.
//!
//! The engine knows a grown stage's tasks only by place (see
//! `mesh_protocol::farm::Grown`): task `i` is line `i % per` of the file of
//! task `i / per` upstream. The node that ran the upstream task counts the
//! lines (the count travels in its report and the farm's log, so every
//! node knows which places hold tasks); the node that runs a grown task
//! reads its line from the upstream task's outputs, which are under its
//! `{out}` before it starts like any dependency's.

use std::path::Path;

use mesh_protocol::farm::{FarmDef, TaskRef, Values};

/// After task `t` succeeded with its outputs in `dir`: how many lines the
/// file that grows other stages from it has; none when no stage grows from
/// its stage. An error (the task fails with it) when the file is missing or
/// has more lines than the grown stage keeps places for.
pub fn count(def: &FarmDef, t: TaskRef, dir: &Path) -> Result<Option<u32>, String> {
    let Some((file, per)) = def.grows(t.stage) else {
        return Ok(None);
    };
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "stages grow from its `{file}`, one task per line, but it could not be read ({}): {e}",
            path.display()
        )
    })?;
    // Read as a parameter file's (`lines = ...`): a value per non-blank
    // line, trimmed.
    let n = Values::lines(&text).len();
    if n > u64::from(per) {
        return Err(format!(
            "its `{file}` has {n} lines, more than the {per} a stage grown from it takes \
             (raise `max` in that stage's sweep)"
        ));
    }
    Ok(Some(n as u32))
}

/// Task `t`'s line, when its stage is grown: read from the file of the task
/// it grew from, under `out` (the farm's `{out}` where `t` runs).
pub fn line(def: &FarmDef, t: TaskRef, out: &Path) -> Result<Option<String>, String> {
    let Some((up, file, k)) = def.grown_source(t) else {
        return Ok(None);
    };
    let path = out
        .join(&def.stage(up).name)
        .join(up.index.to_string())
        .join(file);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("reading its line from {}: {e}", path.display()))?;
    let values = Values::lines(&text);
    if u64::from(k) >= values.len() {
        return Err(format!(
            "it is line {} of {}, which has {} lines",
            k + 1,
            path.display(),
            values.len()
        ));
    }
    let line = values.get(u64::from(k));
    let stage = def.stage(t);
    let var = stage.sweep.vars.len() - 1;
    let in_path = stage
        .workdir
        .iter()
        .chain(&stage.inputs)
        .chain(&stage.outputs)
        .any(|p| p.sweep_vars().any(|v| v == var));
    // As the loader checks every value known before the farm runs.
    if in_path && (line.starts_with('/') || line.split('/').any(|c| c == "..")) {
        return Err(format!(
            "its line `{line}` (line {} of {}) is used in a path and would leave the task's folder",
            k + 1,
            path.display()
        ));
    }
    Ok(Some(line))
}
