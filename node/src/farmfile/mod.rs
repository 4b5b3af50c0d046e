//! Reads farm files (TOML) into a checked `FarmDef`, with errors that name the file, line and field.
//!
//! The file is parsed into toml's spanned document tree and walked by hand
//! rather than deserialized into serde structs: every key and value keeps its
//! byte span, so an error found late (after merging `[defaults]`, reading a
//! params file, or resolving dependencies between stages) can still say which
//! stage, which field and which line it is about. Nothing is run here; a farm
//! either loads completely or not at all. The format is documented for users
//! in `docs/farm-file.md`.

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

/// Why a farm could not be loaded. Everything about the file's content is an
/// [`Invalid`], which names the line and field.
#[derive(Debug, thiserror::Error)]
pub enum FarmFileError {
    #[error("{file}: cannot read the farm file: {source}")]
    Read {
        file: String,
        #[source]
        source: io::Error,
    },
    #[error("{file}: cannot resolve the farm folder `{folder}`: {source}")]
    Root {
        file: String,
        folder: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot find the current directory (the output folder is relative to it): {source}")]
    Cwd {
        #[source]
        source: io::Error,
    },
    #[error("{file}: the path `{}` is not valid UTF-8", .path.display())]
    NotUtf8 { file: String, path: PathBuf },
    #[error("{0}")]
    Invalid(Box<Invalid>),
}

impl FarmFileError {
    /// The 1-based line the error is about, when it is about the file's content.
    pub fn line(&self) -> Option<usize> {
        self.invalid().map(|i| i.line)
    }

    /// The 1-based column (in characters) the error is about.
    pub fn column(&self) -> Option<usize> {
        self.invalid().map(|i| i.col)
    }

    /// The dotted field the error is about, e.g. `stage.after`, `stage.sweep.x`, `defaults.retries`.
    pub fn field(&self) -> Option<&str> {
        self.invalid().and_then(|i| i.field.as_deref())
    }

    pub fn invalid(&self) -> Option<&Invalid> {
        match self {
            FarmFileError::Invalid(i) => Some(i),
            _ => None,
        }
    }
}

/// A problem with the farm file's content, located.
#[derive(Debug)]
pub struct Invalid {
    /// The file as it was given.
    pub file: String,
    pub line: usize,
    pub col: usize,
    /// Where in the farm: `stage \`solve\``, `[defaults]`, `[farm]`; empty at top level.
    pub context: String,
    /// Dotted field, starting with its section (`stage.`, `defaults.`, `farm.`).
    pub field: Option<String>,
    pub problem: Problem,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.col)?;
        // The context already names the section, so the field is shown without it.
        let shown = self.field.as_deref().map(|field| {
            if self.context.is_empty() {
                field
            } else {
                field.split_once('.').map(|(_, rest)| rest).unwrap_or(field)
            }
        });
        match (self.context.is_empty(), shown) {
            (false, Some(field)) => write!(f, "{}, field `{field}`: ", self.context)?,
            (false, None) => write!(f, "{}: ", self.context)?,
            (true, Some(field)) => write!(f, "field `{field}`: ")?,
            (true, None) => {}
        }
        write!(f, "{}", self.problem)
    }
}

/// What is wrong, in words a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("{message}")]
    Syntax { message: String },
    #[error("unknown field `{name}`, expected one of {}{}", quoted_list(.allowed), did_you_mean(.name, .allowed))]
    UnknownField {
        name: String,
        allowed: &'static [&'static str],
    },
    #[error("`{name}` cannot have a default: set it in each `[[stage]]`")]
    PerStageOnly { name: String },
    #[error("missing field `{name}`")]
    MissingField { name: &'static str },
    #[error("missing field `command` (or `shell`): a stage needs something to run")]
    MissingCommand,
    #[error("both `command` and `shell` are given; a stage takes exactly one of them")]
    CommandAndShell,
    #[error("invalid type: {found}, expected {expected}")]
    WrongType {
        found: String,
        expected: &'static str,
    },
    #[error("{value} is out of range, expected {expected}")]
    OutOfRange {
        value: String,
        expected: &'static str,
    },
    #[error("the command is empty; give at least the program to run")]
    EmptyCommand,
    #[error("`{name}` is not a valid {what} name (use letters, digits, `_`, `.` and `-`, and not only dots)")]
    BadName { name: String, what: &'static str },
    #[error("the farm name `{name}`, taken from the file name, is not valid (use letters, digits, `_`, `.` and `-`), so set one with `[farm] name = \"...\"`")]
    BadFileStem { name: String },
    #[error("`{name}` is not a valid sweep variable name (a letter or `_`, then letters, digits or `_`)")]
    BadVarName { name: String },
    #[error("`{name}` is a built-in placeholder (index, stage, farm, out); choose another name for the sweep variable")]
    BuiltinVar { name: String },
    #[error("duplicate stage name `{name}` (first defined on line {first_line})")]
    DuplicateStage { name: String, first_line: usize },
    #[error("no stages: add at least one `[[stage]]` table with a name and a command")]
    NoStages,
    #[error("bad range `{text}`: {problem}")]
    Range { text: String, problem: RangeProblem },
    #[error("expected exactly one of `lines`, `list` or `range`")]
    NoSweepSource,
    #[error("`{second}` given after `{first}`; a sweep variable takes exactly one of `lines`, `list` or `range`")]
    TwoSweepSources {
        first: &'static str,
        second: &'static str,
    },
    #[error("cannot read the parameter file `{path}` (looked for {looked}): {source}")]
    ParamsRead {
        path: String,
        looked: String,
        #[source]
        source: io::Error,
    },
    #[error("the parameter file `{path}` has no values (it is empty or only blank lines)")]
    ParamsEmpty { path: String },
    #[error("the list is empty; a sweep variable needs at least one value")]
    EmptyList,
    #[error("unknown sweep mode `{value}`, expected `product` or `zip`")]
    SweepMode { value: String },
    #[error("zip of unequal lengths: {first} has {first_len} values, {other} has {other_len}")]
    ZipUnequal {
        first: String,
        first_len: u64,
        other: String,
        other_len: u64,
    },
    #[error("the stage expands to more than {max} tasks", max = STAGE_TASKS_MAX)]
    TooManyTasks,
    #[error("{0}")]
    Template(#[from] TemplateError),
    #[error("`{{out}}` is not allowed here: it is an absolute path, and this field must stay inside the farm folder")]
    OutInPath,
    #[error("the path is empty")]
    EmptyPath,
    #[error("`{path}` escapes the farm folder: paths must be relative and must not contain `..`")]
    PathEscapes { path: String },
    #[error("sweep variable `{var}` has the value `{value}`, which would let this path escape the farm folder (values used in paths must not be empty, start with `/` or contain `..`)")]
    ValueEscapes { var: String, value: String },
    #[error("input file `{path}` does not exist (looked for {looked})")]
    InputMissing { path: String, looked: String },
    #[error("`{pattern}` is not a valid glob pattern: {source}")]
    BadGlob {
        pattern: String,
        #[source]
        source: glob::PatternError,
    },
    #[error("unknown stage `{name}` (stages: {stages})")]
    UnknownStage { name: String, stages: String },
    #[error("stage `{name}` cannot wait for itself")]
    SelfDependency { name: String },
    #[error("`after_each` pairs tasks one to one, but stage `{this}` has {this_count} tasks and stage `{other}` has {other_count}")]
    CountMismatch {
        this: String,
        this_count: u32,
        other: String,
        other_count: u32,
    },
    #[error("dependency cycle: {path} (`a -> b` means a waits for b)")]
    Cycle { path: String },
    #[error("`{text}` is not a duration (write e.g. \"90s\", \"10m\", \"1h 30m\", or a number of seconds): {source}")]
    Timeout {
        text: String,
        #[source]
        source: humantime::DurationError,
    },
    #[error("the duration must be greater than zero")]
    ZeroTimeout,
    #[error("the list is empty; at least one exit code must count as success")]
    NoSuccessCodes,
    #[error(
        "`{name}` is not a resource name (letters, digits, `_` and `-`, starting with a letter)"
    )]
    ResourceName { name: String },
    #[error("resource `{name}`: {source}")]
    Amount {
        name: String,
        #[source]
        source: AmountError,
    },
    #[error("`{name}` is not an environment variable name (a letter or `_`, then letters, digits or `_`)")]
    EnvName { name: String },
    #[error("`{name}` is reserved: mesh sets the MESH_* variables itself")]
    EnvReserved { name: String },
}

/// What is wrong with a `range = "..."`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeProblem {
    #[error("expected `start..end` or `start..end:step`, e.g. `1..100`, `0..100:10`, `-5..5` or `0.0..1.0:0.25`")]
    Malformed,
    #[error("empty range: the end is below the start")]
    Empty,
    #[error("the step must be greater than zero")]
    BadStep,
    #[error("a decimal range needs a step, e.g. `0.0..1.0:0.25`")]
    DecimalNeedsStep,
    #[error("more than {} decimals", RANGE_DECIMALS_MAX)]
    TooPrecise,
    #[error("the numbers are too large")]
    TooLarge,
}

