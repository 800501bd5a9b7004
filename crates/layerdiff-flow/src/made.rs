//! What a command makes in the folders it fills (`--out`, `--repro`, a table's folder), so that
//! a run a signal stopped leaves there only its report marked incomplete, or nothing: the door
//! [`watch`]es the folders before any work, the reports record themselves as they are written
//! ([`wrote`]), and an interrupted run's end [`sweep`]s what else it made (an export copied into
//! `--out`, a point's folder, an empty `--out`). What was there before the run stays, whatever
//! it is: only what the run made goes. A run whose report was written whole keeps everything:
//! the signal came as it ended.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The most entries a watched folder is listed to: a folder with more is not swept (what was
/// there before cannot be told from what the run made).
const LISTED: usize = 100_000;

/// A folder the command fills, as it was before the run.
struct Folder {
    path: PathBuf,
    /// Every path under it before the run (itself included when it existed); `None`: too many
    /// to list, so nothing in it is swept.
    before: Option<HashSet<PathBuf>>,
}

/// What the command watches and what it wrote.
#[derive(Default)]
struct Watched {
    folders: Vec<Folder>,
    /// Reports (and their inputs) written, and whether each is whole.
    wrote: Vec<(PathBuf, bool)>,
}

static WATCHED: Mutex<Option<Watched>> = Mutex::new(None);

fn watched() -> std::sync::MutexGuard<'static, Option<Watched>> {
    WATCHED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The command's door, before any work: the folders it fills, as they are now.
pub fn watch(folders: &[PathBuf]) {
    let folders = folders
        .iter()
        .map(|path| Folder {
            path: path.clone(),
            before: listing(path),
        })
        .collect();
    *watched() = Some(Watched {
        folders,
        wrote: Vec::new(),
    });
}

/// Reports written: `whole`, or marked incomplete. A report's inputs file counts as its report.
pub fn wrote(paths: &[PathBuf], whole: bool) {
    if let Some(w) = watched().as_mut() {
        w.wrote.extend(paths.iter().map(|p| (p.clone(), whole)));
    }
}

/// What an interrupted run's end did to the folders it fills.
#[derive(Debug, Default, PartialEq)]
pub struct Swept {
    /// The reports written (kept), and whether all of them are whole.
    pub reports: Vec<PathBuf>,
    /// Those of them written marked incomplete (a sweep's index; the others, its runs' reports
    /// that ended before the signal, are whole).
    pub incomplete: Vec<PathBuf>,
    /// Every report written is whole: nothing was swept.
    pub whole: bool,
    /// What was removed, per folder: the folder itself (made by the run, and left empty) or
    /// the entries made in it, by their path under it.
    pub removed: Vec<(PathBuf, Removed)>,
}

/// What went from one folder.
#[derive(Debug, PartialEq)]
pub enum Removed {
    /// The folder itself: the run made it, and nothing of it is kept.
    Folder,
    /// These entries under it (top-level names), which the run made.
    Entries(Vec<String>),
}

/// An interrupted run's end: removes what the run made in the folders it fills, but its reports
/// marked incomplete (or everything, when a report was written whole); says what it did.
pub fn sweep() -> Swept {
    let Some(w) = watched().take() else {
        return Swept::default();
    };
    let reports: Vec<PathBuf> = w.wrote.iter().map(|(p, _)| p.clone()).collect();
    let whole = !w.wrote.is_empty() && w.wrote.iter().all(|(_, whole)| *whole);
    let incomplete = (w.wrote.iter().filter(|(_, whole)| !whole))
        .map(|(p, _)| p.clone())
        .collect();
    let mut swept = Swept {
        reports,
        incomplete,
        whole,
        removed: Vec::new(),
    };
    if whole {
        return swept;
    }
    let kept: HashSet<PathBuf> = swept.reports.iter().map(|p| absolute(p)).collect();
    for folder in &w.folders {
        if let Some(before) = &folder.before
            && let Some(removed) = sweep_folder(&folder.path, before, &kept)
        {
            swept.removed.push((folder.path.clone(), removed));
        }
    }
    swept
}

