//! The first request head (preflight) and the CONNECT / absolute-form target.
//! The input, the properties checked and the seeds: `mediator::fuzzing::http_head`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::http_head(data));
