//! The dashboard's endpoints in-process: status codes, JSON shapes, the Prometheus text, the token, and bounded updates for a million-task farm.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use mesh_protocol::engine::Counts;
use mesh_protocol::mesh::FarmId;
use mesh_protocol::observe::{Latencies, Latency, Observation, RunRecord};
use mesh_protocol::TaskRef;
use tokio::sync::watch;
use tower::ServiceExt;

use super::view::{DashView, Model, NodePage, MARK_COORDINATOR, MARK_LOCAL, UPDATE_MAX_BYTES};
use super::*;
use crate::view::{MeshStatus, NodeView, ResourceUse};

/// A source with a fixed mesh: `nodes` nodes, each with `runs` recent
/// runs, and one farm of `tasks` tasks with `failures` failures.
struct Fixed {
    observed: Observed,
    farms: Vec<FarmView>,
}

impl Source for Fixed {
    fn observe(&self, _since: HashMap<String, u64>) -> BoxFuture<Result<Observed, SourceError>> {
        Box::pin(std::future::ready(Ok(self.observed.clone())))
    }
    fn farms(&self) -> BoxFuture<Result<Vec<FarmView>, SourceError>> {
        Box::pin(std::future::ready(Ok(self.farms.clone())))
    }
    fn logs(
        &self,
        farm: String,
        task: String,
        _: Option<u32>,
    ) -> BoxFuture<Result<String, SourceError>> {
        let r = if task == "sim/7" {
            Ok(format!("log of {farm} {task}\n"))
        } else {
            Err(SourceError::Refused(format!("no task {task}")))
        };
        Box::pin(std::future::ready(r))
    }
}

const NOW: u64 = 1_800_000_000_000;

