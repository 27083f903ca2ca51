//! Host patterns (grant entries): check_entry agrees with Grant::new; deny beats allow.
//! The input, the properties checked and the seeds: `mediator::fuzzing::pattern`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::pattern(data));
