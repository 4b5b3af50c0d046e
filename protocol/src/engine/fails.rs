//! Failing fast (`max_fails`): a stage whose first ended attempts all fail the same way stops starting tasks, until a success or a resume.
//!
//! A program that cannot start, or a module missing on every node, fails
//! every task of a stage alike; without this each of them fails, and each
//! retry, one message each. Here the engine stops the stage once its first
//! `max_fails` ended attempts failed alike with none succeeding: its
//! tasks not started (and the retries of those that failed) are held
//! (`HELD`, counted as `stopped`), what depends on the stage is skipped,
//! and the farm ends with one [`Event::StageStopped`]. Held tasks have no
//! record that says failed, so a resume runs them; with
//! [`AddOptions::retry_stages`] the stage's failed ones too.
//!
//! A success of the stage (one that was running when it stopped, or a
//! done that a mesh learns of) means the failures were the tasks' own: the
//! stage goes on ([`Event::StageResumed`]).

use rustc_hash::FxHashSet;

use super::{
    ready_each, Action, Engine, Event, FarmSlot, Persist, StageState, Stop, TaskEnd, HELD, PENDING,
};
use crate::farm::{StageDef, TaskRef};

/// What `max_fails` has seen of a stage's ended attempts in this run.
#[derive(Default)]
pub(super) struct Streak {
    /// A success, or two failures that differ: the stage is never stopped.
    broken: bool,
    /// The first failure: its signature, which every later one must
    /// share, and the stop it would be.
    first: Option<(String, Box<Stop>)>,
    attempts: u32,
    tasks: FxHashSet<u32>,
}

impl Streak {
    /// Never stops the stage again (a success, or failures that differ).
    pub(super) fn break_off(&mut self) {
        *self = Streak {
            broken: true,
            ..Streak::default()
        };
    }

    /// True while the stage may still be stopped: its ended attempts all
    /// failed alike so far, and it has not stopped.
    pub(super) fn open(&self) -> bool {
        !self.broken
    }
}

/// A failed attempt of `task` (failed, not stopped on purpose), seen
/// before its status changes: the stop it brings, when the stage stops
/// now. `retry`: the failure would be retried.
pub(super) fn judge(
    st: &mut StageState,
    def: &StageDef,
    task: TaskRef,
    end: &TaskEnd,
    stderr_line: Option<&str>,
    retry: bool,
) -> Option<Stop> {
    if def.max_fails == 0 || st.streak.broken || st.stopped.is_some() {
        return None;
    }
    let values = def.sweep.binding(task.index);
    let sig = signature(end, stderr_line, &values);
    match &st.streak.first {
        None => {
            let stop = Stop {
                attempts: 0,
                tasks: 0,
                task,
                end: end.clone(),
                stderr_line: stderr_line.map(str::to_string),
            };
            st.streak.first = Some((sig, Box::new(stop)));
        }
        Some((first, _)) if *first != sig => {
            st.streak.break_off();
            return None;
        }
        Some(_) => {}
    }
    st.streak.attempts += 1;
    st.streak.tasks.insert(task.index);
    // Stopping holds back what is left: this failure's retry, or tasks
    // not started. A stage with neither (all of it ran already) ends as
    // it is, with its failures said one by one as usual.
    let left = retry || st.counts.queued() > 0;
    if st.streak.attempts < def.max_fails || !left {
        return None;
    }
    let (_, first) = st.streak.first.take()?;
    let stop = Stop {
        attempts: st.streak.attempts,
        tasks: st.streak.tasks.len() as u32,
        ..*first
    };
    st.streak = Streak::default();
    Some(stop)
}

impl Engine {
    /// Stops stage `s` as `max_fails` does: its pending tasks are held and
    /// what depends on it is skipped. Public for a driver that shows a
    /// farm as it ended (`mesh status` restores it from its records, which
    /// have no word of the stop).
    pub fn stop_stage(&mut self, farm: FarmSlot, stage: u32, stop: Stop) {
        let f = &mut self.farms[farm.0 as usize];
        let Some(st) = f.stages.get_mut(stage as usize) else {
            return;
        };
        if st.stopped.is_some() {
            return;
        }
        for i in 0..st.status.len() {
            if st.status[i] == PENDING {
                st.set(i, HELD);
            }
        }
        st.ready.clear();
        st.stopped = Some(stop.clone());
        f.stops += 1;
        self.actions.push_back(Action::Persist(Persist::Stage {
            farm,
            stage,
            stop: Some(stop.clone()),
        }));
        self.actions
            .push_back(Action::Emit(Event::StageStopped { farm, stage, stop }));
        self.fail_dependents(farm, stage, None);
    }

