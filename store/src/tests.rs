//! The store contract, checked against both implementations.

use super::*;
use mesh_protocol::engine::{RecordState, TaskEnd};

fn rec(state: RecordState, attempt: u32) -> TaskRecord {
    TaskRecord {
        run: 0,
        state,
        attempt,
        failures: 0,
        crashes: 0,
        end: Some(TaskEnd::Exited(0)),
        key: Some([7; 32]),
        duration_ms: 12,
        logs: 1,
        grew: None,
        stderr_line: None,
        usage: None,
    }
}

fn contract(s: &mut dyn Store) {
    let f = FarmKey(1);
    let g = FarmKey(2);
    s.write(vec![
        Write::Task {
            farm: f,
            task: TaskRef::new(0, 2),
            record: rec(RecordState::Running, 1),
        },
        Write::Task {
            farm: f,
            task: TaskRef::new(0, 1),
            record: rec(RecordState::Done, 1),
        },
        Write::Task {
            farm: g,
            task: TaskRef::new(0, 0),
            record: rec(RecordState::Done, 1),
        },
        Write::Meta {
            farm: f,
            name: "run".into(),
            value: vec![3],
        },
    ])
    .unwrap();
    // Later writes in later batches win.
    s.write(vec![Write::Task {
        farm: f,
        task: TaskRef::new(0, 2),
        record: rec(RecordState::Done, 2),
    }])
    .unwrap();
    s.flush().unwrap();
    let tasks = s.tasks(f).unwrap();
    assert_eq!(tasks.len(), 2, "only farm f's tasks");
    assert_eq!(tasks[0].0, TaskRef::new(0, 1), "in task order");
    assert_eq!(tasks[1].1.attempt, 2);
    assert_eq!(s.meta(f, "run").unwrap(), Some(vec![3]));
    assert_eq!(s.meta(g, "run").unwrap(), None);

    for i in 0..5 {
        s.write(vec![Write::Journal(JournalEntry {
            at_ms: i,
            farm: f,
            event: JournalEvent::RunStarted {
                run: i as u32,
                resumed: false,
            },
        })])
        .unwrap();
    }
    let j = s.journal(f, 3).unwrap();
    assert_eq!(
        j.iter().map(|e| e.at_ms).collect::<Vec<_>>(),
        vec![2, 3, 4],
        "the last entries, oldest first"
    );

    // Names by prefix, flushed or not; an empty value removes a name.
    let meta = |name: &str, value: Vec<u8>| Write::Meta {
        farm: g,
        name: name.into(),
        value,
    };
    s.write(vec![
        meta("h/1", vec![1]),
        meta("h/2", vec![2]),
        meta("i", vec![9]),
    ])
    .unwrap();
    s.flush().unwrap();
    s.write(vec![meta("h/1", Vec::new()), meta("h/3", vec![3])])
        .unwrap();
    assert_eq!(
        s.metas(g, "h/").unwrap(),
        vec![("h/2".into(), vec![2]), ("h/3".into(), vec![3])]
    );
    assert_eq!(s.meta(g, "h/1").unwrap(), None);
    s.flush().unwrap();
    assert_eq!(s.metas(g, "h/").unwrap().len(), 2);
    assert_eq!(s.metas(f, "h/").unwrap(), vec![]);
}

#[test]
fn a_tasks_usage_survives_reopen_in_a_few_bytes() {
    // Issue 63: a 1M-task farm's log keeps each task's figures.
    let usage = mesh_protocol::engine::Usage {
        cpu_ms: 61_234,
        peak_rss: 215 << 20,
        read_bytes: 1_700_000,
        written_bytes: 52_428_800,
        oom: false,
    };
    let with = TaskRecord {
        usage: Some(Box::new(usage)),
        ..rec(RecordState::Done, 1)
    };
    let added = encode(&with).len() - encode(&rec(RecordState::Done, 1)).len();
    assert!(added <= 16, "the figures cost {added} bytes a task");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let mut s = SledStore::open(&path).unwrap();
        s.write(vec![Write::Task {
            farm: FarmKey(1),
            task: TaskRef::new(0, 0),
            record: with.clone(),
        }])
        .unwrap();
        s.flush().unwrap();
    }
    let s = reopen(&path);
    let got = s.task(FarmKey(1), TaskRef::new(0, 0)).unwrap().unwrap();
    assert_eq!(got.usage.as_deref(), Some(&usage));
}

