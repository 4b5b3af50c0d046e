//! Which folders of `{out}` are set aside so that it holds the farm as it is now: a stage that is gone, with its `tasks.tsv`, and indexes past a stage's last task.

use crate::farm::FarmDef;

/// A folder found directly under `{out}`, as the home read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Folder {
    /// Its name: a stage's, or one the farm no longer has.
    pub name: String,
    /// The names of the folders in it (a task's folder is its index).
    pub folders: Vec<String>,
    /// It has a manifest (`tasks.tsv`) as a file.
    pub manifest: bool,
}

/// What becomes of a stage's manifest when its task folders are set aside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Manifest {
    /// The stage is the farm's (or it has none): left where it is.
    Stays,
    /// Set aside with the folders it describes: it says which values
    /// each held; left behind, it kept the stage's folder in `{out}`.
    Moves,
    /// It describes no folder: mesh wrote it, nothing is lost.
    Removed,
}

/// The task folders of one folder of `{out}` to set aside (never deleted:
/// a user finds them in the set-aside folder, under the same
/// `<stage>/<index>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stale {
    /// The stage's folder under `{out}`.
    pub stage: String,
    /// The task folders in it to move, in the order found.
    pub folders: Vec<String>,
    /// The farm no longer has the stage: once its folders and manifest
    /// are gone, what mesh left of it goes too (a user's own files keep
    /// the folder).
    pub gone: bool,
    /// Its manifest's fate.
    pub manifest: Manifest,
}

/// Whether the home looks into a folder of `{out}` named `name`: hidden
/// ones (the set-aside folder, the stash) are mesh's own, and no glob
/// over `{out}` meets them.
pub fn looked_at(name: &str) -> bool {
    !name.starts_with('.')
}

/// A task folder's name: an index, as mesh writes it (`0`, `17`).
pub fn is_index(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_digit())
        && (name == "0" || !name.starts_with('0'))
}

/// The output folders of tasks the farm no longer has, from what was
/// found under `{out}`: every task folder of a stage that is gone, and
/// each index past its stage's last task (a sweep cut from 8 lines to 6),
/// in the order found; folders with nothing to set aside are left out.
///
/// A grown stage keeps every index below its most possible tasks: how many
/// it has is known only once it runs.
pub fn set_aside(def: &FarmDef, found: &[Folder]) -> Vec<Stale> {
    let mut stale = Vec::new();
    for f in found.iter().filter(|f| looked_at(&f.name)) {
        let indexes = f.folders.iter().filter(|n| is_index(n));
        match def.stages.iter().find(|s| s.name == f.name) {
            None => {
                let folders: Vec<String> = indexes.cloned().collect();
                let manifest = match (f.manifest, folders.is_empty()) {
                    (false, _) => Manifest::Stays,
                    (true, false) => Manifest::Moves,
                    (true, true) => Manifest::Removed,
                };
                stale.push(Stale {
                    stage: f.name.clone(),
                    folders,
                    gone: true,
                    manifest,
                });
            }
            Some(stage) => {
                let len = stage.sweep.len();
                let folders: Vec<String> = indexes
                    .filter(|n| n.parse::<u64>().is_ok_and(|i| i >= len))
                    .cloned()
                    .collect();
                if !folders.is_empty() {
                    stale.push(Stale {
                        stage: f.name.clone(),
                        folders,
                        gone: false,
                        manifest: Manifest::Stays,
                    });
                }
            }
        }
    }
    stale
}
