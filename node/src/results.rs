//! The results a farm has seen, by content key: where each success left its outputs, so a task whose key succeeded before is not run again and its outputs are put wherever they are wanted now.
//!
//! A success is written down as a [`Place`]: the task's output folder and
//! each file in it with its size and modification time. A place counts only
//! while every one of its files is still there unchanged, so outputs a user
//! deleted or edited are made again rather than trusted. Several places are
//! kept per key (the same farm sent to several `--out` folders), newest
//! first.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use mesh_protocol::farm::FarmDef;
use mesh_protocol::home;
use serde::{Deserialize, Serialize};

use crate::state::{remove_if_stale_put, PUT_SUFFIX};

/// Places kept per key: enough for a few `--out` folders in turn.
pub const PLACES_MAX: usize = 4;

/// One output file as its task left it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    /// Relative to the task's output folder.
    pub path: String,
    pub size: u64,
    /// Nanoseconds since the Unix epoch.
    pub mtime_ns: u64,
}

/// A task's output folder after a success, as it was left.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    pub dir: String,
    pub files: Vec<Stamp>,
}

/// Every place a content key's outputs were left, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Results {
    pub places: Vec<Place>,
}

/// The name a key's results are kept under in a farm's store.
pub fn meta_name(key: &[u8; 32]) -> String {
    format!("result/{}", blake3::Hash::from(*key).to_hex())
}

impl Results {
    /// Writes down a success that left `dir` as `files`.
    pub fn add(&mut self, place: Place) {
        self.places.retain(|p| p.dir != place.dir);
        self.places.insert(0, place);
        self.places.truncate(PLACES_MAX);
    }

    /// The newest place whose files are all still there unchanged.
    pub fn whole(&self) -> Option<&Place> {
        self.places.iter().find(|p| p.intact())
    }

    /// Makes `dir` hold the outputs of this key, from a place whose files
    /// are all still there unchanged: none to do when `dir` is that place,
    /// else each file linked (or copied) into `dir`.
    pub fn reuse(&mut self, dir: &Path) -> io::Result<Reused> {
        let before = self.places.len();
        self.places.retain(Place::intact);
        let changed = self.places.len() != before;
        let want = dir.to_string_lossy();
        if self.places.iter().any(|p| p.dir == want) {
            return Ok(Reused {
                here: true,
                changed,
            });
        }
        let Some(from) = self.places.first().cloned() else {
            return Ok(Reused {
                here: false,
                changed,
            });
        };
        let mut placed = Vec::with_capacity(from.files.len());
        for f in &from.files {
            let src = Path::new(&from.dir).join(&f.path);
            let dst = dir.join(&f.path);
            put(&src, &dst)?;
            placed.push(stamp(&dst, f.path.clone())?);
        }
        // What an earlier run left in `dir` is not this key's output.
        prune(dir, &from.files.iter().map(|f| f.path.as_str()).collect())?;
        self.add(Place {
            dir: want.into_owned(),
            files: placed,
        });
        Ok(Reused {
            here: true,
            changed: true,
        })
    }
}

/// What [`Results::reuse`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reused {
    /// The outputs are in the folder: false when no place was whole any
    /// more, and the task must run again.
    pub here: bool,
    /// The places were updated (a new one written down, or stale ones
    /// dropped): to be written down again.
    pub changed: bool,
}

impl Reused {
    /// Not reused, and the places to be written down again (they could
    /// not be read or checked).
    pub const FAILED: Reused = Reused {
        here: false,
        changed: true,
    };
}

impl Results {
    /// The place at `from` now is at `to`: the folder is moved there when
    /// it is still whole (false, and nothing moved, when it is not, or when
    /// this key has no place at `from`).
    pub fn moved(&mut self, from: &Path, to: &Path) -> io::Result<bool> {
        let want = from.to_string_lossy();
        let Some(p) = self.places.iter_mut().find(|p| p.dir == want) else {
            return Ok(false);
        };
        if !p.intact() {
            return Ok(false);
        }
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::rename(from, to)?;
        p.dir = to.to_string_lossy().into_owned();
        Ok(true)
    }

