//! The PROXY protocol v2 header with the invocation labels, on an authority's socket.
//! The input, the properties checked and the seeds: `mediator::fuzzing::proxy_v2`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::proxy_v2(data));
