//! Running the mediator as a service (design section 16): what a service manager, a
//! container runtime or an operator needs beside the proxy itself: the `mediator health`
//! probe (the image has no curl), readiness notification to systemd, and the config-file
//! watch (reload on change, for a Kubernetes ConfigMap). None of it takes a decision or
//! touches a connection. The version with its git revision is `crate::version`, stderr's
//! priorities `crate::journal` (both leaves every layer may use).

pub mod health;
pub mod notify;
pub mod serve;
pub mod watch;
