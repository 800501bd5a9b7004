//! The worker's side: `layerdiff __worker --runtime SPEC [--as-saved] [--ort-library PATH]`
//! builds the runtime and answers requests until its input ends.

use std::ffi::OsString;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use layerdiff_core::Tensor;
use layerdiff_onnx::Model;
use serde_json::{Value, json};

use super::wire;
use crate::{Error, Runtime, RuntimeSpec};

/// Runs a worker with these arguments (those after [`super::WORKER_VERB`]) on this process's
/// standard input and output; returns its exit code (0 once its input ends, 2 for arguments it
/// cannot take, 3 when the pipe breaks).
pub fn serve(args: &[OsString]) -> u8 {
    let (mut spec, mut as_saved, mut library) = (None, false, None);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--runtime") => spec = args.next().and_then(|s| s.to_str()).map(String::from),
            Some("--as-saved") => as_saved = true,
            Some("--ort-library") => library = args.next().map(PathBuf::from),
            _ => {
                eprintln!("error: a worker takes --runtime SPEC [--as-saved] [--ort-library PATH]");
                return 2;
            }
        }
    }
    let spec = match spec.as_deref().map(RuntimeSpec::parse) {
        Some(Ok(spec)) => spec,
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return 2;
        }
        None => {
            eprintln!("error: a worker needs --runtime SPEC");
            return 2;
        }
    };
    let answers = match quiet_stdout() {
        Ok(answers) => answers,
        Err(e) => {
            eprintln!("error: the worker cannot set up its output: {e}");
            return 3;
        }
    };
    crate::use_ort_library(library.as_deref());
    let runtime = spec.configured().build_here(as_saved);
    let mut from = BufReader::new(std::io::stdin().lock());
    let mut to = BufWriter::new(answers);
    loop {
        let request = match wire::header(&mut from) {
            Ok(Some(request)) => request,
            Ok(None) => return 0,
            Err(_) => return 3,
        };
        match answer(&request, &mut from, runtime.as_deref()) {
            Ok((header, values)) => {
                let sent = wire::send(&mut to, &header, &[])
                    .and_then(|()| wire::send_tensors(&mut to, values));
                if sent.is_err() {
                    return 3;
                }
            }
            Err(Answer::Broken) => return 3,
            Err(Answer::Failed(e)) => {
                if wire::send(&mut to, &wire::error(&e), &[]).is_err() {
                    return 3;
                }
            }
        }
    }
}

enum Answer {
    /// The request could not be read: the pipe is broken.
    Broken,
    /// The runtime failed, or could not be built.
    Failed(Error),
}

impl From<Error> for Answer {
    fn from(e: Error) -> Self {
        Answer::Failed(e)
    }
}

/// A request's answer: its header and the tensors it announces, in order. Every blob of the
/// request is read before anything can fail, so the next request starts where it should.
fn answer(
    request: &Value,
    from: &mut impl Read,
    runtime: std::result::Result<&(dyn Runtime + Send + Sync), &Error>,
) -> std::result::Result<(Value, Vec<Tensor>), Answer> {
    let model_bytes = wire::blob(from).map_err(|_| Answer::Broken)?;
    let inputs = match request.get("inputs") {
        Some(headers) => wire::read_tensors(headers, from).map_err(|_| Answer::Broken)?,
        None => Vec::new(),
    };
    let runtime = runtime.map_err(|e| Error::Worker(e.to_string()))?;
    if request["do"] == "describe" {
        return Ok((json!({"facts": runtime.facts()}), Vec::new()));
    }
    let base_dir = request["base_dir"].as_str().map(PathBuf::from);
    let model = Model::from_bytes(&model_bytes, Path::new("the worker's model"), base_dir)
        .map_err(Error::from)?;
    let names =
        |key: &str| -> Option<Vec<String>> { serde_json::from_value(request[key].clone()).ok() };
    match request["do"].as_str() {
        Some("run") => {
            let outputs = names("outputs").unwrap_or_default();
            let runs = match names("twice") {
                Some(keep) => runtime
                    .run_twice(&model, &inputs, &outputs, &keep)?
                    .to_vec(),
                None => vec![runtime.run(&model, &inputs, &outputs)?],
            };
            let headers: Vec<Value> = runs.iter().map(|run| wire::tensors(run)).collect();
            let values = runs.into_iter().flatten().map(|(_, t)| t).collect();
            Ok((json!({"runs": headers}), values))
        }
        Some("optimize") => {
            let into = PathBuf::from(request["into"].as_str().unwrap_or_default());
            let Some(optimized) = runtime.optimize(&model)? else {
                return Ok((json!({"optimized": false}), Vec::new()));
            };
            copy_folder(optimized.folder.path(), &into).map_err(|e| {
                Error::SaveOptimized(format!("handing the optimized graph over: {e}"))
            })?;
            Ok((json!({"optimized": true}), Vec::new()))
        }
        Some("placement") => match runtime.placement(&model, &inputs) {
            Some((_, Ok(nodes))) => Ok((json!({"nodes": nodes}), Vec::new())),
            Some((_, Err(e))) => Err(e.into()),
            None => Ok((json!({"nodes": []}), Vec::new())),
        },
        other => {
            Err(Error::Worker(format!("a request the worker does not know: {other:?}")).into())
        }
    }
}

/// Copies every file of `from` into `into` (the optimized graph and its external data).
fn copy_folder(from: &Path, into: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        std::fs::copy(entry.path(), into.join(entry.file_name()))?;
    }
    Ok(())
}

/// The answers' own channel: a copy of standard output, which is then pointed at standard
/// error, so that what a runtime or a library prints cannot break the answers. The worker also
/// ignores Ctrl-C and SIGTERM sent to the whole terminal's process group: the command that
/// started it decides when to stop, and ends it.
fn quiet_stdout() -> std::io::Result<std::fs::File> {
    #[cfg(unix)]
    {
        use std::os::fd::FromRawFd;
        std::io::stdout().flush()?;
        // SAFETY: plain descriptor calls on this process's own standard streams.
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
            let copy = libc::dup(1);
            if copy < 0 || libc::dup2(2, 1) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(std::fs::File::from_raw_fd(copy))
        }
    }
    #[cfg(not(unix))]
    {
        Err(std::io::Error::other("isolated sides need a Unix system"))
    }
}
