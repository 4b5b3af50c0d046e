//! Run-time fan-out where tasks run: the lines of the file a task writes for a stage grown from it, counted when it ends, and read by each task it grew.
//!
//! The engine knows a grown stage's tasks only by place (see
//! `mesh_protocol::farm::Grown`): task `i` is line `i % per` of the file of
//! task `i / per` upstream. The node that ran the upstream task counts the
//! lines (the count travels in its report and the farm's log, so every
//! node knows which places hold tasks); the node that runs a grown task
//! reads its line from the upstream task's outputs, which are under its
//! `{out}` before it starts like any dependency's.

use std::io;
use std::path::{Path, PathBuf};

use mesh_protocol::farm::{FarmDef, TaskRef, Values};

/// Why a grown stage's file did not give what it should: the task (the
/// one it grows from, or the grown one) fails with these words.
#[derive(Debug, thiserror::Error)]
pub enum GrownError {
    #[error("stages grow from its `{file}`, one task per line, but it could not be read ({}): {source}", .path.display())]
    Unread {
        file: String,
        path: PathBuf,
        source: io::Error,
    },
    #[error("its `{file}` has {lines} lines, more than the {per} a stage grown from it takes (raise `max` in that stage's sweep)")]
    TooMany { file: String, lines: u64, per: u32 },
    #[error("reading its line from {}: {source}", .path.display())]
    NoLine { path: PathBuf, source: io::Error },
    /// `line` counts from 1.
    #[error("it is line {line} of {}, which has {lines} lines", .path.display())]
    PastTheEnd {
        line: u64,
        path: PathBuf,
        lines: u64,
    },
    #[error("its line `{value}` (line {line} of {}) is used in a path and would leave the task's folder", .path.display())]
    Leaves {
        value: String,
        line: u64,
        path: PathBuf,
    },
}

/// After task `t` succeeded with its outputs in `dir`: how many lines the
/// file that grows other stages from it has; none when no stage grows from
/// its stage. An error (the task fails with it) when the file is missing or
/// has more lines than the grown stage keeps places for.
pub fn count(def: &FarmDef, t: TaskRef, dir: &Path) -> Result<Option<u32>, GrownError> {
    let Some((file, per)) = def.grows(t.stage) else {
        return Ok(None);
    };
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).map_err(|source| GrownError::Unread {
        file: file.to_string(),
        path: path.clone(),
        source,
    })?;
    // Read as a parameter file's (`lines = ...`): a value per non-blank
    // line, trimmed.
    let n = Values::lines(&text).len();
    if n > u64::from(per) {
        return Err(GrownError::TooMany {
            file: file.to_string(),
            lines: n,
            per,
        });
    }
    Ok(Some(n as u32))
}

/// Task `t`'s line, when its stage is grown: read from the file of the task
/// it grew from, under `out` (the farm's `{out}` where `t` runs).
pub fn line(def: &FarmDef, t: TaskRef, out: &Path) -> Result<Option<String>, GrownError> {
    let Some((up, file, k)) = def.grown_source(t) else {
        return Ok(None);
    };
    let path = out
        .join(&def.stage(up).name)
        .join(up.index.to_string())
        .join(file);
    let text = std::fs::read_to_string(&path).map_err(|source| GrownError::NoLine {
        path: path.clone(),
        source,
    })?;
    let values = Values::lines(&text);
    if u64::from(k) >= values.len() {
        return Err(GrownError::PastTheEnd {
            line: u64::from(k) + 1,
            path,
            lines: values.len(),
        });
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
        return Err(GrownError::Leaves {
            value: line,
            line: u64::from(k) + 1,
            path,
        });
    }
    Ok(Some(line))
}