/// Decimals beyond this would overflow the scaled `i64` range for ordinary magnitudes.
const RANGE_DECIMALS_MAX: u32 = 9;

/// Suggests the allowed name closest to a misspelt one, when one is close.
fn did_you_mean(name: &str, allowed: &[&str]) -> String {
    allowed
        .iter()
        .map(|a| (edit_distance(name, a), *a))
        .filter(|(d, a)| *d * 2 <= a.len())
        .min()
        .map(|(_, a)| format!(" (did you mean `{a}`?)"))
        .unwrap_or_default()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

fn quoted_list(items: &[&str]) -> String {
    items
        .iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ")
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

impl<'a> Src<'a> {
    fn scope(&self, ctx: Ctx, dflt: bool) -> Scope<'_> {
        Scope {
            src: self,
            ctx,
            dflt,
        }
    }

    fn document(&self, doc: &Spanned<DeTable<'_>>, path: &Path) -> Result<Loaded> {
        let top = self.scope(Ctx::Top, false);
        let mut farm_name: Option<At<String>> = None;
        let mut defaults = Fields::default();
        let mut stage_list: Option<&Spanned<DeValue<'_>>> = None;
        for (key, value) in doc.get_ref().iter() {
            match &**key.get_ref() {
                "farm" => {
                    let farm = self.scope(Ctx::Farm, false);
                    let table = top.table(value, "farm", "a table `[farm]`")?;
                    for (k, v) in table.iter() {
                        match &**k.get_ref() {
                            "name" => farm_name = Some(farm.string(v, "name")?),
                            other => return Err(farm.unknown(k.span().start, other, FARM_FIELDS)),
                        }
                    }
                }
                "defaults" => {
                    let table = top.table(value, "defaults", "a table `[defaults]`")?;
                    defaults = self
                        .scope(Ctx::Defaults, true)
                        .fields(table, DEFAULT_FIELDS)?;
                }
                "stage" => stage_list = Some(value),
                other => return Err(top.unknown(key.span().start, other, TOP_FIELDS)),
            }
        }

        let name = match farm_name {
            Some(n) => {
                if !valid_name(&n.v) {
                    return Err(self.scope(Ctx::Farm, false).fail(
                        n.pos,
                        "name",
                        Problem::BadName {
                            name: n.v,
                            what: "farm",
                        },
                    ));
                }
                n.v
            }
            None => {
                let stem = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if !valid_name(&stem) {
                    return Err(top.fail(0, "farm.name", Problem::BadFileStem { name: stem }));
                }
                stem
            }
        };

        let tables: Vec<(&DeTable<'_>, usize)> = match stage_list {
            None => Vec::new(),
            Some(list) => match list.get_ref() {
                DeValue::Array(items) => {
                    let mut tables = Vec::with_capacity(items.len());
                    for item in items.iter() {
                        match item.get_ref() {
                            DeValue::Table(t) => tables.push((t, item.span().start)),
                            other => {
                                return Err(top.fail(
                                    item.span().start,
                                    "stage",
                                    wrong_type(other, STAGES_EXPECTED),
                                ))
                            }
                        }
                    }
                    tables
                }
                other => {
                    return Err(top.fail(
                        list.span().start,
                        "stage",
                        wrong_type(other, STAGES_EXPECTED),
                    ))
                }
            },
        };
        if tables.is_empty() {
            let pos = stage_list.map(|l| l.span().start).unwrap_or(0);
            return Err(top.fail(pos, "stage", Problem::NoStages));
        }

        // Pass 1: every stage's fields and name, so dependencies can refer forward.
        let mut raw = Vec::with_capacity(tables.len());
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (number, (table, header)) in tables.iter().enumerate() {
            let label = stage_label(table, number + 1);
            let scope = self.scope(Ctx::Stage(label.clone()), false);
            let fields = scope.fields(table, STAGE_FIELDS.as_slice())?;
            let name = match &fields.name {
                Some(n) => n.clone(),
                None => {
                    return Err(scope.fail(*header, "name", Problem::MissingField { name: "name" }))
                }
            };
            if !valid_name(&name.v) {
                return Err(scope.fail(
                    name.pos,
                    "name",
                    Problem::BadName {
                        name: name.v,
                        what: "stage",
                    },
                ));
            }
            if let Some(first) = seen.get(&name.v) {
                return Err(scope.fail(
                    name.pos,
                    "name",
                    Problem::DuplicateStage {
                        name: name.v,
                        first_line: self.line_col(*first).0,
                    },
                ));
            }
            seen.insert(name.v.clone(), name.pos);
            raw.push((label, *header, fields.with_defaults(&defaults)));
        }

        // Pass 2: each stage on its own.
        let mut stages = Vec::with_capacity(raw.len());
        let mut deps = Vec::with_capacity(raw.len());
        let mut outputs_at = Vec::with_capacity(raw.len());
        for (label, header, fields) in raw {
            outputs_at.push(
                fields
                    .outputs
                    .as_ref()
                    .and_then(|o| o.first())
                    .map(|o| (o.pos, o.dflt)),
            );
            let scope = self.scope(Ctx::Stage(label), false);
            let (stage, dep) = scope.stage(fields, header)?;
            stages.push(stage);
            deps.push(dep);
        }

        // Pass 3: dependencies, which need every stage's name and task count.
        self.resolve_deps(&mut stages, &deps)?;
        let warnings = self.shared_outputs(&stages, &outputs_at);
        Ok(Loaded {
            name,
            stages,
            warnings,
        })
    }

    /// Stages that collect `outputs` from a folder their tasks share with
    /// other tasks running at the same time (no per-task `workdir`): one
    /// task's output is overwritten or half-written by another's before it
    /// is collected, silently.
    fn shared_outputs(
        &self,
        stages: &[StageDef],
        outputs_at: &[Option<(usize, bool)>],
    ) -> Vec<FarmWarning> {
        // The folder a stage's tasks all run in, when they share one.
        let shared: Vec<Option<String>> = stages
            .iter()
            .map(|s| {
                if s.outputs.is_empty() {
                    return None;
                }
                match &s.workdir {
                    None => Some(String::new()),
                    Some(w) if w.parts.iter().all(|p| !per_task(p)) => Some(
                        w.parts
                            .iter()
                            .map(|p| match p {
                                Part::Lit(l) => l.clone(),
                                Part::Var(Var::Stage) => s.name.clone(),
                                Part::Var(v) => format!("{v:?}"),
                            })
                            .collect(),
                    ),
                    Some(_) => None,
                }
            })
            .collect();
        let reaches = |from: usize, to: usize| {
            let mut seen = vec![false; stages.len()];
            let mut todo = vec![from];
            while let Some(i) = todo.pop() {
                if i == to {
                    return true;
                }
                if !std::mem::replace(&mut seen[i], true) {
                    let s = &stages[i];
                    todo.extend(s.after.iter().chain(&s.after_each).map(|&t| t as usize));
                }
            }
            false
        };
        let mut out = Vec::new();
        for (i, s) in stages.iter().enumerate() {
            let (Some(folder), Some((pos, dflt))) = (&shared[i], outputs_at[i]) else {
                continue;
            };
            let fix =
                "give each task a folder of its own, e.g. `workdir = \"runs/{stage}/{index}\"`";
            let place = if folder.is_empty() {
                "the farm's folder (no `workdir`)".to_string()
            } else {
                format!("`{folder}`")
            };
            let message = if s.len() > 1 {
                format!(
                    "stage `{}` collects outputs from {place}, which its {} tasks share and may write at the same time, so outputs can come home mixed or empty; {fix}",
                    s.name,
                    s.len()
                )
            } else if let Some(j) = (0..i)
                .find(|&j| shared[j].as_ref() == Some(folder) && !reaches(i, j) && !reaches(j, i))
            {
                format!(
                    "stages `{}` and `{}` collect outputs from {place} and may run at the same time (neither is after the other), so outputs can come home mixed or empty; {fix}",
                    stages[j].name, s.name
                )
            } else {
                continue;
            };
            out.push(FarmWarning {
                file: self.file.to_string(),
                line: self.line_col(pos).0,
                field: if dflt {
                    "defaults.outputs".into()
                } else {
                    "stage.outputs".into()
                },
                message,
            });
        }
        out
    }

    fn resolve_deps(&self, stages: &mut [StageDef], deps: &[Deps]) -> Result<()> {
        let names: Vec<String> = stages.iter().map(|s| s.name.clone()).collect();
        // Edges (target, position, field) per stage, for the cycle search.
        let mut edges: Vec<Vec<(usize, usize, &'static str)>> = vec![Vec::new(); stages.len()];
        for (i, dep) in deps.iter().enumerate() {
            let scope = self.scope(Ctx::Stage(format!("stage `{}`", names[i])), false);
            for (field, list) in [("after", &dep.after), ("after_each", &dep.after_each)] {
                for target in list {
                    let Some(t) = names.iter().position(|n| *n == target.v) else {
                        let others: Vec<&str> = names
                            .iter()
                            .filter(|n| **n != names[i])
                            .map(String::as_str)
                            .collect();
                        return Err(scope.fail(
                            target.pos,
                            field,
                            Problem::UnknownStage {
                                name: target.v.clone(),
                                stages: if others.is_empty() {
                                    "none other".to_string()
                                } else {
                                    others.join(", ")
                                },
                            },
                        ));
                    };
                    if t == i {
                        return Err(scope.fail(
                            target.pos,
                            field,
                            Problem::SelfDependency {
                                name: names[i].clone(),
                            },
                        ));
                    }
                    if field == "after_each" && stages[t].len() != stages[i].len() {
                        return Err(scope.fail(
                            target.pos,
                            field,
                            Problem::CountMismatch {
                                this: names[i].clone(),
                                this_count: stages[i].len(),
                                other: names[t].clone(),
                                other_count: stages[t].len(),
                            },
                        ));
                    }
                    let list = if field == "after" {
                        &mut stages[i].after
                    } else {
                        &mut stages[i].after_each
                    };
                    if !list.contains(&(t as u32)) {
                        list.push(t as u32);
                    }
                    edges[i].push((t, target.pos, field));
                }
            }
        }
        if let Some((cycle, pos, field)) = find_cycle(&edges) {
            let path = cycle
                .iter()
                .map(|&s| names[s].as_str())
                .collect::<Vec<_>>()
                .join(" -> ");
            let scope = self.scope(Ctx::Stage(format!("stage `{}`", names[cycle[0]])), false);
            return Err(scope.fail(pos, field, Problem::Cycle { path }));
        }
        Ok(())
    }

    /// 1-based line and column (in characters) of a byte offset.
    fn line_col(&self, pos: usize) -> (usize, usize) {
        line_col(self.text, pos)
    }
}

const STAGES_EXPECTED: &str = "an array of tables, written `[[stage]]`";

/// The label used before a stage's name is known to be valid.
fn stage_label(table: &DeTable<'_>, number: usize) -> String {
    match table.get("name").and_then(|v| v.get_ref().as_str()) {
        Some(name) => format!("stage `{name}`"),
        None => format!("stage #{number}"),
    }
}

/// Finds a cycle in the stage graph; returns its stages (first repeated at
/// the end), and where the first edge of the cycle was written.
fn find_cycle(
    edges: &[Vec<(usize, usize, &'static str)>],
) -> Option<(Vec<usize>, usize, &'static str)> {
    const WHITE: u8 = 0;
    const GREY: u8 = 1;
    const BLACK: u8 = 2;
    let mut colour = vec![WHITE; edges.len()];
    for start in 0..edges.len() {
        if colour[start] != WHITE {
            continue;
        }
        // Iterative, so a long chain of stages cannot overflow the stack.
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        colour[start] = GREY;
        while let Some(top) = stack.last_mut() {
            let (node, next) = *top;
            if next == edges[node].len() {
                colour[node] = BLACK;
                stack.pop();
                continue;
            }
            top.1 += 1;
            let target = edges[node][next].0;
            match colour[target] {
                WHITE => {
                    colour[target] = GREY;
                    stack.push((target, 0));
                }
                GREY => {
                    let from = stack.iter().position(|(s, _)| *s == target)?;
                    let mut cycle: Vec<usize> = stack[from..].iter().map(|(s, _)| *s).collect();
                    cycle.push(target);
                    let (first, taken) = stack[from];
                    let (_, pos, field) = edges[first][taken - 1];
                    return Some((cycle, pos, field));
                }
                _ => {}
            }
        }
    }
    None
}

/// Checks and errors for one section of the file.
struct Scope<'s> {
    src: &'s Src<'s>,
    ctx: Ctx,
    /// True while reading `[defaults]` itself.
    dflt: bool,
}

impl Scope<'_> {
    fn fail(&self, pos: usize, field: &str, problem: Problem) -> FarmFileError {
        self.fail_from(pos, self.dflt, field, problem)
    }

    fn fail_at<T>(&self, at: &At<T>, field: &str, problem: Problem) -> FarmFileError {
        self.fail_from(at.pos, at.dflt, field, problem)
    }

    /// `dflt` says the value was written in `[defaults]`: the line points
    /// there, so the field is named as a defaults field while the context
    /// still says which stage it broke.
    fn fail_from(&self, pos: usize, dflt: bool, field: &str, problem: Problem) -> FarmFileError {
        let (line, col) = self.src.line_col(pos);
        let (context, field) = match &self.ctx {
            Ctx::Top => (String::new(), field.to_string()),
            Ctx::Farm => ("[farm]".to_string(), format!("farm.{field}")),
            Ctx::Defaults => ("[defaults]".to_string(), format!("defaults.{field}")),
            Ctx::Stage(label) if dflt => (
                format!("{label} (value from [defaults])"),
                format!("defaults.{field}"),
            ),
            Ctx::Stage(label) => (label.clone(), format!("stage.{field}")),
        };
        FarmFileError::Invalid(Box::new(Invalid {
            file: self.src.file.to_string(),
            line,
            col,
            context,
            field: Some(field),
            problem,
        }))
    }

    fn unknown(&self, pos: usize, name: &str, allowed: &'static [&'static str]) -> FarmFileError {
        self.unknown_in(pos, "", name, allowed)
    }

    fn unknown_in(
        &self,
        pos: usize,
        prefix: &str,
        name: &str,
        allowed: &'static [&'static str],
    ) -> FarmFileError {
        self.fail(
            pos,
            &format!("{prefix}{name}"),
            Problem::UnknownField {
                name: name.to_string(),
                allowed,
            },
        )
    }

    fn at<T>(&self, v: T, pos: usize) -> At<T> {
        At {
            v,
            pos,
            dflt: self.dflt,
        }
    }

    fn table<'v, 'i>(
        &self,
        v: &'v Spanned<DeValue<'i>>,
        field: &str,
        expected: &'static str,
    ) -> Result<&'v DeTable<'i>> {
        match v.get_ref() {
            DeValue::Table(t) => Ok(t),
            other => Err(self.fail(v.span().start, field, wrong_type(other, expected))),
        }
    }

    fn string(&self, v: &Spanned<DeValue<'_>>, field: &str) -> Result<At<String>> {
        match v.get_ref() {
            DeValue::String(s) => Ok(self.at(s.to_string(), v.span().start)),
            other => Err(self.fail(v.span().start, field, wrong_type(other, "a string"))),
        }
    }

    fn strings(
        &self,
        v: &Spanned<DeValue<'_>>,
        field: &str,
        expected: &'static str,
    ) -> Result<Vec<At<String>>> {
        match v.get_ref() {
            DeValue::Array(items) => items
                .iter()
                .map(|item| match item.get_ref() {
                    DeValue::String(s) => Ok(self.at(s.to_string(), item.span().start)),
                    other => {
                        Err(self.fail(item.span().start, field, wrong_type(other, "a string")))
                    }
                })
                .collect(),
            other => Err(self.fail(v.span().start, field, wrong_type(other, expected))),
        }
    }

    fn integer(
        &self,
        v: &Spanned<DeValue<'_>>,
        field: &str,
        expected: &'static str,
    ) -> Result<At<i64>> {
        match v.get_ref() {
            DeValue::Integer(i) => match i64::from_str_radix(i.as_str(), i.radix()) {
                Ok(n) => Ok(self.at(n, v.span().start)),
                Err(_) => Err(self.fail(
                    v.span().start,
                    field,
                    Problem::OutOfRange {
                        value: i.to_string(),
                        expected,
                    },
                )),
            },
            other => Err(self.fail(v.span().start, field, wrong_type(other, expected))),
        }
    }

    /// Reads the fields of a `[[stage]]` or `[defaults]` table, checking types only.
    fn fields(&self, table: &DeTable<'_>, allowed: &'static [&'static str]) -> Result<Fields> {
        let mut f = Fields::default();
        for (key, v) in table.iter() {
            let k: &str = key.get_ref();
            let kpos = key.span().start;
            let vpos = v.span().start;
            if !allowed.contains(&k) {
                if STAGE_FIELDS.contains(&k) {
                    return Err(self.fail(
                        kpos,
                        k,
                        Problem::PerStageOnly {
                            name: k.to_string(),
                        },
                    ));
                }
                return Err(self.unknown(kpos, k, allowed));
            }
            match k {
                "name" => f.name = Some(self.string(v, k)?),
                "command" | "shell" => {
                    if f.command.is_some() {
                        return Err(self.fail(kpos, k, Problem::CommandAndShell));
                    }
                    let cmd = if k == "command" {
                        let argv = self.strings(
                            v,
                            k,
                            "an array of strings (use `shell` for a shell command line)",
                        )?;
                        if argv.is_empty() {
                            return Err(self.fail(vpos, k, Problem::EmptyCommand));
                        }
                        RawCommand::Argv(argv)
                    } else {
                        let line = self.string(v, k)?;
                        if line.v.trim().is_empty() {
                            return Err(self.fail(vpos, k, Problem::EmptyCommand));
                        }
                        RawCommand::Shell(line)
                    };
                    f.command = Some(self.at(cmd, kpos));
                }
                "sweep" => f.sweep = Some(self.sweep(v)?),
                "sweep_mode" => {
                    let s = self.string(v, k)?;
                    let mode = match s.v.as_str() {
                        "product" => SweepMode::Product,
                        "zip" => SweepMode::Zip,
                        _ => return Err(self.fail(vpos, k, Problem::SweepMode { value: s.v })),
                    };
                    f.sweep_mode = Some(self.at(mode, vpos));
                }
                "workdir" => f.workdir = Some(self.string(v, k)?),
                "inputs" => f.inputs = Some(self.strings(v, k, "an array of file paths")?),
                "outputs" => {
                    f.outputs =
                        Some(self.strings(v, k, "an array of file paths or glob patterns")?)
                }
                "env" => f.env = self.env(v)?,
                "resources" => f.resources = self.resources(v)?,
                "retries" => {
                    let n = self.integer(v, k, "a non-negative integer")?;
                    let retries = u32::try_from(n.v).map_err(|_| {
                        self.fail(
                            vpos,
                            k,
                            Problem::OutOfRange {
                                value: n.v.to_string(),
                                expected: "a non-negative integer",
                            },
                        )
                    })?;
                    f.retries = Some(self.at(retries, vpos));
                }
                "timeout" => f.timeout_ms = Some(self.duration(v, "timeout")?),
                "expected" => f.expected_ms = Some(self.duration(v, "expected")?),
                "success_codes" => {
                    let DeValue::Array(items) = v.get_ref() else {
                        return Err(self.fail(
                            vpos,
                            k,
                            wrong_type(v.get_ref(), "an array of exit codes"),
                        ));
                    };
                    let mut codes = Vec::with_capacity(items.len());
                    for item in items.iter() {
                        let n = self.integer(item, k, "an exit code (0 to 255)")?;
                        match i32::try_from(n.v) {
                            Ok(c) if (0..=255).contains(&c) => codes.push(c),
                            _ => {
                                return Err(self.fail(
                                    n.pos,
                                    k,
                                    Problem::OutOfRange {
                                        value: n.v.to_string(),
                                        expected: "an exit code (0 to 255)",
                                    },
                                ))
                            }
                        }
                    }
                    if codes.is_empty() {
                        return Err(self.fail(vpos, k, Problem::NoSuccessCodes));
                    }
                    f.success_codes = Some(self.at(codes, vpos));
                }
                "after" | "after_each" => {
                    let names = match v.get_ref() {
                        DeValue::String(s) => vec![self.at(s.to_string(), vpos)],
                        _ => self.strings(v, k, "a stage name or an array of stage names")?,
                    };
                    if k == "after" {
                        f.after = Some(names);
                    } else {
                        f.after_each = Some(names);
                    }
                }
                // `allowed` only lists the fields matched above.
                _ => return Err(self.unknown(kpos, k, allowed)),
            }
        }
        Ok(f)
    }

    fn sweep(&self, v: &Spanned<DeValue<'_>>) -> Result<At<Vec<RawVar>>> {
        let table = self.table(
            v,
            "sweep",
            "a table of sweep variables, e.g. `sweep.x = { range = \"1..10\" }`",
        )?;
        let mut vars = Vec::with_capacity(table.len());
        for (key, spec) in table.iter() {
            let name: &str = key.get_ref();
            let field = format!("sweep.{name}");
            if !valid_var_name(name) {
                return Err(self.fail(
                    key.span().start,
                    &field,
                    Problem::BadVarName {
                        name: name.to_string(),
                    },
                ));
            }
            if BUILTINS.contains(&name) {
                return Err(self.fail(
                    key.span().start,
                    &field,
                    Problem::BuiltinVar {
                        name: name.to_string(),
                    },
                ));
            }
            let entries = self.table(
                spec,
                &field,
                "a table: `{ lines = \"file\" }`, `{ list = [...] }` or `{ range = \"a..b\" }`",
            )?;
            let mut source: Option<(&'static str, &Spanned<DeValue<'_>>)> = None;
            for (sk, sv) in entries.iter() {
                let kind = match SWEEP_FIELDS.iter().find(|f| **f == &**sk.get_ref()) {
                    Some(kind) => *kind,
                    None => {
                        return Err(self.unknown_in(
                            sk.span().start,
                            &format!("{field}."),
                            sk.get_ref(),
                            SWEEP_FIELDS,
                        ))
                    }
                };
                if let Some((first, _)) = source {
                    return Err(self.fail(
                        sk.span().start,
                        &field,
                        Problem::TwoSweepSources {
                            first,
                            second: kind,
                        },
                    ));
                }
                source = Some((kind, sv));
            }
            let Some((kind, sv)) = source else {
                return Err(self.fail(spec.span().start, &field, Problem::NoSweepSource));
            };
            let values = match kind {
                "lines" => self.lines(sv, &field)?,
                "list" => self.list(sv, &field)?,
                _ => {
                    let text = self.string(sv, &field)?;
                    parse_range(&text.v).map_err(|problem| self.fail(text.pos, &field, problem))?
                }
            };
            vars.push(RawVar {
                name: name.to_string(),
                values: self.at(values, key.span().start),
            });
        }
        Ok(self.at(vars, v.span().start))
    }

    fn lines(&self, v: &Spanned<DeValue<'_>>, field: &str) -> Result<Values> {
        let path = self.string(v, field)?;
        let full = self.src.root.join(&path.v);
        let text = std::fs::read_to_string(&full).map_err(|source| {
            self.fail(
                path.pos,
                field,
                Problem::ParamsRead {
                    path: path.v.clone(),
                    looked: full.display().to_string(),
                    source,
                },
            )
        })?;
        let values = Values::lines(&text);
        if values.is_empty() {
            return Err(self.fail(path.pos, field, Problem::ParamsEmpty { path: path.v }));
        }
        if values.len() > STAGE_TASKS_MAX {
            return Err(self.fail(path.pos, field, Problem::TooManyTasks));
        }
        Ok(values)
    }

    fn list(&self, v: &Spanned<DeValue<'_>>, field: &str) -> Result<Values> {
        const EXPECTED: &str = "a string, integer, float or boolean";
        let DeValue::Array(items) = v.get_ref() else {
            return Err(self.fail(
                v.span().start,
                field,
                wrong_type(v.get_ref(), "an array of values"),
            ));
        };
        if items.is_empty() {
            return Err(self.fail(v.span().start, field, Problem::EmptyList));
        }
        let mut values = Vec::with_capacity(items.len());
        for item in items.iter() {
            let text = match item.get_ref() {
                DeValue::String(s) => s.to_string(),
                DeValue::Integer(_) => self.integer(item, field, EXPECTED)?.v.to_string(),
                // The float as written, so `0.10` stays `0.10` in paths and arguments.
                DeValue::Float(f) => f.as_str().trim_start_matches('+').to_string(),
                DeValue::Boolean(b) => b.to_string(),
                other => {
                    return Err(self.fail(item.span().start, field, wrong_type(other, EXPECTED)))
                }
            };
            values.push(text);
        }
        Ok(Values::List(values))
    }

    fn env(&self, v: &Spanned<DeValue<'_>>) -> Result<Vec<(At<String>, At<String>)>> {
        let table = self.table(v, "env", "a table of environment variables")?;
        let mut env = Vec::with_capacity(table.len());
        for (key, value) in table.iter() {
            let name: &str = key.get_ref();
            let field = format!("env.{name}");
            let kpos = key.span().start;
            if !valid_var_name(name) {
                return Err(self.fail(
                    kpos,
                    &field,
                    Problem::EnvName {
                        name: name.to_string(),
                    },
                ));
            }
            if name.starts_with("MESH_") {
                return Err(self.fail(
                    kpos,
                    &field,
                    Problem::EnvReserved {
                        name: name.to_string(),
                    },
                ));
            }
            let text = match value.get_ref() {
                DeValue::String(s) => self.at(s.to_string(), value.span().start),
                DeValue::Integer(_) => {
                    let n = self.integer(value, &field, "a string")?;
                    self.at(n.v.to_string(), n.pos)
                }
                other => {
                    return Err(self.fail(
                        value.span().start,
                        &field,
                        wrong_type(other, "a string"),
                    ))
                }
            };
            env.push((self.at(name.to_string(), kpos), text));
        }
        Ok(env)
    }

    fn resources(&self, v: &Spanned<DeValue<'_>>) -> Result<Vec<(At<String>, At<Amount>)>> {
        const EXPECTED: &str = "a number, or a string such as \"512MiB\"";
        let table = self.table(
            v,
            "resources",
            "a table of resource amounts, e.g. `{ cpu = 2, mem = \"4GiB\" }`",
        )?;
        let mut out = Vec::with_capacity(table.len());
        for (key, value) in table.iter() {
            let name: &str = key.get_ref();
            let field = format!("resources.{name}");
            let kpos = key.span().start;
            let vpos = value.span().start;
            if !valid_resource_name(name) {
                return Err(self.fail(
                    kpos,
                    &field,
                    Problem::ResourceName {
                        name: name.to_string(),
                    },
                ));
            }
            let text = match value.get_ref() {
                DeValue::String(s) => s.to_string(),
                DeValue::Integer(_) => self.integer(value, &field, EXPECTED)?.v.to_string(),
                DeValue::Float(f) => match f.as_str().parse::<f64>() {
                    // Display prints the shortest exact form: 0.5 -> "0.5", 2.0 -> "2".
                    Ok(x) if x.is_finite() => x.to_string(),
                    _ => f.as_str().to_string(),
                },
                other => return Err(self.fail(vpos, &field, wrong_type(other, EXPECTED))),
            };
            let amount = parse_amount(name, &text).map_err(|source| {
                self.fail(
                    vpos,
                    &field,
                    Problem::Amount {
                        name: name.to_string(),
                        source,
                    },
                )
            })?;
            out.push((self.at(name.to_string(), kpos), self.at(amount, vpos)));
        }
        Ok(out)
    }

    /// A positive duration: `"10m"` or a number of seconds.
    fn duration(&self, v: &Spanned<DeValue<'_>>, field: &str) -> Result<At<u64>> {
        const EXPECTED: &str = "a duration such as \"10m\", or a number of seconds";
        let pos = v.span().start;
        let ms = match v.get_ref() {
            DeValue::String(s) => {
                let d = humantime::parse_duration(s).map_err(|source| {
                    self.fail(
                        pos,
                        field,
                        Problem::Timeout {
                            text: s.to_string(),
                            source,
                        },
                    )
                })?;
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
            }
            DeValue::Integer(_) => {
                let secs = self.integer(v, field, EXPECTED)?;
                let secs = u64::try_from(secs.v)
                    .map_err(|_| self.fail(pos, field, Problem::ZeroTimeout))?;
                secs.saturating_mul(1000)
            }
            other => return Err(self.fail(pos, field, wrong_type(other, EXPECTED))),
        };
        if ms == 0 {
            return Err(self.fail(pos, field, Problem::ZeroTimeout));
        }
        Ok(self.at(ms, pos))
    }

    /// Resolves a merged stage: sweep, templates, paths and resources.
    fn stage(&self, f: Fields, header: usize) -> Result<(StageDef, Deps)> {
        let Some(name) = f.name else {
            return Err(self.fail(header, "name", Problem::MissingField { name: "name" }));
        };
        let Some(command) = f.command else {
            return Err(self.fail(header, "command", Problem::MissingCommand));
        };

        let mode = f
            .sweep_mode
            .as_ref()
            .map(|m| m.v)
            .unwrap_or(SweepMode::Product);
        let sweep = match &f.sweep {
            None => Sweep::single(),
            Some(vars) => {
                if mode == SweepMode::Zip {
                    if let Some((first, rest)) = vars.v.split_first() {
                        for var in rest {
                            if var.values.v.len() != first.values.v.len() {
                                return Err(self.fail_at(
                                    &var.values,
                                    &format!("sweep.{}", var.name),
                                    Problem::ZipUnequal {
                                        first: first.name.clone(),
                                        first_len: first.values.v.len(),
                                        other: var.name.clone(),
                                        other_len: var.values.v.len(),
                                    },
                                ));
                            }
                        }
                    }
                }
                let sweep = Sweep {
                    vars: vars
                        .v
                        .iter()
                        .map(|var| SweepVar {
                            name: var.name.clone(),
                            values: var.values.v.clone(),
                        })
                        .collect(),
                    mode,
                };
                if sweep.len() > STAGE_TASKS_MAX {
                    return Err(self.fail_at(vars, "sweep", Problem::TooManyTasks));
                }
                sweep
            }
        };
        let var_names: Vec<&str> = sweep.vars.iter().map(|v| v.name.as_str()).collect();

        let command = match &command.v {
            RawCommand::Argv(args) => CommandTemplate::Argv(
                args.iter()
                    .map(|a| self.template(a, "command", &var_names))
                    .collect::<Result<_>>()?,
            ),
            RawCommand::Shell(line) => {
                CommandTemplate::Shell(self.template(line, "shell", &var_names)?)
            }
        };
        let workdir = match &f.workdir {
            Some(w) => Some(self.path_template(w, "workdir", &sweep)?),
            None => None,
        };
        let mut inputs = Vec::new();
        for input in f.inputs.iter().flatten() {
            let t = self.path_template(input, "inputs", &sweep)?;
            if t.is_static() {
                let full = self.src.root.join(&input.v);
                if !full.is_file() {
                    return Err(self.fail_at(
                        input,
                        "inputs",
                        Problem::InputMissing {
                            path: input.v.clone(),
                            looked: full.display().to_string(),
                        },
                    ));
                }
            }
            inputs.push(t);
        }
        let mut outputs = Vec::new();
        for output in f.outputs.iter().flatten() {
            let t = self.path_template(output, "outputs", &sweep)?;
            let pattern = t.literal_text();
            if let Err(source) = glob::Pattern::new(&pattern) {
                return Err(self.fail_at(output, "outputs", Problem::BadGlob { pattern, source }));
            }
            outputs.push(t);
        }
        let mut env = Vec::with_capacity(f.env.len());
        for (key, value) in &f.env {
            env.push((
                key.v.clone(),
                self.template(value, &format!("env.{}", key.v), &var_names)?,
            ));
        }
        let mut resources =
            Resources::from_pairs(f.resources.iter().map(|(k, a)| (k.v.clone(), a.v)));
        // A task takes one core unless it says otherwise (`cpu = 0` opts out).
        if !f.resources.iter().any(|(k, _)| k.v == CPU) {
            resources.set(CPU, Amount::units(1));
        }

        let stage = StageDef {
            name: name.v,
            command,
            sweep,
            workdir,
            inputs,
            outputs,
            env,
            resources,
            retries: f.retries.map(|r| r.v).unwrap_or(0),
            timeout_ms: f.timeout_ms.map(|t| t.v),
            expected_ms: f.expected_ms.map(|t| t.v),
            success_codes: f.success_codes.map(|c| c.v).unwrap_or_else(|| vec![0]),
            after: Vec::new(),
            after_each: Vec::new(),
        };
        let deps = Deps {
            after: f.after.unwrap_or_default(),
            after_each: f.after_each.unwrap_or_default(),
        };
        Ok((stage, deps))
    }

    fn template(&self, text: &At<String>, field: &str, vars: &[&str]) -> Result<Template> {
        Template::parse(&text.v, vars).map_err(|e| self.fail_at(text, field, Problem::Template(e)))
    }

    /// A template naming a path inside the farm (workdir, inputs, outputs):
    /// neither its text nor any value substituted into it may leave the folder.
    fn path_template(&self, text: &At<String>, field: &str, sweep: &Sweep) -> Result<Template> {
        let names: Vec<&str> = sweep.vars.iter().map(|v| v.name.as_str()).collect();
        let t = self.template(text, field, &names)?;
        if t.parts.iter().any(|p| matches!(p, Part::Var(Var::Out))) {
            return Err(self.fail_at(text, field, Problem::OutInPath));
        }
        if text.v.trim().is_empty() {
            return Err(self.fail_at(text, field, Problem::EmptyPath));
        }
        if !path_stays_inside(&t.literal_text()) {
            return Err(self.fail_at(
                text,
                field,
                Problem::PathEscapes {
                    path: text.v.clone(),
                },
            ));
        }
        let mut used: Vec<usize> = t.sweep_vars().collect();
        used.sort_unstable();
        used.dedup();
        for i in used {
            let var = &sweep.vars[i];
            let mut bad: Option<String> = None;
            var.values.for_each(|value| {
                if bad.is_none()
                    && (value.is_empty() || value.starts_with('/') || value.contains(".."))
                {
                    bad = Some(value.to_string());
                }
            });
            if let Some(value) = bad {
                return Err(self.fail_at(
                    text,
                    field,
                    Problem::ValueEscapes {
                        var: var.name.clone(),
                        value,
                    },
                ));
            }
        }
        Ok(t)
    }
}

/// Serde's wording, so messages read like those of other TOML tools.
fn wrong_type(found: &DeValue<'_>, expected: &'static str) -> Problem {
    let found = match found {
        DeValue::String(s) => format!("string {:?}", &**s),
        DeValue::Integer(i) => format!("integer `{i}`"),
        DeValue::Float(f) => format!("float `{}`", f.as_str()),
        DeValue::Boolean(b) => format!("boolean `{b}`"),
        DeValue::Datetime(d) => format!("datetime `{d}`"),
        DeValue::Array(_) => "array".to_string(),
        DeValue::Table(_) => "table".to_string(),
    };
    Problem::WrongType { found, expected }
}

/// Stage and farm names: they become folder names and task ids (`<stage>/<index>`).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && !name.chars().all(|c| c == '.')
}