    /// The place at `from` was moved to `to` by someone else (outputs set
    /// aside): written down there.
    pub fn renamed(&mut self, from: &Path, to: &Path) -> bool {
        let want = from.to_string_lossy();
        match self.places.iter_mut().find(|p| p.dir == want) {
            Some(p) => {
                p.dir = to.to_string_lossy().into_owned();
                true
            }
            None => false,
        }
    }
}

/// The name under which a farm's store says which content key's result a
/// folder holds (see the runner's `keep_aside`).
pub fn holder_name(dir: &Path) -> String {
    format!(
        "holds/{}",
        blake3::hash(dir.as_os_str().as_encoded_bytes()).to_hex()
    )
}

/// Where a run keeps aside, until it ends, results it is about to replace
/// that another task of the farm is now known by: under `out`, so a folder
/// moves there by a rename.
pub const STASH_DIR: &str = ".mesh-stash";

impl Place {
    /// Every file of `dir`, stamped (none when it does not exist).
    pub fn of(dir: &Path) -> io::Result<Place> {
        let mut found = Vec::new();
        match fs::metadata(dir) {
            Ok(m) if m.is_dir() => walk(dir, dir, &mut found)?,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut files = found
            .into_iter()
            .map(|(rel, p)| stamp(&p, rel))
            .collect::<io::Result<Vec<Stamp>>>()?;
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(Place {
            dir: dir.to_string_lossy().into_owned(),
            files,
        })
    }

    /// What a success left in `dir`: its files stamped, or none at all
    /// for a task that has no outputs (its folder is not looked at).
    pub fn left(dir: &Path, outputs: bool) -> io::Result<Place> {
        if outputs {
            return Place::of(dir);
        }
        Ok(Place {
            dir: dir.to_string_lossy().into_owned(),
            files: Vec::new(),
        })
    }

    fn intact(&self) -> bool {
        let dir = Path::new(&self.dir);
        self.files
            .iter()
            .all(|f| stamp(&dir.join(&f.path), f.path.clone()).is_ok_and(|s| s == *f))
    }
}

/// Puts `src` at `dst` as a file of its own: a copy, which keeps the mode
/// (`copy_file_range`, so a file system that can share extents, such as
/// btrfs or XFS, does so without writing the bytes again). Never a hard
/// link: a user who edits one `--out`'s results in place would change every
/// other folder's, and the place a later reuse copies from. The copy is
/// made beside `dst` under a name of its own and renamed over it, so a
/// reader (another task of the node placing the same dependency, a grown
/// task reading its line) sees the old file or the whole new one, never a
/// half-written one; what was at `dst` is replaced, never written through.
pub fn put(src: &Path, dst: &Path) -> io::Result<()> {
    put_with(dst, |tmp| fs::copy(src, tmp).map(|_| ()))
}

/// Puts a copy of `src` at `dst` as [`put`] does, with permission bits
/// `mode` (0: `src`'s). The bits are given to the copy before it is
/// renamed into place: a file another task copies or runs from `dst`
/// (a staged wrapper, copied into each task's folder) is never seen
/// with the cache's bits in between.
pub fn put_as(src: &Path, dst: &Path, mode: u32) -> io::Result<()> {
    put_with(dst, |tmp| {
        fs::copy(src, tmp)?;
        give_mode(tmp, mode)
    })
}

/// Puts `data` at `dst` as [`put_as`] puts a copy: whole or not at all,
/// with permission bits `mode` (0: a new file's).
pub fn put_bytes(data: &[u8], dst: &Path, mode: u32) -> io::Result<()> {
    put_with(dst, |tmp| {
        fs::write(tmp, data)?;
        give_mode(tmp, mode)
    })
}

/// Gives `path` permission bits `mode` (0: leaves them as they are).
pub fn give_mode(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if mode == 0 {
        return Ok(());
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

fn put_with(dst: &Path, write: impl FnOnce(&Path) -> io::Result<()>) -> io::Result<()> {
    static PUTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if let Some(d) = dst.parent() {
        fs::create_dir_all(d)?;
    }
    let n = PUTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = dst.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dst.with_file_name(format!(".{name}.{}.{n}{PUT_SUFFIX}", std::process::id()));
    let written = write(&tmp).and_then(|_| fs::rename(&tmp, dst));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

fn stamp(path: &Path, rel: String) -> io::Result<Stamp> {
    let m = fs::metadata(path)?;
    if !m.is_file() {
        return Err(io::Error::other("not a file"));
    }
    let mtime_ns = m
        .modified()?
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    Ok(Stamp {
        path: rel,
        size: m.len(),
        mtime_ns,
    })
}

/// Removes under `dir` the copies [`put`] began in a process that is gone
/// (killed before it renamed them); those of a live one are still coming.
fn remove_stale_puts(dir: &Path) -> io::Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            remove_stale_puts(&e.path())?;
        } else {
            remove_if_stale_put(&e)?;
        }
    }
    Ok(())
}

/// Every file under `dir`, with its path relative to `base`; a copy that
/// [`put`] is still making is none.
pub fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> io::Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let p: PathBuf = e.path();
        if e.file_name().to_string_lossy().ends_with(PUT_SUFFIX) {
            continue;
        }
        if e.file_type()?.is_dir() {
            walk(base, &p, out)?;
        } else {
            let rel = p
                .strip_prefix(base)
                .unwrap_or(&p)
                .to_string_lossy()
                .into_owned();
            out.push((rel, p));
        }
    }
    Ok(())
}

