//! Reads farm files (TOML) into a checked `FarmDef`, with errors that name the file, line and field.
//!
//! The file is parsed into toml's spanned document tree and walked by hand
//! rather than deserialized into serde structs: every key and value keeps its
//! byte span, so an error found late (after merging `[defaults]`, reading a
//! params file, or resolving dependencies between stages) can still say which
//! stage, which field and which line it is about. Nothing is run here; a farm
//! either loads completely or not at all. The format is documented for users
//! in `docs/farm-file.md`.
//!
//! `document` walks the file and runs the passes over its stages: `parse`
//! reads a table's fields, `sweep` their sweep variables, `stage` resolves
//! one stage, `deps` links stages, `warn` looks for likely mistakes. Every
//! error is located by `locate` and worded by `error`.

mod deps;
mod document;
mod error;
mod locate;
mod parse;
mod stage;
mod sweep;
mod warn;

#[cfg(test)]
mod tests;

use std::path::{Component, Path, PathBuf};

use mesh_protocol::farm::FarmDef;
use toml::de::DeTable;

pub use error::{FarmFileError, Invalid, Problem, RangeProblem};
pub use warn::FarmWarning;

use locate::syntax_error;

/// Every field a `[[stage]]` takes, in the order docs/farm-file.md lists
/// them (a test holds the parser, the docs and this list together): the
/// order the Python package writes a stage's fields in, read from
/// `mesh describe --json` rather than copied.
pub fn stage_fields() -> &'static [&'static str] {
    parse::STAGE_FIELDS.as_slice()
}

/// The stage fields `[defaults]` may set: not a stage's identity (`name`,
/// `key`) nor its dependencies.
pub fn default_fields() -> &'static [&'static str] {
    parse::DEFAULT_FIELDS
}

/// How to load a farm, beyond the file itself.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// The output folder (`--out`); `None` means `<cwd>/mesh-out/<farm name>`.
    pub out: Option<PathBuf>,
    /// The stages of an open farm the file's stages are added to: they
    /// come first, unchanged, and the file's may depend on them.
    pub before: mesh_protocol::farm::Stages,
    /// The dependency graph of `before` when built: its edges are taken as
    /// they are, so a growth's check costs what it adds.
    pub before_graph: Option<std::sync::Arc<mesh_protocol::graph::Graph>>,
}

impl LoadOptions {
    /// A farm of its own (no stages before its file's) with outputs in `out`.
    pub fn to(out: Option<PathBuf>) -> LoadOptions {
        LoadOptions {
            out,
            before: Default::default(),
            before_graph: None,
        }
    }
}

/// Reads and checks the farm file at `path`.
pub fn load(path: &Path, opts: &LoadOptions) -> Result<FarmDef, FarmFileError> {
    load_with_warnings(path, opts).map(|(def, _)| def)
}

/// Reads and checks the farm file at `path`, with what in it is valid but
/// likely not what its author meant (see [`FarmWarning`]).
pub fn load_with_warnings(
    path: &Path,
    opts: &LoadOptions,
) -> Result<(FarmDef, Vec<FarmWarning>), FarmFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FarmFileError::Read {
        file: path.display().to_string(),
        source,
    })?;
    load_str_with_warnings(path, &text, opts)
}

/// Checks a farm given as text. `path` names the file in messages, and its
/// folder is the farm root: params files and inputs are looked up there.
pub fn load_str(path: &Path, text: &str, opts: &LoadOptions) -> Result<FarmDef, FarmFileError> {
    load_str_with_warnings(path, text, opts).map(|(def, _)| def)
}

/// [`load_str`], with the file's warnings.
pub fn load_str_with_warnings(
    path: &Path,
    text: &str,
    opts: &LoadOptions,
) -> Result<(FarmDef, Vec<FarmWarning>), FarmFileError> {
    let file = path.display().to_string();
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let root = folder
        .canonicalize()
        .map_err(|source| FarmFileError::Root {
            file: file.clone(),
            folder: folder.display().to_string(),
            source,
        })?;
    let doc = DeTable::parse(text).map_err(|e| syntax_error(&file, text, &e))?;
    let src = Src {
        file: &file,
        text,
        root: &root,
        before: &opts.before,
        before_graph: opts.before_graph.as_deref(),
    };
    let loaded = src.document(&doc, path)?;
    let out = match &opts.out {
        Some(out) => absolute(out)?,
        None => absolute(&Path::new("mesh-out").join(&loaded.name))?,
    };
    let def = FarmDef {
        graph: mesh_protocol::graph::GraphCache::ready(loaded.graph),
        name: loaded.name,
        root: utf8(&file, &root)?,
        out: utf8(&file, &out)?,
        stages: loaded.stages,
    };
    Ok((def, loaded.warnings))
}

/// The file being loaded: its name for messages, its text for lines and
/// columns, its folder for parameter files and inputs.
struct Src<'a> {
    file: &'a str,
    text: &'a str,
    root: &'a Path,
    before: &'a mesh_protocol::farm::Stages,
    before_graph: Option<&'a mesh_protocol::graph::Graph>,
}

type Result<T, E = FarmFileError> = std::result::Result<T, E>;

/// `path` against the current directory, without `.` components.
fn absolute(path: &Path) -> Result<PathBuf> {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|source| FarmFileError::Cwd { source })?
            .join(path)
    };
    Ok(joined
        .components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect())
}

fn utf8(file: &str, path: &Path) -> Result<String> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| FarmFileError::NotUtf8 {
            file: file.to_string(),
            path: path.to_path_buf(),
        })
}