    /// Why a stage stopped, while it is stopped.
    pub fn stage_stop(&self, farm: FarmSlot, stage: u32) -> Option<&Stop> {
        self.farms[farm.0 as usize]
            .stages
            .get(stage as usize)?
            .stopped
            .as_ref()
    }

    /// The farm's stopped stages, with why.
    pub fn stage_stops(&self, farm: FarmSlot) -> Vec<(u32, Stop)> {
        let f = &self.farms[farm.0 as usize];
        debug_assert_eq!(
            f.stops as usize,
            f.stages.iter().filter(|s| s.stopped.is_some()).count()
        );
        if f.stops == 0 {
            // Asked at every sync: not a look at every stage of an open
            // farm grown by thousands of batches.
            return Vec::new();
        }
        f.stages
            .iter()
            .enumerate()
            .filter_map(|(s, st)| Some((s as u32, st.stopped.clone()?)))
            .collect()
    }

    /// True while a stage may still stop: its ended attempts so far all
    /// failed the same way, `max_fails` applies, and its tasks and retries
    /// make that many attempts. A driver holds back its failures'
    /// messages meanwhile, to say one stop instead.
    pub fn stage_may_stop(&self, farm: FarmSlot, stage: u32) -> bool {
        let f = &self.farms[farm.0 as usize];
        let (Some(st), Some(def)) = (
            f.stages.get(stage as usize),
            f.def.stages.get(stage as usize),
        ) else {
            return false;
        };
        let attempts = u64::from(def.len()) * (1 + u64::from(def.retries));
        def.max_fails > 0
            && attempts >= u64::from(def.max_fails)
            && st.stopped.is_none()
            && st.streak.open()
    }

    /// A task of the stage succeeded: it is never stopped in this run, and
    /// goes on if it was.
    pub(super) fn succeeded(&mut self, farm: FarmSlot, task: TaskRef) {
        let f = &mut self.farms[farm.0 as usize];
        let s = task.stage as usize;
        let st = &mut f.stages[s];
        st.streak.break_off();
        if st.stopped.take().is_none() {
            return;
        }
        f.stops -= 1;
        for i in 0..st.status.len() {
            if st.status[i] == HELD {
                st.set(i, PENDING);
            }
        }
        st.rewind();
        if st.open && super::per_task(&f.def.stages[s]) {
            let ready = ready_each(f, s, 0..f.stages[s].status.len());
            f.stages[s].ready.extend(ready);
        }
        self.actions.push_back(Action::Persist(Persist::Stage {
            farm,
            stage: task.stage,
            stop: None,
        }));
        self.actions.push_back(Action::Emit(Event::StageResumed {
            farm,
            stage: task.stage,
            task,
        }));
        self.revive_dependents(farm, task.stage, None);
    }
}

/// What two failed attempts of a stage must share to have failed the same
/// way: how they ended (the exit code, the signal, a timeout, or an error
/// of the driver's) and what they said (that error, or the first line
/// written to stderr), less what differs from task to task of one cause:
/// absolute paths (the task's folder; in a mesh, each node's), the task's
/// own sweep values, and numbers. Compared exactly, not by likeness: it
/// must be sure, and a stop that does not come costs only the failures
/// it would have saved.
pub(super) fn signature(end: &TaskEnd, stderr_line: Option<&str>, values: &[String]) -> String {
    let (kind, text) = match end {
        TaskEnd::Exited(c) => (format!("exit {c}"), stderr_line.unwrap_or("")),
        TaskEnd::Signaled(s) => (format!("signal {s}"), stderr_line.unwrap_or("")),
        // What a task stuck until its timeout wrote last differs; that it
        // ran out of time does not.
        TaskEnd::TimedOut { .. } => ("timeout".to_string(), ""),
        TaskEnd::Error(e) => ("error".to_string(), e.as_str()),
        TaskEnd::Cached | TaskEnd::CrashLimit | TaskEnd::Cancelled => ("other".to_string(), ""),
    };
    format!("{kind}: {}", normalize(text, values))
}

