//! Runtimes are spelled the same way everywhere: a runtime's name, then its own parts after
//! colons (`ort:cuda:opt=all`, `tract`, `openvino:precision=bf16`). Each runtime is one module
//! that owns its spelling: a [`RuntimeKind`] registered once with `inventory::submit!` (its
//! name, where the short list names it, and its parser), and what a spelling parses to, a
//! [`Configured`] runtime that spells, builds and describes itself, says how a worker process
//! runs it, and writes its repro. ONNX Runtime: `ort_runtime/spec.rs`; tract:
//! `tract_runtime.rs`; OpenVINO: `openvino_runtime/spec.rs`.

use std::any::Any;
use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;

use crate::{Result, Runtime};

/// A kind of runtime: registered once, in its own module, with
/// `inventory::submit!(RuntimeKind { … })`.
pub struct RuntimeKind {
    /// The name its spellings begin with (`ort`, `tract`).
    pub name: &'static str,
    /// How the short list of runtimes names it, with examples
    /// (`` `openvino` (`openvino:precision=bf16`…) ``).
    pub listed: &'static str,
    /// Where the short list names it: lower first.
    pub rank: u8,
    /// Parses a spelling that begins with the name (the whole text: `ort:cuda:opt=all`); an
    /// error is a line that names the spelling.
    pub parse: fn(&str) -> Result<RuntimeSpec, String>,
    /// The spellings `layerdiff ops` runs by default (`ort`, `ort:opt=all`, `ort:cuda`…), of
    /// which [`op_backends`] keeps those that start here.
    pub op_backends: fn() -> Vec<String>,
    /// The Python wheel that ships its library, where one does: what finds it, and what
    /// [`crate::parse_release`] fetches another release of.
    pub wheel: Option<&'static crate::library::Wheel>,
}

inventory::collect!(RuntimeKind);

/// The registered runtimes' default op-matrix backends that start on this machine, in the
/// short list's order.
pub fn op_backends() -> Vec<String> {
    kinds()
        .into_iter()
        .flat_map(|kind| (kind.op_backends)())
        .filter(|spelling| RuntimeSpec::parse(spelling).is_ok_and(|spec| spec.build().is_ok()))
        .collect()
}

/// The registered runtimes, in the short list's order.
pub fn kinds() -> Vec<&'static RuntimeKind> {
    let mut kinds: Vec<&RuntimeKind> = inventory::iter::<RuntimeKind>.into_iter().collect();
    kinds.sort_by_key(|k| (k.rank, k.name));
    kinds
}

/// A runtime as a spelling set it up: what each runtime's module parses its spelling to.
pub trait Configured: std::fmt::Debug + Send + Sync + Any {
    /// The spelling that parses back to it (defaults left out: `ort`, `ort:cuda:opt=all`).
    fn spelling(&self) -> String;
    /// Builds it in this process (ONNX Runtime loaded as the process chose, see
    /// [`crate::use_ort_library`], where it needs it); with `as_saved`, the one that runs a graph it already optimized, as saved
    /// (see [`Runtime::optimize`]). A side on another release's library loads it here: only a
    /// worker process of its own does that.
    fn build_here(&self, as_saved: bool) -> Result<Box<dyn Runtime + Send + Sync>>;
    /// What a side on it is, built in this process without loading another library: a side on
    /// another release is described as running on it (what the worker that loads it told:
    /// `facts`, see [`Runtime::facts`]), and runs nothing here (see `Isolated`).
    fn described_here(
        &self,
        as_saved: bool,
        _facts: Option<&serde_json::Value>,
    ) -> Result<Box<dyn Runtime + Send + Sync>> {
        self.build_here(as_saved)
    }
    /// The library of another release it runs on, which this process does not load (a runtime
    /// is loaded once per process): such a side always runs in a worker process of its own.
    fn release(&self) -> Option<&Path> {
        None
    }
    /// Whether it loads code layerdiff does not trust (a vendor's custom ops or execution
    /// provider): `Isolation::Auto` runs it in a worker process.
    fn loads_vendor_code(&self) -> bool {
        false
    }
    /// Whether only its worker can tell what it runs on (see [`Runtime::facts`]); with
    /// [`Configured::told`], whether what the worker said is such a description.
    fn asks_worker(&self) -> bool {
        false
    }
    /// Whether `facts`, from its worker, describe it (see [`Configured::asks_worker`]).
    fn told(&self, _facts: &serde_json::Value) -> bool {
        true
    }
    /// How its worker process starts where this program's own worker (`layerdiff __worker`)
    /// cannot run it (a release older than this build's C API runs in its own Python package);
    /// `None`: this program's worker. An error says what is missing.
    fn release_worker(&self, _as_saved: bool) -> Result<Option<Vec<OsString>>> {
        Ok(None)
    }
    /// Its repro's runner: the Python package it needs, and the body of `run_target(inputs)`
    /// in repro.py, which runs `HERE / "model.onnx"` on it and returns the outputs by name
    /// (`inputs`: the piece's graph inputs, in the model's order; `OUTPUTS` holds the output
    /// names in order).
    fn repro(&self, inputs: &[String]) -> (&'static str, String);
}

/// A runtime named on the command line or in the API: one of the registered kinds, set up as
/// its spelling says. Equal when spelled the same.
#[derive(Clone)]
pub struct RuntimeSpec(Arc<dyn Configured>);

impl std::fmt::Debug for RuntimeSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for RuntimeSpec {
    fn eq(&self, other: &Self) -> bool {
        self.spelling() == other.spelling()
    }
}

impl Eq for RuntimeSpec {}

impl std::fmt::Display for RuntimeSpec {
    /// As spelled (see [`RuntimeSpec::spelling`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.spelling())
    }
}

