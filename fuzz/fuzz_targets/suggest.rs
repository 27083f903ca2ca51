//! `mediator suggest`'s input: decision-log lines and shim reports.
//! The input, the properties checked and the seeds: `mediator::fuzzing::suggest`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::suggest(data));
