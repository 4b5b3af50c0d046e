//! Warnings: what in a farm file is valid but likely a mistake, such as outputs collected from a folder that tasks running at once share, or a program that is nowhere to be found.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use mesh_protocol::farm::{CommandTemplate, Part, StageDef, Var};

use super::Src;

/// Something valid in a farm file that is likely a mistake: the farm runs,
/// and `mesh check`, `mesh run` and `mesh submit` say it first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FarmWarning {
    pub file: String,
    pub line: usize,
    /// The dotted field, e.g. `stage.outputs`.
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for FarmWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: {}: {}",
            self.file, self.line, self.field, self.message
        )
    }
}

impl Src<'_> {
    /// Stages that collect `outputs` from a folder their tasks share with
    /// other tasks running at the same time (no per-task `workdir`): one
    /// task's output is overwritten or half-written by another's before it
    /// is collected, silently.
    pub(super) fn shared_outputs(
        &self,
        stages: &mesh_protocol::farm::Stages,
        from: usize,
        outputs_at: &[Option<(usize, bool)>],
    ) -> Vec<FarmWarning> {
        // The folder a stage's tasks all run in, when they share one.
        let shared = |s: &StageDef| -> Option<String> {
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
        };
        let reaches = |from: usize, to: usize| {
            let mut seen = vec![false; stages.len()];
            let mut todo = vec![from];
            while let Some(i) = todo.pop() {
                if i == to {
                    return true;
                }
                if !std::mem::replace(&mut seen[i], true) {
                    let s = &stages[i];
                    todo.extend(s.upstream().map(|t| t as usize));
                }
            }
            false
        };
        let mut out = Vec::new();
        // Only the stages this file adds: those there before were warned
        // of when they came.
        for (i, s) in mesh_protocol::farm::from_on(stages, from) {
            let Some((pos, dflt)) = outputs_at[i - from] else {
                continue;
            };
            let Some(folder) = shared(s) else {
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
            } else if let Some(j) = (0..i).find(|&j| {
                shared(&stages[j]).as_ref() == Some(&folder) && !reaches(i, j) && !reaches(j, i)
            }) {
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
}

impl Src<'_> {
    /// Stages whose `command` names a program their tasks cannot start:
    /// a bare name that is not on PATH (a script in the farm's folder
    /// needs `./`), or a relative path that is neither in the folder the
    /// tasks run in nor one of their inputs, or not executable. Every
    /// task fails alike then, and `max_fails` stops the stage; this says
    /// so before anything runs. Only a `command` whose program has no
    /// placeholder; a `shell` line is the shell's to resolve.
    pub(super) fn missing_programs(
        &self,
        stages: &[Arc<StageDef>],
        command_at: &[Option<(usize, bool)>],
    ) -> Vec<FarmWarning> {
        let mut out = Vec::new();
        for (s, at) in stages.iter().zip(command_at) {
            let (CommandTemplate::Argv(argv), Some((pos, dflt))) = (&s.command, at) else {
                continue;
            };
            let Some(program) = argv.first().filter(|p| p.is_static()) else {
                continue;
            };
            // The stage's own PATH is for its tasks, not for this machine.
            if s.env.iter().any(|(k, _)| k == "PATH") {
                continue;
            }
            let Some(message) = self.program_problem(s, &program.literal_text()) else {
                continue;
            };
            out.push(FarmWarning {
                file: self.file.to_string(),
                line: self.line_col(*pos).0,
                field: if *dflt {
                    "defaults.command".into()
                } else {
                    "stage.command".into()
                },
                message: format!("stage `{}` runs {message}", s.name),
            });
        }
        out
    }

    /// What keeps the tasks of `s` from starting `program`, if anything.
    fn program_problem(&self, s: &StageDef, program: &str) -> Option<String> {
        let relative = program.trim_start_matches("./");
        let input = s
            .inputs
            .iter()
            .any(|i| i.is_static() && i.literal_text().trim_start_matches("./") == relative);
        let in_farm = self.root.join(relative);
        if !program.contains('/') {
            if which::which(program).is_ok() {
                return None;
            }
            let here = in_farm.is_file() && (s.workdir.is_none() || input);
            let fix = if here {
                format!(": the one in the farm's folder is run as `./{program}`")
            } else if in_farm.is_file() {
                format!(
                    ": to run the one in the farm's folder, list it in `inputs` and write `./{program}`"
                )
            } else {
                ", so its tasks will not start".to_string()
            };
            return Some(format!("`{program}`, which is not on PATH{fix}"));
        }
        if Path::new(program).is_absolute() {
            // Another machine may have it where this one does not.
            return None;
        }
        // Where the tasks run, when the file can tell: the farm's folder
        // or one folder for all. A stage after others may run what they
        // made.
        let folder = match &s.workdir {
            None => Some(self.root.to_path_buf()),
            Some(w) if w.is_static() => Some(self.root.join(w.literal_text())),
            Some(_) => None,
        };
        let found = if input {
            Some(in_farm)
        } else {
            folder
                .as_ref()
                .map(|f| f.join(relative))
                .filter(|p| p.is_file())
        };
        let made_before = s.upstream().next().is_some();
        match found {
            Some(p) if !executable(&p) => Some(format!(
                "`{program}`, which is not executable, so its tasks will not start (`chmod +x {relative}`, or run it with `sh`)"
            )),
            Some(_) => None,
            None if folder.is_none() || made_before => None,
            None => Some(format!(
                "`{program}`, which is neither in the folder its tasks run in nor one of their inputs, so its tasks will not start"
            )),
        }
    }
}

fn executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

/// A placeholder that differs from task to task of a stage.
fn per_task(p: &Part) -> bool {
    matches!(p, Part::Var(Var::Index | Var::Sweep(_)))
}
