//! A TLS ClientHello at the start of a tunnel (SNI).
//! The input, the properties checked and the seeds: `mediator::fuzzing::client_hello`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::client_hello(data));
