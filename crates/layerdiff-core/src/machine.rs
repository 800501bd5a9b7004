//! The machine a report was made on: what, besides the two sides' versions, changes its
//! numbers. The comparison itself gives the same bits on every instruction set; the sides do
//! not (PyTorch and ONNX Runtime pick kernels per CPU), so a report is byte-stable only on the
//! same CPU kind with the same library versions.

use std::path::Path;

use serde::Serialize;

/// The machine facts a report records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Machine {
    /// CPU model, as the OS names it (`AMD EPYC 7B13`), or the architecture when it does not.
    pub cpu: String,
    /// The widest vector instruction set the kernels of both sides may use: `avx512`, `avx2`,
    /// `sse`, `neon` or the architecture.
    pub instruction_set: String,
    /// Logical cores (the sides' default thread counts follow them).
    pub logical_cores: usize,
    /// OS and architecture (`linux x86_64`).
    pub os: String,
    /// NVIDIA GPUs and their driver (`NVIDIA H100 80GB HBM3, driver 580.159.04`), as the
    /// driver lists them; absent where there are none. A GPU provider's numbers depend on both.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// layerdiff's version.
    pub layerdiff: String,
}

impl Machine {
    /// This machine.
    pub fn this() -> Self {
        Self {
            cpu: cpu_model().unwrap_or_else(|| std::env::consts::ARCH.to_string()),
            instruction_set: instruction_set(),
            logical_cores: std::thread::available_parallelism().map_or(1, usize::from),
            os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
            gpus: nvidia_gpus(Path::new("/proc/driver/nvidia")),
            layerdiff: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// One line for the Markdown report.
    pub fn describe(&self) -> String {
        let gpus = if self.gpus.is_empty() {
            String::new()
        } else {
            format!(", {}", self.gpus.join(", "))
        };
        format!(
            "{} ({}, {} logical cores){gpus}, {}, layerdiff {}",
            self.cpu, self.instruction_set, self.logical_cores, self.os, self.layerdiff
        )
    }
}

/// Each GPU's model with the driver's version, read from the NVIDIA driver's files under
/// `root` (`/proc/driver/nvidia`: `gpus/*/information`, `version`).
fn nvidia_gpus(root: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(root.join("gpus")) else {
        return Vec::new();
    };
    let driver = std::fs::read_to_string(root.join("version"))
        .ok()
        .and_then(|v| {
            let line = v.lines().next()?.to_string();
            line.split_whitespace()
                .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
                .map(str::to_string)
        });
    let mut folders: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    folders.sort();
    folders
        .iter()
        .filter_map(|f| {
            let info = std::fs::read_to_string(f.join("information")).ok()?;
            let model = info
                .lines()
                .find_map(|l| l.strip_prefix("Model:"))?
                .trim()
                .to_string();
            Some(match &driver {
                Some(d) => format!("{model}, driver {d}"),
                None => model,
            })
        })
        .collect()
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map(|(_, name)| name.trim().to_string())
        .filter(|n| !n.is_empty())
}

fn instruction_set() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") {
            return "avx512".to_string();
        }
        if has!("avx2") {
            return "avx2".to_string();
        }
        return "sse".to_string();
    }
    #[cfg(target_arch = "aarch64")]
    {
        return "neon".to_string();
    }
    #[allow(unreachable_code)]
    std::env::consts::ARCH.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_is_described_and_matches_itself() {
        let m = Machine::this();
        assert!(!m.cpu.is_empty() && m.logical_cores >= 1);
        assert!(
            ["avx512", "avx2", "sse", "neon"].contains(&m.instruction_set.as_str())
                || m.instruction_set == std::env::consts::ARCH
        );
        assert!(m.describe().contains(&format!("({}, ", m.instruction_set)));
    }

    #[test]
    fn gpus_are_read_from_the_nvidia_driver_files() {
        let root = tempfile::tempdir().unwrap();
        let gpu = root.path().join("gpus/0000:00:05.0");
        std::fs::create_dir_all(&gpu).unwrap();
        std::fs::write(
            gpu.join("information"),
            "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 41\n",
        )
        .unwrap();
        std::fs::write(
            root.path().join("version"),
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n",
        )
        .unwrap();
        assert_eq!(
            nvidia_gpus(root.path()),
            ["NVIDIA H100 80GB HBM3, driver 580.159.04"]
        );
        assert!(nvidia_gpus(&root.path().join("none")).is_empty());
    }
}
