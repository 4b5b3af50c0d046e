//! Where in the file a problem is: byte offsets to line and column, and the section, stage and field an error names.

use super::error::{FarmFileError, Invalid, Problem};
use super::Src;

/// A value with where it was written, and whether it came from `[defaults]`.
#[derive(Clone, Debug)]
pub(super) struct At<T> {
    pub(super) v: T,
    pub(super) pos: usize,
    pub(super) dflt: bool,
}

/// Where in the farm a field lives; decides the error's context and field prefix.
#[derive(Clone, Debug)]
pub(super) enum Ctx {
    Top,
    Farm,
    Defaults,
    /// A stage, by its label (`stage \`solve\`` or `stage #2`).
    Stage(String),
}

impl Src<'_> {
    pub(super) fn scope(&self, ctx: Ctx, dflt: bool) -> Scope<'_> {
        Scope {
            src: self,
            ctx,
            dflt,
        }
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub(super) fn line_col(&self, pos: usize) -> (usize, usize) {
        line_col(self.text, pos)
    }
}

/// Checks and errors for one section of the file. What it reads is read in
/// `parse`, `sweep` and `stage`; here is how it places what is wrong.
pub(super) struct Scope<'s> {
    pub(super) src: &'s Src<'s>,
    ctx: Ctx,
    /// True while reading `[defaults]` itself.
    dflt: bool,
}

impl Scope<'_> {
    pub(super) fn fail(&self, pos: usize, field: &str, problem: Problem) -> FarmFileError {
        self.fail_from(pos, self.dflt, field, problem)
    }

    pub(super) fn fail_at<T>(&self, at: &At<T>, field: &str, problem: Problem) -> FarmFileError {
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

    pub(super) fn unknown(
        &self,
        pos: usize,
        name: &str,
        allowed: &'static [&'static str],
    ) -> FarmFileError {
        self.unknown_in(pos, "", name, allowed)
    }

    pub(super) fn unknown_in(
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

    pub(super) fn at<T>(&self, v: T, pos: usize) -> At<T> {
        At {
            v,
            pos,
            dflt: self.dflt,
        }
    }
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
pub(super) fn syntax_error(file: &str, text: &str, e: &toml::de::Error) -> FarmFileError {
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
