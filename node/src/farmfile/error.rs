//! What can go wrong loading a farm file, in words a user can act on: the error types and their wording.

use std::fmt;
use std::io;
use std::path::PathBuf;

use mesh_protocol::farm::{TemplateError, STAGE_TASKS_MAX};
use mesh_protocol::resources::AmountError;
use toml::de::DeValue;

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
    #[error("both `{first}` and `{second}` are given; a stage takes exactly one of `command`, `shell` and `python`")]
    CommandAndShell {
        first: &'static str,
        second: &'static str,
    },
    #[error("`python` takes the interpreter and then a script: [\"python3\", \"script.py\", ...]")]
    PythonScript,
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
    #[error("`{name}` is not a valid {what} name, expected letters, digits, `_`, `.` and `-` (not only dots)")]
    BadName { name: String, what: &'static str },
    #[error("`{name}` (the file's name) is not a valid farm name, expected letters, digits, `_`, `.` and `-`; set one with `[farm] name = \"...\"`")]
    BadFileStem { name: String },
    #[error("`{name}` is not a valid sweep variable name, expected a letter or `_`, then letters, digits or `_`")]
    BadVarName { name: String },
    #[error("`{name}` is a built-in placeholder (index, stage, farm, out); choose another name for the sweep variable")]
    BuiltinVar { name: String },
    #[error("duplicate stage name `{name}` (first defined on line {first_line})")]
    DuplicateStage { name: String, first_line: usize },
    #[error("no stages: add at least one `[[stage]]` table with a name and a command")]
    NoStages,
    #[error("`{text}` is not a valid range: {problem}")]
    Range { text: String, problem: RangeProblem },
    #[error("expected exactly one of `lines`, `list` or `range`")]
    NoSweepSource,
    #[error("`max` is for a variable grown from another stage's file: give `from = \"stage\"` and `lines = \"file\"` with it")]
    MaxWithoutFrom,
    #[error("a variable grown from another stage takes its values from `lines = \"file\"`, the file each of that stage's tasks writes")]
    GrownNeedsLines,
    #[error("expected the name of a file inside each task's folder (no `..`, not absolute)")]
    GrownFile,
    #[error("a grown variable is its stage's only one: the stage has the variables of stage `{from}` already, each task those of the task it grew from (remove the others)")]
    GrownNotAlone { from: String },
    #[error("stage `{from}` keeps no outputs, so none of its files reach the tasks grown from it: add `{file}` to its `outputs`")]
    GrownFromNoOutputs { from: String, file: String },
    #[error("stage `{from}` already grows stage `{other}` from `{other_file}`: every stage grown from it reads the same file")]
    GrownTwoFiles {
        from: String,
        other: String,
        other_file: String,
    },
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
    #[error("{0}")]
    Dependency(String),
    /// Dependencies that read well but do not expand (see `Graph::build_parts`).
    #[error(transparent)]
    Graph(mesh_protocol::graph::DepError),
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
    #[error("`{text}` is not a valid duration, expected e.g. \"90s\", \"10m\", \"1h 30m\" or a number of seconds such as \"90\" or 90 ({source})")]
    Duration {
        text: String,
        #[source]
        source: humantime::DurationError,
    },
    #[error("the duration must be greater than zero")]
    ZeroDuration,
    #[error("the list is empty; at least one exit code must count as success")]
    NoSuccessCodes,
    #[error("`{name}` is not a valid resource name, expected a letter, then letters, digits, `_` and `-`")]
    ResourceName { name: String },
    #[error("{0}")]
    Amount(#[source] AmountError),
    #[error("`{name}` is not a valid environment variable name, expected a letter or `_`, then letters, digits or `_`")]
    EnvName { name: String },
    #[error("`{value}` has no unit, so it would be {value} bytes; expected a size with its unit, e.g. \"{value}MiB\" or \"4G\" (\"{value}B\" if bytes are meant)")]
    MemWithoutUnit { value: String },
    #[error("`{name}` is reserved: mesh sets the MESH_* variables itself")]
    EnvReserved { name: String },
}

/// What is wrong with a `range = "..."`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeProblem {
    #[error("expected `start..end` or `start..end:step`, e.g. `1..100`, `0..100:10`, `-5..5` or `0.0..1.0:0.25`")]
    Malformed,
    #[error("the end is below the start (an empty range)")]
    Empty,
    #[error("the step must be greater than zero")]
    BadStep,
    #[error("a decimal range needs a step, e.g. `0.0..1.0:0.25`")]
    DecimalNeedsStep,
    #[error("more than {max} decimals")]
    TooPrecise { max: u32 },
    #[error("the numbers are too large")]
    TooLarge,
}

/// Suggests the allowed name closest to a misspelt one, when one is close.
fn did_you_mean(name: &str, allowed: &[&str]) -> String {
    allowed
        .iter()
        .map(|a| (strsim::levenshtein(name, a), *a))
        .filter(|(d, a)| *d * 2 <= a.len())
        .min()
        .map(|(_, a)| format!(" (did you mean `{a}`?)"))
        .unwrap_or_default()
}

fn quoted_list(items: &[&str]) -> String {
    items
        .iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Serde's wording, so messages read like those of other TOML tools.
pub(super) fn wrong_type(found: &DeValue<'_>, expected: &'static str) -> Problem {
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