fn fixture(nodes: usize, runs: u64, tasks: u64, failures: usize) -> Fixed {
    let id = |i: usize| format!("12D3KooWNodeWithALongPeerIdentifier{i:06}");
    let views = (0..nodes)
        .map(|i| NodeView {
            id: id(i),
            coordinator: i == 0,
            local: i == 1,
            queued: 3,
            running: 2,
            usage: vec![
                ResourceUse {
                    kind: "cpu".into(),
                    used: 2.0,
                    total: 4.0,
                },
                ResourceUse {
                    kind: "mem".into(),
                    used: 0.0,
                    total: 8e9,
                },
            ],
            ..NodeView::default()
        })
        .collect();
    let mut lat = Latencies::default();
    for ms in 1..200 {
        lat.record_ms(Latency::QueueWait, ms);
        lat.record(Latency::MessageRtt, ms * 10);
    }
    let obs = (0..nodes)
        .map(|i| {
            let o = Observation {
                unix_ms: NOW,
                load: Some(1.5),
                cpus: 4,
                mem_used: Some(1 << 30),
                mem_total: Some(8 << 30),
                latency: lat.export(),
                beat: None,
                runs: (0..runs)
                    .map(|s| RunRecord {
                        seq: s + 1,
                        changed: s + 1,
                        farm: FarmId(0xabcd_ef01 << 32),
                        task: TaskRef::new(0, s as u32),
                        attempt: 1,
                        slot: (s % 4) as u32,
                        start: NOW - 30_000 + s * 10,
                        end: (s % 5 != 0).then_some(NOW - 29_000 + s * 10),
                        failed: s % 7 == 0,
                    })
                    .collect(),
                ..Observation::default()
            };
            (id(i), o)
        })
        .collect();
    let status = MeshStatus {
        nodes: views,
        coordinator: Some(id(0)),
        term: 3,
        ..MeshStatus::default()
    };
    let counts = Counts {
        total: tasks,
        done: tasks / 3,
        running: 8.min(tasks / 4),
        failed: failures as u64,
        ..Counts::default()
    };
    let farm = FarmView {
        id: "sweep-abcdef01".into(),
        name: "sweep".into(),
        accepted: true,
        counts: counts.clone(),
        stages: vec![("sim".into(), counts)],
        failures: (0..failures)
            .map(|i| {
                format!(
                    "sim/{i} (attempt 2 on {}): exit code 1",
                    id(i % nodes.max(1))
                )
            })
            .collect(),
        home: id(1),
        used: vec![crate::used::StageUse {
            stage: "sim".into(),
            runs: 3,
            runtime_buckets: vec![0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            runtime_sum_ms: 9_000,
            peak_buckets: vec![1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            peak_sum: 100 << 20,
            ..crate::used::StageUse::default()
        }],
        ..FarmView::default()
    };
    Fixed {
        observed: Observed::new(status, obs),
        farms: vec![farm],
    }
}

/// The router over one update made from `f`, with `token`.
fn app(f: Fixed, token: Option<&str>) -> Router {
    let mut model = Model::default();
    let json = model.update(NOW, &f.observed, &f.farms).to_json();
    let update = Update {
        json,
        observed: Some(f.observed.clone()),
        farms: f.farms.clone(),
    };
    let (_tx, rx) = watch::channel(Arc::new(update));
    // The sender is dropped: the receiver keeps the last value.
    router(rx, Arc::new(f), token.map(String::from))
}

async fn get(app: &Router, uri: &str) -> (StatusCode, String, String) {
    let resp = app
        .clone()
        .oneshot(Request::get(uri).body(Body::empty()).expect("request"))
        .await
        .expect("answered");
    let status = resp.status();
    let ctype = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or("").to_string())
        .unwrap_or_default();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 24)
        .await
        .expect("body");
    (status, ctype, String::from_utf8_lossy(&body).into_owned())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn page_assets_status_and_logs_are_served() {
    rt().block_on(async {
        let app = app(fixture(3, 50, 1000, 2), None);
        let (s, ct, body) = get(&app, "/").await;
        assert_eq!(s, StatusCode::OK);
        assert!(ct.starts_with("text/html"), "{ct}");
        assert!(
            body.contains("app.js") && body.contains("style.css"),
            "{body}"
        );
        for asset in ["/app.js", "/style.css"] {
            let (s, _, body) = get(&app, asset).await;
            assert_eq!(s, StatusCode::OK);
            assert!(body.len() > 100, "{asset} is served whole");
        }

        let (s, ct, body) = get(&app, "/api/status").await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(ct, "application/json");
        let v: DashView = serde_json::from_str(&body).expect("a DashView");
        // The mesh at a glance, and a cell per node in id order.
        assert_eq!(v.glance.nodes, 3);
        assert_eq!(v.heat.levels, "555", "half of each node's cores in use");
        assert_eq!(v.heat.marks, [(0, MARK_COORDINATOR), (1, MARK_LOCAL)]);
        // The table is paged from the server.
        let (s, _, body) = get(&app, "/api/nodes").await;
        assert_eq!(s, StatusCode::OK);
        let p: NodePage = serde_json::from_str(&body).expect("a NodePage");
        assert_eq!((p.total, p.matched, p.rows.len()), (3, 3, 3));
        assert_eq!(v.coordinator.as_deref(), Some(p.rows[0].id.as_str()));
        assert!(p.rows[0].coordinator);
        assert_eq!(p.rows[0].load, Some(1.5));
        assert_eq!(p.rows[0].resources[0].kind, "cpu");
        let ids = |body: &str| -> Vec<String> {
            let p: NodePage = serde_json::from_str(body).expect("a NodePage");
            p.rows
                .into_iter()
                .map(|r| r.id[r.id.len() - 1..].to_string())
                .collect()
        };
        let (_, _, body) = get(&app, "/api/nodes?sort=id&desc=true&per=2").await;
        assert_eq!(ids(&body), ["2", "1"]);
        let (_, _, body) = get(&app, "/api/nodes?sort=id&desc=true&per=2&page=1").await;
        assert_eq!(ids(&body), ["0"]);
        let (_, _, body) = get(&app, "/api/nodes?q=000001").await;
        assert_eq!(ids(&body), ["1"]);
        let (_, _, body) = get(&app, "/api/nodes?at=2").await;
        assert_eq!(ids(&body), ["2"]);
        let (_, _, body) = get(&app, "/api/nodes?state=idle").await;
        assert!(ids(&body).is_empty(), "every node runs tasks");
        let (_, _, body) = get(&app, "/api/nodes?state=busy").await;
        assert_eq!(ids(&body).len(), 3);
        assert_eq!(v.farms[0].stages[0].total, 1000);
        assert_eq!(v.farms[0].stages[0].done, 333);
        assert_eq!(v.farms[0].failures.len(), 2);
        let link = v.farms[0].failures[0].logs.clone().expect("a logs link");
        assert_eq!(link, "/api/logs/sweep%2Dabcdef01/sim%2F0?attempt=2");
        // Runs of every node, in lanes per node and slot, named by stage.
        assert_eq!(v.stream.lanes.len(), 3 * 4);
        assert_eq!(v.stream.bars.len(), 3 * 50);
        assert_eq!(v.stream.stages, vec!["sweep-abcdef01/sim".to_string()]);
        assert!(v.stream.bars.iter().any(|b| b.2.is_none()), "running bars");
        assert!(v.stream.bars.iter().any(|b| b.4 == 1), "failed bars");
        assert_eq!(v.latency[0].name, "queue_wait");
        assert_eq!(v.latency[0].count, 3 * 199);

        let (s, ct, body) = get(&app, "/api/logs/sweep-abcdef01/sim%2F7").await;
        assert_eq!(s, StatusCode::OK);
        assert!(ct.starts_with("text/plain"));
        assert_eq!(body, "log of sweep-abcdef01 sim/7\n");
        let (s, _, _) = get(&app, "/api/logs/sweep-abcdef01/sim%2F8").await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        let (s, _, _) = get(&app, "/nothing-here").await;
        assert_eq!(s, StatusCode::NOT_FOUND);
    });
}

#[test]
fn metrics_parse_as_prometheus_text() {
    rt().block_on(async {
        let app = app(fixture(2, 10, 1000, 1), None);
        let (s, _, body) = get(&app, "/metrics").await;
        assert_eq!(s, StatusCode::OK);
        let lines = body.lines().map(|l| Ok(l.to_string()));
        let scrape = prometheus_parse::Scrape::parse(lines).expect("parses");
        let find = |name: &str, labels: &[(&str, &str)]| {
            scrape
                .samples
                .iter()
                .find(|s| {
                    s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
                })
                .unwrap_or_else(|| panic!("no {name} {labels:?} in\n{body}"))
                .value
                .clone()
        };
        use prometheus_parse::Value;
        let gauge = |v: Value| match v {
            Value::Gauge(g) | Value::Untyped(g) => g,
            other => panic!("not a gauge: {other:?}"),
        };
        let tasks = |state| gauge(find("mesh_tasks", &[("stage", "sim"), ("state", state)]));
        assert_eq!(tasks("done"), 333.0);
        assert_eq!(tasks("failed"), 1.0);
        assert_eq!(tasks("queued"), 1000.0 - 333.0 - 8.0 - 1.0);
        let node = "12D3KooWNodeWithALongPeerIdentifier000000";
        assert_eq!(gauge(find("mesh_node_queued", &[("node", node)])), 3.0);
        let cpu = [("node", node), ("resource", "cpu")];
        assert_eq!(gauge(find("mesh_node_resource_used", &cpu)), 2.0);
        assert_eq!(gauge(find("mesh_node_resource_total", &cpu)), 4.0);
        // OpenMetrics names a counter's sample `_total`; this parser,
        // reading the older text format, cannot tie it to its TYPE line.
        match find("mesh_steals_total", &[("node", node)]) {
            Value::Counter(c) | Value::Untyped(c) => assert_eq!(c, 0.0),
            other => panic!("steals is not a counter: {other:?}"),
        }
        match find("mesh_latency_seconds", &[("kind", "queue_wait")]) {
            Value::Histogram(h) => {
                let total = h.iter().map(|b| b.count).fold(0.0, f64::max);
                assert_eq!(
                    total,
                    2.0 * 199.0,
                    "every recorded wait is in the +Inf bucket"
                );
                let below_100ms = h
                    .iter()
                    .find(|b| (b.less_than - 0.1).abs() < 1e-9)
                    .expect("a 100 ms bucket")
                    .count;
                assert!(
                    (199.0..=2.0 * 101.0).contains(&below_100ms),
                    "{below_100ms}"
                );
            }
            other => panic!("latency is not a histogram: {other:?}"),
        }
        // What finished tasks used, per farm and stage.
        let sim = [("farm", "sweep-abcdef01"), ("stage", "sim")];
        match find("mesh_task_runtime_seconds", &sim) {
            Value::Histogram(h) => {
                let upto = |le: f64| {
                    h.iter()
                        .find(|b| (b.less_than - le).abs() < 1e-9)
                        .unwrap()
                        .count
                };
                assert_eq!((upto(0.5), upto(1.0), upto(5.0)), (0.0, 1.0, 3.0));
            }
            other => panic!("runtime is not a histogram: {other:?}"),
        }
        match find("mesh_task_peak_memory_bytes", &sim) {
            Value::Histogram(h) => {
                let mib16 = h
                    .iter()
                    .find(|b| b.less_than == (16u64 << 20) as f64)
                    .unwrap();
                assert_eq!(mib16.count, 1.0);
                assert_eq!(h.iter().map(|b| b.count).fold(0.0, f64::max), 3.0);
            }
            other => panic!("peak memory is not a histogram: {other:?}"),
        }
    });
}

#[test]
fn a_token_is_asked_for_when_one_is_set() {
    rt().block_on(async {
        let app = app(fixture(1, 1, 10, 0), Some("s3cret"));
        for uri in ["/", "/api/status", "/metrics", "/api/events"] {
            let (s, _, body) = get(&app, uri).await;
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri}");
            assert!(body.contains("token"), "{body}");
        }
        let (s, _, _) = get(&app, "/api/status?token=wrong").await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        let (s, _, _) = get(&app, "/api/status?token=s3cret").await;
        assert_eq!(s, StatusCode::OK);
        let resp = app
            .clone()
            .oneshot(
                Request::get("/metrics")
                    .header("authorization", "Bearer s3cret")
                    .body(Body::empty())
                    .expect("request"),
            )
            .await
            .expect("answered");
        assert_eq!(resp.status(), StatusCode::OK);
    });
}

