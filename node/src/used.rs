//! What a stage's tasks used against what they asked: runtime, CPU and peak memory per stage, and the hints `mesh status` gives on the asks.
//!
//! Read from the farm's log on a node that holds it (a mesh farm) or from
//! the store's records (`mesh run`): each finished run that its node
//! measured (see `usage.rs`) counts once.

use mesh_protocol::engine::Usage;
use mesh_protocol::farm::FarmDef;
use mesh_protocol::resources::{CPU, MEM};
use serde::{Deserialize, Serialize};

/// Bytes for people, as `view::bytes` says them (`310.4 MiB`); not
/// imported from there, as the views hold these figures.
fn bytes(n: u64) -> String {
    bytesize::ByteSize::b(n).to_string()
}

/// A stage's measured runs, summed up.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageUse {
    pub stage: String,
    /// Finished runs that were measured.
    pub runs: u64,
    pub runtime_p50_ms: u64,
    pub runtime_p90_ms: u64,
    /// CPU time over run time, in percent of one core (200: two cores busy).
    pub cpu_pct: f64,
    /// Peak resident memory of a run, in bytes: the median, the 99th
    /// percentile and the largest.
    pub peak_p50: u64,
    pub peak_p99: u64,
    pub peak_max: u64,
    /// Bytes read and written, over every measured run.
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// Runs the kernel killed for want of memory.
    pub oom: u64,
    /// What each task of the stage asks: memory in bytes (0: no ask), cores.
    pub mem_asked: u64,
    pub cpu_asked: f64,
    /// Runs per bucket of runtime (upper bounds `RUNTIME_BUCKETS_S`, then
    /// one unbounded) and of peak memory (`PEAK_BUCKETS`), each bucket its
    /// own count, with the sums: Prometheus's histograms per stage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtime_buckets: Vec<u64>,
    #[serde(default)]
    pub runtime_sum_ms: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peak_buckets: Vec<u64>,
    #[serde(default)]
    pub peak_sum: u64,
}

/// Upper bounds of the runtime buckets, in seconds: a tenth of a second to
/// a day.
pub const RUNTIME_BUCKETS_S: [f64; 14] = [
    0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0,
];
/// Upper bounds of the peak memory buckets, in bytes: 16 MiB to 64 GiB.
pub const PEAK_BUCKETS: [u64; 11] = [
    16 << 20,
    64 << 20,
    128 << 20,
    256 << 20,
    512 << 20,
    1 << 30,
    2 << 30,
    4 << 30,
    8 << 30,
    16 << 30,
    64 << 30,
];

/// Each value's bucket among `bounds` (the last, past every bound), counted.
fn buckets(values: &[u64], bounds: &[u64]) -> Vec<u64> {
    let mut n = vec![0; bounds.len() + 1];
    for &v in values {
        n[bounds.partition_point(|&b| b < v)] += 1;
    }
    n
}

/// A run that counts toward its stage's figures.
pub struct Measured {
    pub stage: u32,
    pub runtime_ms: u64,
    pub usage: Usage,
}

/// Memory that is used this little of its ask (or less) is worth asking
/// less of; this much of it (or more) is close to being killed for it.
const FAR_BELOW: f64 = 0.5;
const CLOSE_TO: f64 = 0.9;
/// A stage's cores are worth asking fewer of when its tasks keep fewer than
/// this share of them busy.
const CORES_IDLE: f64 = 0.5;
/// Runs a stage needs before a hint about its asks is given.
const HINT_RUNS: u64 = 3;