fn valid_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A decimal number as an integer mantissa and its number of decimals.
fn parse_decimal(text: &str) -> Option<(i128, u32)> {
    let t = text.trim();
    let (neg, digits) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    if digits.contains('.') && frac.is_empty() {
        return None;
    }
    let decimals = u32::try_from(frac.len()).ok()?;
    let mantissa: i128 = format!("{whole}{frac}").parse().ok()?;
    Some((if neg { -mantissa } else { mantissa }, decimals))
}

/// Reads `a..b` or `a..b:step` (inclusive of `b` when a step lands on it).
fn parse_range(text: &str) -> std::result::Result<Values, Problem> {
    let fail = |problem| Problem::Range {
        text: text.to_string(),
        problem,
    };
    let (span, step) = match text.split_once(':') {
        Some((span, step)) => (span, Some(step)),
        None => (text, None),
    };
    let (start, end) = span
        .split_once("..")
        .ok_or_else(|| fail(RangeProblem::Malformed))?;
    let start = parse_decimal(start).ok_or_else(|| fail(RangeProblem::Malformed))?;
    let end = parse_decimal(end).ok_or_else(|| fail(RangeProblem::Malformed))?;
    let step = match step {
        Some(s) => Some(parse_decimal(s).ok_or_else(|| fail(RangeProblem::Malformed))?),
        None => None,
    };
    let decimals = start.1.max(end.1).max(step.map(|s| s.1).unwrap_or(0));
    if decimals > RANGE_DECIMALS_MAX {
        return Err(fail(RangeProblem::TooPrecise));
    }
    if decimals > 0 && step.is_none() {
        return Err(fail(RangeProblem::DecimalNeedsStep));
    }
    let scale = |(m, d): (i128, u32)| m.checked_mul(10i128.pow(decimals - d));
    let too_large = || fail(RangeProblem::TooLarge);
    let a = scale(start).ok_or_else(too_large)?;
    let b = scale(end).ok_or_else(too_large)?;
    let s = match step {
        Some(step) => scale(step).ok_or_else(too_large)?,
        None => 1,
    };
    if s <= 0 {
        return Err(fail(RangeProblem::BadStep));
    }
    if b < a {
        return Err(fail(RangeProblem::Empty));
    }
    let count = (b - a) / s + 1;
    if count > i128::from(STAGE_TASKS_MAX) {
        return Err(Problem::TooManyTasks);
    }
    let last = a + (count - 1) * s;
    let fits = |x: i128| i64::try_from(x).is_ok();
    if !fits(a) || !fits(s) || !fits(last) {
        return Err(too_large());
    }
    Ok(Values::Range {
        start: a as i64,
        step: s as i64,
        count: count as u64,
        decimals,
    })
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, pos: usize) -> (usize, usize) {
    let mut pos = pos.min(text.len());
    while !text.is_char_boundary(pos) {
        pos -= 1;
    }
    let before = &text[..pos];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    (line, before[line_start..].chars().count() + 1)
}

