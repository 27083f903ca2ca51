//! KDE's proxy settings (kioslaverc).
//! The input, the properties checked and the seeds: `mediator::fuzzing::kioslaverc`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::kioslaverc(data));