/// Removes under `root` what is not in `before` and not `kept` (files, then folders left
/// empty, deepest first); says what went.
fn sweep_folder(
    root: &Path,
    before: &HashSet<PathBuf>,
    kept: &HashSet<PathBuf>,
) -> Option<Removed> {
    let now = listing(root)?;
    let mut made: Vec<&PathBuf> = now.iter().filter(|p| !before.contains(*p)).collect();
    // deepest first: a folder's entries go before it
    made.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    let mut gone = Vec::new();
    for path in made {
        if kept.contains(&absolute(path)) {
            continue;
        }
        let is_dir = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
        let removed = if is_dir {
            std::fs::remove_dir(path).is_ok() // only when left empty
        } else {
            std::fs::remove_file(path).is_ok()
        };
        if removed {
            gone.push(path.clone());
        }
    }
    if gone.iter().any(|p| p == root) {
        return Some(Removed::Folder);
    }
    let mut names: Vec<String> = gone
        .iter()
        .filter_map(|p| p.strip_prefix(root).ok()?.components().next())
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.dedup();
    (!names.is_empty()).then_some(Removed::Entries(names))
}

/// Every path under `root`, itself included (empty when it does not exist); `None` past
/// [`LISTED`] entries. Links are listed, not followed.
fn listing(root: &Path) -> Option<HashSet<PathBuf>> {
    let mut found = HashSet::new();
    if std::fs::symlink_metadata(root).is_err() {
        return Some(found);
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        if found.len() >= LISTED {
            return None;
        }
        let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        if is_dir && let Ok(entries) = std::fs::read_dir(&path) {
            stack.extend(entries.flatten().map(|e| e.path()));
        }
        found.insert(path);
    }
    Some(found)
}

/// `path` made absolute against the working folder, to match however it was spelled.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

impl Swept {
    /// What the end did, in words: `wrote …, marked INCOMPLETE`, `no report written`, and what
    /// was removed.
    pub fn words(&self) -> String {
        let shown = |paths: &[PathBuf]| {
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut text = if self.reports.is_empty() {
            "no report written".to_string()
        } else if self.whole {
            format!(
                "the run had ended, its reports whole ({})",
                shown(&self.reports)
            )
        } else {
            let kept = self.reports.len() - self.incomplete.len();
            let before = if kept > 0 {
                format!("; kept {kept} report file(s) written whole before it")
            } else {
                String::new()
            };
            format!(
                "wrote the layers compared before it, marked INCOMPLETE: {}{before}",
                shown(&self.incomplete)
            )
        };
        for (folder, removed) in &self.removed {
            text.push_str(&match removed {
                Removed::Folder => {
                    format!("; removed {}, which the run had made", folder.display())
                }
                Removed::Entries(names) => format!(
                    "; removed what the run had made in {}: {}",
                    folder.display(),
                    names.join(", ")
                ),
            });
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_the_run_made_goes_and_its_incomplete_report_stays() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("notes.txt"), "mine").unwrap();
        let before = listing(&out).unwrap();
        // the run: an export, a point's folder, its report
        std::fs::write(out.join("model.onnx"), "onnx").unwrap();
        std::fs::create_dir_all(out.join("step-0")).unwrap();
        std::fs::write(out.join("step-0/report.json"), "{}").unwrap();
        std::fs::write(out.join("report.json"), "{}").unwrap();
        let kept = HashSet::from([absolute(&out.join("report.json"))]);
        let removed = sweep_folder(&out, &before, &kept).unwrap();
        assert_eq!(
            removed,
            Removed::Entries(vec!["model.onnx".into(), "step-0".into()])
        );
        let mut left: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["notes.txt", "report.json"]);
    }

    #[test]
    fn a_folder_the_run_made_goes_whole_when_nothing_in_it_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("new");
        let before = listing(&out).unwrap();
        assert!(before.is_empty());
        std::fs::create_dir_all(out.join("step-1")).unwrap();
        std::fs::write(out.join("model.onnx"), "onnx").unwrap();
        assert_eq!(
            sweep_folder(&out, &before, &HashSet::new()),
            Some(Removed::Folder)
        );
        assert!(!out.exists());
        let swept = Swept {
            reports: vec![],
            incomplete: vec![],
            whole: false,
            removed: vec![(out.clone(), Removed::Folder)],
        };
        assert_eq!(
            swept.words(),
            format!(
                "no report written; removed {}, which the run had made",
                out.display()
            )
        );
    }
}