#[test]
fn the_token_is_the_meshs_and_loopback_needs_none() {
    let a = token_for(b"key one");
    assert_eq!(
        a,
        token_for(b"key one"),
        "every node of a mesh derives the same"
    );
    assert_ne!(a, token_for(b"key two"));
    assert!(!a.contains("key"));
    let lo = Http::new("127.0.0.1:8787".parse().expect("addr"), None).expect("loopback");
    assert!(lo.token.is_none());
    let open = "0.0.0.0:8787".parse().expect("addr");
    assert!(Http::new(open, None).is_err(), "no key, no open dashboard");
    let with = Http::new(open, Some(b"key one")).expect("with a key");
    assert_eq!(with.token.as_deref(), Some(a.as_str()));
}

#[test]
fn events_stream_sends_updates() {
    rt().block_on(async {
        let f = fixture(2, 5, 100, 0);
        let (tx, rx) = watch::channel(Arc::new(Update::default()));
        let app = router(rx, Arc::new(fixture(1, 1, 1, 0)), None);
        let resp = app
            .oneshot(
                Request::get("/api/events")
                    .body(Body::empty())
                    .expect("request"),
            )
            .await
            .expect("answered");
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("text/event-stream")
        );
        let mut body = resp.into_body().into_data_stream();
        let mut model = Model::default();
        for round in 0..2 {
            let json = model
                .update(NOW + round * 1000, &f.observed, &f.farms)
                .to_json();
            tx.send(Arc::new(Update {
                json: json.clone(),
                observed: None,
                farms: Vec::new(),
            }))
            .expect("a receiver");
            let chunk = futures::StreamExt::next(&mut body)
                .await
                .expect("an event")
                .expect("bytes");
            let text = String::from_utf8_lossy(&chunk);
            assert!(text.starts_with("data: {"), "{text}");
            let v: DashView =
                serde_json::from_str(text.trim_start_matches("data: ").trim()).expect("a view");
            assert_eq!(v.at, NOW + round * 1000);
        }
    });
}

