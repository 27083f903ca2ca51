//! Test support for the end-to-end tests: a loopback origin, a DNS server on loopback,
//! and helpers to run the real `mediator` binary.