/// A TOML syntax error, placed in its section by reading the lines above it
/// (the document tree does not exist when the text does not parse).
fn syntax_error(file: &str, text: &str, e: &toml::de::Error) -> FarmFileError {
    let pos = e.span().map(|s| s.start).unwrap_or(0).min(text.len());
    let (line, col) = line_col(text, pos);
    let lines: Vec<&str> = text.lines().collect();
    let mut context = String::new();
    let mut section = String::new();
    let mut stages = 0;
    let mut stage_header_line = 0;
    for (i, l) in lines.iter().enumerate().take(line.saturating_sub(1)) {
        let t = l.trim();
        if let Some(h) = t.strip_prefix("[[").and_then(|h| h.split("]]").next()) {
            section = h.trim().to_string();
            if section == "stage" {
                stages += 1;
                stage_header_line = i;
            }
        } else if let Some(h) = t.strip_prefix('[').and_then(|h| h.split(']').next()) {
            section = h.trim().to_string();
        }
    }
    let first = section.split('.').next().unwrap_or("");
    let prefix = match first {
        "stage" => {
            // The stage's name, if it was written above the error.
            let name = lines
                .iter()
                .take(line.saturating_sub(1))
                .skip(stage_header_line + 1)
                .filter_map(|l| l.split_once('='))
                .find(|(k, _)| k.trim() == "name")
                .map(|(_, v)| v.trim().trim_matches(|c| c == '"' || c == '\'').to_string());
            context = match name {
                Some(n) => format!("stage `{n}`"),
                None => format!("stage #{stages}"),
            };
            format!("{section}.")
        }
        "defaults" => {
            context = "[defaults]".to_string();
            format!("{section}.")
        }
        "farm" => {
            context = "[farm]".to_string();
            format!("{section}.")
        }
        "" => String::new(),
        _ => format!("{section}."),
    };
    let key = lines.get(line - 1).and_then(|l| {
        let t = l.trim_start();
        if t.starts_with('[') || t.starts_with('#') {
            return None;
        }
        let (k, _) = t.split_once('=')?;
        let k = k.trim();
        let keyish = !k.is_empty()
            && k.chars().all(|c| {
                c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '"' | '\'' | ' ')
            });
        keyish.then(|| k.replace(['"', '\'', ' '], ""))
    });
    let field = key.map(|k| format!("{prefix}{k}"));
    let message = e.message().trim().replace('\n', "; ");
    FarmFileError::Invalid(Box::new(Invalid {
        file: file.to_string(),
        line,
        col,
        context,
        field,
        problem: Problem::Syntax { message },
    }))
}

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