#[test]
fn mem_store_keeps_the_contract() {
    contract(&mut MemStore::new());
}

#[test]
fn sled_store_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    contract(&mut SledStore::open(&dir.path().join("db")).unwrap());
}

/// The store at `path` opened again after this process dropped it. sled
/// writes segments on threads of its own that hold the database (and its
/// file lock) for a moment after the last handle is dropped, so under
/// load an open at once can find it still locked (CI saw it once); a
/// node restarted is another process, whose lock went with it.
fn reopen(path: &std::path::Path) -> SledStore {
    for _ in 0..100 {
        match SledStore::open(path) {
            Err(StoreError::Locked { .. }) => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            r => return r.unwrap(),
        }
    }
    panic!(
        "{} stayed locked for 5 s after it was dropped",
        path.display()
    )
}

/// A sled store at `path` holding one done task, open.
fn one_done(path: &std::path::Path) -> SledStore {
    let mut s = SledStore::open(path).unwrap();
    s.write(vec![Write::Task {
        farm: FarmKey(4),
        task: TaskRef::new(1, 7),
        record: rec(RecordState::Done, 1),
    }])
    .unwrap();
    s.flush().unwrap();
    s
}

/// Whether the store at `path` opens with `one_done`'s task in it.
fn has_one_done(path: &std::path::Path) -> bool {
    let s = reopen(path);
    s.task(FarmKey(4), TaskRef::new(1, 7)).unwrap() == Some(rec(RecordState::Done, 1))
}

#[test]
fn sled_store_survives_reopen_and_refuses_a_second_opener() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let _s = one_done(&path);
        assert!(matches!(
            SledStore::open(&path),
            Err(StoreError::Locked { .. })
        ));
    }
    assert!(has_one_done(&path));
}

#[test]
fn a_snapshot_half_written_when_the_node_was_killed_costs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    drop(one_done(&path));
    // What a SIGKILL while sled writes a snapshot leaves: the file it
    // renames only once whole, still empty, sorting after every snapshot.
    std::fs::write(path.join("snap.FFFFFFFFFFFFFFFF.generating"), b"").unwrap();
    assert!(has_one_done(&path));
    assert!(!path.join("snap.FFFFFFFFFFFFFFFF.generating").exists());
}

#[test]
fn mem_store_crash_loses_only_the_unflushed_tail() {
    let mut s = MemStore::new();
    let f = FarmKey(1);
    let w = |i| Write::Task {
        farm: f,
        task: TaskRef::new(0, i),
        record: rec(RecordState::Done, 1),
    };
    s.write(vec![w(0)]).unwrap();
    s.flush().unwrap();
    s.write(vec![w(1)]).unwrap();
    assert_eq!(s.tasks(f).unwrap().len(), 2, "reads see unflushed writes");
    s.crash();
    assert_eq!(s.tasks(f).unwrap().len(), 1);
}

