//! The start of a `mesh run`: the farm's store opened (new or resumed), the run's start recorded, old logs cleared, stale outputs set aside, and the driver assembled with the farm in its engine.

use super::*;

/// A farm's store opened for a run: new (its definition loaded) or resumed
/// (its definition read back from the store).
struct Opened {
    id: String,
    key: FarmKey,
    def: FarmDef,
    file: PathBuf,
    store: SledStore,
    resumed: bool,
}

impl Opened {
    fn open(start: RunStart, opts: &RunOptions) -> Result<Opened, RunError> {
        let (id, key, def, file, store, resumed) = match start {
            RunStart::New { def, file } => {
                let (id, key) = farm_identity(&def.name, &file);
                let store = open_store(&opts.state, &id)?;
                (id, key, *def, file, store, false)
            }
            RunStart::Resume { id } => {
                let store = open_store(&opts.state, &id)?;
                let key = farm_key(&id);
                let def = store
                    .def(key)?
                    .ok_or_else(|| RunError::NoDefinition(id.clone()))?;
                let file = store
                    .meta(key, META_FILE)?
                    .map(|b| PathBuf::from(String::from_utf8_lossy(&b).into_owned()))
                    .unwrap_or_default();
                (id, key, def, file, store, true)
            }
        };
        Ok(Opened {
            id,
            key,
            def,
            file,
            store,
            resumed,
        })
    }

    /// Records the run's start (a new run's definition, its number, the
    /// resources it has), clears a new run's old logs and sets aside the
    /// outputs of tasks no longer in the farm; returns the run's number,
    /// the stages to run whole again and the records a resume goes on from.
    fn begin(
        &mut self,
        opts: &RunOptions,
        started_at_ms: u64,
        obs: &mut dyn Observer,
    ) -> Result<Begun, RunError> {
        let (id, key, def, file, resumed) =
            (&self.id, self.key, &self.def, &self.file, self.resumed);
        let store = &mut self.store;
        let prev_run = stored_run(store, key)?;
        let run = if resumed {
            prev_run.max(1)
        } else {
            prev_run + 1
        };
        // A resumed stage that was stopped runs whole; a new run starts anew.
        let retry_stages: Vec<u32> = if resumed {
            stored_stops(store, key, def)?
                .into_iter()
                .map(|(s, _)| s)
                .collect()
        } else {
            Vec::new()
        };
        let mut batch: Vec<Write> = (0..def.stages.len())
            .map(|s| Write::Meta {
                farm: key,
                name: meta_stop(s),
                value: Vec::new(),
            })
            .collect();
        if !resumed {
            // Logs belong to a run: a new run starts without the last one's.
            let logs = opts.state.logs_dir(id);
            if let Err(e) = fs::remove_dir_all(&logs) {
                if e.kind() != io::ErrorKind::NotFound {
                    return Err(
                        io_err(format!("cannot clear old logs in {}", logs.display()))(e).into(),
                    );
                }
            }
            batch.push(Write::Def {
                farm: key,
                def: Box::new(def.clone()),
            });
            batch.push(Write::Meta {
                farm: key,
                name: META_RUN.into(),
                value: run.to_be_bytes().to_vec(),
            });
            batch.push(Write::Meta {
                farm: key,
                name: META_FILE.into(),
                value: file.to_string_lossy().as_bytes().to_vec(),
            });
        }
        batch.push(Write::Meta {
            farm: key,
            name: META_RESOURCES.into(),
            value: opts.resources.to_string().into_bytes(),
        });
        batch.push(Write::Journal(JournalEntry {
            at_ms: started_at_ms,
            farm: key,
            event: JournalEvent::RunStarted { run, resumed },
        }));
        store.write(batch)?;
        store.flush()?;
        let restored = if resumed {
            store.tasks(key)?
        } else {
            Vec::new()
        };
        // `{out}` holds the farm as it is now: a sweep cut short, a stage
        // gone, leave it (never deleted; see `results::set_aside_stale`).
        // On a resume too: a run killed after it recorded the farm and
        // before this left them in place (the oracle's seed 55).
        let out = Path::new(&def.out);
        match results::set_aside_stale(out, def, started_at_ms) {
            Ok(Some(aside)) => {
                let n = aside.moves.len() as u64;
                obs.set_aside(&results::set_aside_line(n, &aside.to));
                // Still results: a sweep grown back reuses them from there.
                set_aside_places(store, key, &aside)?;
            }
            Ok(None) => {}
            Err(e) => {
                return Err(io_err(format!(
                    "cannot set aside the outputs of tasks no longer in the farm, in {}",
                    out.display()
                ))(e)
                .into())
            }
        }
        // On a resume too: a run killed while it wrote them left them half done.
        results::write_manifests(Path::new(&def.out), &def.stages).map_err(io_err(format!(
            "cannot write which task is which ({}) in {}",
            results::MANIFEST,
            def.out
        )))?;
        Ok(Begun {
            run,
            retry_stages,
            restored,
        })
    }
}

