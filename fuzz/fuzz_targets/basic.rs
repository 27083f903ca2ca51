//! Proxy-Authorization: Basic values.
//! The input, the properties checked and the seeds: `mediator::fuzzing::basic`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::basic(data));