#[test]
fn any_task_index_round_trips_in_both_stores() {
    // Far-apart indices and stages (the memory store keeps near ones in a
    // vector and the rest in a map) all come back, in task order.
    let dir = tempfile::tempdir().unwrap();
    let mut sled = SledStore::open(&dir.path().join("db")).unwrap();
    let mut mem = MemStore::new();
    let refs = [
        TaskRef::new(0, u32::MAX),
        TaskRef::new(0, 3),
        TaskRef::new(5000, 1),
        TaskRef::new(2, 70_000),
        TaskRef::new(2, 0),
    ];
    for s in [&mut sled as &mut dyn Store, &mut mem] {
        let f = FarmKey(9);
        let writes = refs
            .iter()
            .map(|&task| Write::Task {
                farm: f,
                task,
                record: rec(RecordState::Done, task.index % 7 + 1),
            })
            .collect();
        s.write(writes).unwrap();
        s.flush().unwrap();
        let mut want = refs.to_vec();
        want.sort();
        let got: Vec<TaskRef> = s.tasks(f).unwrap().into_iter().map(|(t, _)| t).collect();
        assert_eq!(got, want);
        for &t in &refs {
            assert_eq!(
                s.task(f, t).unwrap(),
                Some(rec(RecordState::Done, t.index % 7 + 1))
            );
        }
        assert_eq!(s.task(f, TaskRef::new(0, 4)).unwrap(), None);
    }
}

#[test]
fn sled_store_replays_its_log_once_and_stops_at_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let f = FarmKey(3);
    let log;
    {
        let mut s = SledStore::open(&path).unwrap();
        for i in 0..3 {
            s.write(vec![
                Write::Task {
                    farm: f,
                    task: TaskRef::new(0, i),
                    record: rec(RecordState::Done, 1),
                },
                Write::Journal(JournalEntry {
                    at_ms: i as u64,
                    farm: f,
                    event: JournalEvent::RunStarted {
                        run: 1,
                        resumed: false,
                    },
                }),
            ])
            .unwrap();
            s.flush().unwrap();
        }
        // What a process killed now would leave behind.
        log = std::fs::read(path.join("mesh.wal")).unwrap();
        assert!(!log.is_empty(), "flushed records are in the log");
    }
    assert!(
        std::fs::read(path.join("mesh.wal")).unwrap().is_empty(),
        "a clean close checkpoints and empties the log"
    );
    // Put the log back, as if the close never happened, with half a record after it.
    let mut torn = log.clone();
    torn.extend_from_slice(&log[..log.len() / 5]);
    std::fs::write(path.join("mesh.wal"), &torn).unwrap();
    let s = reopen(&path);
    assert_eq!(s.tasks(f).unwrap().len(), 3);
    assert_eq!(
        s.journal(f, 100).unwrap().len(),
        3,
        "replaying a log sled already has duplicates nothing"
    );
}

#[test]
fn task_records_across_chunk_boundaries_survive_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let f = FarmKey(9);
    let ids = [0u32, 255, 256, 257, 1000, 70_000];
    let mut s = SledStore::open(&dir.path().join("db")).unwrap();
    for (n, &i) in ids.iter().enumerate() {
        s.write(vec![Write::Task {
            farm: f,
            task: TaskRef::new(1, i),
            record: rec(RecordState::Done, n as u32 + 1),
        }])
        .unwrap();
        if n % 2 == 0 {
            // Fold some into sled, leave others in the log, to read from both.
            s.checkpoint().unwrap();
        }
    }
    s.flush().unwrap();
    let got: Vec<_> = s
        .tasks(f)
        .unwrap()
        .into_iter()
        .map(|(t, r)| (t.index, r.attempt))
        .collect();
    assert_eq!(
        got,
        vec![(0, 1), (255, 2), (256, 3), (257, 4), (1000, 5), (70_000, 6)]
    );
    assert_eq!(s.task(f, TaskRef::new(1, 256)).unwrap().unwrap().attempt, 3);
    assert!(s.task(f, TaskRef::new(1, 258)).unwrap().is_none());
    assert!(
        s.task(f, TaskRef::new(0, 256)).unwrap().is_none(),
        "another stage"
    );
    drop(s);
    let s = reopen(&dir.path().join("db"));
    assert_eq!(s.tasks(f).unwrap().len(), ids.len());
}