/// Each stage's figures, in stage order, from its measured runs; stages
/// with none are left out.
pub fn by_stage(def: &FarmDef, runs: impl Iterator<Item = Measured>) -> Vec<StageUse> {
    let mut per: Vec<Vec<(u64, Usage)>> = vec![Vec::new(); def.stages.len()];
    for m in runs {
        if let Some(v) = per.get_mut(m.stage as usize) {
            v.push((m.runtime_ms, m.usage));
        }
    }
    per.into_iter()
        .zip(&def.stages)
        .filter(|(v, _)| !v.is_empty())
        .map(|(v, stage)| {
            let mut runtimes: Vec<u64> = v.iter().map(|r| r.0).collect();
            let mut peaks: Vec<u64> = v.iter().map(|r| r.1.peak_rss).collect();
            runtimes.sort_unstable();
            peaks.sort_unstable();
            let wall: u64 = runtimes.iter().sum();
            let cpu: u64 = v.iter().map(|r| r.1.cpu_ms).sum();
            StageUse {
                stage: stage.name.clone(),
                runs: v.len() as u64,
                runtime_p50_ms: quantile(&runtimes, 0.5),
                runtime_p90_ms: quantile(&runtimes, 0.9),
                cpu_pct: if wall > 0 {
                    cpu as f64 * 100.0 / wall as f64
                } else {
                    0.0
                },
                peak_p50: quantile(&peaks, 0.5),
                peak_p99: quantile(&peaks, 0.99),
                peak_max: peaks.last().copied().unwrap_or(0),
                read_bytes: v.iter().map(|r| r.1.read_bytes).sum(),
                written_bytes: v.iter().map(|r| r.1.written_bytes).sum(),
                oom: v.iter().filter(|r| r.1.oom).count() as u64,
                mem_asked: stage.resources.get(MEM).whole(),
                cpu_asked: stage.resources.get(CPU).as_f64(),
                runtime_buckets: buckets(
                    &runtimes,
                    &RUNTIME_BUCKETS_S.map(|s| (s * 1000.0) as u64),
                ),
                runtime_sum_ms: wall,
                peak_buckets: buckets(&peaks, &PEAK_BUCKETS),
                peak_sum: peaks.iter().sum(),
            }
        })
        .collect()
}

