//! Host canonicalisation: idempotent, and a host that canonicalises to X is decided as X.
//! The input, the properties checked and the seeds: `mediator::fuzzing::host`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::host(data));