/// A placeholder that differs from task to task of a stage.
fn per_task(p: &Part) -> bool {
    matches!(p, Part::Var(Var::Index | Var::Sweep(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_protocol::farm::{Command, TaskRef};

    fn opts(out: &str) -> LoadOptions {
        LoadOptions {
            out: Some(PathBuf::from(out)),
        }
    }

    /// Writes `files` into a fresh folder and loads `farm.toml` from it.
    fn load_in(farm: &str, files: &[(&str, &str)]) -> (tempfile::TempDir, Result<FarmDef>) {
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, text) in files {
            let path = dir.path().join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).expect("mkdir");
            }
            std::fs::write(path, text).expect("write");
        }
        let path = dir.path().join("farm.toml");
        std::fs::write(&path, farm).expect("write farm");
        let result = load(&path, &opts("/tmp/mesh-test-out"));
        (dir, result)
    }

    fn good(farm: &str, files: &[(&str, &str)]) -> (tempfile::TempDir, FarmDef) {
        let (dir, result) = load_in(farm, files);
        match result {
            Ok(def) => (dir, def),
            Err(e) => panic!("farm should load, got: {e}"),
        }
    }

    fn bad(farm: &str, files: &[(&str, &str)]) -> FarmFileError {
        match load_in(farm, files).1 {
            Ok(_) => panic!("farm should not load"),
            Err(e) => e,
        }
    }

    fn warnings(farm: &str) -> Vec<FarmWarning> {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("farm.toml");
        std::fs::write(&path, farm).expect("write farm");
        match load_with_warnings(&path, &opts("/tmp/mesh-test-out")) {
            Ok((_, w)) => w,
            Err(e) => panic!("farm should load, got: {e}"),
        }
    }

    #[test]
    fn outputs_from_a_folder_tasks_share_are_warned_of() {
        // The new user's farm: 30 tasks writing o.txt where they all run.
        let w = warnings(
            "[farm]\nname = \"f\"\n[[stage]]\nname = \"s\"\nshell = \"echo {i} > o.txt\"\nsweep.i = { range = \"1..30\" }\noutputs = [\"o.txt\"]\n",
        );
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!((w[0].line, w[0].field.as_str()), (7, "stage.outputs"));
        assert!(w[0].message.contains("30 tasks"), "{}", w[0]);
        assert!(
            w[0].message.contains("{index}"),
            "says how to fix it: {}",
            w[0]
        );
        assert!(w[0].to_string().contains("farm.toml:7: stage.outputs: "));
        // A workdir shared by every task is no better.
        let w = warnings(
            "[farm]\nname = \"f\"\n[defaults]\noutputs = [\"o.txt\"]\n[[stage]]\nname = \"s\"\nshell = \"true\"\nsweep.i = { list = [1, 2] }\nworkdir = \"runs/{stage}\"\n",
        );
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!((w[0].line, w[0].field.as_str()), (4, "defaults.outputs"));
    }

    #[test]
    fn outputs_from_a_folder_of_their_own_are_fine() {
        for workdir in ["runs/{index}", "runs/{i}"] {
            let w = warnings(&format!(
                "[farm]\nname = \"f\"\n[[stage]]\nname = \"s\"\nshell = \"true\"\nsweep.i = {{ list = [1, 2] }}\nworkdir = \"{workdir}\"\noutputs = [\"o.txt\"]\n"
            ));
            assert!(w.is_empty(), "{workdir}: {w:?}");
        }
        // One task alone, or no outputs, races with nothing.
        let w = warnings(
            "[farm]\nname = \"f\"\n[[stage]]\nname = \"a\"\nshell = \"true\"\noutputs = [\"o.txt\"]\n[[stage]]\nname = \"b\"\nshell = \"true\"\nsweep.i = { list = [1, 2] }\n",
        );
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn stages_sharing_a_folder_warn_only_when_they_can_overlap() {
        let farm = |after: &str| {
            format!(
                "[farm]\nname = \"f\"\n[[stage]]\nname = \"a\"\nshell = \"true\"\noutputs = [\"o.txt\"]\n[[stage]]\nname = \"b\"\nshell = \"true\"\n{after}outputs = [\"p.txt\"]\n"
            )
        };
        let w = warnings(&farm(""));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].message.contains("stages `a` and `b`"), "{}", w[0]);
        assert!(warnings(&farm("after = [\"a\"]\n")).is_empty());
    }

    fn values(def: &FarmDef, stage: u32) -> Vec<Vec<String>> {
        let s = &def.stages[stage as usize];
        (0..s.len()).map(|i| s.sweep.binding(i)).collect()
    }

    const BRIEF_EXAMPLE: &str = r#"
