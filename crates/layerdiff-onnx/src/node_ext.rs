use crate::{AttributeProto, Error, GraphProto, NodeProto, Result, StringStringEntryProto};

/// Small conveniences on generated `NodeProto`s, with errors that name the node.
pub trait NodeExt {
    /// The attribute called `name`, if present.
    fn attr(&self, name: &str) -> Option<&AttributeProto>;
    /// An integer attribute, or an error naming the node when it is missing.
    fn attr_i64(&self, name: &str) -> Result<i64>;
    /// A float attribute, or an error naming the node when it is missing.
    fn attr_f32(&self, name: &str) -> Result<f32>;
    /// The value of a `metadata_props` entry.
    fn metadata(&self, key: &str) -> Option<&str>;
    /// The node's name, or a stand-in built from its op type and first output.
    fn display_name(&self) -> String;
    /// The subgraphs the node runs (an `If`'s branches, a `Loop`'s or a `Scan`'s body).
    fn subgraphs(&self) -> impl Iterator<Item = &GraphProto>;
}

impl NodeExt for NodeProto {
    fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.attribute.iter().find(|a| a.name() == name)
    }

    fn attr_i64(&self, name: &str) -> Result<i64> {
        self.attr(name)
            .and_then(|a| a.i)
            .ok_or_else(|| self.attribute_error(format!("missing integer attribute `{name}`")))
    }

    fn attr_f32(&self, name: &str) -> Result<f32> {
        self.attr(name)
            .and_then(|a| a.f)
            .ok_or_else(|| self.attribute_error(format!("missing float attribute `{name}`")))
    }

    fn metadata(&self, key: &str) -> Option<&str> {
        lookup(&self.metadata_props, key)
    }

    fn subgraphs(&self) -> impl Iterator<Item = &GraphProto> {
        self.attribute
            .iter()
            .flat_map(|a| a.g.iter().chain(&a.graphs))
    }

    fn display_name(&self) -> String {
        if !self.name().is_empty() {
            return self.name().to_string();
        }
        match self.output.first() {
            Some(out) => format!("{}→{out}", self.op_type()),
            None => self.op_type().to_string(),
        }
    }
}

impl NodeProto {
    fn attribute_error(&self, message: String) -> Error {
        Error::Attribute {
            node: self.display_name(),
            op_type: self.op_type().to_string(),
            message,
        }
    }
}

pub(crate) fn lookup<'a>(entries: &'a [StringStringEntryProto], key: &str) -> Option<&'a str> {
    entries.iter().find(|e| e.key() == key).map(|e| e.value())
}
