//! Tasks for clients one by one (the Python package's `as_completed` and `tasks`): each task of a farm said once, when it ended for good and, done, its outputs are home.
//!
//! A follower reads the home's copy of the farm's log from its start, so
//! one that comes late hears every task that ended before it came, and one
//! that comes early hears each as it ends. A done task is held back until
//! its outputs are in the home's folder: what a client is told is done, it
//! can open. A task is said once whatever the log says of it again (a done
//! repeated for holders, a done after a failure once a partition heals).
//! A task of a stage that fits no node is said failed, with why, as soon
//! as the coordinator says so: it has no entry in the log, and an open
//! farm is never over, so nothing else would ever tell its client.

use super::{label_of, Home, Lent};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mesh_protocol::engine::TaskEnd;
use mesh_protocol::farm::FarmDef;
use mesh_protocol::home::{Rest, Seen, Told};
use mesh_protocol::mesh::{Entry, FarmId, Replica};
use mesh_protocol::TaskRef;

use crate::control::{ControlResponse, ErrorKind, TaskEvent};
use crate::mesh_node::refusals::QueryError;
use crate::mesh_node::reply::{Reply, REPLY_MAX};
use crate::mesh_node::{Event, LoopHandle};
use crate::task_words::describe_failure;
use crate::view::FarmView;

/// Entries of the log read in one turn of the loop for one follower: a
/// follower of a finished million-task farm is fed over many turns, not
/// in one that holds up the node.
const READ_PER_TURN_MAX: usize = 4096;

/// Places of a follower's queue (`REPLY_MAX`) the log is not read into:
/// for the tasks whose outputs come home meanwhile, and the end. A
/// follower whose queue is fuller waits, its place in the log kept, until
/// half of it is free; only one that takes in nothing while this many
/// outputs come home is cut off as lagged.
const KEEP_FREE: usize = 64;

/// One client following a farm's tasks: what it was told is `home`'s
/// `Told`, which says what to tell it next.
pub(in crate::mesh_node) struct Feed {
    reply: Reply,
    told: Told,
    /// A task waits for room in its queue, to bring it back (`Cmd::Feed`).
    stalled: Arc<AtomicBool>,
    /// Told the end.
    over: bool,
}

impl Feed {
    fn new(r: &Replica, reply: Reply) -> Feed {
        let mut f = Feed {
            reply,
            told: Told::default(),
            stalled: Arc::new(AtomicBool::new(false)),
            over: false,
        };
        f.fit(&r.spec.def);
        f
    }

    /// Room to mark the tasks of every stage of `def` said.
    fn fit(&mut self, def: &FarmDef) {
        self.told.fit(def.stages.len(), |s| def.stages[s].len());
    }

    /// Brings this follower back to the loop once half its queue is free:
    /// the loop cannot wait for its reader, a task can.
    fn wait_room(&self, farm: FarmId, handle: &LoopHandle) {
        if self.stalled.swap(true, Ordering::Relaxed) {
            return;
        }
        let (reply, stalled, handle) = (self.reply.clone(), self.stalled.clone(), handle.clone());
        tokio::spawn(async move {
            if reply.wait_room(REPLY_MAX / 2).await.is_ok() {
                stalled.store(false, Ordering::Relaxed);
                let _ = handle.tell(Event::Feed(farm)).await;
            }
        });
    }
}

impl Home {
    /// Whether followers of long logs wait for their next part.
    pub(in crate::mesh_node) fn feeding(&self) -> bool {
        !self.feed_more.is_empty()
    }

    /// Feeds the followers of long logs their next part (a turn each).
    pub(in crate::mesh_node) fn feed_more(&mut self, m: &mut Lent<'_>) {
        for farm in std::mem::take(&mut self.feed_more) {
            self.feed(m, farm, None);
        }
    }