/// What [`Opened::begin`] found: the run's number, the stages to run whole
/// again, and the records a resume goes on from.
struct Begun {
    run: u32,
    retry_stages: Vec<u32>,
    restored: Vec<(TaskRef, TaskRecord)>,
}

impl Driver {
    /// Opens the farm's store, records the run's start and gives the
    /// engine the farm with the records restored; serves the dashboard
    /// when asked to.
    pub(super) async fn open(
        start: RunStart,
        opts: &RunOptions,
        obs: &mut dyn Observer,
    ) -> Result<(Driver, Engine), RunError> {
        let clock = Instant::now();
        let started_at_ms = unix_ms();
        let mut opened = Opened::open(start, opts)?;
        let Begun {
            run,
            retry_stages,
            restored,
        } = opened.begin(opts, started_at_ms, obs)?;
        let Opened {
            id,
            key,
            def,
            file,
            store,
            ..
        } = opened;
        let def = Arc::new(def);
        let mut engine = Engine::new(opts.resources.clone());
        let slot = engine.add_farm(
            0,
            def.clone(),
            restored,
            &AddOptions {
                run,
                retry_failed: opts.retry_failed,
                retry_stages,
                open: false,
            },
        );
        let mut d = Driver {
            id: id.clone(),
            key,
            def: def.clone(),
            slot,
            store,
            logs_dir: opts.state.logs_dir(&id),
            root: PathBuf::from(&def.root),
            out: PathBuf::from(&def.out),
            views_dir: opts.state.farm_dir(&id).join("views"),
            gpu_ids: opts.gpus.iter().map(|g| g.id.clone()).collect(),
            input_hashes: HashMap::new(),
            stage_digests: HashMap::new(),
            rerun: results::rerun_stages(&def, opts.rerun.as_deref()),
            pending: Vec::new(),
            unwritten: HashMap::new(),
            unwritten_meta: HashMap::new(),
            stash_dir: PathBuf::from(&def.out).join(results::STASH_DIR),
            stashed: 0,
            programs: HashMap::new(),
            live: HashMap::new(),
            unsaid: HashMap::new(),
            shared: None,
            runs: HashMap::new(),
            clock,
            status: FarmStatus {
                id: id.clone(),
                name: def.name.clone(),
                file: file.to_string_lossy().into_owned(),
                out: def.out.clone(),
                run,
                state: RunState::Running,
                pid: std::process::id(),
                host: hostname(),
                started_at_ms,
                updated_at_ms: started_at_ms,
                elapsed_ms: 0,
                counts: Counts::default(),
                stages: Vec::new(),
                failed: Vec::new(),
                eta: None,
                eta_history: Vec::new(),
                used: Vec::new(),
            },
            runtimes: vec![(0, Vec::new()); def.stages.len()],
            estimate_after: None,
        };
        d.serve_dashboard(opts).await?;
        d.refresh(&engine, clock);
        let _ = opts.state.write_status(&d.status);
        obs.started(&d.status);
        Ok((d, engine))
    }

    /// The dashboard, when `--http` asks for one: it reads what the
    /// driver shares with it.
    async fn serve_dashboard(&mut self, opts: &RunOptions) -> Result<(), RunError> {
        if let Some(http) = &opts.http {
            let label = hostname();
            let shared = Arc::new(Mutex::new(Shared {
                status: self.status.clone(),
                node: NodeView {
                    id: label,
                    local: true,
                    coordinator: true,
                    ..NodeView::default()
                },
                recorder: Recorder::default(),
                latency: Latencies::default(),
                def: self.def.clone(),
                logs_dir: opts.state.logs_dir(&self.id),
            }));
            self.shared = Some(shared.clone());
            let bound = dash::serve(http.clone(), Arc::new(RunSource(shared)))
                .await
                .map_err(io_err(format!(
                    "cannot serve the dashboard on {}",
                    http.addr
                )))?;
            if let Some(tell) = opts.on_http {
                tell(&dash::dashboard_line(bound, http.token.as_deref()));
            }
        }
        Ok(())
    }
}

/// The latest run number of a farm (0 before its first).
/// Writes down where the results in folders set aside are now.
fn set_aside_places(
    store: &mut SledStore,
    farm: FarmKey,
    aside: &results::SetAside,
) -> Result<(), RunError> {
    let mut batch = Vec::new();
    for (from, to) in &aside.moves {
        let Some(held) = store.meta(farm, &results::holder_name(from))? else {
            continue;
        };
        let Ok(key) = <[u8; 32]>::try_from(held.as_slice()) else {
            continue;
        };
        let name = results::meta_name(&key);
        let Some(mut res) = store
            .meta(farm, &name)?
            .and_then(|b| postcard::from_bytes::<Results>(&b).ok())
        else {
            continue;
        };
        if res.renamed(from, to) {
            batch.push(Write::Meta {
                farm,
                name,
                value: postcard::to_stdvec(&res).expect("plain data"),
            });
            batch.push(Write::Meta {
                farm,
                name: results::holder_name(to),
                value: key.to_vec(),
            });
        }
    }
    if !batch.is_empty() {
        store.write(batch)?;
    }
    Ok(())
}
