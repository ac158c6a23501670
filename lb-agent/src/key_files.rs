//! The groups' VRRP key files (see [`crate::vrrp::auth`]), read at start and again every
//! second: an edited file, or a Secret the kubelet updated in place, takes effect without a
//! restart. A file that stops parsing keeps the keys it had; one never read gives none, and
//! its group's instances do not run on this node (running unauthenticated, or unable to verify
//! anyone, would split the group).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use tracing::{error, info};

use crate::vrrp::auth::Keyring;

#[derive(Default)]
pub struct KeyFiles {
    files: BTreeMap<PathBuf, KeyFile>,
}

#[derive(Default)]
struct KeyFile {
    /// The bytes last read, so an unchanged file costs a read and a compare.
    text: Option<Vec<u8>>,
    keys: Option<Arc<Keyring>>,
    /// Why the last read was not used, while it is not.
    error: Option<String>,
}

/// Reads and parses one key file; the error says what was wrong with which line.
pub fn read(path: &Path) -> Result<Keyring, String> {
    parse(path, &std::fs::read(path).map_err(|e| read_error(path, e))?)
}

fn read_error(path: &Path, e: std::io::Error) -> String {
    format!("cannot read {}: {e}", path.display())
}

/// A key file's content as keys; the error names the file and, where one is at fault, the line.
fn parse(path: &Path, text: &[u8]) -> Result<Keyring, String> {
    let text = std::str::from_utf8(text).map_err(|_| format!("{}: not UTF-8 text", path.display()))?;
    Keyring::parse(text).map_err(|e| format!("{}: {e}", path.display()))
}

impl KeyFiles {
    /// Reads each of `paths` (forgetting the files no longer named); true when the keys of any
    /// changed. Problems are logged when they appear, not on every read.
    pub fn refresh<'a>(&mut self, paths: impl IntoIterator<Item = &'a PathBuf>) -> bool {
        let wanted: BTreeMap<&PathBuf, ()> = paths.into_iter().map(|p| (p, ())).collect();
        let before = self.files.len();
        self.files.retain(|path, _| wanted.contains_key(path));
        let mut changed = self.files.len() != before;
        for path in wanted.into_keys() {
            let file = self.files.entry(path.clone()).or_default();
            changed |= file.reload(path);
        }
        changed
    }

    /// The keys of `path`, if it was ever read whole.
    pub fn keys(&self, path: &Path) -> Option<Arc<Keyring>> {
        self.files.get(path)?.keys.clone()
    }

    /// Why `path` is not in use now, if it is not.
    pub fn error(&self, path: &Path) -> Option<&str> {
        self.files.get(path)?.error.as_deref()
    }
}

impl KeyFile {
    fn reload(&mut self, path: &Path) -> bool {
        let text = match std::fs::read(path) {
            Ok(text) => text,
            Err(e) => {
                self.failed(read_error(path, e));
                self.text = None;
                return false;
            }
        };
        if self.text.as_ref() == Some(&text) {
            return false;
        }
        let parsed = parse(path, &text);
        self.text = Some(text);
        match parsed {
            Ok(keys) if self.keys.as_deref() == Some(&keys) => {
                self.error = None;
                false
            }
            Ok(keys) => {
                info!(key_file = %path.display(), key_ids = ?keys.key_ids(), "VRRP keys loaded (the first signs)");
                self.keys = Some(Arc::new(keys));
                self.error = None;
                true
            }
            Err(e) => {
                self.failed(e);
                false
            }
        }
    }

    fn failed(&mut self, message: String) {
        if self.error.as_ref() != Some(&message) {
            let kept = if self.keys.is_some() {
                "keeping the keys read before"
            } else {
                "the group's VRRP instances do not run on this node until it can be read"
            };
            error!(error = %message, "VRRP key file unusable; {kept}");
            self.error = Some(message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "0123456789abcdef0123456789abcdef";
    const NEW: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn a_file_is_followed_and_a_broken_edit_keeps_the_old_keys() {
        let dir = std::env::temp_dir().join(format!("lb-agent-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("edge");
        let mut files = KeyFiles::default();

        assert!(!files.refresh([&path]), "missing: nothing to use");
        assert!(files.keys(&path).is_none());
        assert!(files.error(&path).unwrap().contains("cannot read"));

        std::fs::write(&path, format!("{OLD}\n")).unwrap();
        assert!(files.refresh([&path]));
        let first = files.keys(&path).unwrap();
        assert!(!files.refresh([&path]), "unchanged");

        std::fs::write(&path, "short\n").unwrap();
        assert!(!files.refresh([&path]));
        assert_eq!(files.keys(&path), Some(first.clone()), "kept");
        assert!(files.error(&path).unwrap().contains("line 1"), "{:?}", files.error(&path));

        std::fs::write(&path, format!("{NEW}\n{OLD}\n")).unwrap();
        assert!(files.refresh([&path]), "rotated");
        assert_ne!(files.keys(&path), Some(first));
        assert_eq!(files.error(&path), None);

        assert!(files.refresh(std::iter::empty()), "forgotten when no group names it");
        assert!(files.keys(&path).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
