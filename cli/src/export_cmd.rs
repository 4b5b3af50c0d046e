//! `mesh export FARM [-o FILE]`: a farm, finished or running, as a WfCommons trace (WfFormat 1.5), the inverse of `mesh import wfformat`: from the node that keeps a copy of it, or with no node here, from this machine's `mesh run` store.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use mesh_node::control::{
    Client, ControlError, ControlRequest, ControlResponse, ErrorKind, Target,
};
use mesh_node::runner::{self, RunError};
use mesh_node::state::StateDir;
use serde_json::Value;

use crate::out::outln;

pub fn export(to: &Target, state: &StateDir, farm: &str, out: Option<&Path>) -> Result<ExitCode> {
    let trace = trace(to, state, farm)?;
    let text = serde_json::to_string_pretty(&trace)?;
    match out {
        None => outln!("{text}"),
        Some(p) if p == Path::new("-") => outln!("{text}"),
        Some(p) => {
            write_file(p, &text)?;
            eprintln!("{}", summary(&trace, p));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The farm's trace: from the node, or with none here (or a node that
/// does not know the farm) from this machine's `mesh run` store.
pub fn trace(to: &Target, state: &StateDir, farm: &str) -> Result<Value> {
    match from_mesh(to, farm)? {
        Some(t) => Ok(t),
        None if !to.is_local() => bail!("the mesh knows no farm `{farm}` (see `mesh list`)"),
        None => from_store(state, farm),
    }
}

/// The trace from the node, `None` when there is none here or the mesh
/// does not know the farm (it may be a `mesh run` farm of this machine).
fn from_mesh(to: &Target, farm: &str) -> Result<Option<Value>> {
    let req = ControlRequest::Export {
        farm: farm.to_string(),
    };
    let mut c = match Client::request(to, &req) {
        Ok(c) => c,
        Err(ControlError::NoNode(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    match c.recv() {
        Some(Ok(ControlResponse::Trace(t))) => Ok(Some(*t)),
        Some(Ok(ControlResponse::Error {
            kind: ErrorKind::UnknownFarm,
            ..
        })) => Ok(None),
        Some(Ok(ControlResponse::Error {
            kind: ErrorKind::BadRequest,
            message,
        })) => bail!(
            "the node does not know `mesh export` ({message}): it runs an older mesh than this command"
        ),
        Some(Ok(ControlResponse::Error { message, .. })) => bail!("{message}"),
        Some(Ok(other)) => bail!("unexpected answer from the node: {other:?}"),
        Some(Err(e)) => Err(e.into()),
        None => bail!("the node closed the connection without an answer"),
    }
}

/// A `mesh run` farm of this machine, read from its store.
fn from_store(state: &StateDir, farm: &str) -> Result<Value> {
    let s = state.find(Some(farm))?;
    let facts = runner::export(state, &s.id).map_err(|e| match e {
        RunError::AlreadyRunning { .. } => anyhow::anyhow!(
            "{e}: `mesh export` reads a `mesh run` farm from its store, which the run holds until it stops; export it then"
        ),
        e => e.into(),
    })?;
    Ok(mesh_node::export::trace(&facts).0)
}

/// Writes `text` to `path` whole or not at all: beside it first, then renamed.
pub fn write_file(path: &Path, text: &str) -> Result<()> {
    if path.is_dir() {
        bail!(
            "{} is a folder: give a file to write, e.g. -o trace.json",
            path.display()
        );
    }
    let written = mesh_node::state::write_atomic(path, |w| {
        w.write_all(text.as_bytes())?;
        w.write_all(b"\n")
    });
    written.with_context(|| format!("cannot write {}", path.display()))
}

/// What was written, in a line: counted from the trace itself.
fn summary(t: &Value, path: &Path) -> String {
    let len = |v: &Value| v.as_array().map_or(0, Vec::len);
    let w = &t["workflow"];
    let tasks = w["specification"]["tasks"].as_array();
    let edges: usize = tasks.map_or(0, |ts| ts.iter().map(|t| len(&t["parents"])).sum());
    let ran = len(&w["execution"]["tasks"]);
    let machines = len(&w["execution"]["machines"]);
    format!(
        "wrote {}: WfFormat {} trace of {}, {} tasks ({ran} with a recorded run), {edges} edges, {} files, {machines} machines",
        path.display(),
        t["schemaVersion"].as_str().unwrap_or("?"),
        t["name"].as_str().unwrap_or("?"),
        tasks.map_or(0, Vec::len),
        len(&w["specification"]["files"]),
    )
}