[farm]
name = "sweep"

[defaults]
resources = { cpu = 1, mem = "512MiB" }
retries = 1
timeout = "10m"

[[stage]]
name = "solve"
command = ["./wrapper.sh", "solver", "{x}", "{seed}"]
sweep.x = { lines = "params.txt" }
sweep.seed = { range = "1..3" }
sweep_mode = "product"
workdir = "runs/{stage}/{index}"
inputs = ["case/model.edp", "wrapper.sh"]
outputs = ["result.dat", "logs/*.log"]
env = { OMP_NUM_THREADS = "1" }
resources = { cpu = 1, gpu = 0.5, token = 1 }
success_codes = [0]

[[stage]]
name = "report"
after = ["solve"]
shell = "cat {out}/solve/*/result.dat > summary.txt"
outputs = ["summary.txt"]
"#;

    #[test]
    fn the_reference_example_expands_to_the_right_tasks() {
        let (dir, def) = good(
            BRIEF_EXAMPLE,
            &[
                ("params.txt", "alpha\n\nbeta\n  gamma  \n"),
                ("wrapper.sh", "#!/bin/sh\n"),
                ("case/model.edp", "model\n"),
            ],
        );
        assert_eq!(def.name, "sweep");
        assert_eq!(def.out, "/tmp/mesh-test-out");
        let root = dir.path().canonicalize().expect("canonical");
        assert_eq!(def.root, root.to_str().expect("utf8"));
        assert_eq!(def.stages.len(), 2);
        assert_eq!(def.stages[0].len(), 9, "3 lines x 3 seeds");
        assert_eq!(def.task_count(), 10);

        // Product order: the first variable varies slowest.
        let task = def.expand(TaskRef::new(0, 4));
        assert_eq!(
            task.command,
            Command::Argv(vec![
                "./wrapper.sh".into(),
                "solver".into(),
                "beta".into(),
                "2".into()
            ])
        );
        assert_eq!(task.workdir.as_deref(), Some("runs/solve/4"));
        assert_eq!(task.inputs, ["case/model.edp", "wrapper.sh"]);
        assert_eq!(task.outputs, ["result.dat", "logs/*.log"]);
        assert_eq!(task.env, [("OMP_NUM_THREADS".to_string(), "1".to_string())]);
        assert_eq!(def.task_name(TaskRef::new(0, 8)), "solve/8");
        assert_eq!(def.expand(TaskRef::new(0, 8)).command, {
            Command::Argv(vec![
                "./wrapper.sh".into(),
                "solver".into(),
                "gamma".into(),
                "3".into(),
            ])
        });

        let solve = &def.stages[0];
        // Resources merge per key: mem from [defaults], the rest from the stage.
        assert_eq!(
            solve.resources.to_string(),
            "cpu=1,gpu=0.5,mem=512MiB,token=1"
        );
        assert_eq!(solve.retries, 1);
        assert_eq!(solve.timeout_ms, Some(600_000));
        assert_eq!(solve.success_codes, [0]);

        let report = &def.stages[1];
        assert_eq!(report.after, [0]);
        assert!(report.after_each.is_empty());
        assert_eq!(report.len(), 1);
        assert_eq!(
            def.expand(TaskRef::new(1, 0)).command,
            Command::Shell("cat /tmp/mesh-test-out/solve/*/result.dat > summary.txt".into())
        );
        // [defaults] apply to every stage.
        assert_eq!(report.resources.to_string(), "cpu=1,mem=512MiB");
        assert_eq!(report.retries, 1);
    }

    #[test]
    fn defaults_merge_and_every_task_takes_a_core_unless_it_says_otherwise() {
        let (_dir, def) = good(
            r#"
[defaults]
resources = { mem = "1GiB", token = 1 }
env = { A = "from-defaults", B = 2 }
retries = 3
workdir = "runs/{stage}/{index}"
expected = "10m"

[[stage]]
name = "plain"
command = ["true"]

[[stage]]
name = "no-core"
command = ["true"]
resources = { cpu = 0, token = 0 }
env = { A = "own" }
retries = 0
timeout = 90
expected = 30
"#,
            &[],
        );
        let plain = &def.stages[0];
        assert_eq!(plain.resources.to_string(), "cpu=1,mem=1GiB,token=1");
        assert_eq!(plain.retries, 3);
        assert_eq!(plain.timeout_ms, None);
        assert_eq!(plain.expected_ms, Some(600_000));
        let task = def.expand(TaskRef::new(0, 0));
        assert_eq!(task.workdir.as_deref(), Some("runs/plain/0"));
        assert_eq!(
            task.env,
            [
                ("A".into(), "from-defaults".into()),
                ("B".into(), "2".into())
            ]
        );

        let own = &def.stages[1];
        assert_eq!(
            own.resources.to_string(),
            "mem=1GiB",
            "cpu = 0 and token = 0 ask for nothing"
        );
        assert_eq!(own.retries, 0);
        assert_eq!(own.timeout_ms, Some(90_000));
        assert_eq!(own.expected_ms, Some(30_000));
        let task = def.expand(TaskRef::new(1, 0));
        assert_eq!(
            task.env,
            [("B".into(), "2".into()), ("A".into(), "own".into())]
        );
        assert_eq!(task.workdir.as_deref(), Some("runs/no-core/0"));
    }

    #[test]
    fn dependencies_resolve_to_stage_positions() {
        let (_dir, def) = good(
            r#"
[[stage]]
name = "report"
command = ["true"]
after = "analyze"

[[stage]]
name = "simulate"
command = ["echo", "{x}"]
sweep.x = { range = "1..4" }

[[stage]]
name = "analyze"
shell = "cat {out}/simulate/{index}/sim.dat"
sweep.i = { range = "0..3" }
after_each = ["simulate"]
after = ["simulate", "simulate"]
"#,
            &[],
        );
        assert_eq!(
            def.stages[0].after,
            [2],
            "a stage may wait for one defined later"
        );
        assert_eq!(def.stages[2].after_each, [1]);
        assert_eq!(def.stages[2].after, [1], "repeated names count once");
        assert_eq!(
            def.expand(TaskRef::new(2, 3)).command,
            Command::Shell("cat /tmp/mesh-test-out/simulate/3/sim.dat".into())
        );
    }

    #[test]
    fn ranges_read_steps_negatives_and_decimals() {
        let range = |text: &str| match parse_range(text) {
            Ok(v) => (0..v.len()).map(|i| v.get(i)).collect::<Vec<_>>(),
            Err(e) => panic!("{text}: {e}"),
        };
        assert_eq!(range("1..100").len(), 100);
        assert_eq!(range("1..100")[99], "100");
        assert_eq!(range("0..100:10").len(), 11);
        assert_eq!(range("0..10:3"), ["0", "3", "6", "9"]);
        assert_eq!(range("-5..5").len(), 11);
        assert_eq!(range("-5..5")[0], "-5");
        assert_eq!(range("7..7"), ["7"]);
        assert_eq!(range(" 1 .. 3 "), ["1", "2", "3"]);
        assert_eq!(
            parse_range("0.0..1.0:0.25").ok(),
            Some(Values::Range {
                start: 0,
                step: 25,
                count: 5,
                decimals: 2
            })
        );
        assert_eq!(
            range("0.0..1.0:0.25"),
            ["0.00", "0.25", "0.50", "0.75", "1.00"]
        );
        assert_eq!(range("-1.5..0.5:1"), ["-1.5", "-0.5", "0.5"]);
        assert_eq!(range("0..1:0.3"), ["0.0", "0.3", "0.6", "0.9"]);

        let problem = |text: &str| match parse_range(text) {
            Err(Problem::Range { problem, .. }) => problem,
            other => panic!("{text}: expected a range problem, got {other:?}"),
        };
        assert_eq!(problem("1-10"), RangeProblem::Malformed);
        assert_eq!(problem("1..x"), RangeProblem::Malformed);
        assert_eq!(problem("1...5"), RangeProblem::Malformed);
        assert_eq!(problem("1."), RangeProblem::Malformed);
        assert_eq!(problem("10..1"), RangeProblem::Empty);
        assert_eq!(problem("0..10:0"), RangeProblem::BadStep);
        assert_eq!(problem("0..10:-1"), RangeProblem::BadStep);
        assert_eq!(problem("0..1.5"), RangeProblem::DecimalNeedsStep);
        assert_eq!(problem("0..1:0.0000000001"), RangeProblem::TooPrecise);
        assert_eq!(
            problem("99999999999999999999..99999999999999999999"),
            RangeProblem::TooLarge
        );
        assert!(matches!(
            parse_range("0..9999999999999"),
            Err(Problem::TooManyTasks)
        ));
    }

    #[test]
    fn zip_pairs_values_and_lists_take_any_scalar() {
        let (_dir, def) = good(
            r#"
[[stage]]
name = "z"
command = ["echo", "{a}", "{b}"]
sweep.a = { list = [1, "two", 2.5, true, 0.10, -3] }
sweep.b = { range = "10..15" }
sweep_mode = "zip"
"#,
            &[],
        );
        assert_eq!(def.stages[0].len(), 6);
        assert_eq!(
            values(&def, 0),
            [
                ["1", "10"],
                ["two", "11"],
                ["2.5", "12"],
                ["true", "13"],
                ["0.10", "14"],
                ["-3", "15"]
            ]
        );
    }

    #[test]
    fn names_and_output_folder_have_defaults() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("my-farm.toml");
        let text = "[[stage]]\nname = \"s\"\ncommand = [\"true\"]\n";
        let def = load_str(&path, text, &LoadOptions::default()).expect("loads");
        assert_eq!(def.name, "my-farm");
        let cwd = std::env::current_dir().expect("cwd");
        assert_eq!(
            PathBuf::from(&def.out),
            cwd.join("mesh-out").join("my-farm")
        );
        let def = load_str(&path, text, &opts("./results")).expect("loads");
        assert_eq!(PathBuf::from(&def.out), cwd.join("results"));
        assert_eq!(def.stages[0].sweep, Sweep::single());
        assert_eq!(def.stages[0].success_codes, [0]);
    }

    #[test]
    fn a_file_name_that_is_no_farm_name_asks_for_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("my farm.toml");
        let text = "[[stage]]\nname = \"s\"\ncommand = [\"true\"]\n";
        let err = load_str(&path, text, &LoadOptions::default()).expect_err("bad stem");
        assert_eq!(err.field(), Some("farm.name"));
        assert_eq!(err.line(), Some(1));
        assert!(
            err.to_string().contains("set one with `[farm] name"),
            "{err}"
        );
    }

    #[test]
    fn errors_read_file_line_context_field_and_expectation() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sweep.toml");
        let text = "[[stage]]\nname = \"solve\"\ncommand = [\"true\"]\nretries = \"x\"\n";
        let err = load_str(&path, text, &LoadOptions::default()).expect_err("bad retries");
        assert_eq!(
            err.to_string(),
            format!(
                "{}:4:11: stage `solve`, field `retries`: invalid type: string \"x\", expected a non-negative integer",
                path.display()
            )
        );
        assert_eq!(err.line(), Some(4));
        assert_eq!(err.column(), Some(11));
        assert_eq!(err.field(), Some("stage.retries"));
    }

    #[test]
    fn sweep_values_used_in_paths_are_checked_only_where_used() {
        // A value with `..` is fine as an argument ...
        good(
            r#"
[[stage]]
name = "s"
command = ["echo", "{x}"]
sweep.x = { list = ["../up", "/abs"] }
workdir = "runs/{index}"
"#,
            &[],
        );
        // ... but not in an output path.
        let err = bad(
            r#"
[[stage]]
name = "s"
command = ["echo", "{x}"]
sweep.x = { lines = "p.txt" }
outputs = ["out-{x}.dat"]
"#,
            &[("p.txt", "ok\n/etc/shadow\n")],
        );
        assert_eq!(err.field(), Some("stage.outputs"));
        assert!(err.to_string().contains("value `/etc/shadow`"), "{err}");
        // Dynamic inputs are checked when staged, not at load time.
        good(
            r#"
[[stage]]
name = "s"
command = ["true"]
sweep.case = { list = ["a", "b"] }
inputs = ["cases/{case}.dat"]
"#,
            &[],
        );
    }

    #[test]
    fn a_cycle_is_named_in_order() {
        let err = bad(
            r#"
[[stage]]
name = "a"
command = ["true"]

[[stage]]
name = "b"
command = ["true"]
after = ["c"]

[[stage]]
name = "c"
command = ["true"]
after = ["a", "b"]
"#,
            &[],
        );
        assert!(
            err.to_string().contains("dependency cycle: b -> c -> b"),
            "{err}"
        );
        assert_eq!(err.line(), Some(9));
    }

    /// Checks one bad farm against its `.expected` file: `line: N`, `field: F`
    /// (or `-` for none), then substrings the message must contain.
    fn check(file: &Path, expected: &str) -> std::result::Result<(), String> {
        let mut lines = expected.lines();
        let want_line: usize = lines
            .next()
            .and_then(|l| l.strip_prefix("line: "))
            .and_then(|n| n.trim().parse().ok())
            .ok_or("the .expected file must start with `line: N`")?;
        let want_field = lines
            .next()
            .and_then(|l| l.strip_prefix("field: "))
            .map(str::trim)
            .ok_or("the second line of the .expected file must be `field: F`")?;
        let err = match load(file, &opts("/tmp/mesh-test-out")) {
            Ok(_) => return Err("loaded without error".to_string()),
            Err(e) => e,
        };
        let msg = err.to_string();
        let mut wrong = Vec::new();
        if err.line() != Some(want_line) {
            wrong.push(format!("line {:?}, expected {want_line}", err.line()));
        }
        let want_field = (want_field != "-").then_some(want_field);
        if err.field() != want_field {
            wrong.push(format!("field {:?}, expected {want_field:?}", err.field()));
        }
        for sub in lines.filter(|l| !l.trim().is_empty()) {
            if !msg.contains(sub) {
                wrong.push(format!("message lacks {sub:?}"));
            }
        }
        if !msg.starts_with(&format!("{}:{want_line}:", file.display())) {
            wrong.push("message does not start with file:line:".to_string());
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!("{}\n      actual: {msg}", wrong.join("; ")))
        }
    }

    #[test]
    fn bad_farms_fail_with_the_expected_errors() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/farms/bad");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("tests/farms/bad")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        files.sort();
        assert!(files.len() >= 25, "only {} bad farms", files.len());
        let mut failures = Vec::new();
        for file in &files {
            let expected = match std::fs::read_to_string(file.with_extension("expected")) {
                Ok(text) => text,
                Err(e) => {
                    failures.push(format!("{}: no .expected file: {e}", file.display()));
                    continue;
                }
            };
            if std::env::var_os("MESH_SHOW_ERRORS").is_some() {
                if let Err(e) = load(file, &opts("/tmp/mesh-test-out")) {
                    eprintln!("{e}");
                }
            }
            if let Err(why) = check(file, &expected) {
                let name = file
                    .file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default();
                failures.push(format!("{name}: {why}"));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} bad farms did not fail as expected:\n{}",
            failures.len(),
            files.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn every_example_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let mut farms: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("examples/")
            .filter_map(|e| e.ok().map(|e| e.path().join("farm.toml")))
            .filter(|p| p.is_file())
            .collect();
        farms.sort();
        assert!(
            farms.len() >= 3,
            "expected at least three examples, found {farms:?}"
        );
        for farm in farms {
            if let Err(e) = load(&farm, &opts("/tmp/mesh-example-out")) {
                panic!("{} does not load: {e}", farm.display());
            }
        }
    }
}
