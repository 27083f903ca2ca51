//! The frame scan of a terminated tunnel's HTTP/2 server output.
//! The input, the properties checked and the seeds: `mediator::fuzzing::h2_resets`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::h2_resets(data));
