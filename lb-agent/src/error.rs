//! The agent's one error type, and the configuration's (which it carries). Imports no feature
//! module: every module may use it.

use std::path::{Path, PathBuf};

/// A configuration error: which field, and what was expected there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: expected {expected}")]
pub struct ConfigError {
    pub field: String,
    pub expected: String,
}

impl ConfigError {
    pub fn new(field: impl Into<String>, expected: impl Into<String>) -> Self {
        Self { field: field.into(), expected: expected.into() }
    }

    /// This error, in the config file at `path`.
    pub fn in_file(self, path: &Path) -> Error {
        Error::Config { path: path.to_owned(), error: self }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read config file {path}: {source}")]
    ConfigRead { path: PathBuf, source: std::io::Error },

    #[error("config file {path}: {error}")]
    Config { path: PathBuf, error: ConfigError },

    #[error("loading the embedded BPF object: {0}")]
    BpfLoad(#[from] aya::EbpfError),

    #[error("BPF program {program}: {source}")]
    BpfProgram { program: &'static str, source: aya::programs::ProgramError },

    #[error("BPF map {map}: {source}")]
    BpfMap { map: &'static str, source: aya::maps::MapError },

    #[error("BPF map {0} is missing from the embedded object")]
    BpfMapMissing(&'static str),

    #[error("attaching XDP to {interface} in {mode} mode: {source}")]
    XdpAttach { interface: String, mode: &'static str, source: aya::programs::ProgramError },

    #[error("BPF link of {program}: {source}")]
    BpfLink { program: &'static str, source: aya::programs::links::LinkError },

    #[error("too many {what}: the data plane holds at most {limit}")]
    Capacity { what: &'static str, limit: u32 },

    #[error("pinning under {path}: {reason}")]
    Pin { path: PathBuf, reason: String },

    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),

    #[error("netlink: {0}")]
    Netlink(#[from] rtnetlink::Error),

    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
}

impl Error {
    /// Configuration mistakes exit with 64 (EX_USAGE) so supervisors can tell them from
    /// runtime failures, which exit with 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::ConfigRead { .. } | Error::Config { .. } => 64,
            _ => 1,
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }

    /// The error's kind as the `error` label of `lbagent_errors_total`: short, stable, one per
    /// variant (kube-rs controller-rs's `metric_label`).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::ConfigRead { .. } => "config_read",
            Error::Config { .. } => "config",
            Error::BpfLoad(_) => "bpf_load",
            Error::BpfProgram { .. } => "bpf_program",
            Error::BpfMap { .. } => "bpf_map",
            Error::BpfMapMissing(_) => "bpf_map_missing",
            Error::XdpAttach { .. } => "xdp_attach",
            Error::BpfLink { .. } => "bpf_link",
            Error::Capacity { .. } => "capacity",
            Error::Pin { .. } => "pin",
            Error::Kube(_) => "kube",
            Error::Netlink(_) => "netlink",
            Error::Io { .. } => "io",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The error and each cause its message does not already include: aya's errors, for one,
/// leave the system call's errno (often the whole story: EPERM, ENOMEM) to their sources.
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let text = e.to_string();
        if !message.contains(&text) {
            message = format!("{message}: {text}");
        }
        cause = e.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_labels_are_distinct_snake_case_words() {
        let io = || std::io::Error::other("x");
        let errors = [
            Error::ConfigRead { path: "a".into(), source: io() },
            Error::Config { path: "a".into(), error: ConfigError::new("f", "e") },
            Error::BpfMapMissing("M"),
            Error::Capacity { what: "services", limit: 1 },
            Error::Pin { path: "a".into(), reason: "r".into() },
            Error::io("c", io()),
        ];
        let labels: std::collections::BTreeSet<_> = errors.iter().map(Error::metric_label).collect();
        assert_eq!(labels.len(), errors.len());
        assert!(labels.iter().all(|l| l.chars().all(|c| c.is_ascii_lowercase() || c == '_')), "{labels:?}");
    }
}