/// `text` with absolute paths, the task's sweep values that have letters
/// (numbers go with all numbers) as whole words, and runs of digits
/// written as placeholders.
fn normalize(text: &str, values: &[String]) -> String {
    let mut words: Vec<&str> = values
        .iter()
        .map(String::as_str)
        .filter(|v| v.chars().any(char::is_alphabetic))
        .collect();
    // Longest first, so that a value inside another is not taken from it.
    words.sort_by_key(|v| std::cmp::Reverse(v.len()));
    let mut text = text.to_string();
    for w in words {
        text = replace_word(&text, w, "<value>");
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut prev: Option<char> = None;
    while let Some(c) = chars.next() {
        if c == '/' && !prev.is_some_and(in_path) {
            while chars
                .next_if(|&n| !n.is_whitespace() && !"'\"`),;:".contains(n))
                .is_some()
            {}
            out.push_str("<path>");
            prev = Some('>');
        } else if c.is_ascii_digit() {
            while chars.next_if(char::is_ascii_digit).is_some() {}
            out.push('#');
            prev = Some(c);
        } else {
            out.push(c);
            prev = Some(c);
        }
    }
    out
}

/// A character that continues a relative path: a `/` after one is not
/// the start of an absolute path.
fn in_path(c: char) -> bool {
    c.is_alphanumeric() || "._-~".contains(c)
}

/// `text` with each occurrence of `word` that is not part of a longer
/// word (no letter or digit right before or after it) replaced.
fn replace_word(text: &str, word: &str, with: &str) -> String {
    let alnum = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (at, _) in text.match_indices(word) {
        if at < last {
            continue;
        }
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        if alnum(before) || alnum(after) {
            continue;
        }
        out.push_str(&text[last..at]);
        out.push_str(with);
        last = at + word.len();
    }
    out.push_str(&text[last..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(end: TaskEnd, line: Option<&str>, values: &[&str]) -> String {
        let values: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        signature(&end, line, &values)
    }

    #[test]
    fn what_differs_from_task_to_task_of_one_cause_is_left_out() {
        let start = |dir: &str| {
            TaskEnd::Error(format!(
                "could not start `wrapper.sh` in {dir}: No such file or directory (os error 2)"
            ))
        };
        // Each task's folder, on each node.
        assert_eq!(
            sig(start("/home/a/farm/runs/3"), None, &["3"]),
            sig(start("/state/n2/work/9/root/runs/17"), None, &["17"])
        );
        // A value of the sweep, and numbers.
        assert_eq!(
            sig(
                TaskEnd::Exited(1),
                Some("error: cannot open alpha.csv (line 12)"),
                &["alpha"]
            ),
            sig(
                TaskEnd::Exited(1),
                Some("error: cannot open beta.csv (line 40)"),
                &["beta"]
            )
        );
        // A relative path is kept, less its numbers.
        assert_eq!(
            sig(TaskEnd::Exited(2), Some("runs/3/in.txt: bad header"), &[]),
            sig(TaskEnd::Exited(2), Some("runs/4/in.txt: bad header"), &[])
        );
        assert!(sig(TaskEnd::Exited(2), Some("runs/3/in.txt"), &[]).contains("runs/#/in.txt"));
    }

    #[test]
    fn failures_that_differ_in_more_differ() {
        let line = |l| sig(TaskEnd::Exited(1), Some(l), &[]);
        assert_ne!(line("ModuleNotFoundError: numpy"), line("MemoryError"));
        assert_ne!(
            sig(TaskEnd::Exited(1), Some("x"), &[]),
            sig(TaskEnd::Exited(2), Some("x"), &[])
        );
        assert_ne!(
            sig(TaskEnd::Signaled(9), None, &[]),
            sig(TaskEnd::Exited(9), None, &[])
        );
    }

    #[test]
    fn a_value_is_taken_out_only_as_a_whole_word() {
        let values = ["a".to_string()];
        assert_eq!(normalize("a bad value", &values), "<value> bad value");
        let values = ["ab".to_string(), "abc".to_string()];
        assert_eq!(normalize("abc ab abcd", &values), "<value> <value> abcd");
    }
}
