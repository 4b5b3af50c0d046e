//! `mesh report FARM [-o FILE]`: one HTML page of a farm, finished or running, to look at without a node or a network: its timeline per node and slot, what each stage used against its asks, its failures, the data it moved and its end as estimated.
//!
//! Read from what the node (or, for a `mesh run` farm, the store) already
//! gives: the trace `mesh export` writes and the view `mesh status FARM
//! --json` prints, so the page's figures are theirs.

mod draw;
mod model;
mod page;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use mesh_node::control::Target;
use mesh_node::eta::Estimated;
use mesh_node::runner::{self, RunError};
use mesh_node::state::{RunState, StateDir};
use mesh_node::used::StageUse;
use mesh_protocol::engine::Counts;

use crate::export_cmd;
use crate::out::outln;

/// What the page says of a farm beside its trace: its status.
#[derive(Clone, Debug, Default)]
pub struct About {
    pub id: String,
    pub name: String,
    pub state: String,
    pub home: Option<String>,
    pub finished: bool,
    pub counts: Counts,
    pub used: Vec<StageUse>,
    pub failures: Vec<String>,
    pub eta_history: Vec<Estimated>,
    /// Outputs brought home over the mesh.
    pub home_bytes: u64,
}

pub fn report(to: &Target, state: &StateDir, farm: &str, out: Option<&Path>) -> Result<ExitCode> {
    let about = about(to, state, farm)?;
    let trace = export_cmd::trace(to, state, farm)?;
    let model = model::Model::of(&trace);
    drop(trace);
    let made_at = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let html = page::render(&about, &model, &made_at)?;
    let path = match out {
        Some(p) if p == Path::new("-") => {
            outln!("{html}");
            return Ok(ExitCode::SUCCESS);
        }
        Some(p) => p.to_path_buf(),
        None => PathBuf::from(format!("{}-report.html", about.id)),
    };
    export_cmd::write_file(&path, &html)?;
    eprintln!(
        "wrote {}: {} tasks, {} runs, {} of HTML",
        path.display(),
        about.counts.total,
        model.runs.len(),
        mesh_node::view::bytes(html.len() as u64 + 1)
    );
    Ok(ExitCode::SUCCESS)
}

/// The farm's status from the node that knows it, else this machine's
/// `mesh run` farm from its store.
fn about(to: &Target, state: &StateDir, farm: &str) -> Result<About> {
    if let Some(v) = crate::mesh_cmds::farm_view(to, farm)? {
        return Ok(About {
            id: v.id.clone(),
            name: v.name.clone(),
            state: v.state_word().to_string(),
            home: Some(v.home.clone()).filter(|h| !h.is_empty()),
            finished: v.finished,
            counts: v.counts.clone(),
            used: v.used,
            failures: v.failures,
            eta_history: v.eta_history,
            home_bytes: v.data.home_bytes,
        });
    }
    if !to.is_local() {
        anyhow::bail!("the mesh knows no farm `{farm}` (see `mesh list`)");
    }
    let mut s = state.find(Some(farm))?;
    if s.state != RunState::Running {
        // Not running: the store has the exact picture, as `mesh status` reads it.
        match runner::inspect(state, &s.id) {
            Ok(i) => {
                s.counts = i.counts;
                s.used = i.used;
            }
            Err(RunError::AlreadyRunning { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(About {
        id: s.id.clone(),
        name: s.name.clone(),
        state: crate::show::state_word(s.state).to_string(),
        home: None,
        finished: s.state.is_finished(),
        counts: s.counts.clone(),
        used: s.used,
        failures: s
            .failed
            .iter()
            .map(|f| format!("{} (attempt {}): {}", f.task, f.attempt, f.reason))
            .collect(),
        eta_history: s.eta_history,
        home_bytes: 0,
    })
}
