//! A task's own `{out}`: a folder made for one attempt that shows exactly the outputs of the tasks it depends on, at `<stage>/<index>/<file>`, and nothing else.
//!
//! A task once read the farm's output folder itself, and a glob there
//! (`cat {out}/sim/*/part.txt`) saw whatever had finished: unfinished,
//! unrelated, stale or about to be remade. Now the folder it sees is built
//! from the graph, as a Nextflow task's work folder holds its inputs: a real
//! folder per dependency, and in it a link per file to where the output is
//! (the farm's output folder on its home, the node's own folder for the
//! farm elsewhere): a hard link on the same file system, else a symbolic
//! one. Links, so a gather over many outputs costs a link per file and no
//! bytes; real folders, so `find` and `os.walk` descend into them as into
//! the farm's own. Only a stage whose command or
//! environment names `{out}` gets one: a task that cannot see it costs
//! nothing. docs/design/task-view.md has the measurements.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mesh_protocol::farm::{FarmDef, TaskRef};

/// What one attempt's view is made of, to make off the node's loop (a
/// gather's view is a link per file of every task it depends on).
#[derive(Clone)]
pub struct TaskView {
    /// The folder the task sees as `{out}`: made before it starts, removed
    /// once it ends.
    pub dir: PathBuf,
    /// Where the outputs it depends on are, at `<stage>/<index>/`.
    pub base: PathBuf,
    pub def: Arc<dyn AsRef<FarmDef> + Send + Sync>,
    pub task: TaskRef,
}

/// Why a task's view could not be made (the task fails with it).
#[derive(Debug, thiserror::Error)]
#[error("cannot show the task what it depends on in {}: {source}", .path.display())]
pub struct ViewError {
    path: PathBuf,
    source: io::Error,
}

impl TaskView {
    /// Makes the folder: what an earlier attempt left there goes first.
    /// Returns how many files it shows.
    pub fn build(&self) -> Result<u64, ViewError> {
        let at = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ViewError { path, source }
        };
        crate::results::remove_folder(&self.dir).map_err(at(&self.dir))?;
        fs::create_dir_all(&self.dir).map_err(at(&self.dir))?;
        let def: &FarmDef = (*self.def).as_ref();
        let mut stages = HashSet::new();
        let mut shown = 0;
        let mut n = 0;
        while let Some(d) = def.dependency(self.task, n) {
            n += 1;
            let stage = def.stage(d);
            if stage.outputs.is_empty() {
                continue;
            }
            let rel = Path::new(&stage.name).join(d.index.to_string());
            let from = self.base.join(&rel);
            let mut files = Vec::new();
            match crate::results::walk(&from, &from, &mut files) {
                Ok(()) => {}
                // No folder: a grown place that is no task, or a task
                // that left no file.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(at(&from)(e)),
            }
            if stages.insert(d.stage) {
                let s = self.dir.join(&stage.name);
                fs::create_dir_all(&s).map_err(at(&s))?;
            }
            let to = self.dir.join(&rel);
            match fs::create_dir(&to) {
                Ok(()) => {}
                // The same task named twice (`after` and `by` on one stage).
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(at(&to)(e)),
            }
            for (file, path) in files {
                let dst = to.join(&file);
                if file.contains('/') {
                    let parent = dst.parent().unwrap_or(&to);
                    fs::create_dir_all(parent).map_err(at(parent))?;
                }
                // A hard link where it can be (no inode to make: measured
                // 17 µs a link here against 230 µs a symbolic one, and `find
                // -type f` sees a file), else, across file systems, a
                // symbolic one. Either way the task reads the file the
                // dependency left: outputs are replaced by a rename, never
                // written through, so a link keeps what it was made to.
                if fs::hard_link(&path, &dst).is_err() {
                    std::os::unix::fs::symlink(&path, &dst).map_err(at(&dst))?;
                }
                shown += 1;
            }
        }
        Ok(shown)
    }

    /// Removes the folder (the outputs it links to stay).
    pub fn remove(&self) {
        if let Err(e) = crate::results::remove_folder(&self.dir) {
            tracing::info!(dir = %self.dir.display(), "a task's view was not removed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_protocol::farm::{CommandTemplate, Sweep, SweepMode, SweepVar, Template, Values};

    fn stage(name: &str, n: usize, outputs: bool) -> mesh_protocol::farm::StageDef {
        let sweep = Sweep {
            vars: vec![SweepVar {
                name: "i".into(),
                values: Values::List((0..n).map(|i| i.to_string()).collect()),
            }],
            mode: SweepMode::Product,
        };
        let mut s = mesh_protocol::farm::StageDef::new(
            name,
            CommandTemplate::Shell(Template::literal("true")),
            sweep,
        );
        if outputs {
            s.outputs = vec![Template::literal("*")];
        }
        s
    }

    #[test]
    fn a_view_shows_the_outputs_of_its_dependencies_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        // Three sim tasks; merge/1 waits for sim/1 only (after_each).
        let mut merge = stage("merge", 3, true);
        merge.after_each = vec![0];
        let def = FarmDef {
            name: "f".into(),
            root: t.path().display().to_string(),
            out: out.display().to_string(),
            stages: vec![stage("sim", 3, true).into(), merge.into()].into(),
            graph: mesh_protocol::graph::GraphCache::default(),
        };
        for i in 0..3 {
            let d = out.join(format!("sim/{i}/sub"));
            fs::create_dir_all(&d).unwrap();
            fs::write(out.join(format!("sim/{i}/part.txt")), format!("{i}\n")).unwrap();
            fs::write(d.join("deep.txt"), "deep").unwrap();
        }
        // Stale and unrelated: never shown.
        fs::create_dir_all(out.join("sim/7")).unwrap();
        fs::write(out.join("sim/7/part.txt"), "stale").unwrap();
        fs::create_dir_all(out.join("other/0")).unwrap();
        let view = TaskView {
            dir: t.path().join("view"),
            base: out.clone(),
            def: Arc::new(def),
            task: TaskRef::new(1, 1),
        };
        // A leftover of an earlier attempt goes.
        fs::create_dir_all(view.dir.join("sim/2")).unwrap();
        assert_eq!(view.build().unwrap(), 2);
        let mut seen = Vec::new();
        crate::results::walk(&view.dir, &view.dir, &mut seen).unwrap();
        let mut seen: Vec<String> = seen.into_iter().map(|(r, _)| r).collect();
        seen.sort();
        assert_eq!(seen, ["sim/1/part.txt", "sim/1/sub/deep.txt"]);
        assert_eq!(
            fs::read_to_string(view.dir.join("sim/1/part.txt")).unwrap(),
            "1\n"
        );
        view.remove();
        assert!(!view.dir.exists());
        assert!(out.join("sim/1/part.txt").is_file(), "the outputs stay");
    }
}
