//! Decision records off the box (design section 19): renderings of what the decision
//! log's writer hands over, so that no call site knows which format is on. `ocsf` renders
//! a record as an OCSF Network Activity event.

pub(crate) mod ocsf;
pub(crate) mod otlp;
