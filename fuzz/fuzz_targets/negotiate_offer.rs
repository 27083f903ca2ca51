//! A parent proxy's Proxy-Authenticate offers (Negotiate).
//! The input, the properties checked and the seeds: `mediator::fuzzing::negotiate_offer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::negotiate_offer(data));
