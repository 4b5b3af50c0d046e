//! `mesh describe [--json]`: what this `mesh` takes and where it keeps its state, for clients that must agree with it.
//!
//! The Python package and the Snakemake plugin read these from the binary
//! instead of keeping copies that drift: the state folder (where a node's
//! socket is) and the order of a stage's fields (the farm text they write).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use mesh_node::farmfile;

use crate::out::outln;

pub fn describe(state: &Path, json: bool) -> Result<ExitCode> {
    if json {
        let v = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "state_dir": state,
            "stage_fields": farmfile::stage_fields(),
            "default_fields": farmfile::default_fields(),
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        outln!("mesh {}", env!("CARGO_PKG_VERSION"));
        outln!("state folder: {}", state.display());
        outln!("stage fields: {}", farmfile::stage_fields().join(", "));
        outln!(
            "[defaults] fields: {}",
            farmfile::default_fields().join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
