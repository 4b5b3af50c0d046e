//! The GPUs a machine offers, found without being told: the devices a batch system gave this job, else those the NVIDIA driver lists.
//!
//! A task granted GPUs sees them as its `CUDA_VISIBLE_DEVICES`: the ids of
//! its devices as this module found them (`3,5` when SLURM gave the job
//! devices 3 and 5), not the places in mesh's own pool (0 and 1). Where
//! they come from, first found first:
//!
//! 1. `CUDA_VISIBLE_DEVICES` in the node's own environment: a batch
//!    system (SLURM with `--gres=gpu:2`, PBS) sets it to the job's devices;
//!    set but empty (or `NoDevFiles`), the job has none.
//! 2. `nvidia-smi -L`: every device of the machine, with its name.
//! 3. The driver's `/proc/driver/nvidia/gpus/*/information`, where
//!    `nvidia-smi` is not installed.
//!
//! `--resources gpu=N` still decides how many: the first N devices found,
//! or devices `0..N` where fewer were found (as before detection).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One GPU: how tasks name it (`CUDA_VISIBLE_DEVICES`) and what it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub id: String,
    /// The model, when the driver says (`NVIDIA H200`); empty otherwise.
    pub name: String,
}

/// How long `nvidia-smi` may take: on a machine whose driver is wedged
/// it can hang, and a node must still start.
const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(10);

/// The GPUs of this machine, or of this job, as found here.
pub fn detect() -> Vec<Gpu> {
    let listed = nvidia_smi().unwrap_or_else(|| proc_gpus(Path::new("/proc/driver/nvidia/gpus")));
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) => visible(&v, &listed),
        Err(_) => listed,
    }
}

/// The devices `CUDA_VISIBLE_DEVICES` names (`3,5`, or UUIDs), with their
/// names where the machine's list has them.
fn visible(value: &str, listed: &[Gpu]) -> Vec<Gpu> {
    let value = value.trim();
    if value.is_empty() || value == "NoDevFiles" || value == "-1" {
        return Vec::new();
    }
    value
        .split(',')
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map(|id| Gpu {
            id: id.to_string(),
            name: listed
                .iter()
                .find(|g| g.id == id)
                .map(|g| g.name.clone())
                .unwrap_or_default(),
        })
        .collect()
}

/// `nvidia-smi -L`, where it is installed and answers in time.
fn nvidia_smi() -> Option<Vec<Gpu>> {
    let mut child = Command::new("nvidia-smi")
        .arg("-L")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + NVIDIA_SMI_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(_)) | Err(_) => return None,
            Ok(None) if std::time::Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take()?, &mut out).ok()?;
    Some(parse_nvidia_smi(&out))
}

/// `GPU 0: NVIDIA H200 (UUID: GPU-…)` lines: the index and the model.
fn parse_nvidia_smi(text: &str) -> Vec<Gpu> {
    text.lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("GPU ")?;
            let (index, rest) = rest.split_once(':')?;
            let index: u32 = index.trim().parse().ok()?;
            let name = rest.split(" (UUID").next().unwrap_or(rest).trim();
            Some(Gpu {
                id: index.to_string(),
                name: name.to_string(),
            })
        })
        .collect()
}

/// The driver's own list: a folder per device, its `information` file
/// naming the model; numbered in the order of their bus ids, as CUDA's
/// `PCI_BUS_ID` order does.
fn proc_gpus(dir: &Path) -> Vec<Gpu> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut buses: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    buses.sort();
    buses
        .iter()
        .enumerate()
        .map(|(i, bus)| Gpu {
            id: i.to_string(),
            name: std::fs::read_to_string(bus.join("information"))
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("Model:").map(|m| m.trim().to_string()))
                })
                .unwrap_or_default(),
        })
        .collect()
}

/// The devices a node offers when it is told how many (`--resources
/// gpu=N`): the first `n` found, or `0..n` where fewer were found.
pub fn take(found: &[Gpu], n: usize) -> Vec<Gpu> {
    if found.len() >= n {
        return found[..n].to_vec();
    }
    (0..n)
        .map(|i| Gpu {
            id: i.to_string(),
            name: String::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_lines_give_index_and_model() {
        let text = "GPU 0: NVIDIA H200 (UUID: GPU-7f0c1a2b-0000)\nGPU 1: Tesla V100-SXM2-16GB (UUID: GPU-1234)\nNo devices were found\n";
        let got = parse_nvidia_smi(text);
        assert_eq!(
            got,
            vec![
                Gpu {
                    id: "0".into(),
                    name: "NVIDIA H200".into()
                },
                Gpu {
                    id: "1".into(),
                    name: "Tesla V100-SXM2-16GB".into()
                },
            ]
        );
    }

    #[test]
    fn the_job_s_visible_devices_win_with_the_machine_s_names() {
        let listed =
            parse_nvidia_smi("GPU 0: A (UUID: x)\nGPU 3: B (UUID: y)\nGPU 5: C (UUID: z)\n");
        let got = visible("3,5", &listed);
        assert_eq!(
            got.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
            ["3", "5"]
        );
        assert_eq!(got[1].name, "C");
        assert!(visible("", &listed).is_empty());
        assert!(visible("NoDevFiles", &listed).is_empty());
        assert_eq!(visible("GPU-abc", &[])[0].id, "GPU-abc");
    }

    #[test]
    fn the_driver_s_folders_count_the_devices_in_bus_order() {
        let dir = tempfile::tempdir().unwrap();
        for (bus, model) in [
            ("0000:3b:00.0", "NVIDIA A100"),
            ("0000:1a:00.0", "NVIDIA A30"),
        ] {
            let d = dir.path().join(bus);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("information"),
                format!("Model: \t {model}\nIRQ: 1\n"),
            )
            .unwrap();
        }
        let got = proc_gpus(dir.path());
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].id.as_str(), got[0].name.as_str()),
            ("0", "NVIDIA A30")
        );
        assert_eq!(got[1].name, "NVIDIA A100");
        assert!(proc_gpus(&dir.path().join("none")).is_empty());
    }

    #[test]
    fn a_count_given_takes_the_first_found_or_numbers_them() {
        let found = visible("3,5", &[]);
        assert_eq!(take(&found, 1)[0].id, "3");
        let ids: Vec<String> = take(&found, 3).into_iter().map(|g| g.id).collect();
        assert_eq!(ids, ["0", "1", "2"]);
        assert!(take(&found, 0).is_empty());
    }
}