#[test]
fn a_million_task_farm_on_a_big_mesh_fits_one_update() {
    // 1,000 nodes, each with a full record of runs, a million-task farm
    // and thousands of failures: every part of the view at its limit.
    let f = fixture(1000, 512, 1_000_000, 5000);
    let mut model = Model::default();
    let mut sizes = Vec::new();
    for round in 0..3 {
        let json = model
            .update(NOW + round * 1000, &f.observed, &f.farms)
            .to_json();
        sizes.push(json.len());
        let v: DashView = serde_json::from_str(&json).expect("a view");
        assert_eq!(v.glance.nodes, 1000, "every node counted");
        assert_eq!(v.heat.levels.len(), 1000, "every node in the heat map");
        assert!(!v.stream.bars.is_empty());
        assert_eq!(v.farms[0].stages[0].total, 1_000_000);
    }
    assert!(
        sizes.iter().all(|&s| s <= UPDATE_MAX_BYTES),
        "update sizes {sizes:?} over {UPDATE_MAX_BYTES}"
    );
}

#[test]
fn rates_and_etas_follow_progress() {
    let mut f = fixture(1, 0, 1000, 0);
    let mut model = Model::default();
    let mut last = None;
    for round in 0..5u64 {
        f.farms[0].stages[0].1.done = 100 + round * 50;
        f.farms[0].counts.done = 100 + round * 50;
        last = Some(model.update(NOW + round * 1000, &f.observed, &f.farms));
    }
    let v = last.expect("updates");
    let s = &v.farms[0].stages[0];
    assert!((s.rate - 50.0).abs() < 0.01, "{}", s.rate);
    let eta = s.eta_s.expect("an ETA");
    assert!((eta - (1000.0 - 300.0) / 50.0).abs() < 0.01, "{eta}");
    assert_eq!(
        v.series.done.iter().skip(1).copied().collect::<Vec<_>>(),
        vec![50; 4]
    );
}