impl<C: Configured> From<C> for RuntimeSpec {
    fn from(configured: C) -> Self {
        Self(Arc::new(configured))
    }
}

/// A spelling that is no runtime but is taken where a runtime is (`expected:PATH`, a file of
/// values): named in the short list of an unknown name, and suggested for a slip of its own.
pub struct OtherSpelling {
    /// The name it begins with (`expected`).
    pub name: &'static str,
    /// How a slip of its name is pointed to it (`expected:PATH`).
    pub suggested: &'static str,
    /// How the short list names it.
    pub listed: &'static str,
}

impl RuntimeSpec {
    /// Parses a spelling of a registered runtime.
    pub fn parse(text: &str) -> Result<Self, String> {
        Self::parse_among(text, &[])
    }

    /// [`Self::parse`] where `others` are spelled beside the runtimes: a name none of them
    /// has is told with them in the short list.
    pub fn parse_among(text: &str, others: &[OtherSpelling]) -> Result<Self, String> {
        let head = text.split(':').next().unwrap_or_default();
        let kinds = kinds();
        match kinds.iter().find(|k| k.name == head) {
            Some(kind) => (kind.parse)(text),
            None => Err(unknown_name(head, &kinds, others)),
        }
    }

    /// The spelling that parses back to this spec.
    pub fn spelling(&self) -> String {
        self.0.spelling()
    }

    /// The runtime's own settings, where it is of type `C` (ONNX Runtime's: `OrtSpec`).
    pub fn get<C: Configured>(&self) -> Option<&C> {
        (&*self.0 as &dyn Any).downcast_ref()
    }

    /// What this runtime is set up as: its module's [`Configured`].
    pub fn configured(&self) -> &dyn Configured {
        &*self.0
    }
}

#[cfg(test)]
mod tests;

/// Where `head` is no runtime's name (`openvno`), nor one of the `others`, why in a line: the
/// nearest name where one is a slip away, and the short list (the whole grammar is `--help`'s).
fn unknown_name(head: &str, kinds: &[&RuntimeKind], others: &[OtherSpelling]) -> String {
    let names: Vec<&str> = (kinds.iter().map(|k| k.name))
        .chain(others.iter().map(|o| o.name))
        .collect();
    let near = if head.starts_with("onnxruntime") {
        Some("ort")
    } else {
        nearest(head, &names)
    };
    let suggested = |name: &str| {
        (others.iter().find(|o| o.name == name)).map_or(name.to_string(), |o| o.suggested.into())
    };
    let near = near.map_or(".".to_string(), |name| {
        format!("; did you mean `{}`?", suggested(name))
    });
    let listed: Vec<&str> = (kinds.iter().map(|k| k.listed))
        .chain(others.iter().map(|o| o.listed))
        .collect();
    format!(
        "unknown runtime `{head}`{near} Runtimes: {}; `--help` spells every option",
        listed.join(", ")
    )
}

/// The name of `names` that `word` is a slip of (one edit, or a third of the name's
/// length), if any.
pub fn nearest<'a>(word: &str, names: &[&'a str]) -> Option<&'a str> {
    (names.iter().map(|name| (edits(word, name), *name)).min())
        .filter(|(d, name)| *d <= 1.max(name.len() / 3))
        .map(|(_, name)| name)
}

/// The edit distance between `a` and `b` (insertions, deletions, substitutions).
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// A Python string literal of `text` (for a repro's runner).
pub fn py_str(text: &str) -> String {
    serde_json::to_string(text).expect("a string serialises")
}

/// A comment for a repro of a side layerdiff ran on another release's library (`lib=PATH`):
/// the Python whose package holds that library runs the script as layerdiff ran it.
pub(crate) fn release_note(library: Option<&Path>) -> String {
    library.map_or_else(String::new, |library| {
        format!(
            "    # layerdiff ran the target on\n    #   {}\n    # Run this with the Python of the virtualenv that holds it (`python -m\n    # layerdiff.releases` made it): another release may answer otherwise.\n",
            library.display()
        )
    })
}
