//! `Peer`'s whole driver API, ordered as quinn orders `Connection`'s: construction and setup (`new`, `set_*`, `restore_*`), what the driver polls for output (actions, the next timeout), what it feeds in (messages, membership, timeouts, its answers to actions, the user's commands), what it and the status pages read, and the invariant checks.

use super::*;

impl Peer {
    // ----- construction and setup: who this node is, its knobs, what its store kept -----

    /// A node with these resources. `joining`: it was pointed at an existing
    /// mesh, so it waits to hear a coordinator before electing itself.
    pub fn new(
        now: Millis,
        id: NodeId,
        total: Resources,
        cfg: Config,
        seed: u64,
        joining: bool,
    ) -> Peer {
        let mut members = Membership::new(
            now,
            id,
            seed ^ id.0.rotate_left(17),
            cfg.dead_after_ms,
            cfg.step_upkeep,
        );
        members.set_quiet_swim(cfg.quiet_swim);
        Peer {
            rng: SmallRng::seed_from_u64(seed ^ id.0),
            specs: Specs::default(),
            coord: None,
            worker: Worker::new(total),
            steal: Stealing::new(),
            holdings: Holdings::default(),
            allocs: Allocs::default(),
            next_resend: now + cfg.resend_ms,
            kept: Kept {
                farms: BTreeSet::new(),
                next_ask: now,
            },
            said: Said {
                victims: on_members::NO_VICTIMS.clone(),
                victims_of: None,
                files_max: 0,
                gpus: Vec::new(),
                machine: None,
            },
            out: Out::new(id),
            clock: now,
            polled: None,
            node: Node {
                id,
                started_at: now,
                members,
                election: Election::new(
                    joining,
                    now + cfg.join_wait_ms,
                    now + cfg.join_wait_ms.max(JOIN_ALONE_MS),
                ),
                cfg,
            },
        }
    }

    /// How this node is known on the network (in its membership packets
    /// and beats), and which life of it this is: later than any before it
    /// on this node (the wall clock at start does).
    pub fn set_address(&mut self, now: Millis, label: String, addrs: Vec<String>, life: u64) {
        self.due_first(now);
        self.node
            .members
            .set_address(now, label, addrs, life, &mut self.out);
        self.pump(now);
    }

    /// This node's machine as measured now, told in its beats.
    pub fn set_machine(&mut self, machine: Option<MachineLoad>) {
        self.said.machine = machine;
    }

    /// This node's GPUs (how tasks name each, and its model), told in its beats.
    pub fn set_gpus(&mut self, gpus: Vec<(String, String)>) {
        self.said.gpus = gpus;
    }

    /// This node's open-file limit, told in its beats.
    pub fn set_files_max(&mut self, limit: u64) {
        self.said.files_max = limit;
    }

    /// The unix time, in ms, at this peer's clock zero: the times of the
    /// allocation log (the peer reads no clock).
    pub fn set_wall_base(&mut self, unix_ms: u64) {
        self.allocs.wall_base = unix_ms;
    }

    /// This node runs in batch job `job` (`mesh join --alloc-job`), and
    /// drains at `deadline` (its walltime less a margin): it starts only
    /// tasks expected to end before then, and the coordinator hands it no
    /// others.
    pub fn set_batch_job(&mut self, job: Option<String>, deadline: Option<Millis>) {
        self.worker.set_batch_job(job, deadline);
    }

    /// This node was started to join a mesh at an address the user gave:
    /// until a node there says whom it follows, it never runs alone (see
    /// `Election`).
    pub fn joins_by_address(&mut self) {
        self.node.election.joins_by_address();
    }

    /// Starts measuring latencies (see [`Latency`]).
    pub fn observe(&mut self) {
        self.out.observed.get_or_insert_with(Box::default);
    }

    /// For a driver that writes nothing down and never reads a store back
    /// (the simulator's nodes that no scenario restarts): no
    /// [`Action::Persist`] is made, nor what only one would carry. What
    /// the peer does is otherwise the same.
    pub fn keep_no_store(&mut self) {
        self.out.keep_nothing();
    }

    /// The book kept in this node's store, at startup.
    pub fn restore_allocs(&mut self, book: AllocBook) {
        self.allocs.restore(book);
        on_members::machines_changed(self.coord.as_mut());
    }

    /// A farm found in this node's store at startup: held again (and
    /// offered to the coordinator until it is over), and coordinated here
    /// if this node is elected. `finished`: it was over here, with these counts.
    pub fn restore_farm(
        &mut self,
        stored: StoredFarm,
        finished: Option<(engine::Counts, Vec<engine::Counts>)>,
    ) {
        self.specs.insert(stored.spec.id, stored.spec.clone());
        self.holdings.restore(self.node.id, stored, finished);
    }

    /// Results this node reported before it stopped and that were not
    /// acknowledged: kept, and reported again.
    pub fn restore_unacked(&mut self, reports: Vec<Report>) {
        self.worker.restore_unacked(reports);
    }

    /// Farms whose outputs this node keeps, found in its state at start,
    /// or when it follows a new coordinator (it may have been cut off from
    /// the rest): their ends may have been told while it was down or
    /// away, so it asks their homes (through its coordinator), at its
    /// next resend and then every `KEEPS_EVERY_MS`, until each says so.
    pub fn restore_kept(&mut self, farms: impl IntoIterator<Item = FarmId>) {
        // Asked again even of farms it already asked about: those asks
        // went to the coordinator of its side of a cut, which could not
        // reach the home (the next would come `KEEPS_EVERY_MS` later).
        let mut any = false;
        for farm in farms {
            self.kept.farms.insert(farm);
            any = true;
        }
        if any {
            self.kept.next_ask = 0;
        }
    }

    // ----- what the driver polls for output: actions, in order, and the next timeout -----