#[test]
fn a_long_run_that_ends_after_shorter_ones_is_seen_ending() {
    let mut rec = crate::observe::Recorder::default();
    let farm = FarmId(0xabcd_ef01 << 32);
    let long = rec.started(farm, TaskRef::new(0, 0), 1, NOW - 5000);
    let short = rec.started(farm, TaskRef::new(0, 1), 1, NOW - 4000);
    rec.ended(short, None, false, NOW - 3000);
    let mut f = fixture(1, 0, 10, 0);
    let node = f.observed.nodes[0].0.clone();
    let mut model = Model::default();
    let poll = |rec: &crate::observe::Recorder, model: &mut Model, f: &mut Fixed, at: u64| {
        let since = model.since().get(&node).copied().unwrap_or(0);
        let mut o = rec.observation(since, Default::default(), at);
        o.unix_ms = at;
        f.observed.nodes[0].1 = o;
        model.update(at, &f.observed, &f.farms)
    };
    let v = poll(&rec, &mut model, &mut f, NOW);
    assert_eq!(v.stream.bars.iter().filter(|b| b.2.is_none()).count(), 1);
    rec.ended(long, None, true, NOW + 500);
    let v = poll(&rec, &mut model, &mut f, NOW + 1000);
    assert_eq!(v.stream.bars.len(), 2);
    assert!(
        v.stream.bars.iter().all(|b| b.2.is_some()),
        "the long run is shown ended: {:?}",
        v.stream.bars
    );
    assert_eq!(v.stream.bars.iter().filter(|b| b.4 == 1).count(), 1);
}