    /// A client follows the tasks of `farm`, whose home is this node.
    pub(in crate::mesh_node) fn follow_tasks(
        &mut self,
        m: &mut Lent<'_>,
        farm: FarmId,
        reply: Reply,
    ) {
        let Some(r) = m.mesh.replica(farm) else {
            let _ = reply.send(ControlResponse::error(
                ErrorKind::Refused,
                "this node keeps no copy of the farm's log",
            ));
            return;
        };
        let feed = Feed::new(r, reply);
        if let Some(o) = self.farms.get_mut(&farm) {
            o.feeds.push(feed);
        }
        self.feed(m, farm, None);
    }

    /// Tells the farm's followers what ended since they last heard: on
    /// every change to the farm's progress here, and with `fetched` when
    /// that task's outputs came home. Once the farm is over, the last
    /// tasks are said and then its end.
    pub(in crate::mesh_node) fn feed(
        &mut self,
        m: &mut Lent<'_>,
        farm: FarmId,
        fetched: Option<TaskRef>,
    ) {
        let Some(r) = m.mesh.replica(farm) else {
            return;
        };
        let Some(o) = self.farms.get_mut(&farm) else {
            return;
        };
        if o.feeds.is_empty() {
            return;
        }
        let mut feeds = std::mem::take(&mut o.feeds);
        let finished = o.view.finished.then(|| o.view.clone());
        let unrun = if r.spec.open && !o.view.finished {
            unrun_stages(r, &o.view, &o.not_run, &feeds)
        } else {
            Vec::new()
        };
        let mut more = false;
        for f in &mut feeds {
            f.fit(&r.spec.def);
            if let Some(t) = fetched {
                if f.told.came_home(t, r.outputs_here(t)) {
                    let _ = f.reply.send(task_said(m, r, t));
                }
            }
            // Each entry says at most one task: read no more than fit.
            let room = f.reply.room().saturating_sub(KEEP_FREE);
            let entries = r.log.slice(f.told.read, READ_PER_TURN_MAX.min(room));
            f.told.read += entries.len() as u64;
            if f.told.read < r.log.len() {
                if room < READ_PER_TURN_MAX {
                    f.wait_room(farm, m.handle);
                } else {
                    more = true;
                }
            }
            for e in entries {
                let t = e.task();
                let seen = match r.log.get(t) {
                    Some(Entry::Done { .. }) => Seen::Done {
                        home: r.outputs_here(t),
                    },
                    Some(Entry::Failed { .. }) => Seen::Failed,
                    _ => Seen::Open,
                };
                if f.told.read_entry(t, seen) {
                    let _ = f.reply.send(task_said(m, r, t));
                }
            }
            if !r.unplaceable.is_empty() && !say_unplaced(m, f, r) {
                f.wait_room(farm, m.handle);
            }
            if !unrun.is_empty() && !say_unrun(m, f, r, &unrun) {
                f.wait_room(farm, m.handle);
            }
        }
        if let (Some(view), false) = (finished, more) {
            // Over: every output is home, so whatever still waits is said,
            // as much as fits, to a follower that has read the whole log.
            for f in feeds.iter_mut().filter(|f| f.told.read >= r.log.len()) {
                let (last, end) = f.told.last(f.reply.room());
                for t in last {
                    let _ = f.reply.send(task_said(m, r, t));
                }
                if end {
                    let _ = f.reply.send(ControlResponse::Finished(view.clone()));
                    f.over = true;
                } else {
                    f.wait_room(farm, m.handle);
                }
            }
        }
        feeds.retain(|f| !f.over && !f.reply.is_closed());
        if let Some(o) = self.farms.get_mut(&farm) {
            o.feeds = feeds;
        }
        if more {
            // The rest of a long log in the next turns of the loop: not
            // through its own channel, which it must never wait on.
            self.feed_more.insert(farm);
        }
    }
}

/// Says the tasks of the stages that fit no node failed, as many as
/// the follower has room for; false when some are left for later.
fn say_unplaced(m: &Lent<'_>, f: &mut Feed, r: &Replica) -> bool {
    let stages: Vec<(u32, Option<u32>)> = r
        .unplaceable
        .iter()
        .map(|(s, _)| (*s, r.spec.def.stages.get(*s as usize).map(|d| d.len())))
        .collect();
    // `task_event` says why: the coordinator's words for the stage.
    say_rest(m, f, r, Rest::Unplaced, &stages, |_| None)
}

