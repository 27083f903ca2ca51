//! Request rules on method, path and query parameter names.
//! The input, the properties checked and the seeds: `mediator::fuzzing::request_rule`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::request_rule(data));
