//! PAC answer strings ("PROXY a:1; SOCKS5 b:2; DIRECT").
//! The input, the properties checked and the seeds: `mediator::fuzzing::pac_answer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::pac_answer(data));
