//! What a report may be written over. Never a file the run reads (`--json model.onnx` replaced
//! the model), and never an existing file layerdiff did not write (`--html notes.txt` replaced
//! the notes): layerdiff replaces only its own earlier outputs, which it knows by what they
//! begin with. Both are refused before any work starts, and the file stays as it was.

use std::io::Read;
use std::path::{Path, PathBuf};

/// How much of an existing file is read to tell whether layerdiff wrote it.
const LOOKED_AT: u64 = 64 * 1024;

/// `Ok` where writing the file `path` loses nothing: it does not exist yet, or it is an output
/// layerdiff wrote and not one of the files the run `reads`; else why not.
pub(crate) fn kept(path: &Path, reads: &[PathBuf]) -> Result<(), String> {
    if !path.exists() {
        return Ok(());
    }
    if let Some(read) = reads.iter().find(|read| same_file(path, read)) {
        return Err(format!(
            "it is `{}`, which this run reads: the report would replace it; write the report \
             elsewhere",
            read.display()
        ));
    }
    if !written_by_layerdiff(path) {
        return Err(
            "a file there was not written by layerdiff, and layerdiff replaces only its own \
             reports: move it, or write the report elsewhere"
                .to_string(),
        );
    }
    Ok(())
}

/// Whether `a` and `b` are one file (the same path however spelled, or a link to it).
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) if a == b => true,
        #[cfg(unix)]
        _ => {
            use std::os::unix::fs::MetadataExt;
            match (std::fs::metadata(a), std::fs::metadata(b)) {
                (Ok(a), Ok(b)) => a.is_file() && a.dev() == b.dev() && a.ino() == b.ino(),
                _ => false,
            }
        }
        #[cfg(not(unix))]
        _ => false,
    }
}

/// Whether the file at `path` is one of layerdiff's outputs: a report in any of its formats
/// names layerdiff near its start (the JSON's schema, the Markdown's and HTML's title, the
/// inputs' metadata), the chart says what it charts, and the Model Explorer node data is the
/// object of per-node results it writes. An empty file holds nothing to lose.
fn written_by_layerdiff(path: &Path) -> bool {
    let mut start = Vec::new();
    let read = std::fs::File::open(path).and_then(|f| f.take(LOOKED_AT).read_to_end(&mut start));
    if read.is_err() {
        return false; // unreadable: the write fails with its own reason, or is refused here
    }
    if start.iter().all(u8::is_ascii_whitespace) {
        return true;
    }
    let text = String::from_utf8_lossy(&start);
    text.contains("layerdiff")
        || text.contains("each layer's error as a multiple of its tolerance")
        || text.starts_with("{\n  \"results\": {")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_the_run_reads_is_never_replaced_however_it_is_spelled() {
        let folder = tempfile::tempdir().unwrap();
        let model = folder.path().join("victim.onnx");
        std::fs::write(&model, b"layerdiff in its bytes does not make it a report").unwrap();
        let spelled = folder.path().join(".").join("victim.onnx");
        let why = kept(&spelled, std::slice::from_ref(&model)).unwrap_err();
        assert!(
            why.starts_with("it is `") && why.contains("which this run reads"),
            "{why}"
        );
        assert!(kept(&folder.path().join("new.json"), &[model]).is_ok());
    }

    #[test]
    fn only_layerdiffs_own_outputs_are_replaced() {
        let folder = tempfile::tempdir().unwrap();
        let notes = folder.path().join("notes.txt");
        std::fs::write(&notes, b"my notes\n").unwrap();
        let why = kept(&notes, &[]).unwrap_err();
        assert!(why.contains("not written by layerdiff"), "{why}");
        let report = folder.path().join("r.json");
        std::fs::write(&report, b"{\n  \"schema\": \"layerdiff.report/4\"\n}").unwrap();
        assert!(kept(&report, &[]).is_ok());
        let empty = folder.path().join("empty.md");
        std::fs::write(&empty, b"").unwrap();
        assert!(kept(&empty, &[]).is_ok());
    }
}
