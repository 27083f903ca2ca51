//! The credential placeholder search and its percent-decoder.
//! The input, the properties checked and the seeds: `mediator::fuzzing::placeholder`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::placeholder(data));
