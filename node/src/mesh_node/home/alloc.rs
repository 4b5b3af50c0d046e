//! `mesh alloc` on this node: batch operations run off the loop, how a batch job's node starts, and changes to the allocation queues answered once this node's copy of the book shows them; the scripts and batch commands it runs are `node/src/alloc/`.

use super::{Home, HomeOut, Lent};
use std::path::PathBuf;
use std::time::Instant;

use mesh_protocol::mesh::{AllocBook, AllocCmd, BatchOp};

use crate::alloc::{batch, script};
use crate::control::{ControlResponse, ErrorKind};
use crate::mesh_node::reply::Reply;
use crate::mesh_node::Event;

/// How many of the mesh's addresses a batch job's node is given to join.
const JOIN_ADDRS: usize = 4;

/// How long `mesh alloc add|remove|pause|resume` waits to see its change
/// in this node's copy of the book.
const ALLOC_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A user's change to the allocation queues, answered once this node's
/// copy of the book shows it.
struct AllocWait {
    cmd: AllocCmd,
    until: Instant,
    reply: Reply,
}

impl AllocWait {
    fn done(&self, book: &AllocBook) -> bool {
        match &self.cmd {
            AllocCmd::Add(d) => book.queue(&d.name).is_some(),
            AllocCmd::Remove { queue } => book.queue(queue).is_none(),
            AllocCmd::Pause { queue } => book.queue(queue).is_none_or(|q| q.paused.is_some()),
            AllocCmd::Resume { queue } => book.queue(queue).is_none_or(|q| q.paused.is_none()),
        }
    }
}

/// What `mesh alloc` keeps on a node.
pub(in crate::mesh_node) struct Alloc {
    /// The mesh secret's file, named in the scripts of `mesh alloc`.
    key_path: PathBuf,
    /// The mesh's part of its jobs' names (`keys::mesh_tag`).
    tag: String,
    waits: Vec<AllocWait>,
}

impl Alloc {
    pub(in crate::mesh_node) fn new(key_path: PathBuf, tag: String) -> Alloc {
        Alloc {
            key_path,
            tag,
            waits: Vec::new(),
        }
    }
}

impl Alloc {
    /// Carries out a batch operation off the loop; its end comes back as `Cmd::Batch`.
    pub(in crate::mesh_node) fn batch(&self, m: &Lent<'_>, op: BatchOp) {
        let handle = m.handle.clone();
        let launch = match &op {
            BatchOp::Submit { queue, .. } => Some(self.launch(m, &queue.name)),
            _ => None,
        };
        let dir = m.state.join("alloc");
        let tag = self.tag.clone();
        tokio::spawn(async move {
            let done = match op {
                BatchOp::Submit { queue, jobs } => {
                    let launch = launch.expect("built for a submission");
                    batch::submit(*queue, jobs, launch, &dir).await
                }
                BatchOp::Poll { system, jobs } => batch::poll(system, jobs).await,
                BatchOp::Cancel { system, job } => batch::cancel(system, job).await,
                BatchOp::List { system, gen } => batch::list(system, gen, tag).await,
            };
            let _ = handle.tell(Event::Batch(done)).await;
        });
    }

    /// How a job of queue `queue` starts its node: this binary, joining
    /// this node, with this node's key; state and output under `alloc/`.
    pub(in crate::mesh_node) fn launch(&self, m: &Lent<'_>, queue: &str) -> script::Launch {
        // This node, then a few members: a job that starts after this node
        // is gone still finds the mesh.
        let beat = m.mesh.beat();
        let loopback = |a: &&String| a.starts_with("/ip4/127.") || a.starts_with("/ip6/::1/");
        let pick = |addrs: &[String]| {
            addrs
                .iter()
                .find(|a| !loopback(a))
                .or_else(|| addrs.first())
                .cloned()
        };
        let join = pick(&beat.addrs)
            .into_iter()
            .chain(m.mesh.members().filter_map(|m| pick(m.addrs())))
            .take(JOIN_ADDRS)
            .collect::<Vec<_>>()
            .join(",");
        script::Launch::new(
            std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "mesh".into()),
            join,
            self.key_path.display().to_string(),
            m.state,
            queue,
            self.tag.clone(),
        )
    }

    /// Answers the `mesh alloc` changes this node's book now shows, and
    /// those that waited too long.
    pub(in crate::mesh_node) fn answer_waits(&mut self, m: &Lent<'_>) {
        if self.waits.is_empty() {
            return;
        }
        let book = m.mesh.alloc_book().clone();
        let now = Instant::now();
        self.waits.retain(|w| {
            if w.done(&book) {
                let _ = w.reply.send(ControlResponse::Allocs(Box::new((*book).clone())));
                false
            } else if now >= w.until {
                let _ = w.reply.send(ControlResponse::error(
                    ErrorKind::Refused,
                    "the coordinator did not confirm the change in time (is the mesh up? `mesh status`); it may still be applied: see `mesh alloc list`",
                ));
                false
            } else {
                true
            }
        });
    }
}

impl Home {
    /// A change to the allocation queues: refused at once when it cannot apply, else
    /// handed to the peer and answered once this node's book shows it.
    pub(in crate::mesh_node) fn alloc_command(
        &mut self,
        m: &mut Lent<'_>,
        cmd: AllocCmd,
        reply: Reply,
    ) {
        let book = m.mesh.alloc_book().clone();
        let err = match &cmd {
            AllocCmd::Add(d) if book.queue(&d.name).is_some() => Some(format!(
                "there is already a queue `{}` (`mesh alloc remove {}` first)",
                d.name, d.name
            )),
            AllocCmd::Remove { queue } | AllocCmd::Pause { queue } | AllocCmd::Resume { queue }
                if book.queue(queue).is_none() =>
            {
                Some(format!(
                    "no allocation queue `{queue}` (see `mesh alloc list`)"
                ))
            }
            _ if m.mesh.coordinator().is_none() => {
                Some("the mesh has no coordinator yet; try again in a moment".into())
            }
            _ => None,
        };
        if let Some(e) = err {
            let _ = reply.send(ControlResponse::error(ErrorKind::Refused, e));
            return;
        }
        self.allocs.waits.push(AllocWait {
            cmd: cmd.clone(),
            until: Instant::now() + ALLOC_WAIT,
            reply,
        });
        self.out.push_back(HomeOut::Alloc(cmd));
    }
}
