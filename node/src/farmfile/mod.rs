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
//! Its rooms: `document.rs` walks the file's tables into stages and
//! resolves the dependencies between them; `scope.rs` reads one table's
//! fields, each checked where it was written; `sweep.rs` reads sweeps
//! (parameter files, lists, ranges) into the values tasks are expanded
//! from; `error.rs` says what is wrong and where (file, line, column,
//! stage, field). What they share (a value with its place, a stage's raw
//! fields) is defined here, so each room reads it directly.

mod document;
mod error;
mod scope;
mod sweep;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};

use mesh_protocol::farm::{
    path_stays_inside, CommandTemplate, FarmDef, Part, StageDef, Sweep, SweepMode, SweepVar,
    Template, TemplateError, Values, Var, STAGE_TASKS_MAX,
};
use mesh_protocol::resources::{
    parse_amount, valid_resource_name, Amount, AmountError, Resources, CPU,
};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

pub use error::{FarmFileError, Invalid, Problem, RangeProblem};
// Each room calls the others' helpers by name.
use document::*;
use error::*;
use scope::*;
#[cfg(test)]
use sweep::parse_range;

/// How to load a farm, beyond the file itself.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// The output folder (`--out`); `None` means `<cwd>/mesh-out/<farm name>`.
    pub out: Option<PathBuf>,
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
    };
    let loaded = src.document(&doc, path)?;
    let out = match &opts.out {
        Some(out) => absolute(out)?,
        None => absolute(&Path::new("mesh-out").join(&loaded.name))?,
    };
    let def = FarmDef {
        name: loaded.name,
        root: utf8(&file, &root)?,
        out: utf8(&file, &out)?,
        stages: loaded.stages,
    };
    Ok((def, loaded.warnings))
}

const TOP_FIELDS: &[&str] = &["farm", "defaults", "stage"];
const FARM_FIELDS: &[&str] = &["name"];
/// Every stage field: its identity, everything `[defaults]` may set, its dependencies.
static STAGE_FIELDS: std::sync::LazyLock<Vec<&'static str>> = std::sync::LazyLock::new(|| {
    let mut f = vec!["name"];
    f.extend_from_slice(DEFAULT_FIELDS);
    f.extend_from_slice(&["after", "after_each"]);
    f
});
/// Stage fields that make sense for every stage: identity and dependencies do not.
const DEFAULT_FIELDS: &[&str] = &[
    "command",
    "shell",
    "sweep",
    "sweep_mode",
    "workdir",
    "inputs",
    "outputs",
    "env",
    "resources",
    "retries",
    "timeout",
    "expected",
    "success_codes",
];
const SWEEP_FIELDS: &[&str] = &["lines", "list", "range"];
const BUILTINS: &[&str] = &["index", "stage", "farm", "out"];

/// A value with where it was written, and whether it came from `[defaults]`.
#[derive(Clone, Debug)]
struct At<T> {
    v: T,
    pos: usize,
    dflt: bool,
}

#[derive(Clone, Debug)]
enum RawCommand {
    Argv(Vec<At<String>>),
    Shell(At<String>),
}

#[derive(Clone, Debug)]
struct RawVar {
    name: String,
    values: At<Values>,
}

/// One stage's (or `[defaults]`') fields, type-checked but not yet resolved.
#[derive(Clone, Debug, Default)]
struct Fields {
    name: Option<At<String>>,
    command: Option<At<RawCommand>>,
    sweep: Option<At<Vec<RawVar>>>,
    sweep_mode: Option<At<SweepMode>>,
    workdir: Option<At<String>>,
    inputs: Option<Vec<At<String>>>,
    outputs: Option<Vec<At<String>>>,
    env: Vec<(At<String>, At<String>)>,
    resources: Vec<(At<String>, At<Amount>)>,
    retries: Option<At<u32>>,
    timeout_ms: Option<At<u64>>,
    expected_ms: Option<At<u64>>,
    success_codes: Option<At<Vec<i32>>>,
    after: Option<Vec<At<String>>>,
    after_each: Option<Vec<At<String>>>,
}

impl Fields {
    /// Fills what the stage leaves out from `[defaults]`; for `env` and
    /// `resources` the merge is per key, so a stage can add one resource
    /// without repeating the others.
    fn with_defaults(mut self, d: &Fields) -> Fields {
        fn keyed<T: Clone>(
            own: Vec<(At<String>, T)>,
            d: &[(At<String>, T)],
        ) -> Vec<(At<String>, T)> {
            let mut merged: Vec<(At<String>, T)> = d
                .iter()
                .filter(|(k, _)| !own.iter().any(|(o, _)| o.v == k.v))
                .cloned()
                .collect();
            merged.extend(own);
            merged
        }
        self.command = self.command.or_else(|| d.command.clone());
        self.sweep = self.sweep.or_else(|| d.sweep.clone());
        self.sweep_mode = self.sweep_mode.or_else(|| d.sweep_mode.clone());
        self.workdir = self.workdir.or_else(|| d.workdir.clone());
        self.inputs = self.inputs.or_else(|| d.inputs.clone());
        self.outputs = self.outputs.or_else(|| d.outputs.clone());
        self.env = keyed(self.env, &d.env);
        self.resources = keyed(self.resources, &d.resources);
        self.retries = self.retries.or_else(|| d.retries.clone());
        self.timeout_ms = self.timeout_ms.or_else(|| d.timeout_ms.clone());
        self.expected_ms = self.expected_ms.or_else(|| d.expected_ms.clone());
        self.success_codes = self.success_codes.or_else(|| d.success_codes.clone());
        self
    }
}

/// Where in the farm a field lives; decides the error's context and field prefix.
#[derive(Clone, Debug)]
enum Ctx {
    Top,
    Farm,
    Defaults,
    /// A stage, by its label (`stage \`solve\`` or `stage #2`).
    Stage(String),
}

struct Src<'a> {
    file: &'a str,
    text: &'a str,
    root: &'a Path,
}

struct Loaded {
    name: String,
    stages: Vec<StageDef>,
    warnings: Vec<FarmWarning>,
}

/// A stage's dependency names, kept until every stage's task count is known.
struct Deps {
    after: Vec<At<String>>,
    after_each: Vec<At<String>>,
}

type Result<T, E = FarmFileError> = std::result::Result<T, E>;

/// Checks and errors for one section of the file.
struct Scope<'s> {
    src: &'s Src<'s>,
    ctx: Ctx,
    /// True while reading `[defaults]` itself.
    dflt: bool,
}