    /// The next action for the driver to carry out, in order; None when
    /// the peer has nothing more until the next call.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        let action = self.out.actions.pop_front();
        if action.is_none() && self.out.actions.capacity() > 64 {
            // A burst (every member coming up while a mesh forms) would
            // otherwise leave its capacity behind at every node for good.
            self.out.actions = std::collections::VecDeque::new();
        }
        action
    }

    /// Every action at once, in order, into `into` (which must be empty):
    /// the queues are swapped, so no action is moved one by one (the
    /// simulator steps a peer five million times a run). The peer keeps
    /// `into`'s buffer: a driver that hands back one grown by a burst
    /// should drop it first, as `poll_action` does.
    pub fn take_actions(&mut self, into: &mut std::collections::VecDeque<Action>) {
        debug_assert!(
            into.is_empty(),
            "take_actions into a queue with actions left"
        );
        std::mem::swap(&mut self.out.actions, into);
    }

    /// Whether actions wait for the driver.
    pub fn has_actions(&self) -> bool {
        !self.out.actions.is_empty()
    }

    /// When the peer next needs [`Peer::handle_timeout`].
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        let mut at = self.next_timer_but_beats();
        // Which beat is the next loud one matters only if a beat comes first.
        if self.node.members.next_beat() < at {
            at = at.min(self.next_loud_beat());
        }
        Some(at)
    }

    /// When the first timer but the heartbeat is due (SWIM's that would
    /// do something, and `each_timer`'s).
    fn next_timer_but_beats(&self) -> Millis {
        let mut at = self.node.members.next_timer().unwrap_or(Millis::MAX);
        self.each_timer(|t, _, quiet| {
            if let Some(t) = t.filter(|&t| t < at) {
                if !quiet() {
                    at = t;
                }
            }
        });
        at
    }

    /// Whether a timer is due by `now` (`poll_timeout() <= now`), asked
    /// without finding the next one: most inputs come between timers, and
    /// an input asks before it is handled (`due_first`).
    fn due_by(&self, now: Millis) -> bool {
        let mut due = self.node.members.timer_due_by(now);
        self.each_timer(|t, _, quiet| due = due || t.is_some_and(|t| t <= now) && !quiet());
        due || self.beat_due_by(now)
    }

    /// Whether the heartbeat due at `at` would do nothing, fired then with
    /// nothing before it, and if so until when the beats after it stay
    /// quiet with nothing done here: no report is due (or the driver sends
    /// the one due, see `poll_promise`: then until the report after it)
    /// and the beat is quiet apart from its report. Time ends it at the
    /// report's beat or when a stage leaves the depth's window; an input
    /// fires the beats due first. Such a beat only sets the next one, a
    /// beat later, and is no sign of lateness; where quiet timers are
    /// skipped, it wakes no one (`next_loud_beat`).
    fn quiet_until(&self, at: Millis) -> Option<Millis> {
        self.quiet_until_with(at, self.stretch_report(), self.quiet_state())
    }

    /// The report that ends a stretch of quiet beats: the next, or where
    /// the driver sends that one, the one after it. None for the
    /// coordinator, which reports to no one: its beat that would report
    /// is as quiet as the others.
    fn stretch_report(&self) -> Millis {
        let members = &self.node.members;
        if self.coord.is_some() {
            return Millis::MAX;
        }
        members.promise().map_or(members.next_report(), |p| p.next)
    }

    /// `quiet_until`, given the report that ends the stretch and `state`.
    fn quiet_until_with(
        &self,
        at: Millis,
        report: Millis,
        state: Option<Millis>,
    ) -> Option<Millis> {
        let depth = state?;
        // The coordinator's beat looks for its silent workers: quiet only
        // before the first could be silent (the silence timer wakes it then).
        let silence = match self.coord {
            Some(_) => self.node.members.next_silence().unwrap_or(Millis::MAX),
            None => Millis::MAX,
        };
        if at >= report || at >= depth || at >= silence || !self.quiet_at(at) {
            return None;
        }
        Some(report.min(depth).min(silence))
    }

    /// What makes a heartbeat quiet apart from its report and does not
    /// change with time, and if it holds until when the prefetch depth
    /// does: this node is a worker that follows a coordinator, or the
    /// coordinator, whose look at its workers' silence is as last taken
    /// and whose own running stages are noted as they are (its beat finds
    /// its victims again, which only what it tells later reads: it fires
    /// before the next input, as a worker's quiet beat does); its members
    /// need no other look, it has nothing to steal, and its depth's last
    /// measure holds.
    fn quiet_state(&self) -> Option<Millis> {
        let node = &self.node;
        let look = match (&self.coord, node.election.coordinator()) {
            (None, Some(_)) => node.members.quiet_look(),
            // At health 0 only: its watch's limit moves with its health,
            // which an ack taken without a step would lower before the
            // beat fires.
            (Some(c), Some(me)) if me == node.id => {
                node.members.health() == 0
                    && node
                        .members
                        .quiet_look_watching(on_members::watch(node, self.clock))
                    && c.notes_started(me, &self.worker.started())
            }
            _ => false,
        };
        if !look || steal::would_steal(node, self.coord.as_ref(), &self.worker, &self.steal) {
            return None;
        }
        self.worker.depth_holds_until(node.cfg.queue_max)
    }

    /// What makes the heartbeat at `at` quiet and changes with time: it
    /// passes over no deposed coordinator, and watches no one, or as the
    /// coordinator its workers as it last did.
    fn quiet_at(&self, at: Millis) -> bool {
        let node = &self.node;
        node.election.passed_over(at).is_none()
            && match on_members::watch(node, at) {
                membership::Watch::None => true,
                w @ membership::Watch::Direct(_) => {
                    self.coord.is_some() && node.members.quiet_look_watching(w)
                }
                membership::Watch::One(..) => false,
            }
    }

    /// [`poll_timeout`](Self::poll_timeout), for a driver that sends a
    /// worker's reports itself rather than wake it for them (the
    /// simulator, where quiet timers are skipped); with the moment of the
    /// next heartbeat whose only work is its report to the coordinator,
    /// with nothing else due here by then, where there is one. The driver
    /// sends that report at that moment ([`Peer::promised_report`]) unless
    /// an input comes first; the heartbeat fires with the next input,
    /// without sending it. Asked after every step: each answer replaces
    /// the last, and the next input takes the wake it answered as whether
    /// a timer is due, so a driver that changes the peer otherwise (a
    /// `set_*`, `restore_*` or `give_back`) before that input asks again.
    pub fn poll_promise(&mut self, now: Millis) -> (Option<Millis>, Option<Millis>) {
        let (wake, promise) = self.find_promise(now);
        self.polled = wake;
        (wake, promise)
    }

    /// See [`poll_promise`](Self::poll_promise).
    fn find_promise(&mut self, now: Millis) -> (Option<Millis>, Option<Millis>) {
        self.node.members.set_promise(None);
        let members = &self.node.members;
        let other = self.next_timer_but_beats();
        let beat = members.next_beat();
        if beat >= other || !members.skips_quiet() {
            // As `poll_timeout`: a beat after the other timers, or every beat, wakes.
            return (Some(other.min(beat)), None);
        }
        let state = self.quiet_state();
        let loud = self.loud_beat_from(beat, self.stretch_report(), state);
        let node = &self.node;
        let alone = self.coord.is_none()
            && loud > now
            && loud < other
            && loud >= members.next_report()
            && node.election.seed().is_none()
            && state.is_some_and(|depth| loud < depth)
            && self.quiet_at(loud);
        if !alone {
            return (Some(other.min(loud)), None);
        }
        // As the wake would find it: the clock at the beat.
        let next = loud + on_members::report_interval(node, loud);
        let after = self.loud_beat_from(beat, next, state);
        self.node.members.set_promise(Some(membership::Promise {
            at: loud,
            next,
            loud: after,
        }));
        (Some(other.min(after)), Some(loud))
    }

    /// The first heartbeat from `at` that may do something, where `report`
    /// ends the quiet stretch and `state` is `quiet_state`.
    fn loud_beat_from(&self, at: Millis, report: Millis, state: Option<Millis>) -> Millis {
        match self.quiet_until_with(at, report, state) {
            Some(until) => {
                let every = self.node.cfg.heartbeat_ms.max(1);
                // Saturating: a coordinator of no one is quiet for good.
                let beats = until.saturating_sub(at).div_ceil(every);
                at.saturating_add(beats.saturating_mul(every))
            }
            None => at,
        }
    }

    /// The report promised for the heartbeat at `at` (`poll_promise`),
    /// as that heartbeat would send it: to whom, and the message. The
    /// heartbeat itself fires with the next input, without sending it.
    pub fn promised_report(&self, at: Millis) -> Option<(NodeId, Msg)> {
        if self.node.members.promise().map(|p| p.at) != Some(at) {
            return None;
        }
        let to = self.node.election.coordinator()?;
        // Built as the wake's beat is: its clock is the beat's moment.
        let told = Told {
            clock: self.clock.max(at),
            ..self.told()
        };
        Some((to, Msg::Beat(Arc::new(told.report()))))
    }

    /// The next heartbeat that may do something; every one where every
    /// timer is stepped.
    fn next_loud_beat(&self) -> Millis {
        let members = &self.node.members;
        let at = members.next_beat();
        if !members.skips_quiet() {
            return at;
        }
        self.loud_beat_from(at, self.stretch_report(), self.quiet_state())
    }

    /// The quiet heartbeats due before `now` (and at it, with `at_now`),
    /// fired as each would have been at its time: only the next one's
    /// time moves. At a wake, the beat of that moment is left to
    /// `beat_due`, after the timers of the same moment, as stepped.
    fn fire_quiet_beats(&mut self, now: Millis, at_now: bool) {
        let due = |at: Millis| at < now || at_now && at == now;
        let every = self.node.cfg.heartbeat_ms;
        if let Some(p) = self.node.members.promise() {
            // Nothing came since the promise: every beat before its loud
            // one is quiet, the promised one but for its report, sent.
            loop {
                let at = self.node.members.next_beat();
                if !due(at) || at >= p.loud {
                    break;
                }
                if at == p.at {
                    let queued = self.worker.queued() as u32;
                    self.node.members.report_sent(every, queued, &mut self.out);
                } else {
                    self.node.members.beat_quiet(every, &mut self.out);
                }
            }
        }
        loop {
            let at = self.node.members.next_beat();
            if !due(at) || self.quiet_until(at).is_none() {
                return;
            }
            if self.coord.is_some() {
                // The coordinator's quiet beat does its look at its time,
                // sending nothing.
                let sent = (self.out.actions.len(), self.out.inbox.len());
                self.node.members.beat_due(at, every);
                on_members::heartbeat_due(&mut self.roles(), at);
                self.node.members.count_quiet(&mut self.out);
                debug_assert_eq!(
                    sent,
                    (self.out.actions.len(), self.out.inbox.len()),
                    "a quiet beat sends nothing"
                );
            } else {
                self.node.members.beat_quiet(every, &mut self.out);
            }
        }
    }

    /// Which timers are due at `now`: what [`handle_timeout`](Self::handle_timeout)
    /// would fire, for a driver that accounts for its wakes (the
    /// simulator's speed line, which names the timers it stepped through).
    pub fn timers_due(&self, now: Millis) -> TimersDue {
        let mut due = TimersDue::default();
        self.each_timer(|t, kind, quiet| {
            if t.is_some_and(|t| t <= now) && !quiet() {
                due.add(kind);
            }
        });
        if self.beat_due_by(now) {
            due.add(TimerKind::Heartbeat);
        }
        self.node.members.timers_due(now, &mut due);
        due
    }

    /// Whether a heartbeat that may do something is due by `now`.
    fn beat_due_by(&self, now: Millis) -> bool {
        let members = &self.node.members;
        // A promise knows its loud beat: nothing came since.
        let loud = || {
            members
                .promise()
                .map_or_else(|| self.next_loud_beat(), |p| p.loud)
        };
        members.next_beat() <= now && loud() <= now
    }

    /// Each of this peer's timers but SWIM's (which `Membership` keeps)
    /// and the heartbeat (`next_loud_beat`, asked only where it matters),
    /// with when it is due, if it is set, and whether it wakes no one for
    /// having nothing to do: what both the next timeout and the timers due
    /// are read from. That last is asked of the caller's closure only
    /// where the time matters to it (a look at whether the resend round
    /// is quiet was 2% of a quiet farm's run, at every poll).
    fn each_timer(&self, mut f: impl FnMut(Option<Millis>, TimerKind, &dyn Fn() -> bool)) {
        let loud = || false;
        f(self.node.members.next_silence(), TimerKind::Silence, &loud);
        // A round with nothing to send wakes no one (`fire_late_resend`).
        f(Some(self.next_resend), TimerKind::Resend, &|| {
            self.resend_quiet()
        });
        f(self.worker.next_timer(), TimerKind::Task, &loud);
        f(
            self.steal.poll_timeout(self.node.cfg.steal_timeout_ms),
            TimerKind::Steal,
            &loud,
        );
        if let Some(c) = &self.coord {
            // A round with nothing to tell wakes no one (`fire_late_progress`).
            f(c.poll_timeout(), TimerKind::Progress, &|| {
                self.node.members.skips_quiet() && c.progress_quiet()
            });
            f(c.settle_timeout(), TimerKind::Settle, &loud);
            f(self.allocs.poll_timeout(), TimerKind::Allocation, &loud);
        }
    }

    // ----- what the driver feeds in: messages, membership, the clock -----

    /// A message from node `from`, on a link or as a packet.
    pub fn handle_message(&mut self, now: Millis, from: NodeId, msg: Msg) {
        self.due_first(now);
        self.out.inbox.push_back((from, msg));
        self.pump(now);
    }

    /// A membership packet in closed form ([`Action::QuietSwim`]) from
    /// node `from`, handled as [`handle_message`](Self::handle_message)
    /// handles the packet it stands for: in closed form where it would be
    /// handled first in its step and would tell this node nothing, else
    /// built and handled as the packet. Whether it went in closed form.
    pub fn handle_quiet_swim(&mut self, now: Millis, from: NodeId, q: &QuietSwim) -> bool {
        self.due_first(now);
        // A message to itself from what just fired comes before it.
        if !self.out.inbox.is_empty() {
            let data = self.node.members.packet(q);
            self.out.inbox.push_back((from, Msg::Swim(data)));
            self.pump(now);
            return false;
        }
        let mut quiet = false;
        self.pump_with(now, |p| {
            quiet = p.node.members.quiet_swim_in(now, q, &mut p.out);
            if !quiet {
                let data = p.node.members.packet(q);
                p.node.members.handle_swim(now, &data, &mut p.out);
            }
            on_members::members_changed(&mut p.roles(), now);
        });
        quiet
    }

    /// An ack in closed form ([`Action::QuietSwim`], not a ping) taken
    /// when its sender sends it rather than when it arrives, for a driver
    /// that knows it arrives (nothing lost, cut off, gone or stalled on
    /// the way); false, and nothing changed, where this node would not
    /// take it quietly. Nothing that a step does before the ack would have
    /// arrived reads what it changes: the probe it answers is looked at
    /// again only at its indirect stage (hundreds of milliseconds on, and
    /// quiet where the ack came) and at the next probe. The driver then
    /// polls again ([`poll_promise`](Self::poll_promise)), as after the
    /// ack's step.
    pub fn take_quiet_ack(&mut self, now: Millis, q: &QuietSwim) -> bool {
        // Nothing may wait to fire first.
        if !q.is_ack() || self.input_fires(now) {
            return false;
        }
        let taken = self.node.members.quiet_swim_in(now, q, &mut self.out);
        debug_assert!(!self.has_actions(), "an ack taken sends nothing");
        taken
    }

    /// A ping in closed form ([`Action::QuietSwim`]) answered at its
    /// arrival without the rest of a step, for a driver that sends what
    /// the answer asks (the ack, among this node's actions) and keeps this
    /// node's wake as it was: answering a quiet ping sets no timer and
    /// changes nothing a poll reads. False, and nothing changed, where
    /// the step would do more than answer: a timer due (its wake has yet
    /// to come this millisecond), a promised beat whose report went and
    /// which this input would fire, a message of its own waiting, or a
    /// ping that cannot be taken quietly.
    pub fn answer_quiet_ping(&mut self, now: Millis, q: &QuietSwim) -> bool {
        if !q.is_ping() || !self.out.inbox.is_empty() || self.input_fires(now) {
            return false;
        }
        self.node.members.quiet_swim_in(now, q, &mut self.out)
    }

    /// A worker's message to this node, its coordinator, that tells it
    /// nothing new, taken at its arrival without the rest of a step, for
    /// a driver that sends what it asks (among this node's actions) and
    /// keeps this node's wake; false, and nothing changed, anywhere else.
    /// Reports make most of a long farm's traffic while every slot is
    /// busy:
    ///
    /// - a report ([`Msg::Beat`] asking for the answer) from a member
    ///   heard before with the resources it had and running the stages
    ///   it ran, following this node in its term and holding tasks, each
    ///   of the claims it lists this coordinator's record of that
    ///   worker's claims, and no more than it records (nothing to adopt
    ///   or give up): heard as a step hears it, this node's beat the
    ///   answer;
    /// - a list of the claims a worker holds ([`Msg::Claimed`]), as a
    ///   report's: no answer.
    ///
    /// The step around it must do nothing else (`steps_quietly`). Taking
    /// either sets no timer and changes nothing a poll reads.
    pub fn take_quiet_message(&mut self, now: Millis, from: NodeId, msg: &Msg) -> bool {
        let Some(c) = self.coord.as_ref() else {
            return false;
        };
        let quiet = match msg {
            Msg::Beat(b) => {
                b.ask
                    && !b.idle
                    && self.steal.is_empty()
                    && self.beat_tells_nothing(from, b)
                    && c.lists_nothing_new(from, &b.claimed)
            }
            Msg::Claimed { tasks, .. } => {
                from != self.node.id
                    && self.node.election.coordinator() == Some(self.node.id)
                    && c.lists_nothing_new(from, tasks)
            }
            _ => false,
        };
        if !quiet || self.input_fires(now) || !self.steps_quietly(now) {
            return false;
        }
        // Its quiet beats first, at their times: what it tells next
        // carries the victims they find.
        self.fire_quiet_beats(now, true);
        self.woke(now);
        if let Msg::Beat(b) = msg {
            on_members::quiet_report_heard(&mut self.roles(), now, from, b.clone());
        }
        debug_assert!(
            self.out.inbox.is_empty() && !self.node.members.has_news(),
            "a quiet message brings nothing to handle in a step"
        );
        true
    }

    /// The coordinator's answer to this node's report ([`Msg::Beat`]) taken
    /// at its arrival without the rest of a step, for a driver that sends
    /// what hearing it asks (a steal it starts, a roster it asks for) and
    /// then polls this node again, as after the step: where the answer
    /// tells nothing new of its sender (heard before, with the resources
    /// and running stages it had, coordinating this node's term) and the
    /// step around it would do nothing but fire what an input fires first
    /// (the beat whose report went, quiet timers): nothing due, no message
    /// of its own waiting, no silence of its own, no member's news or
    /// change of whom it watches, no report of its own, no coordinator
    /// role. Heard as the step hears it; false, and nothing changed,
    /// anywhere else.
    pub fn take_quiet_answer(&mut self, now: Millis, from: NodeId, msg: &Msg) -> bool {
        let Msg::Beat(b) = msg else {
            return false;
        };
        let quiet = self.coord.is_none() && !b.ask && self.beat_tells_nothing(from, b);
        if !quiet || self.due_by_polled(now) || !self.steps_quietly(now) {
            return false;
        }
        self.due_first(now);
        on_members::beat_heard(&mut self.roles(), now, from, b.clone());
        debug_assert!(
            self.out.inbox.is_empty() && !self.node.members.has_news(),
            "a quiet answer brings nothing to handle in a step"
        );
        true
    }

    /// Whether `b` from `from` is a beat of the quiet exchange that tells
    /// this node nothing new: a worker's report asking for the answer, or
    /// its coordinator's answer, between this node and a member heard
    /// before with the resources and running stages it had, both
    /// following the same coordinator (the one of the two that does not
    /// ask) in this node's term.
    fn beat_tells_nothing(&self, from: NodeId, b: &Beat) -> bool {
        let (me, election) = (self.node.id, &self.node.election);
        let coordinator = if b.ask { me } else { from };
        b.version == PROTOCOL_VERSION
            && from != me
            && b.coordinator == Some(coordinator)
            && election.coordinator() == Some(coordinator)
            && b.term == election.term()
            && self.node.members.hears_again(from, b)
    }

    /// Whether a step at `now` would do nothing but fire what an input
    /// fires first and handle its message: no message of its own waiting,
    /// no silence of its own to recover from, no member's news or change of whom it
    /// watches, no report of its own to send, and as coordinator nothing
    /// to place, drain or sync (`Coord::steps_quietly`).
    fn steps_quietly(&self, now: Millis) -> bool {
        if !self.out.inbox.is_empty()
            || self.silent_since(now).is_some()
            || !self.worker.sends_nothing()
            || !self.coord.as_ref().is_none_or(Coord::steps_quietly)
            || self.node.members.has_news()
        {
            return false;
        }
        let watch = on_members::watch(&self.node, self.clock.max(now));
        !self.node.members.watch_changed(watch)
    }

    /// Whether an input at `now` would fire something first: a timer due
    /// (its wake has yet to come this millisecond), or a promised beat
    /// whose report went (a poll now would forget it). A packet taken
    /// without a step is taken only where nothing would.
    fn input_fires(&self, now: Millis) -> bool {
        self.node.members.promise().is_some_and(|p| p.at <= now) || self.due_by_polled(now)
    }

    /// Whether a timer is due by `now`, from the wake `poll_promise` last
    /// answered where it stands (see `polled`), else by looking.
    fn due_by_polled(&self, now: Millis) -> bool {
        match self.polled {
            Some(wake) => {
                debug_assert_eq!(wake <= now, self.due_by(now), "a wake polled at {wake}");
                wake <= now
            }
            None => self.due_by(now),
        }
    }

    /// The membership packet `q` stands for, as SWIM would have built it.
    pub fn quiet_packet(&mut self, q: &QuietSwim) -> Vec<u8> {
        self.node.members.packet(q)
    }

    /// A membership packet ([`Action::Swim`]) from another node.
    pub fn handle_swim(&mut self, now: Millis, data: &[u8]) {
        self.due_first(now);
        self.node.members.handle_swim(now, data, &mut self.out);
        on_members::members_changed(&mut self.roles(), now);
        self.pump(now);
    }

    /// Before an input at `now`, whatever is due by `now` fires, as if its
    /// wake had come first: what a peer does never depends on which of a
    /// timer and an input at one moment the driver hands it first, nor on
    /// whether it was woken for a timer that would have done nothing
    /// (`fire_quiet_beats` and `Membership::fire_quiet` fire those here).
    pub(super) fn due_first(&mut self, now: Millis) {
        let due = self.due_by_polled(now);
        self.polled = None;
        if due {
            self.handle_timeout(now);
        } else {
            // What is due fires before an input at its moment.
            self.fire_late_progress(now, true);
            self.fire_late_resend(now, true);
            self.fire_quiet_beats(now, true);
            self.woke(now);
            self.node.members.fire_quiet(now, &mut self.out);
        }
    }

    /// A coordinator's progress round due before `now` (and at it, with
    /// `at_now`) that woke no one, having nothing to tell
    /// (`Coord::progress_quiet`), fired before anything else of this
    /// step, as its own wake would have fired it: it sends nothing, and
    /// the round after it keeps its phase. At a wake, the round of that
    /// moment is left to its place among the timers, as stepped.
    fn fire_late_progress(&mut self, now: Millis, at_now: bool) {
        // A round with news was not skipped: it fires where its wake does.
        let late = |c: &Coord| {
            c.poll_timeout()
                .is_some_and(|t| t < now || at_now && t == now)
                && c.progress_quiet()
        };
        if self.coord.as_ref().is_some_and(late) {
            self.progress_round(now);
        }
    }

    /// Whether this node's resend round would do nothing whenever it
    /// came, this state kept: a worker's (the coordinator's round checks
    /// its own claims and its holders' copies) with no report
    /// unacknowledged, no farm's spec awaited, no copy kept to confirm,
    /// not a farm's home, its allocation book as its coordinator's, and
    /// what it holds listed by its reports (`Beat::claimed`), which come
    /// as often. Such a round wakes no one, as SWIM's quiet gossip tick
    /// does.
    fn resend_quiet(&self) -> bool {
        self.node.members.skips_quiet()
            && self.coord.is_none()
            && self.kept.farms.is_empty()
            && self.worker.resends_nothing()
            && self.holdings.resends_nothing()
            && allocation::in_step(
                &self.allocs,
                self.node.election.leader(),
                &self.node.members,
            )
            && on_tasks::lists_with_reports(&self.node, self.clock)
    }

    /// The resend rounds due before `now` (and at it, with `at_now`) that
    /// woke no one, having nothing to send (`resend_quiet`), fired before
    /// anything else of this step, each at its own moment as its wake
    /// would have fired it: the round after them keeps its phase. At a
    /// wake, the round of that moment is left to its place, as stepped.
    fn fire_late_resend(&mut self, now: Millis, at_now: bool) {
        let due = |t: Millis| t < now || at_now && t == now;
        if !due(self.next_resend) || !self.resend_quiet() {
            return;
        }
        while due(self.next_resend) {
            let at = self.next_resend;
            self.next_resend = at + self.node.cfg.resend_ms;
            // Such a round does nothing: checked where it costs nothing.
            if cfg!(debug_assertions) {
                on_tasks::resend_due(&mut self.roles(), at);
                debug_assert!(!self.has_actions(), "a quiet resend round sends nothing");
            }
        }
    }

    /// The coordinator's round that tells the farms' holders their
    /// counts and streams them the log.
    fn progress_round(&mut self, now: Millis) {
        on_farms::sync_holders(
            now,
            true,
            &self.node,
            self.coord.as_mut(),
            &self.holdings,
            &mut self.out,
        );
    }

    /// The time of [`poll_timeout`](Self::poll_timeout) came: the timers due fire.
    pub fn handle_timeout(&mut self, now: Millis) {
        self.polled = None;
        self.fire_late_progress(now, false);
        self.fire_late_resend(now, false);
        // A beat whose report the driver sent is fired as at an input.
        let promised = self.node.members.promise().is_some_and(|p| p.at == now);
        self.fire_quiet_beats(now, promised);
        self.woke(now);
        self.worker.fire_timers(now, &mut self.out);
        self.node.members.fire_timers(now, &mut self.out);
        on_members::members_changed(&mut self.roles(), now);
        if self.node.members.beat_due(now, self.node.cfg.heartbeat_ms) {
            on_members::heartbeat_due(&mut self.roles(), now);
        }
        if now >= self.next_resend {
            self.next_resend = now + self.node.cfg.resend_ms;
            on_tasks::resend_due(&mut self.roles(), now);
        }
        self.steal.expire(now, self.node.cfg.steal_timeout_ms);
        if self.coord.as_ref().is_some_and(|c| c.progress_due(now)) {
            self.progress_round(now);
        }
        if self.coord.is_some() && self.allocs.poll_timeout().is_some_and(|t| now >= t) {
            on_farms::allocs_due(&mut self.coordinating(), now);
        }
        self.pump(now);
    }

    /// A node to join the mesh through (an address the user gave, or a
    /// peer this node knew before it restarted): this node announces
    /// itself there and learns the members from it.
    pub fn introduce(&mut self, now: Millis, id: NodeId, label: String, addrs: Vec<String>) {
        self.due_first(now);
        self.node
            .members
            .introduce(now, id, label, addrs, &mut self.out);
        self.node.election.introduced(id);
        on_members::members_changed(&mut self.roles(), now);
        self.pump(now);
    }

    /// A node this one joins through (an address the user gave, a peer it
    /// remembered) is connected, though membership knew it already: it
    /// counts as introduced, so its beat answers the join (see
    /// [`Peer::introduce`]).
    pub fn seed_reached(&mut self, now: Millis, id: NodeId) {
        self.due_first(now);
        self.node.election.introduced(id);
        self.pump(now);
    }

    /// Records a latency measured by the driver (a message's round trip).
    pub fn record_latency(&mut self, kind: Latency, micros: u64) {
        if let Some(o) = self.out.observed() {
            o.latency.record(kind, micros);
        }
    }

    // ----- what the driver feeds in: its answers to actions -----

    /// A task this node started is over (its process exited, or it never
    /// started). `outputs`: what a successful attempt left, kept here until
    /// the farm's home has it.
    pub fn task_finished(
        &mut self,
        now: Millis,
        task: Assigned,
        outcome: Outcome,
        outputs: Vec<OutputFile>,
    ) {
        self.tasks_finished(now, vec![(task, outcome, outputs)]);
    }

    /// Tasks that ended at about the same time, as one step: their results
    /// go to the coordinator as one report, and its answer is one assignment.
    pub fn tasks_finished(
        &mut self,
        now: Millis,
        ended: Vec<(Assigned, Outcome, Vec<OutputFile>)>,
    ) {
        self.due_first(now);
        for (task, outcome, outputs) in ended {
            let ended = Ended {
                task,
                outcome,
                outputs,
            };
            self.worker
                .finish_one(now, ended, &self.node, &self.specs, &mut self.out);
        }
        let mut w = self.working();
        w.start_queued(now);
        // Running dry: steal now rather than at the next beat.
        w.try_steal(now);
        self.pump(now);
    }

    /// A task this node started goes back to the coordinator unstarted when
    /// it is reported over: nothing is counted against it (what it depends
    /// on is being made again, and waiting here would keep that run's slot).
    pub fn give_back(&mut self, task: Assigned) {
        self.worker.give_back(task);
    }

    /// On the home: the outputs of `task` asked for by [`Action::Fetch`]
    /// are here and verified, or could not be brought (tried again later).
    pub fn fetched(&mut self, now: Millis, farm: FarmId, task: TaskRef, got: Fetched) {
        self.due_first(now);
        let answered = FetchAnswered { farm, task, got };
        if self
            .holdings
            .fetched(now, answered, &self.node, &mut self.out)
        {
            self.pump(now);
        }
    }

    /// The farm's inputs (none, or every one) are here: a copy held here
    /// now counts, and a farm waiting for that may be accepted.
    pub fn inputs_ready(&mut self, now: Millis, farm: FarmId, ok: bool) {
        self.due_first(now);
        // When not, asked again at the next resend, from whoever has them then.
        if ok && self.holdings.inputs_came(farm) {
            on_farms::inputs_arrived(
                farm,
                &self.node,
                &self.holdings,
                self.coord.as_mut(),
                &mut self.out,
            );
            self.pump(now);
        }
    }

    /// The batch system's answer to [`BatchOp::Submit`](super::super::BatchOp::Submit): the job ids.
    pub fn batch_submitted(
        &mut self,
        now: Millis,
        queue: &QueueDef,
        result: Result<Vec<String>, String>,
    ) {
        self.batch_answered(now, |allocs, term| {
            allocs.submitted(now, term, queue, result)
        });
    }

    /// The batch system's answer to [`BatchOp::Poll`](super::super::BatchOp::Poll): the state of each
    /// job it still lists.
    pub fn batch_polled(
        &mut self,
        now: Millis,
        system: BatchSystem,
        result: Result<Vec<(String, JobState)>, String>,
    ) {
        self.batch_answered(now, |allocs, term| allocs.polled(now, term, system, result));
    }

    /// The batch system's answer to [`BatchOp::List`](super::super::BatchOp::List):
    /// every job of this mesh it knows.
    pub fn batch_listed(
        &mut self,
        now: Millis,
        system: BatchSystem,
        gen: u64,
        result: Result<Vec<super::super::Listed>, String>,
    ) {
        self.batch_answered(now, |allocs, term| {
            allocs.listed(now, term, system, gen, result)
        });
    }

    /// The batch system's answer to [`BatchOp::Cancel`](super::super::BatchOp::Cancel).
    pub fn batch_cancelled(&mut self, now: Millis, job: &str, result: Result<(), String>) {
        self.batch_answered(now, |allocs, term| allocs.cancelled(now, term, job, result));
    }

    // ----- what the driver feeds in: the user's commands -----

    /// A farm submitted on this node, which becomes its home. `reused`:
    /// its tasks done before (in an earlier farm, with the same content
    /// key): they are done from the start. Those whose entry names this
    /// node have their outputs in place here already (the driver put them
    /// there); those of other nodes are brought from them.
    pub fn submit(&mut self, now: Millis, spec: FarmSpec, reused: Vec<Entry>) {
        self.due_first(now);
        on_farms::farm_submitted(
            spec,
            reused,
            &self.node,
            &mut self.specs,
            &mut self.holdings,
            &mut self.out,
        );
        self.pump(now);
    }

    /// A farm submitted on this node grew: `spec` is its next generation
    /// (see [`FarmSpec::grows_into`]), offered to the coordinator, and
    /// said `Accepted` once durable as a farm is. `reused`: tasks of its
    /// new stages done before, as [`Peer::submit`] takes them. False, and
    /// nothing done, when it is not the next generation of a farm whose
    /// home is here.
    pub fn grow(&mut self, now: Millis, spec: FarmSpec, reused: Vec<Entry>) -> bool {
        self.due_first(now);
        let grew = on_farms::farm_grew(
            spec,
            reused,
            &self.node,
            &mut self.specs,
            &mut self.holdings,
            &mut self.out,
        );
        self.pump(now);
        grew
    }

    /// Asks the coordinator to stop a farm.
    pub fn cancel(&mut self, now: Millis, farm: FarmId) {
        self.due_first(now);
        self.node
            .election
            .leader()
            .send(&mut self.out, |_| Msg::Cancel { farm });
        self.pump(now);
    }

    /// Asks the coordinator to stop one task of a farm.
    pub fn cancel_task(&mut self, now: Millis, farm: FarmId, task: TaskRef) {
        self.due_first(now);
        self.node
            .election
            .leader()
            .send(&mut self.out, |_| Msg::CancelTask { farm, task });
        self.pump(now);
    }

    /// This node becomes the farm's home (its old home is gone, or the
    /// user wants the outputs elsewhere): every output is brought to
    /// `out`, and the farm is offered to the coordinator with the new claim.
    pub fn take_home(&mut self, now: Millis, spec: Arc<FarmSpec>, out: String) {
        self.due_first(now);
        on_farms::home_taken(&mut self.roles(), now, spec, out);
        self.pump(now);
    }

    /// A user's change to the allocation queues, sent to the coordinator.
    pub fn alloc_command(&mut self, now: Millis, cmd: AllocCmd) {
        self.due_first(now);
        self.node
            .election
            .leader()
            .send(&mut self.out, |_| Msg::Alloc(Box::new(cmd)));
        self.pump(now);
    }

    /// Stops this node's tasks (Ctrl-C): running ones are killed, queued ones given back.
    pub fn interrupt(&mut self, now: Millis) {
        self.due_first(now);
        self.worker
            .interrupt(now, &mut self.out, self.node.election.leader());
        self.pump(now);
    }

    // ----- what the driver and status pages read: this node and its members -----

    /// Which node this is.
    pub fn id(&self) -> NodeId {
        self.node.id
    }

    /// The highest coordinator term this node knows.
    pub fn term(&self) -> u64 {
        self.node.election.term()
    }

    /// The coordinator this node follows (itself when it coordinates), if it knows one.
    pub fn coordinator(&self) -> Option<NodeId> {
        self.node.election.coordinator()
    }

    /// True while this node is the elected coordinator.
    pub fn is_coordinator(&self) -> bool {
        self.coord.is_some()
    }

    /// This node's own beat, as it would gossip it now.
    pub fn beat(&self) -> Beat {
        self.told().beat()
    }

    /// Every member as this node last heard it (its beat; an empty one for
    /// a member known only by SWIM), with its label; this node first. On
    /// the coordinator, every worker's own report.
    pub fn node_beats(&self) -> Vec<(String, Arc<Beat>)> {
        let own = (self.node.members.label().to_owned(), Arc::new(self.beat()));
        std::iter::once(own)
            .chain(
                self.node
                    .members
                    .iter()
                    .map(|m| (m.label().to_owned(), m.beat_arc())),
            )
            .collect()
    }

    /// The members this node knows alive, in id order, itself not among them.
    pub fn members(&self) -> impl Iterator<Item = Member<'_>> {
        self.node.members.iter()
    }

    /// How many members this node knows alive.
    pub fn member_count(&self) -> usize {
        self.node.members.len()
    }

    /// A sum over the members this node knows alive of
    /// [`member_hash`]`(id)`: two nodes whose sums plus their own
    /// `member_hash` are equal know the same nodes (a check of a whole
    /// mesh at O(N), not O(N²)).
    pub fn members_sum(&self) -> u64 {
        self.node.members.sum()
    }

    /// How a member is reached: its label and addresses, as set by its
    /// driver (see [`Peer::set_address`]).
    pub fn address_of(&self, id: NodeId) -> Option<(&str, &[String])> {
        self.node.members.address_of(id)
    }

    /// How many tasks this node wants queued beyond those it runs now.
    pub fn prefetch_depth(&self) -> u32 {
        self.worker.depth()
    }

    /// How many tasks wait in this node's queue, assigned and not started.
    pub fn queued(&self) -> usize {
        self.worker.queued()
    }

    /// How many tasks run on this node now.
    pub fn running_count(&self) -> usize {
        self.worker.running_count()
    }

    /// The settings this peer runs with.
    pub fn config(&self) -> &Config {
        &self.node.cfg
    }

    /// True when nothing runs here and nothing waits to be reported.
    pub fn idle(&self) -> bool {
        self.worker.idle()
    }

    /// True when nothing runs here and every result has been acknowledged;
    /// tasks may still be queued here.
    pub fn reported(&self) -> bool {
        self.worker.reported()
    }

    /// Counters of what this node sent and stole, for the simulator and `mesh status`.
    pub fn stats(&self) -> &Stats {
        &self.out.stats
    }

    /// The latencies measured since `observe`, and the coordinator
    /// changes seen.
    pub fn latencies(&self) -> Option<(&Latencies, u64)> {
        self.out
            .observed
            .as_deref()
            .map(|o| (&o.latency, o.failovers))
    }

    // ----- what the driver and status pages read: farms and the allocation queues -----

    /// A farm's definition, when this node knows it.
    pub fn spec(&self, farm: FarmId) -> Option<&Arc<FarmSpec>> {
        self.specs.get(&farm)
    }

    /// Every farm whose definition this node has.
    pub fn specs(&self) -> impl Iterator<Item = &Arc<FarmSpec>> {
        self.specs.values()
    }

    /// The progress of a farm this node holds, as it would show it.
    pub fn progress(&self, farm: FarmId) -> Option<FarmProgress> {
        self.holdings.get(farm).map(|r| r.progress())
    }

    /// A farm this node holds a copy of.
    pub fn replica(&self, farm: FarmId) -> Option<&Replica> {
        self.holdings.get(farm)
    }

    /// Every farm this node holds a copy of.
    pub fn replicas(&self) -> impl Iterator<Item = &Replica> {
        self.holdings.iter()
    }

    /// Farms this node coordinates.
    pub fn coordinated(&self) -> Vec<FarmId> {
        self.coord
            .as_ref()
            .map_or(Vec::new(), |c| c.slots().to_vec())
    }

    /// The coordinator's view of a farm's progress, when this node coordinates it.
    pub fn coordinated_progress(&self, farm: FarmId) -> Option<engine::Counts> {
        self.coord.as_ref()?.progress(farm)
    }

    /// A farm this node coordinates, as the coordinator knows it: its home,
    /// progress and first `failures_max` failures.
    pub fn coordinated_farm(
        &self,
        farm: FarmId,
        failures_max: usize,
    ) -> Option<(Home, FarmProgress, Vec<Entry>)> {
        self.coord.as_ref()?.farm_view(farm, failures_max)
    }

    /// The log of a farm this node coordinates.
    pub fn coordinated_log(&self, farm: FarmId) -> Option<&FarmLog> {
        self.coord.as_ref()?.log(farm)
    }

    /// Which node runs a task now (true), or ran it to its end, as far as
    /// this node knows (as coordinator, or from its copy of the farm).
    pub fn where_ran(&self, farm: FarmId, task: TaskRef) -> Option<(NodeId, bool)> {
        if self.worker.runs(farm, task) {
            return Some((self.node.id, true));
        }
        if let Some(r) = self.coord.as_ref().and_then(|c| c.where_ran(farm, task)) {
            return Some(r);
        }
        self.holdings.get(farm).and_then(|r| ended_on(&r.log, task))
    }

    /// Whether this node runs the task now.
    pub fn runs(&self, farm: FarmId, task: TaskRef) -> bool {
        self.worker.runs(farm, task)
    }

    /// The allocation queues and their jobs, as this node last heard.
    pub fn alloc_book(&self) -> &Arc<AllocBook> {
        self.allocs.book()
    }

    // ----- checks (the simulator's and the tests') -----

    /// Checks the peer's invariants that are cheap enough for every step of
    /// the simulator (no pass over tasks): nothing free beyond its total,
    /// and as coordinator, the engine's cheap checks and one claim per task
    /// the engine counts as running.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.worker
            .check_bounds()
            .and_then(|()| self.node.members.check())
            .map_err(|e| format!("node {}: {e}", self.node.id))?;
        self.check_coord_counts()
    }

    pub(super) fn check_coord_counts(&self) -> Result<(), String> {
        match &self.coord {
            Some(c) => c.check_counts(self.node.id),
            None => Ok(()),
        }
    }

    /// The checks of [`Peer::check_tasks`] on what changed since the last
    /// call (the pool against the grants counted as tasks started and ended here, the
    /// nodes whose claims changed, the stages whose runs did), after every
    /// step at a cost that does not grow with the mesh.
    pub fn check_step(&mut self) -> Result<(), String> {
        self.worker
            .check_step()
            .map_err(|e| format!("node {}: {e}", self.node.id))?;
        self.check_coord_counts()?;
        match &mut self.coord {
            Some(c) => c.check_step(self.node.id),
            None => Ok(()),
        }
    }

    /// The deeper checks, a pass over the peer's tasks: what its pool has
    /// lent matches its running tasks' grants; as coordinator (thousands of
    /// claims), the engine's runs per stage and each node's claims against
    /// the load the coordinator books for it.
    pub fn check_tasks(&self) -> Result<(), String> {
        self.worker
            .check_tasks()
            .map_err(|e| format!("node {}: {e}", self.node.id))?;
        match &self.coord {
            Some(c) => c.check_tasks(self.node.id),
            None => Ok(()),
        }
    }

    /// Every check, the coordinator's counters against a scan of every
    /// task included (see `Engine::audit`): for tests and the end of a
    /// simulation.
    pub fn audit(&self) -> Result<(), String> {
        self.check_invariants()?;
        self.check_tasks()?;
        match &self.coord {
            Some(c) => c.engine().audit(),
            None => Ok(()),
        }
    }
}
