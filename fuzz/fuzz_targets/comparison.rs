#![no_main]
//! See layerdiff_fuzz::comparison.

libfuzzer_sys::fuzz_target!(|data: &[u8]| layerdiff_fuzz::comparison(data));
