//! What ONNX Runtime says, as users read it: its messages without the source locations and
//! C++ signatures it prefixes, and a refusal of a model read for the node it has no kernel
//! for.

use crate::Error;

/// ONNX Runtime prefixes many messages with a source location and a C++ signature
/// (`/onnxruntime_src/…/model.cc:256 onnxruntime::Model::Model(…) Unsupported model IR version…`);
/// users need only the sentence after them.
pub(crate) fn clean_message(message: String) -> String {
    let Some(rest) = message
        .strip_prefix("/onnxruntime_src/")
        .and_then(|m| m.split_once(' '))
        .map(|(_, r)| r)
    else {
        return message;
    };
    let signature_end = rest
        .find('(')
        .filter(|&open| rest[..open].contains("::"))
        .and_then(|open| {
            let mut depth = 0usize;
            rest[open..].char_indices().find_map(|(i, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                (depth == 0).then_some(open + i + 1)
            })
        });
    match signature_end {
        Some(end) => rest[end..].trim_start().to_string(),
        None => rest.to_string(),
    }
}

/// ONNX Runtime's refusal of a model (`text`, its words): the node it has no kernel for where
/// it names one (`Could not find an implementation for Acosh(9) node with name 'n1'`), else
/// the model refused. An older release's worker sends its refusals back as `session`, read
/// here the same way.
pub(crate) fn refused(text: String) -> Error {
    let lacks = || {
        let after = text.split_once("Could not find an implementation for ")?.1;
        let (op, rest) = after.split_once(" node with name '")?;
        let (node, _) = rest.split_once('\'')?;
        Some((
            node.to_string(),
            format!("no kernel for {op} and its input types"),
        ))
    };
    match lacks() {
        Some((node, why)) if !node.is_empty() => Error::LacksNode {
            node,
            why,
            message: Error::Session(text).to_string(),
        },
        _ => Error::Session(text),
    }
}
