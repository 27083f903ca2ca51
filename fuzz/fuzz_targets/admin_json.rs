//! The JSON body of POST /v1/authorities.
//! The input, the properties checked and the seeds: `mediator::fuzzing::admin_json`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::admin_json(data));