/// A running task's figures reach the page with its lane, its stage by
/// name and its stage's ask; its CPU share is counted from its start at
/// first, then between two looks; a task that is not running is not shown.
#[test]
fn running_tasks_are_shown_with_what_they_hold_and_their_cpu_share() {
    use mesh_protocol::observe::RunningUse;
    const MIB: u64 = 1 << 20;
    let mut rec = crate::observe::Recorder::default();
    let farm = FarmId(0xabcd_ef01 << 32);
    rec.started(farm, TaskRef::new(0, 4), 1, NOW - 9000);
    rec.started(farm, TaskRef::new(0, 7), 2, NOW - 10_000);
    let ended = rec.started(farm, TaskRef::new(0, 5), 1, NOW - 8000);
    rec.ended(ended, None, false, NOW - 1000);
    let mut f = fixture(1, 0, 10, 0);
    f.farms[0].asks = vec![crate::view::StageAsk {
        stage: "sim".into(),
        mem: 1 << 30,
        cpu: 1.0,
    }];
    let figures = |task: u32, attempt: u32, rss: u64, cpu_ms: Option<u64>| RunningUse {
        farm,
        task: TaskRef::new(0, task),
        attempt,
        rss,
        peak: rss + MIB,
        cpu_ms,
    };
    let mut model = Model::default();
    let mut poll = |at: u64, running: Vec<RunningUse>| {
        let mut o = rec.observation(0, Default::default(), at);
        o.running = running;
        f.observed.nodes[0].1 = o;
        model.update(at, &f.observed, &f.farms)
    };
    let v = poll(
        NOW,
        vec![
            figures(7, 2, 40 * MIB, Some(5000)),
            figures(4, 1, 300 * MIB, None),
            // Ended: its figures came late, and are not shown.
            figures(5, 1, 900 * MIB, Some(1)),
        ],
    );
    let lines: Vec<_> = v.running.iter().map(|r| (r.task, r.attempt)).collect();
    assert_eq!(lines, vec![(4, 1), (7, 2)], "the heaviest first");
    let (heavy, light) = (&v.running[0], &v.running[1]);
    assert_eq!(
        (heavy.farm.as_str(), heavy.stage.as_str()),
        ("sweep-abcdef01", "sim")
    );
    assert_eq!(
        (heavy.rss, heavy.peak, heavy.mem_asked),
        (300 * MIB, 301 * MIB, 1 << 30)
    );
    assert_eq!(heavy.cpu_pct, None, "no CPU read yet");
    assert_eq!(heavy.slot, 0);
    assert_eq!((light.slot, light.start), (1, NOW - 10_000));
    // 5 s of CPU over its 10 s: half a core.
    assert_eq!(light.cpu_pct, Some(50.0));
    // Then 1.5 s more in the second since: a core and a half.
    let v = poll(NOW + 1000, vec![figures(7, 2, 41 * MIB, Some(6500))]);
    assert_eq!(v.running.len(), 1);
    assert_eq!(v.running[0].cpu_pct, Some(150.0));
    let json: serde_json::Value = serde_json::from_str(&v.to_json()).expect("json");
    assert_eq!(json["running"][0]["rss"], 41 * MIB);
}