/// Generation `gen` of an open farm of `stages` one-task stages, with an
/// input file per stage.
fn open_farm(gen: u32, stages: usize, open: bool) -> std::sync::Arc<mesh_protocol::mesh::FarmSpec> {
    use mesh_protocol::farm::{CommandTemplate, StageDef, Sweep, Template};
    use mesh_protocol::mesh::{FarmId, FarmSpec, InputFile, NodeId};
    let stage = |i: usize| {
        std::sync::Arc::new(StageDef::new(
            &format!("f{i}"),
            CommandTemplate::Argv(vec![Template::literal("true")]),
            Sweep::range("i", 1),
        ))
    };
    std::sync::Arc::new(FarmSpec {
        id: FarmId(9),
        origin: NodeId(1),
        def: std::sync::Arc::new(FarmDef {
            graph: Default::default(),
            name: "python".into(),
            root: "/r".into(),
            out: "/r/out".into(),
            stages: (0..stages).map(stage).collect(),
        }),
        inputs: (0..stages)
            .map(|i| InputFile {
                path: format!("calls/{i}.pkl"),
                hash: [i as u8; 32],
                mode: 0o644,
            })
            .collect(),
        submitted_ms: 5,
        gen,
        open,
    })
}

/// What a step of `book` writes for `p`.
fn writes_of(book: &mut MeshState, p: mesh_protocol::mesh::Persist) -> Vec<Write> {
    let mut out = Vec::new();
    book.writes(p, &mut out);
    out
}

#[test]
fn a_grown_farm_is_written_as_what_it_adds_and_read_back_whole() {
    use mesh_protocol::mesh::Persist;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let meta_len = |w: &[Write], name: &str| {
        w.iter()
            .find_map(|w| match w {
                Write::Meta { name: n, value, .. } if n == name => Some(value.len()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no {name} in {} writes", w.len()))
    };
    {
        let mut s = SledStore::open(&path).unwrap();
        let mut book = MeshState::default();
        let w = writes_of(&mut book, Persist::Farm(open_farm(0, 200, true)));
        let whole = meta_len(&w, "spec");
        s.write(w).unwrap();
        // Two more generations: a stage added, then one with none.
        let w = writes_of(&mut book, Persist::Farm(open_farm(1, 201, true)));
        assert!(w
            .iter()
            .all(|w| !matches!(w, Write::Meta { name, .. } if name == "spec")));
        let grown = meta_len(&w, "g/0000000000");
        assert!(
            grown * 50 < whole,
            "a growth of one stage wrote {grown} bytes, the farm {whole}"
        );
        s.write(w).unwrap();
        s.write(writes_of(&mut book, Persist::Farm(open_farm(2, 201, true))))
            .unwrap();
        s.flush().unwrap();
    }
    let s = reopen(&path);
    let (mut book, farms, _) = MeshState::load(&s).unwrap();
    assert_eq!(farms.len(), 1);
    let spec = &farms[0].0.spec;
    assert_eq!(**spec, *open_farm(2, 201, true));
    // Read back, it grows as what it adds again; once closed it is no
    // longer kept to be grown (a copy of it is written whole); a copy
    // that is no growth of it (another folder) is written whole, and the
    // growths written before it are not read into it.
    let w = writes_of(&mut book, Persist::Farm(open_farm(3, 202, false)));
    meta_len(&w, "g/0000000002");
    let w = writes_of(&mut book, Persist::Farm(open_farm(3, 202, false)));
    meta_len(&w, "spec");
    let moved = std::sync::Arc::new(mesh_protocol::mesh::FarmSpec {
        def: std::sync::Arc::new(FarmDef {
            out: "/elsewhere".into(),
            ..(*open_farm(5, 203, false).def).clone()
        }),
        ..(*open_farm(5, 203, false)).clone()
    });
    let w = writes_of(&mut book, Persist::Farm(moved.clone()));
    meta_len(&w, "spec");
    drop(s);
    let mut s = SledStore::open(&path).unwrap();
    s.write(w).unwrap();
    s.flush().unwrap();
    let (_, farms, _) = MeshState::load(&s).unwrap();
    assert_eq!(*farms[0].0.spec, *moved);
}