/// Removes every file under `dir` that `keep` (paths relative to `dir`) does
/// not name, and the folders that leaves empty: a task's output folder
/// holds what its last run made and nothing of an earlier one (a
/// chromosome dropped from the farm once stayed beside the new ones, and a
/// gather read it). A missing `dir` is empty already.
pub fn prune(dir: &Path, keep: &HashSet<&str>) -> io::Result<()> {
    let mut found = Vec::new();
    match walk(dir, dir, &mut found) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    remove_stale_puts(dir)?;
    let mut emptied = HashSet::new();
    for (rel, path) in found {
        if !keep.contains(rel.as_str()) {
            fs::remove_file(&path)?;
            if let Some(parent) = path.parent().filter(|p| *p != dir) {
                emptied.insert(parent.to_path_buf());
            }
        }
    }
    // Deepest first; a folder that still holds something stays.
    let mut emptied: Vec<PathBuf> = emptied.into_iter().collect();
    emptied.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for d in emptied {
        let mut at = d.as_path();
        while at != dir && at.starts_with(dir) && fs::remove_dir(at).is_ok() {
            match at.parent() {
                Some(p) => at = p,
                None => break,
            }
        }
    }
    Ok(())
}

/// Removes a task's output folder before it runs again (none is fine).
pub fn remove_folder(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The folder under `out` where outputs of tasks no longer in the farm are
/// set aside: hidden, so no glob over `{out}` meets it, and one per run, so
/// nothing set aside earlier is overwritten.
pub const SET_ASIDE_DIR: &str = ".mesh-set-aside";

/// Moves out of `out` the output folders of tasks the farm no longer has: a
/// stage that is gone, or an index past its stage's last task (a sweep cut
/// from 8 lines to 6), to `<out>/.mesh-set-aside/<when>/<stage>/<index>`
/// (`<when>` in UTC, to the millisecond).
/// Never deleted: a user finds them there. Returns where they went and how
/// many task folders, or `None` when nothing was stale.
///
/// Which ones is `home::set_aside`'s to say, from what is found here.
pub fn set_aside_stale(out: &Path, def: &FarmDef, when_ms: u64) -> io::Result<Option<SetAside>> {
    let found = match found_in(out) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_millis(when_ms);
    let aside = out
        .join(SET_ASIDE_DIR)
        .join(humantime::format_rfc3339_millis(when).to_string());
    let mut moves = Vec::new();
    for stale in home::set_aside(def, &found) {
        let stage = out.join(&stale.stage);
        for name in &stale.folders {
            let (from, to) = (stage.join(name), aside.join(&stale.stage).join(name));
            if let Some(p) = to.parent() {
                fs::create_dir_all(p)?;
            }
            fs::rename(&from, &to)?;
            moves.push((from, to));
        }
        match stale.manifest {
            home::Manifest::Stays => {}
            home::Manifest::Moves => fs::rename(
                stage.join(MANIFEST),
                aside.join(&stale.stage).join(MANIFEST),
            )?,
            home::Manifest::Removed => fs::remove_file(stage.join(MANIFEST))?,
        }
        if stale.gone {
            // A user's own files keep the folder (never deleted).
            remove_stale_puts(&stage)?;
            let _ = fs::remove_dir(&stage);
        }
    }
    Ok((!moves.is_empty()).then_some(SetAside { to: aside, moves }))
}

/// What `out` holds, as `home::set_aside` decides from: each folder the
/// home looks at, with the folders in it and whether it has a manifest.
/// Names that are not UTF-8 are no task's or stage's, and not listed.
fn found_in(out: &Path) -> io::Result<Vec<home::Folder>> {
    let mut found = Vec::new();
    for e in fs::read_dir(out)? {
        let e = e?;
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        if !home::looked_at(&name) || !e.file_type()?.is_dir() {
            continue;
        }
        let mut folders = Vec::new();
        for t in fs::read_dir(e.path())? {
            let t = t?;
            if t.file_type()?.is_dir() {
                if let Ok(n) = t.file_name().into_string() {
                    folders.push(n);
                }
            }
        }
        let manifest = e.path().join(MANIFEST).is_file();
        found.push(home::Folder {
            name,
            folders,
            manifest,
        });
    }
    Ok(found)
}

/// Task folders set aside: where, and each one's old and new path.
#[derive(Debug)]
pub struct SetAside {
    pub to: PathBuf,
    pub moves: Vec<(PathBuf, PathBuf)>,
}

/// The name of a stage's manifest under `<out>/<stage>/`.
pub const MANIFEST: &str = "tasks.tsv";

/// Writes `<out>/<stage>/tasks.tsv` for each stage that leaves outputs: a
/// header (`index` and the sweep's variables) and a line per task, its
/// index and its values, so a user can tell which folder holds which
/// values (folders keep index names; a task is known by its values).
/// Tabs, newlines and backslashes in values are written `\t`, `\n`,
/// `\\`. A grown stage has none: its values are known as it runs.
pub fn write_manifests(out: &Path, stages: &mesh_protocol::farm::Stages) -> io::Result<()> {
    use std::io::Write as _;
    for stage in stages {
        if stage.outputs.is_empty() || stage.sweep.grown().is_some() {
            continue;
        }
        let dir = out.join(&stage.name);
        fs::create_dir_all(&dir)?;
        crate::state::write_atomic(&dir.join(MANIFEST), |w| {
            let escape = |v: &str| {
                v.replace('\\', "\\\\")
                    .replace('\t', "\\t")
                    .replace('\n', "\\n")
            };
            write!(w, "index")?;
            for v in &stage.sweep.vars {
                write!(w, "\t{}", escape(&v.name))?;
            }
            writeln!(w)?;
            for i in 0..stage.len() {
                write!(w, "{i}")?;
                for value in stage.sweep.binding(i) {
                    write!(w, "\t{}", escape(&value))?;
                }
                writeln!(w)?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// What a user is told of outputs set aside.
pub fn set_aside_line(n: u64, to: &Path) -> String {
    let s = if n == 1 { "" } else { "s" };
    format!(
        "moved the outputs of {n} task{s} no longer in the farm to {}",
        to.display()
    )
}

/// Per stage, whether `--rerun` names it or a stage it depends on (see
/// `home::rerun_stages`).
pub use mesh_protocol::home::rerun_stages;

#[cfg(test)]
mod tests {
    use super::*;

    fn write(p: &Path, text: &str) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    #[test]
    fn a_success_is_put_in_a_new_folder_and_an_edited_one_is_not_trusted() {
        let t = tempfile::tempdir().unwrap();
        let a = t.path().join("a/solve/0");
        write(&a.join("r.txt"), "10");
        write(&a.join("logs/x.log"), "log");
        let mut r = Results::default();
        r.add(Place::of(&a).unwrap());
        assert_eq!(
            r.reuse(&a).unwrap(),
            Reused {
                here: true,
                changed: false
            },
            "already in place"
        );

        let b = t.path().join("b/solve/0");
        assert_eq!(
            r.reuse(&b).unwrap(),
            Reused {
                here: true,
                changed: true
            }
        );
        assert_eq!(fs::read_to_string(b.join("r.txt")).unwrap(), "10");
        assert_eq!(fs::read_to_string(b.join("logs/x.log")).unwrap(), "log");
        assert_eq!(r.places.len(), 2);

        // Both folders edited: no place is whole, the task must run again.
        std::thread::sleep(std::time::Duration::from_millis(5));
        write(&a.join("r.txt"), "70");
        fs::remove_file(b.join("r.txt")).unwrap();
        let c = t.path().join("c/solve/0");
        assert_eq!(r.reuse(&c).unwrap(), Reused::FAILED);
        assert!(r.places.is_empty());
    }

    #[test]
    fn placing_unlinks_what_was_there_instead_of_writing_through_it() {
        let t = tempfile::tempdir().unwrap();
        let (src, dst, other) = (
            t.path().join("src"),
            t.path().join("dst"),
            t.path().join("other"),
        );
        write(&src, "new");
        write(&other, "kept");
        fs::hard_link(&other, &dst).unwrap();
        put(&src, &dst).unwrap();
        assert_eq!(fs::read_to_string(&dst).unwrap(), "new");
        assert_eq!(fs::read_to_string(&other).unwrap(), "kept");
    }

    #[test]
    fn a_put_file_is_its_own_so_editing_it_leaves_the_source_alone() {
        use std::io::Write;
        let t = tempfile::tempdir().unwrap();
        let (src, dst) = (t.path().join("e1/o.txt"), t.path().join("e2/o.txt"));
        write(&src, "made\n");
        put(&src, &dst).unwrap();
        fs::OpenOptions::new()
            .append(true)
            .open(&dst)
            .unwrap()
            .write_all(b"tampered\n")
            .unwrap();
        assert_eq!(fs::read_to_string(&src).unwrap(), "made\n");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(fs::metadata(&src).unwrap().nlink(), 1);
    }

    #[test]
    fn a_copy_begun_by_a_process_that_is_gone_is_pruned_and_a_live_ones_stays() {
        // The oracle's seed 17: `mesh run` SIGKILLed while it put a reused
        // output left `.seen.txt.<pid>.<n>.mesh-put` beside the outputs.
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("s1/0");
        write(&dir.join("seen.txt"), "kept");
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let stale = dir.join(format!(".seen.txt.{gone_pid}.1{PUT_SUFFIX}"));
        let live = dir.join(format!(".id.txt.{}.2{PUT_SUFFIX}", std::process::id()));
        write(&stale, "half");
        write(&live, "coming");
        prune(&dir, &["seen.txt"].into_iter().collect()).unwrap();
        assert!(!stale.exists(), "a dead process's copy goes");
        assert!(live.exists(), "this process's copy is still coming");
        assert_eq!(fs::read_to_string(dir.join("seen.txt")).unwrap(), "kept");
    }

    #[test]
    fn a_manifest_begun_by_a_process_that_is_gone_is_swept_when_the_next_run_writes_it() {
        // The oracle's seed 2 in CI: `mesh run` SIGKILLed while it wrote
        // tasks.tsv left a temporary file in the stage's folder for good.
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        let farm = t.path().join("farm.toml");
        let text = "[farm]\nname = \"m\"\n[[stage]]\nname = \"s0\"\n\
                    sweep.u = { range = \"1..3\" }\noutputs = [\"id.txt\"]\nshell = \"true\"\n";
        let opts = crate::farmfile::LoadOptions::to(Some(out.clone()));
        let def = crate::farmfile::load_str(&farm, text, &opts).unwrap();
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let stale = out.join(format!("s0/.{MANIFEST}.{gone_pid}.x1Yz9q{PUT_SUFFIX}"));
        write(&stale, "ind");
        write_manifests(&out, &def.stages).unwrap();
        let mut names: Vec<String> = fs::read_dir(out.join("s0"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [MANIFEST],
            "the stage's folder holds its manifest alone"
        );
        assert_eq!(
            fs::read_to_string(out.join("s0").join(MANIFEST)).unwrap(),
            "index\tu\n0\t1\n1\t2\n2\t3\n"
        );
    }

    #[test]
    fn a_stage_removed_from_the_farm_leaves_no_folder_in_out() {
        // Issue 65: its task folders went aside, its tasks.tsv stayed and
        // kept `{out}/s1`, a stage the farm no longer has.
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        let farm = t.path().join("farm.toml");
        let stage = |n: &str| {
            format!(
                "[[stage]]\nname = \"{n}\"\nsweep.u = {{ range = \"1..2\" }}\n\
                 outputs = [\"id.txt\"]\nshell = \"true\"\n"
            )
        };
        let opts = crate::farmfile::LoadOptions::to(Some(out.clone()));
        let load = |stages: &[&str]| {
            let text = format!(
                "[farm]\nname = \"m\"\n{}",
                stages.iter().map(|n| stage(n)).collect::<String>()
            );
            crate::farmfile::load_str(&farm, &text, &opts).unwrap()
        };
        let before = load(&["s0", "s1", "s2"]);
        write_manifests(&out, &before.stages).unwrap();
        for s in ["s0", "s1"] {
            for i in 0..2 {
                write(&out.join(format!("{s}/{i}/id.txt")), &format!("{s}.{i}"));
            }
        }
        // s2 never ran: its manifest alone. s3 is no stage mesh wrote, but
        // holds a user's notes.
        write(&out.join("s3/notes.txt"), "mine");
        let after = load(&["s0"]);
        let aside = set_aside_stale(&out, &after, 0)
            .unwrap()
            .expect("s1 set aside");
        assert_eq!(aside.moves.len(), 2, "two task folders");
        let mut left: Vec<String> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [SET_ASIDE_DIR, "s0", "s3"],
            "{{out}} holds the farm as it is"
        );
        assert_eq!(
            fs::read_to_string(aside.to.join("s1").join(MANIFEST)).unwrap(),
            "index\tu\n0\t1\n1\t2\n",
            "the manifest went with the folders it describes"
        );
        assert_eq!(
            fs::read_to_string(aside.to.join("s1/1/id.txt")).unwrap(),
            "s1.1"
        );
        assert_eq!(
            fs::read_to_string(out.join("s3/notes.txt")).unwrap(),
            "mine"
        );
    }

    #[test]
    fn an_executable_output_stays_executable_when_put() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let (src, dst) = (t.path().join("run.sh"), t.path().join("x/run.sh"));
        write(&src, "#!/bin/sh\n");
        fs::set_permissions(&src, fs::Permissions::from_mode(0o755)).unwrap();
        put(&src, &dst).unwrap();
        assert_eq!(
            fs::metadata(&dst).unwrap().permissions().mode() & 0o777,
            0o755
        );
    }

    /// Seed 004's wrapper: staged once into the farm's folder and copied
    /// from there into each task's, while another task of the node may be
    /// placing it again. A reader must never find it without its bits.
    #[test]
    fn a_file_put_with_its_mode_is_never_seen_without_it() {
        use std::os::unix::fs::PermissionsExt;
        use std::sync::atomic::{AtomicBool, Ordering};
        let t = tempfile::tempdir().unwrap();
        let (cached, dst) = (t.path().join("cached"), t.path().join("root/wrapper.sh"));
        write(&cached, "#!/bin/sh\necho hi\n");
        fs::set_permissions(&cached, fs::Permissions::from_mode(0o644)).unwrap();
        put_as(&cached, &dst, 0o755).unwrap();
        let done = AtomicBool::new(false);
        let seen = std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut wrong = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    if let Ok(m) = fs::metadata(&dst) {
                        let mode = m.permissions().mode() & 0o777;
                        if mode != 0o755 {
                            wrong.push(format!("{mode:o}"));
                        }
                    }
                }
                wrong
            });
            for _ in 0..2000 {
                put_as(&cached, &dst, 0o755).unwrap();
            }
            put_bytes(b"#!/bin/sh\n", &dst, 0o755).unwrap();
            done.store(true, Ordering::Relaxed);
            reader.join().unwrap()
        });
        assert!(seen.is_empty(), "seen with modes {seen:?}");
        assert_eq!(fs::read_to_string(&dst).unwrap(), "#!/bin/sh\n");
    }
}
