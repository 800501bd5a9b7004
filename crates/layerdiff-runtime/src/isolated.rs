//! Sides whose runtime layerdiff does not trust run in a worker process: a segfault or abort in
//! native code (a vendor's custom-op library, a provider) then ends the worker, not the run. The
//! run that crashed is replayed on shorter and shorter beginnings of its graph, each in a fresh
//! worker, to name the node it dies on; the comparison goes on without that node (see the `onnx`
//! verb), and the report says why those layers were not compared.
//!
//! The worker is this program again (`layerdiff __worker --runtime SPEC`, or the Python
//! package's `python -m layerdiff __worker …`, see [`set_worker_command`]): it builds the runtime
//! from its spelling and answers requests on its standard input and output, one at a time.
//! A side on another release's library (`ort:lib=PATH`, `openvino:lib=PATH`) always runs in a
//! worker: this program's, or the one its runtime says (an ONNX Runtime release older than the
//! binding's C API runs in the release's own Python, see `ort_runtime/release.rs`).

use std::ffi::OsString;
use std::io::{BufReader, BufWriter, Read};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

use layerdiff_core::Tensor;
use layerdiff_onnx::{Model, NodeExt, extract_nodes};
use serde_json::{Value, json};

use crate::{Error, Optimized, Provider, ReducedMath, Result, Runtime, RuntimeSpec};

mod isolation;
mod serve;
mod wire;
mod worker;

use worker::{Failure, Worker};

pub use isolation::Isolation;
pub use serve::serve;

/// The first argument that makes `layerdiff` a worker.
pub const WORKER_VERB: &str = "__worker";

static WORKER_COMMAND: OnceLock<Vec<OsString>> = OnceLock::new();

/// The command that starts a worker (its arguments follow). Where this program is not itself
/// `layerdiff` (the Python package's extension inside `python`), its entry sets this once;
/// elsewhere it is this executable with [`WORKER_VERB`].
pub fn set_worker_command(command: Vec<OsString>) {
    let _ = WORKER_COMMAND.set(command);
}

fn worker_command() -> Result<Vec<OsString>> {
    if let Some(command) = WORKER_COMMAND.get() {
        return Ok(command.clone());
    }
    let exe = std::env::current_exe()
        .map_err(|e| Error::Worker(format!("cannot find this program to start a worker: {e}")))?;
    Ok(vec![exe.into_os_string(), WORKER_VERB.into()])
}

impl RuntimeSpec {
    /// Builds the runtime (loading ONNX Runtime when needed, see [`crate::use_ort_library`]),
    /// in this process, or in a worker process for a side on another release's library.
    pub fn build(&self) -> Result<Box<dyn Runtime + Send + Sync>> {
        self.build_isolated(Isolation::Never)
    }

    /// [`Self::build`], in a worker process where `isolation` says so (see [`Isolated`]).
    pub fn build_isolated(&self, isolation: Isolation) -> Result<Box<dyn Runtime + Send + Sync>> {
        if isolation.applies(self) {
            Ok(Box::new(Isolated::new(self)?))
        } else {
            self.configured().build_here(false)
        }
    }
}

/// A runtime whose runs happen in a worker process (see the module's words).
pub struct Isolated {
    spec: RuntimeSpec,
    /// The worker runs an already optimized graph as saved.
    as_saved: bool,
    /// The same runtime built here, for what it is (name, details, options); it runs nothing.
    here: Box<dyn Runtime + Send + Sync>,
    /// What the worker told of itself, where only it can (see [`Isolated::worker_facts`]).
    facts: Option<serde_json::Value>,
    worker: Mutex<Option<Worker>>,
}

impl Isolated {
    /// `spec`'s runtime, run in a worker process (that loads the ONNX Runtime library this
    /// process chose, see [`crate::use_ort_library`]).
    pub fn new(spec: &RuntimeSpec) -> Result<Self> {
        // a release this side cannot run on is refused now, not at its first run
        spec.configured().release_worker(false)?;
        let mut isolated = Self {
            here: spec.configured().described_here(false, None)?,
            facts: None,
            spec: spec.clone(),
            as_saved: false,
            worker: Mutex::new(None),
        };
        if let Some(facts) = isolated.worker_facts()? {
            isolated.here = spec.configured().described_here(false, Some(&facts))?;
            isolated.facts = Some(facts);
        }
        Ok(isolated)
    }

    /// What the worker says the side is, where only it can tell ([`Runtime::facts`]: OpenVINO
    /// on another library, ONNX Runtime on a library whose file name does not say its
    /// release); `None` for every other side, which this process describes itself.
    fn worker_facts(&self) -> Result<Option<Value>> {
        let runtime = self.spec.configured();
        if !runtime.asks_worker() {
            return Ok(None);
        }
        let facts = (self.ask(&json!({"do": "describe"}), &[&[]], |answer, _| {
            Ok(answer["facts"].clone())
        }))
        .map_err(|f| self.failed(f))?;
        if !runtime.told(&facts) {
            return Err(Error::Worker(format!(
                "the worker described its {} as {facts}",
                self.here.name()
            )));
        }
        Ok(Some(facts))
    }

