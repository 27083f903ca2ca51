//! The SOCKS5 handshake: greeting, RFC 1929 authentication, request.
//! The input, the properties checked and the seeds: `mediator::fuzzing::socks5`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::socks5(data));