/// The value at `q` of sorted `v` (nearest rank).
fn quantile(v: &[u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// A duration for people: `1.20 s` under ten seconds, else `4m 10s`.
pub fn secs(ms: u64) -> String {
    if ms < 10_000 {
        format!("{:.2} s", ms as f64 / 1000.0)
    } else {
        humantime::format_duration(std::time::Duration::from_secs(ms / 1000)).to_string()
    }
}

impl StageUse {
    /// Its figures in a line: `runtime p50 1.20 s, p90 3.40 s · CPU 96% ·
    /// peak memory p50 210.0 MiB, max 216.6 MiB of 4.0 GiB asked · read
    /// 1.6 MiB, wrote 50.0 MiB (12 runs)`.
    pub fn words(&self) -> String {
        let asked = if self.mem_asked > 0 {
            format!(" of {} asked", bytes(self.mem_asked))
        } else {
            String::new()
        };
        let s = if self.runs == 1 { "" } else { "s" };
        // A task is first looked at 10 ms in (see usage.rs): a stage of
        // quicker ones has no peak to say, which is not 0 B.
        let peak = if self.peak_max == 0 {
            format!("peak memory not seen (ended before a look){asked}")
        } else {
            format!(
                "peak memory p50 {}, max {}{asked}",
                bytes(self.peak_p50),
                bytes(self.peak_max)
            )
        };
        format!(
            "runtime p50 {}, p90 {} · CPU {:.0}% · {peak} · read {}, wrote {} ({} run{s})",
            secs(self.runtime_p50_ms),
            secs(self.runtime_p90_ms),
            self.cpu_pct,
            bytes(self.read_bytes),
            bytes(self.written_bytes),
            self.runs
        )
    }

    /// What its figures say of its asks, once it has enough runs: memory
    /// far below or close to the ask, cores left idle, kills for memory.
    pub fn hints(&self) -> Vec<String> {
        let mut out = Vec::new();
        let name = &self.stage;
        if self.oom > 0 {
            let s = if self.oom == 1 { "" } else { "s" };
            let asked = if self.mem_asked > 0 {
                format!(", asked {}", bytes(self.mem_asked))
            } else {
                ", no memory asked".to_string()
            };
            out.push(format!(
                "stage {name}: {} task{s} killed out of memory (peak {}{asked}): ask for more memory (mem)",
                self.oom,
                bytes(self.peak_max)
            ));
        }
        if self.runs < HINT_RUNS {
            return out;
        }
        let asked = self.mem_asked as f64;
        let peak = self.peak_max as f64;
        if self.mem_asked > 0 && self.peak_max > 0 {
            let (ask, max, p99) = (
                bytes(self.mem_asked),
                bytes(self.peak_max),
                bytes(self.peak_p99),
            );
            if peak <= asked * FAR_BELOW {
                out.push(format!(
                    "stage {name} asks {ask} of memory and used at most {max} (p99 {p99}): ask less to run more at once"
                ));
            } else if peak >= asked * CLOSE_TO {
                out.push(format!(
                    "stage {name} asks {ask} of memory and used up to {max} (p99 {p99}), within a tenth of its ask: a larger input may not fit"
                ));
            }
        }
        if self.cpu_asked > 1.0 && self.cpu_pct < self.cpu_asked * 100.0 * CORES_IDLE {
            out.push(format!(
                "stage {name} asks {} cores and kept {:.1} busy on average: ask fewer to run more at once",
                self.cpu_asked,
                self.cpu_pct / 100.0
            ));
        }
        out
    }
}

/// What one task's run that counts used, for `mesh logs FARM TASK`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskUsed {
    pub runtime_ms: u64,
    pub usage: Usage,
}

impl TaskUsed {
    /// In a line: `ran 41.20 s · CPU 96% · peak memory 290.1 MiB · read
    /// 1.2 MiB, wrote 80.3 MiB`, and `· killed for want of memory` where so.
    pub fn words(&self) -> String {
        let u = &self.usage;
        let cpu = if self.runtime_ms > 0 {
            format!(
                " · CPU {:.0}%",
                u.cpu_ms as f64 * 100.0 / self.runtime_ms as f64
            )
        } else {
            String::new()
        };
        let oom = if u.oom {
            " · killed for want of memory"
        } else {
            ""
        };
        let peak = if u.peak_rss == 0 {
            "not seen (ended before a look)".to_string()
        } else {
            bytes(u.peak_rss)
        };
        format!(
            "ran {}{cpu} · peak memory {peak} · read {}, wrote {}{oom}",
            secs(self.runtime_ms),
            bytes(u.read_bytes),
            bytes(u.written_bytes)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(resources: &str) -> FarmDef {
        let text = format!(
            "[farm]\nname = \"u\"\n[[stage]]\nname = \"solve\"\nsweep.i = {{ range = \"0..9\" }}\n\
             resources = {{ {resources} }}\nshell = \"true\"\n"
        );
        let opts = crate::farmfile::LoadOptions::default();
        crate::farmfile::load_str(std::path::Path::new("farm.toml"), &text, &opts).unwrap()
    }

    fn run(ms: u64, cpu_ms: u64, peak_mib: u64) -> Measured {
        Measured {
            stage: 0,
            runtime_ms: ms,
            usage: Usage {
                cpu_ms,
                peak_rss: peak_mib << 20,
                read_bytes: 1,
                written_bytes: 2,
                oom: false,
            },
        }
    }

    #[test]
    fn runs_fall_in_the_buckets_prometheus_reads() {
        let runs = [
            run(50, 0, 10),
            run(100, 0, 16),
            run(101, 0, 17),
            run(99_000_000, 0, 100_000),
        ];
        let u = &by_stage(&def("mem = \"1GiB\""), runs.into_iter())[0];
        // 50 and 100 ms are at most 0.1 s; 101 ms in the 0.5 s bucket; the
        // longest past a day.
        assert_eq!(u.runtime_buckets[..2], [2, 1]);
        assert_eq!(u.runtime_buckets.last(), Some(&1));
        assert_eq!(u.runtime_buckets.iter().sum::<u64>(), 4);
        assert_eq!(u.runtime_sum_ms, 99_000_251);
        // 10 and 16 MiB at most 16 MiB, 17 in the 64 MiB bucket, 100,000
        // MiB past 64 GiB.
        assert_eq!(u.peak_buckets[..2], [2, 1]);
        assert_eq!(u.peak_buckets.last(), Some(&1));
        assert_eq!(u.peak_sum, (10 + 16 + 17 + 100_000) << 20);
    }

    #[test]
    fn a_stage_that_uses_far_less_memory_than_it_asks_is_told_to_ask_less() {
        let d = def("cpu = 4, mem = \"4GiB\"");
        let runs = (1..=10).map(|i| run(i * 100, i * 100, 200 + i * 10));
        let u = by_stage(&d, runs);
        assert_eq!(u.len(), 1);
        let u = &u[0];
        assert_eq!((u.runs, u.runtime_p50_ms, u.runtime_p90_ms), (10, 500, 900));
        assert_eq!(u.peak_max, 300 << 20);
        assert!((u.cpu_pct - 100.0).abs() < 1e-9, "{}", u.cpu_pct);
        assert_eq!((u.read_bytes, u.written_bytes), (10, 20));
        let hints = u.hints();
        assert_eq!(
            hints,
            [
                "stage solve asks 4.0 GiB of memory and used at most 300.0 MiB (p99 300.0 MiB): ask less to run more at once",
                "stage solve asks 4 cores and kept 1.0 busy on average: ask fewer to run more at once",
            ]
        );
    }

    #[test]
    fn close_to_the_ask_and_killed_for_memory_are_said_and_a_good_ask_is_not() {
        let d = def("mem = \"1GiB\"");
        let mut runs: Vec<Measured> = (0..4).map(|_| run(1000, 900, 950)).collect();
        runs[0].usage.oom = true;
        let u = &by_stage(&d, runs.into_iter())[0];
        let hints = u.hints();
        assert_eq!(hints.len(), 2, "{hints:?}");
        assert!(
            hints[0].contains("1 task killed out of memory (peak 950.0 MiB, asked 1.0 GiB)"),
            "{hints:?}"
        );
        assert!(hints[1].contains("within a tenth of its ask"), "{hints:?}");
        let fine = &by_stage(&d, (0..4).map(|_| run(1000, 900, 700)))[0];
        assert!(fine.hints().is_empty(), "{:?}", fine.hints());
        // Two runs are too few to judge an ask by.
        let few = &by_stage(&d, (0..2).map(|_| run(1000, 900, 100)))[0];
        assert!(few.hints().is_empty());
    }

    /// Tasks that end before their first look have no peak: said so, not
    /// said to hold nothing, and no hint drawn from it.
    #[test]
    fn a_peak_never_seen_is_not_said_as_0_bytes() {
        let d = def("mem = \"1GiB\"");
        let u = &by_stage(&d, (0..4).map(|_| run(5, 2, 0)))[0];
        let words = u.words();
        assert!(
            words.contains("peak memory not seen (ended before a look) of 1.0 GiB asked"),
            "{words}"
        );
        assert!(!words.contains("0 B"), "{words}");
        assert!(u.hints().is_empty(), "{:?}", u.hints());
        let one = TaskUsed {
            runtime_ms: 5,
            usage: run(5, 2, 0).usage,
        };
        assert!(
            one.words().contains("peak memory not seen"),
            "{}",
            one.words()
        );
        let seen = &by_stage(&d, (0..4).map(|_| run(1000, 900, 950)))[0];
        assert!(
            seen.words().contains("peak memory p50 950.0 MiB"),
            "{}",
            seen.words()
        );
    }
}