    fn spawn(&self) -> Result<Worker> {
        let log = tempfile::Builder::new()
            .prefix(".layerdiff-worker-")
            .tempfile()
            .map_err(|e| Error::Worker(format!("cannot make the worker's log: {e}")))?;
        let command = match self.spec.configured().release_worker(self.as_saved)? {
            Some(command) => command,
            None => {
                let mut command = worker_command()?;
                command.extend(["--runtime".into(), self.spec.spelling().into()]);
                if self.as_saved {
                    command.push("--as-saved".into());
                }
                if let Some(library) = crate::chosen_ort_library() {
                    command.extend(["--ort-library".into(), library.into()]);
                }
                command
            }
        };
        let mut run = Command::new(&command[0]);
        run.args(&command[1..]);
        let stderr = log
            .reopen()
            .map_err(|e| Error::Worker(format!("cannot open the worker's log: {e}")))?;
        let mut child = run
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| {
                Error::Worker(format!(
                    "cannot start a worker process (`{}`): {e}",
                    command[0].to_string_lossy()
                ))
            })?;
        let to = BufWriter::new(child.stdin.take().expect("piped"));
        let from = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Worker {
            child,
            to,
            from,
            log,
        })
    }

    /// Sends one request and reads its answer with `read` (its header, then its blobs).
    fn ask<T>(
        &self,
        request: &Value,
        blobs: &[&[u8]],
        read: impl FnOnce(&Value, &mut dyn Read) -> std::io::Result<T>,
    ) -> Result<T, Failure> {
        let mut guard = self.worker.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            *guard = Some(self.spawn().map_err(Failure::Said)?);
        }
        let worker = guard.as_mut().expect("started above");
        let answer =
            wire::send(&mut worker.to, request, blobs).and_then(|()| {
                match wire::header(&mut worker.from)? {
                    None => Err(std::io::ErrorKind::UnexpectedEof.into()),
                    Some(h) if !h["error"].is_null() => Ok(Err(wire::to_error(&h))),
                    Some(h) => read(&h, &mut worker.from).map(Ok),
                }
            });
        match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(said)) => Err(Failure::Said(said)),
            Err(_) => {
                let worker = guard.take().expect("started above");
                Err(worker.died())
            }
        }
    }

    /// Runs `model` in the worker; `twice`: two runs in one session, keeping those values.
    fn ask_run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
        twice: Option<&[String]>,
    ) -> Result<Vec<Vec<(String, Tensor)>>, Failure> {
        let bytes = model.to_bytes();
        let request = json!({
            "do": "run",
            "base_dir": model.base_dir(),
            "inputs": wire::tensors(inputs),
            "outputs": outputs,
            "twice": twice,
        });
        self.ask(&request, &blobs(&bytes, inputs), |answer, from| {
            let runs = answer["runs"].as_array().cloned().unwrap_or_default();
            runs.iter()
                .map(|run| wire::read_tensors(run, from))
                .collect()
        })
    }

    /// The error of a run that killed the worker, naming the node it died on where shorter
    /// beginnings of `model` tell it.
    fn crashed(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        how: String,
        last_words: Option<String>,
    ) -> Error {
        let node = self.crashing_node(model, inputs).map(|i| {
            let node = &model.graph().node[i];
            let op = match node.domain() {
                "" | "ai.onnx" => node.op_type().to_string(),
                domain => format!("{domain}.{}", node.op_type()),
            };
            crate::CrashedNode {
                name: node.display_name(),
                op,
                outputs: node
                    .output
                    .iter()
                    .filter(|o| !o.is_empty())
                    .cloned()
                    .collect(),
            }
        });
        self.crash(how, node, last_words)
    }

    /// The error of a request that failed other than by a run's crash (which [`Self::crashed`]
    /// traces to a node).
    fn failed(&self, failure: Failure) -> Error {
        match failure {
            Failure::Said(e) => e,
            Failure::Died(how, last_words) => self.crash(how, None, last_words),
        }
    }

    fn crash(
        &self,
        how: String,
        node: Option<crate::CrashedNode>,
        last_words: Option<String>,
    ) -> Error {
        Error::Crashed(Box::new(crate::Crash {
            runtime: self.here.name().to_string(),
            how,
            node,
            last_words,
        }))
    }

    /// The node whose run kills the worker: the last of the shortest beginning of the graph
    /// (its nodes in file order, every value no other of them reads an output) that kills it,
    /// found by halving. `None` when the whole graph run this way does not crash (the crash
    /// comes from more than one node, or not every time).
    fn crashing_node(&self, model: &Model, inputs: &[(String, Tensor)]) -> Option<usize> {
        let count = model.graph().node.len();
        let crashes = |k: usize| {
            let Ok(beginning) = beginning(model, k, inputs) else {
                return false;
            };
            let outputs: Vec<String> = beginning
                .graph()
                .output
                .iter()
                .map(|o| o.name().to_string())
                .collect();
            matches!(
                self.ask_run(&beginning, inputs, &outputs, None),
                Err(Failure::Died(..))
            )
        };
        if count == 0 || !crashes(count) {
            return None;
        }
        let (mut survives, mut dies) = (0, count);
        while dies - survives > 1 {
            let middle = (survives + dies) / 2;
            if crashes(middle) {
                dies = middle;
            } else {
                survives = middle;
            }
        }
        Some(dies - 1)
    }
}

