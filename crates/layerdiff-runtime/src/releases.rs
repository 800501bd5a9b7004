//! Another release of a runtime, as its Python wheel ships it: which package on the package
//! index ships which runtime (each runtime's module names its [`Wheel`] where it registers),
//! which versions layerdiff runs, and what an older one needs installed beside it. `python -m
//! layerdiff.releases` fetches a release into a virtualenv of its own by these rules.

use crate::library::Wheel;
use crate::spec::kinds;

/// A runtime's wheel: the runtime's name as its spellings begin (`ort`), and the wheel.
pub type RuntimeWheel = (&'static str, &'static Wheel);

/// The wheels of the registered runtimes, in the short list's order.
pub fn wheels() -> Vec<RuntimeWheel> {
    (kinds().into_iter())
        .filter_map(|kind| Some((kind.name, kind.wheel?)))
        .collect()
}

/// The runtime and wheel that `package` is (`onnxruntime-gpu`); the error names the packages
/// there are.
pub fn wheel_of(package: &str) -> Result<RuntimeWheel, String> {
    (wheels().into_iter())
        .find(|(_, wheel)| wheel.packages.contains(&package))
        .ok_or_else(|| format!("`{package}` is not a runtime's package: {}", packages()))
}

fn packages() -> String {
    let all: Vec<&str> = (wheels().iter())
        .flat_map(|(_, w)| w.packages.iter().copied())
        .collect();
    all.join(", ")
}

/// The first runtime's first package, which a version alone names (`onnxruntime`).
fn first_package() -> &'static str {
    (wheels().first())
        .and_then(|(_, w)| w.packages.first())
        .copied()
        .unwrap_or("")
}

/// `PACKAGE==VERSION` (a version alone is the first runtime's first package, `onnxruntime`),
/// checked: a package a runtime ships, a version of two or three numbers, not older than its
/// runtime's oldest. The error is a line that names the spelling.
pub fn parse_release(text: &str) -> Result<(String, String), String> {
    let (package, version) = match text.split_once("==") {
        Some((package, version)) => (package.trim().to_lowercase().replace('_', "-"), version),
        None => (first_package().to_string(), text),
    };
    let version = version.trim();
    let numbers = version.split('.').collect::<Vec<_>>();
    let well_formed = (2..=3).contains(&numbers.len())
        && (numbers.iter()).all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let (_, wheel) = wheel_of(&package)
        .ok()
        .filter(|_| well_formed)
        .ok_or_else(|| {
            format!(
                "`{text}` is not a release: give PACKAGE==VERSION with PACKAGE one of {} \
                 (`{}==1.30.0`)",
                packages(),
                first_package()
            )
        })?;
    if let Some((oldest, why)) = wheel.oldest
        && before(version, oldest)
    {
        return Err(format!(
            "`{text}`: layerdiff runs {} {oldest} and later ({why}); give a newer release",
            wheel.runtime
        ));
    }
    Ok((package, version.to_string()))
}

/// What a release of `wheel` at `version` needs installed beside it (`numpy<2`), else nothing
/// more than its own dependencies.
pub fn release_needs(wheel: &Wheel, version: &str) -> Vec<&'static str> {
    (wheel.needs_before.iter())
        .filter(|(until, _)| before(version, until))
        .map(|(_, need)| *need)
        .collect()
}

/// Whether `version` comes before `than` by its major and minor numbers.
fn before(version: &str, than: &str) -> bool {
    let key = |v: &str| -> (u64, u64) {
        let mut parts = v.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    };
    key(version) < key(than)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_a_package_a_runtime_ships_and_a_version_it_runs() {
        let parsed = |t: &str| parse_release(t);
        let release = |p: &str, v: &str| Ok((p.to_string(), v.to_string()));
        assert_eq!(
            parsed("onnxruntime==1.30.0"),
            release("onnxruntime", "1.30.0")
        );
        assert_eq!(parsed("1.22.1"), release("onnxruntime", "1.22.1"));
        assert_eq!(
            parsed("onnxruntime_gpu==1.31.1"),
            release("onnxruntime-gpu", "1.31.1")
        );
        assert_eq!(
            parsed("openvino==2026.4.0"),
            release("openvino", "2026.4.0")
        );
        assert_eq!(wheel_of("onnxruntime-gpu").map(|w| w.0), Ok("ort"));
        assert_eq!(wheel_of("openvino").map(|w| w.0), Ok("openvino"));
        let err = parsed("tensorflow==2.21.0").unwrap_err();
        assert!(
            err.contains("one of onnxruntime, onnxruntime-gpu, openvino (`onnxruntime==1.30.0`)"),
            "{err}"
        );
        assert!(parsed("onnxruntime==latest").is_err());
        assert!(parsed("onnxruntime==1").is_err());
        let old = parsed("openvino==2024.6.0").unwrap_err();
        assert!(old.contains("OpenVINO 2025.1 and later"), "{old}");
    }

    #[test]
    fn an_older_onnx_runtime_needs_numpy_1() {
        let (_, ort) = wheel_of("onnxruntime").unwrap();
        assert_eq!(release_needs(ort, "1.18.1"), ["numpy<2"]);
        assert!(release_needs(ort, "1.19.0").is_empty());
        let (_, openvino) = wheel_of("openvino").unwrap();
        assert!(release_needs(openvino, "2026.4.0").is_empty());
    }
}
