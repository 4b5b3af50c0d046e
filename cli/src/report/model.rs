//! A farm's trace (the WfFormat `mesh export` writes) read back into what the report draws: each run with its stage, node, start and figures, and the data its tasks took from other nodes.

use std::collections::HashMap;

use serde_json::Value;

/// One task's run that counts, as the trace records it.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// Index into `Model::stages`.
    pub stage: usize,
    pub task: String,
    pub machine: Option<String>,
    /// Unix ms; none for a farm whose runs kept no start (`mesh run`).
    pub start_ms: Option<u64>,
    pub runtime_ms: u64,
    /// Measured where the node could: percent of one core, peak bytes.
    pub cpu_pct: Option<f64>,
    pub peak: Option<u64>,
    pub failed: Option<String>,
}

/// Bytes a node's tasks took from another node's (their dependencies'
/// outputs, which mesh moved to them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moved {
    pub from: String,
    pub to: String,
    pub bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Model {
    /// Stage names, in the order the trace first names them.
    pub stages: Vec<String>,
    pub runs: Vec<Run>,
    /// Most first.
    pub moved: Vec<Moved>,
    /// When the first run started and the last ended (Unix ms).
    pub span: Option<(u64, u64)>,
}

fn ms_of(stamp: &Value) -> Option<u64> {
    let t = humantime::parse_rfc3339_weak(stamp.as_str()?).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64)
}

fn strings(v: &Value) -> impl Iterator<Item = &str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str)
}

impl Model {
    /// From a trace as `mesh export` writes it.
    pub fn of(trace: &Value) -> Model {
        let w = &trace["workflow"];
        let mut m = Model::default();
        let mut stage_of: HashMap<&str, usize> = HashMap::new();
        // Each task's stage, parents and outputs, by id.
        let mut spec: HashMap<&str, (usize, &Value, &Value)> = HashMap::new();
        for t in w["specification"]["tasks"].as_array().into_iter().flatten() {
            let (Some(id), Some(cat)) = (t["id"].as_str(), t["category"].as_str()) else {
                continue;
            };
            let n = stage_of.len();
            let s = *stage_of.entry(cat).or_insert_with(|| {
                m.stages.push(cat.to_string());
                n
            });
            spec.insert(id, (s, &t["parents"], &t["outputFiles"]));
        }
        let sizes: HashMap<&str, u64> = w["specification"]["files"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| Some((f["id"].as_str()?, f["sizeInBytes"].as_u64()?)))
            .collect();
        let mut ran_on: HashMap<&str, &str> = HashMap::new();
        for e in w["execution"]["tasks"].as_array().into_iter().flatten() {
            let Some(id) = e["id"].as_str() else { continue };
            let Some(&(stage, ..)) = spec.get(id) else {
                continue;
            };
            let machine = strings(&e["machines"]).next();
            if let Some(node) = machine {
                ran_on.insert(id, node);
            }
            m.runs.push(Run {
                stage,
                task: id.to_string(),
                machine: machine.map(str::to_string),
                start_ms: ms_of(&e["executedAt"]),
                runtime_ms: (e["runtimeInSeconds"].as_f64().unwrap_or(0.0) * 1000.0).round() as u64,
                cpu_pct: e["avgCPU"].as_f64(),
                peak: e["memoryInBytes"].as_u64(),
                failed: e["failed"].as_str().map(str::to_string),
            });
        }
        let mut moved: HashMap<(&str, &str), u64> = HashMap::new();
        for (&id, &to) in &ran_on {
            for p in strings(spec[id].1) {
                let Some(&from) = ran_on.get(p).filter(|&&from| from != to) else {
                    continue;
                };
                let bytes: u64 = strings(spec[p].2).filter_map(|f| sizes.get(f)).sum();
                *moved.entry((from, to)).or_default() += bytes;
            }
        }
        m.moved = moved
            .into_iter()
            .filter(|&(_, b)| b > 0)
            .map(|((from, to), bytes)| Moved {
                from: from.to_string(),
                to: to.to_string(),
                bytes,
            })
            .collect();
        m.moved.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then_with(|| (&a.from, &a.to).cmp(&(&b.from, &b.to)))
        });
        let timed = m
            .runs
            .iter()
            .filter_map(|r| Some((r.start_ms?, r.runtime_ms)));
        m.span = timed.fold(None, |span, (s, d)| match span {
            None => Some((s, s + d)),
            Some((a, b)) => Some((a.min(s), b.max(s + d))),
        });
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn runs_and_the_data_moved_between_nodes_come_from_the_trace() {
        let trace = json!({"workflow": {
            "specification": {
                "tasks": [
                    {"id": "a.0", "category": "a", "parents": [], "outputFiles": ["a/0/x"]},
                    {"id": "a.1", "category": "a", "parents": [], "outputFiles": ["a/1/x"]},
                    {"id": "b.0", "category": "b", "parents": ["a.0", "a.1"], "outputFiles": []},
                ],
                "files": [{"id": "a/0/x", "sizeInBytes": 100}, {"id": "a/1/x", "sizeInBytes": 7}],
            },
            "execution": {"tasks": [
                {"id": "a.0", "runtimeInSeconds": 1.5, "executedAt": "2026-12-02T10:00:00.000Z",
                 "machines": ["n1"], "avgCPU": 98.5, "memoryInBytes": 1000},
                {"id": "a.1", "runtimeInSeconds": 1.0, "executedAt": "2026-12-02T10:00:01.000Z",
                 "machines": ["n2"]},
                {"id": "b.0", "runtimeInSeconds": 2.0, "executedAt": "2026-12-02T10:00:03.000Z",
                 "machines": ["n2"], "failed": "exit code 1"},
            ]},
        }});
        let m = Model::of(&trace);
        assert_eq!(m.stages, ["a", "b"]);
        assert_eq!(m.runs.len(), 3);
        assert_eq!(m.runs[0].runtime_ms, 1500);
        assert_eq!(m.runs[0].peak, Some(1000));
        assert_eq!(m.runs[1].cpu_pct, None);
        assert_eq!(m.runs[2].failed.as_deref(), Some("exit code 1"));
        let (a, b) = m.span.unwrap();
        assert_eq!(b - a, 5000);
        // b.0 ran on n2: a.0's output came from n1, a.1's was there.
        assert_eq!(
            m.moved,
            [Moved {
                from: "n1".into(),
                to: "n2".into(),
                bytes: 100
            }]
        );
    }
}
