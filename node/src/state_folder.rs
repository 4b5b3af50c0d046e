//! Which state folder a `mesh` uses: the one rule, for this process and for a node process seen in `/proc`.
//!
//! The Python package and the Snakemake plugin do not copy it: they ask the
//! binary (`mesh describe --json`), so that a client and the node it looks
//! for can never disagree on where the node's socket is.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The variable that names the state folder, as `--state-dir` does.
pub const STATE_DIR_VAR: &str = "MESH_STATE_DIR";

/// No state folder can be named.
#[derive(Debug, thiserror::Error)]
pub enum StateFolderError {
    #[error("no data folder is known for this user; pass --state-dir or set {STATE_DIR_VAR}")]
    NoDataFolder,
    #[error("--state-dir {}: cannot make it absolute: {source}", .path.display())]
    Absolute {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The state folder of an environment whose variables `var` gives (an
/// empty one counts as unset): `$MESH_STATE_DIR` as it is written
/// (relative to that process's folder), else `mesh` in the user's data
/// folder: `$XDG_DATA_HOME` where it is absolute (the XDG spec ignores a
/// relative one), else `~/.local/share`; `~/Library/Application Support`
/// on macOS. `~` is `$HOME`, else this user's home in the password
/// database, as `dirs` has it. `None` when there is no home at all.
pub fn resolve(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let var = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var(STATE_DIR_VAR) {
        return Some(dir);
    }
    let home = || var("HOME").or_else(dirs::home_dir);
    let data = if cfg!(target_os = "macos") {
        home()?.join("Library/Application Support")
    } else {
        match var("XDG_DATA_HOME").filter(|p| p.is_absolute()) {
            Some(xdg) => xdg,
            None => home()?.join(".local/share"),
        }
    };
    Some(data.join("mesh"))
}

/// This process's state folder, absolute: `flag` (`--state-dir`, or
/// `$MESH_STATE_DIR` as the argument parser read it), else [`resolve`] of
/// this process's environment.
pub fn of_this_process(flag: Option<&Path>) -> Result<PathBuf, StateFolderError> {
    let dir = match flag {
        Some(p) => p.to_path_buf(),
        None => resolve(|name| std::env::var_os(name)).ok_or(StateFolderError::NoDataFolder)?,
    };
    // Made absolute once, here: batch job scripts, the control socket and
    // the paths a node prints name it from wherever they are used.
    std::path::absolute(&dir).map_err(|source| StateFolderError::Absolute { path: dir, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn the_variable_first_then_the_users_data_folder() {
        let home = [("HOME", "/home/ada")];
        let mesh = [("HOME", "/home/ada"), ("MESH_STATE_DIR", "rel/state")];
        let xdg = [("HOME", "/home/ada"), ("XDG_DATA_HOME", "/data/ada")];
        let xdg_rel = [("HOME", "/home/ada"), ("XDG_DATA_HOME", "data")];
        let empty = [("HOME", "/home/ada"), ("MESH_STATE_DIR", "")];
        let p = |s: &str| Some(PathBuf::from(s));
        // A relative variable stays relative: only its process knows its folder.
        assert_eq!(resolve(env(&mesh)), p("rel/state"));
        if cfg!(target_os = "macos") {
            assert_eq!(
                resolve(env(&home)),
                p("/home/ada/Library/Application Support/mesh")
            );
            assert_eq!(
                resolve(env(&xdg)),
                p("/home/ada/Library/Application Support/mesh")
            );
        } else {
            assert_eq!(resolve(env(&home)), p("/home/ada/.local/share/mesh"));
            assert_eq!(resolve(env(&xdg)), p("/data/ada/mesh"));
            assert_eq!(resolve(env(&xdg_rel)), p("/home/ada/.local/share/mesh"));
            assert_eq!(resolve(env(&empty)), p("/home/ada/.local/share/mesh"));
        }
    }

    #[test]
    fn this_process_gets_an_absolute_folder() {
        let here = std::env::current_dir().unwrap();
        let dir = of_this_process(Some(Path::new("some/state"))).unwrap();
        assert_eq!(dir, here.join("some/state"));
    }
}
