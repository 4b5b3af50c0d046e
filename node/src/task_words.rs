//! Tasks in people's words: the `stage/index` ids users give, how an attempt ended, and why a stage stopped.
//!
//! Shared by the single-machine runner and the mesh node, so `mesh run`
//! and a mesh speak of tasks alike.

use std::time::Duration;

use mesh_protocol::engine::{Stop, TaskEnd};
use mesh_protocol::farm::FarmDef;
use mesh_protocol::TaskRef;
use nix::sys::signal::Signal;

/// Why a task id a user gave names no task of the farm.
#[derive(Debug, thiserror::Error)]
pub enum TaskIdError {
    #[error("`{0}` is not a task id (expected <stage>/<index>, e.g. solve/3)")]
    NoSlash(String),
    #[error("`{task}` is not a task id: `{index}` is not an index")]
    NotAnIndex { task: String, index: String },
    #[error("farm {farm} has no stage `{stage}` (stages: {})", .stages.join(", "))]
    NoStage {
        farm: String,
        stage: String,
        stages: Vec<String>,
    },
    #[error("stage {stage} has tasks 0 to {last}; there is no {task}")]
    PastTheEnd {
        stage: String,
        last: u32,
        task: String,
    },
}

/// `stage/index` in a farm.
pub(crate) fn parse_task(def: &FarmDef, task: &str) -> Result<TaskRef, TaskIdError> {
    let Some((stage, index)) = task.rsplit_once('/') else {
        return Err(TaskIdError::NoSlash(task.to_string()));
    };
    let Ok(index) = index.parse::<u32>() else {
        return Err(TaskIdError::NotAnIndex {
            task: task.to_string(),
            index: index.to_string(),
        });
    };
    let Some(s) = def.stages.iter().position(|s| s.name == stage) else {
        return Err(TaskIdError::NoStage {
            farm: def.name.clone(),
            stage: stage.to_string(),
            stages: def.stages.iter().map(|s| s.name.clone()).collect(),
        });
    };
    let len = def.stages[s].len();
    if index >= len {
        return Err(TaskIdError::PastTheEnd {
            stage: stage.to_string(),
            last: len.saturating_sub(1),
            task: task.to_string(),
        });
    }
    Ok(TaskRef::new(s as u32, index))
}

/// A task's end in words, for people.
pub fn describe_end(end: &TaskEnd) -> String {
    match end {
        TaskEnd::Exited(c) => format!("exit code {c}"),
        TaskEnd::Signaled(s) => match Signal::try_from(*s) {
            Ok(sig) => format!("killed by {sig}"),
            Err(_) => format!("killed by signal {s}"),
        },
        TaskEnd::TimedOut { after_ms } => {
            format!(
                "timed out after {}",
                humantime::format_duration(Duration::from_millis(*after_ms))
            )
        }
        TaskEnd::Cached => "already done (same content key)".into(),
        TaskEnd::Error(e) => e.clone(),
        TaskEnd::CrashLimit => {
            "was running each time its node died; failed after the crash limit".into()
        }
        TaskEnd::Cancelled => "cancelled".into(),
    }
}

/// A task's end with its cause: the first line it wrote to stderr beside
/// the end (`exit code 1: solver diverged at step 17`), so a failure reads
/// whole wherever it is shown, without `mesh logs`.
pub fn describe_failure(end: &TaskEnd, stderr_line: Option<&str>) -> String {
    let said = describe_end(end);
    match (end, stderr_line) {
        (TaskEnd::Cached | TaskEnd::Cancelled | TaskEnd::CrashLimit, _) | (_, None) => said,
        (_, Some(line)) => format!("{said}: {line}"),
    }
}

/// A stage's stop (`max_fails`) in words: why, and how to change it.
pub fn describe_stop(stage: &str, stop: &Stop) -> String {
    let what = if stop.attempts == stop.tasks {
        format!("its first {} tasks", stop.tasks)
    } else {
        format!(
            "its first {} attempts ({} tasks)",
            stop.attempts, stop.tasks
        )
    };
    let cause = describe_failure(&stop.end, stop.stderr_line.as_deref());
    format!(
        "stage `{stage}` stopped after {what} failed the same way: {cause} (set max_fails to change this)"
    )
}