/// Says the tasks of `unrun`'s stages that did not run failed, with
/// why; as [`say_unplaced`].
fn say_unrun(m: &Lent<'_>, f: &mut Feed, r: &Replica, unrun: &[Unrun]) -> bool {
    let stages: Vec<(u32, Option<u32>)> = unrun.iter().map(|u| (u.stage, Some(u.len))).collect();
    say_rest(m, f, r, Rest::Unrun, &stages, |stage| {
        unrun
            .iter()
            .find(|u| u.stage == stage)
            .map(|u| u.why.clone())
    })
}

/// Says the tasks of `stages` without an entry in the log failed, as
/// `home::Told::rest` lets, `why` (by stage) their reason where it
/// says one; false when some are left for later.
fn say_rest(
    m: &Lent<'_>,
    f: &mut Feed,
    r: &Replica,
    which: Rest,
    stages: &[(u32, Option<u32>)],
    why: impl Fn(u32) -> Option<String>,
) -> bool {
    let (tell, all) = f.told.rest(which, stages, f.reply.room(), KEEP_FREE, |t| {
        r.log.get(t).is_some()
    });
    for t in tell {
        let mut ev = task_event(m, r, t);
        if let Some(why) = why(t.stage) {
            ev.state = "failed".into();
            ev.reason = Some(why);
        }
        let _ = f.reply.send(ControlResponse::Task(Box::new(ev)));
    }
    all
}

fn task_said(m: &Lent<'_>, r: &Replica, t: TaskRef) -> ControlResponse {
    ControlResponse::Task(Box::new(task_event(m, r, t)))
}

/// Task `t` of the farm of `r`, as a client sees it.
pub(in crate::mesh_node) fn task_event(m: &Lent<'_>, r: &Replica, t: TaskRef) -> TaskEvent {
    let def = &r.spec.def;
    let stage = def.stage(t);
    let mut ev = TaskEvent {
        task: def.task_name(t),
        stage: stage.name.clone(),
        index: t.index,
        params: def.binding(t).into_iter().collect(),
        state: "unfinished".into(),
        at_ms: crate::state::unix_ms(),
        ..TaskEvent::default()
    };
    match r.log.get(t) {
        Some(Entry::Done {
            node,
            attempt,
            outputs,
            ..
        }) => {
            ev.state = "done".into();
            ev.exit_code = r.log.get(t).and_then(|e| e.ran()?.exit_code).or(
                // A run that counts exited 0 when only 0 counts.
                (stage.success_codes == [0] && *attempt > 0).then_some(0),
            );
            ev.node = Some(label_of(m, *node));
            ev.attempt = *attempt;
            let dir = Path::new(r.out_dir())
                .join(&stage.name)
                .join(t.index.to_string());
            for f in outputs.iter() {
                match &f.data {
                    Some(data) => {
                        use base64::Engine as _;
                        let b64 = base64::engine::general_purpose::STANDARD.encode(data);
                        ev.values.insert(f.path.clone(), b64);
                    }
                    None => ev
                        .outputs
                        .push(dir.join(&f.path).to_string_lossy().into_owned()),
                }
            }
        }
        Some(Entry::Failed {
            node,
            attempt,
            end,
            stderr_line,
            ..
        }) => {
            ev.state = "failed".into();
            match **end {
                TaskEnd::Exited(c) => ev.exit_code = Some(c),
                TaskEnd::Signaled(s) => ev.signal = Some(s),
                _ => {}
            }
            ev.reason = Some(describe_failure(end, stderr_line.as_deref()));
            ev.node = Some(label_of(m, *node));
            ev.attempt = *attempt;
        }
        None => {
            if let Some((_, why)) = r.unplaceable.iter().find(|(s, _)| *s == t.stage) {
                ev.state = "failed".into();
                ev.reason = Some(format!(
                    "unplaceable: stage {} fits no node of the mesh: {why}",
                    stage.name
                ));
            }
        }
        _ => {}
    }
    if let Some(e) = r.log.get(t) {
        ev.usage = e.ran().and_then(|ran| ran.usage);
        (ev.start_ms, ev.end_ms) = match e.ran() {
            Some(ran) if ran.ended_ms != 0 => (ran.started_ms(), Some(ran.ended_ms)),
            // Not in the log (a copy restored from its records after a
            // restart keeps no times): what this node saw, if it ran it.
            _ => m.runs.record().run_times(r.id(), t, ev.attempt),
        };
    }
    ev
}

