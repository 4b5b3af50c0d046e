//! Warnings: what in a farm file is valid but likely a mistake, such as outputs collected from a folder that tasks running at once share.

use mesh_protocol::farm::{Part, StageDef, Var};

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
}

/// A placeholder that differs from task to task of a stage.
fn per_task(p: &Part) -> bool {
    matches!(p, Part::Var(Var::Index | Var::Sweep(_)))
}