/// A request's blobs: the model's bytes, then each input's.
fn blobs<'a>(model: &'a [u8], inputs: &'a [(String, Tensor)]) -> Vec<&'a [u8]> {
    std::iter::once(model)
        .chain(inputs.iter().map(|(_, t)| t.bytes.as_slice()))
        .collect()
}

/// The first `k` nodes of `model`, every value they produce and none of them reads an output.
fn beginning(model: &Model, k: usize, inputs: &[(String, Tensor)]) -> Result<Model> {
    let nodes = &model.graph().node[..k];
    let read: std::collections::HashSet<&str> = nodes
        .iter()
        .flat_map(|n| n.input.iter().map(String::as_str))
        .collect();
    let outputs: Vec<String> = nodes
        .iter()
        .flat_map(|n| n.output.iter())
        .filter(|o| !o.is_empty() && !read.contains(o.as_str()))
        .cloned()
        .collect();
    let picked: Vec<usize> = (0..k).collect();
    Ok(extract_nodes(model, &picked, &outputs, inputs)?)
}

impl Runtime for Isolated {
    fn name(&self) -> &str {
        self.here.name()
    }

    fn detail(&self) -> String {
        format!("{}, in a worker process", self.here.detail())
    }

    fn options(&self) -> Vec<(String, String)> {
        self.here.options()
    }

    fn reduced_math(&self) -> Option<ReducedMath> {
        self.here.reduced_math()
    }

    fn kernels_per_graph(&self) -> Option<&'static str> {
        self.here.kernels_per_graph()
    }

    fn casts_half_per_graph(&self) -> bool {
        self.here.casts_half_per_graph()
    }

    fn rewrites(&self) -> bool {
        self.here.rewrites()
    }

    fn compiles_graph(&self) -> bool {
        self.here.compiles_graph()
    }

    fn optimize(&self, model: &Model) -> Result<Option<Optimized>> {
        if !self.here.rewrites() {
            return Ok(None);
        }
        let unsaved = |e: &dyn std::fmt::Display| Error::SaveOptimized(e.to_string());
        let folder = tempfile::tempdir().map_err(|e| unsaved(&e))?;
        let bytes = model.to_bytes();
        let request =
            json!({"do": "optimize", "base_dir": model.base_dir(), "into": folder.path()});
        let optimized = self
            .ask(&request, &[&bytes], |answer, _| {
                Ok(answer["optimized"] == true)
            })
            .map_err(|f| self.failed(f))?;
        if !optimized {
            return Ok(None);
        }
        let saved = Model::load(folder.path().join("optimized.onnx")).map_err(|e| unsaved(&e))?;
        let runtime = Self {
            here: (self.spec.configured()).described_here(true, self.facts.as_ref())?,
            facts: self.facts.clone(),
            spec: self.spec.clone(),
            as_saved: true,
            worker: Mutex::new(None),
        };
        Ok(Some(Optimized {
            model: saved,
            runtime: Box::new(runtime),
            folder,
        }))
    }

    fn placement(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
    ) -> Option<crate::NodePlacement> {
        let provider = self.spec.ort()?.provider;
        if provider == Provider::Cpu {
            return None;
        }
        let bytes = model.to_bytes();
        let request = json!({"do": "placement", "base_dir": model.base_dir(), "inputs": wire::tensors(inputs)});
        let nodes = self
            .ask(&request, &blobs(&bytes, inputs), |answer, _| {
                serde_json::from_value::<Vec<(String, usize)>>(answer["nodes"].clone())
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
            })
            .map_err(|f| self.failed(f));
        Some((provider.ort_name(), nodes))
    }

    fn run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> Result<Vec<(String, Tensor)>> {
        match self.ask_run(model, inputs, outputs, None) {
            Ok(mut runs) if runs.len() == 1 => Ok(runs.remove(0)),
            Ok(_) => Err(Error::Worker(
                "the worker answered a run with no values".into(),
            )),
            Err(Failure::Died(how, words)) => Err(self.crashed(model, inputs, how, words)),
            Err(said) => Err(self.failed(said)),
        }
    }

    fn run_twice(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
        keep: &[String],
    ) -> Result<[Vec<(String, Tensor)>; 2]> {
        match self.ask_run(model, inputs, outputs, Some(keep)) {
            Ok(runs) => <[_; 2]>::try_from(runs).map_err(|_| {
                Error::Worker("the worker answered two runs with other than two".into())
            }),
            Err(Failure::Died(how, words)) => Err(self.crashed(model, inputs, how, words)),
            Err(said) => Err(self.failed(said)),
        }
    }
}
