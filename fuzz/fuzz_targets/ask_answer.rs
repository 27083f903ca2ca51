//! An answer to a question of the host (admin API body, endpoint body, control line).
//! The input, the properties checked and the seeds: `mediator::fuzzing::ask_answer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mediator::fuzzing::ask_answer(data));
