//! A runtime added by one module and one registration line, as a vendor's would be: `standin`,
//! tract with one node's value 1% off where asked (`standin:off=NODE`): a kernel fault planted
//! in the runtime, not in the file.

use layerdiff_core::Tensor;
use layerdiff_onnx::Model;
use layerdiff_runtime::{Configured, Runtime, RuntimeKind, RuntimeSpec, TractRuntime};

layerdiff_runtime::inventory::submit!(RuntimeKind {
    name: "standin",
    listed: "`standin` (tract, `standin:off=NODE`)",
    rank: 9,
    parse: StandIn::parse,
    op_backends: Vec::new,
    wheel: None,
});

/// The stand-in as spelled: the node whose value it computes 1% off, if any.
#[derive(Debug, Clone)]
pub struct StandIn {
    off: Option<String>,
}

impl StandIn {
    fn parse(text: &str) -> Result<RuntimeSpec, String> {
        let off = match text.strip_prefix("standin") {
            Some("") => None,
            Some(rest) => Some(
                (rest.strip_prefix(":off=").filter(|n| !n.is_empty()))
                    .ok_or_else(|| {
                        format!("unknown runtime `{text}` (expected `standin[:off=NODE]`)")
                    })?
                    .to_string(),
            ),
            None => return Err(format!("unknown runtime `{text}`")),
        };
        Ok(Self { off }.into())
    }
}

impl Configured for StandIn {
    fn spelling(&self) -> String {
        match &self.off {
            Some(node) => format!("standin:off={node}"),
            None => "standin".to_string(),
        }
    }

    fn build_here(
        &self,
        _as_saved: bool,
    ) -> layerdiff_runtime::Result<Box<dyn Runtime + Send + Sync>> {
        Ok(Box::new(self.clone()))
    }

    fn repro(&self, _inputs: &[String]) -> (&'static str, String) {
        let body = "    raise SystemExit(\"the stand-in runtime has no Python package\")\n";
        ("numpy", body.to_string())
    }
}

impl Runtime for StandIn {
    fn name(&self) -> &str {
        "standin"
    }

    fn detail(&self) -> String {
        match &self.off {
            Some(node) => format!("tract with node `{node}` 1% off"),
            None => "tract".to_string(),
        }
    }

    fn run(
        &self,
        model: &Model,
        inputs: &[(String, Tensor)],
        outputs: &[String],
    ) -> layerdiff_runtime::Result<Vec<(String, Tensor)>> {
        let mut values = TractRuntime.run(model, inputs, outputs)?;
        // the node's own value comes out 1% off (what reads it is computed right)
        let off = (model.graph().node.iter())
            .find(|n| Some(n.name()) == self.off.as_deref())
            .map(|n| n.output[0].clone());
        for (name, value) in &mut values {
            if Some(&*name) == off.as_ref() {
                let view = value.view();
                let scaled: Vec<f64> = (0..view.numel()).map(|i| view.get_f64(i) * 1.01).collect();
                let shape = value.shape.clone();
                *value = Tensor::from_f64(value.dtype, &scaled)
                    .reshaped(&shape)
                    .expect("same size");
            }
        }
        Ok(values)
    }
}
