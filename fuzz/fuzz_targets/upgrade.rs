//! The Upgrade header of a request inside a terminated tunnel.
//! The input, the properties checked and the seeds: `mediator::fuzzing::upgrade`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::upgrade(data));
