use std::collections::HashSet;

use crate::{Error, GraphIndex, Model, Result, ValueInfoProto};

/// Makes each named value a graph output so a runtime returns it, keeping the declared type
/// where the file has one. Values that are already outputs are left alone; graph order and
/// existing outputs are unchanged, so the original outputs keep their positions.
pub fn expose_values<S: AsRef<str>>(model: &mut Model, values: &[S]) -> Result<()> {
    let index = GraphIndex::new(model.graph());
    let mut present: HashSet<String> = index.graph_outputs().iter().cloned().collect();
    let declared: Vec<ValueInfoProto> = {
        let g = model.graph();
        g.value_info.iter().chain(&g.input).cloned().collect()
    };
    let mut added = Vec::new();
    for value in values {
        let value = value.as_ref();
        if !index.has_value(value) {
            return Err(Error::UnknownValue(value.to_string()));
        }
        if !present.insert(value.to_string()) {
            continue;
        }
        let info = declared
            .iter()
            .find(|v| v.name() == value)
            .cloned()
            .unwrap_or_else(|| ValueInfoProto {
                name: Some(value.to_string()),
                ..Default::default()
            });
        added.push(info);
    }
    model.graph_mut().output.extend(added);
    Ok(())
}
