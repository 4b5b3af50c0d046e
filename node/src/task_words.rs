//! Tasks in people's words: the `stage/index` ids users give, how an attempt ended, and why a stage stopped.
//!
//! Shared by the single-machine runner and the mesh node, so `mesh run`
//! and a mesh speak of tasks alike.

use std::time::Duration;

use mesh_protocol::engine::{Stop, TaskEnd};
use mesh_protocol::farm::FarmDef;
use mesh_protocol::TaskRef;
use nix::sys::signal::Signal;

/// `stage/index` in a farm.
pub(crate) fn parse_task(def: &FarmDef, task: &str) -> Result<TaskRef, String> {
    let Some((stage, index)) = task.rsplit_once('/') else {
        return Err(format!(
            "`{task}` is not a task id (expected <stage>/<index>, e.g. solve/3)"
        ));
    };
    let Ok(index) = index.parse::<u32>() else {
        return Err(format!(
            "`{task}` is not a task id: `{index}` is not an index"
        ));
    };
    let Some(s) = def.stages.iter().position(|s| s.name == stage) else {
        let names: Vec<&str> = def.stages.iter().map(|s| s.name.as_str()).collect();
        return Err(format!(
            "farm {} has no stage `{stage}` (stages: {})",
            def.name,
            names.join(", ")
        ));
    };
    let len = def.stages[s].len();
    if index >= len {
        return Err(format!(
            "stage {stage} has tasks 0 to {}; there is no {task}",
            len.saturating_sub(1)
        ));
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
    let end = describe_end(&stop.end);
    let cause = match (&stop.end, &stop.stderr_line) {
        (TaskEnd::Exited(_) | TaskEnd::Signaled(_), Some(line)) => format!("{end}: {line}"),
        _ => end,
    };
    format!(
        "stage `{stage}` stopped after {what} failed the same way: {cause} (set max_fails to change this)"
    )
}
