//! The configuration file (mediator.toml).
//! The input, the properties checked and the seeds: `mediator::fuzzing::config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::config(data));
