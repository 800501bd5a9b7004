//! The side vocabulary: how every side is spelled (`ort:opt=all`, `torch:cuda:bf16`, `xla`,
//! `expected:PATH`), parsed here once for every door, and the rules between the spellings.

pub mod keras;
pub mod onnx_side;
pub mod target;
pub mod torch;