/// The tasks of a farm this node holds, `done`, `failed` or
/// `unfinished` (all with none), in task order, at most `limit`.
pub(in crate::mesh_node) fn tasks_in(
    m: &Lent<'_>,
    farm: FarmId,
    state: Option<&str>,
    limit: Option<u64>,
) -> Result<Vec<TaskEvent>, QueryError> {
    if let Some(s) = state.filter(|s| !matches!(*s, "done" | "failed" | "unfinished")) {
        return Err(QueryError::NoSuchState(s.to_string()));
    }
    let r = m.mesh.replica(farm).ok_or(QueryError::NoCopy)?;
    let limit = limit.unwrap_or(u64::MAX);
    let mut out = Vec::new();
    for (s, stage) in r.spec.def.stages.iter().enumerate() {
        for i in 0..stage.len() {
            if out.len() as u64 >= limit {
                return Ok(out);
            }
            let t = TaskRef::new(s as u32, i);
            if let Some((up, _, k)) = r.spec.def.grown_source(t) {
                // A place of a grown stage is a task once the task it
                // grows from found that many lines.
                let lines = r.log.get(up).and_then(|e| e.ran()?.grew);
                if lines.is_none_or(|n| k >= n) {
                    continue;
                }
            }
            let is = match r.log.get(t) {
                Some(Entry::Done { .. }) => "done",
                Some(Entry::Failed { .. }) => "failed",
                None if r.unplaceable.iter().any(|(s, _)| *s == t.stage) => "failed",
                _ => "unfinished",
            };
            if state.is_none_or(|want| want == is) {
                out.push(task_event(m, r, t));
            }
        }
    }
    Ok(out)
}

/// A stage of an open farm whose tasks without an entry in the log will
/// not run, and why.
struct Unrun {
    stage: u32,
    len: u32,
    why: String,
}

/// The stages of an open farm with nothing left to run, some of it not
/// run, whose every task that ended is in the home's log (the coordinator's
/// counts may come before the log's entries), and not yet told to every
/// follower.
fn unrun_stages(
    r: &Replica,
    view: &FarmView,
    not_run: &BTreeSet<u32>,
    feeds: &[Feed],
) -> Vec<Unrun> {
    let mut out = Vec::new();
    // Only stages with tasks not run: an open farm grown by many batches
    // has many stages, few of them not run, and this is looked at each
    // refresh.
    for &s in not_run {
        let s = s as usize;
        let Some((name, c)) = view.stages.get(s) else {
            continue;
        };
        let not_run = c.skipped + c.cancelled + c.stopped;
        if not_run == 0
            || c.running + c.queued_on_nodes > 0
            || c.done + c.failed + not_run < c.total
        {
            continue;
        }
        let Some(def) = r.spec.def.stages.get(s).filter(|d| d.name == *name) else {
            continue;
        };
        let (stage, len) = (s as u32, def.len());
        if feeds
            .iter()
            .all(|f| f.told.rest_told(Rest::Unrun, stage, len))
        {
            continue;
        }
        let logged = (0..len)
            .filter(|&i| r.log.get(TaskRef::new(stage, i)).is_some())
            .count() as u64;
        if logged < c.done + c.failed {
            continue;
        }
        let stopped = format!("stage `{name}` ");
        let why = if c.stopped > 0 {
            match view.stopped.iter().find(|l| l.starts_with(&stopped)) {
                Some(line) => line.clone(),
                None => format!("stage `{name}` stopped (see max_fails)"),
            }
        } else if c.skipped > 0 {
            "skipped: a task it depends on failed".to_string()
        } else {
            "cancelled".to_string()
        };
        out.push(Unrun { stage, len, why });
    }
    out
}
