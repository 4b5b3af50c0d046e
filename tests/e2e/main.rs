//! End-to-end tests: the real `mesh` binary, real child processes, a real sled store on disk.
//!
//! One test binary (see cli/Cargo.toml) so the binary under test is built once.

mod alloc;
mod apart;
mod browser;
mod circles;
mod dashboard;
mod data;
mod describe;
mod exact;
mod export;
mod grown;
mod heal;
mod import;
mod input;
mod lengths;
mod mesh;
mod open;
mod oracle;
mod remote;
mod report;
mod resume;
mod right;
mod run;
mod sim;
mod tidy;
mod told;
mod used;
mod warm;
mod whatif;

use mesh_tests::Sandbox;

fn sandbox() -> Sandbox {
    Sandbox::new(env!("CARGO_BIN_EXE_mesh"))
}
