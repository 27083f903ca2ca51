//! Credentials held by the mediator (design section 14): with `--config F --authority A`
//! the child's `child_env` variables hold their placeholders, whatever the caller's
//! environment had under those names, and the secret's file is never read by the shim.

use crate::support::{Fixture, expect, probe_command, stdout};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![config_credentials_give_the_child_its_placeholders]
}

fn config_credentials_give_the_child_its_placeholders() -> TestResult {
    let fx = Fixture::new("cred"); // <socket_dir>/authority.sock
    let socket_dir = fx.socket.parent().unwrap().to_owned();
    let cfg = fx.path("mediator.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\nsocket_dir = {:?}\n\
             [[authority]]\nname = \"authority\"\nallow = [\"api.example\"]\n\
             [[authority.credential]]\nhost = \"api.example\"\nheader = \"Authorization\"\n\
             secret_file = \"/nonexistent/secret\"\nplaceholder = \"mediator:api:authority\"\n\
             child_env = \"API_TOKEN\"\n",
            socket_dir.to_str().unwrap(),
        ),
    )
    .unwrap();
    let out = probe_command(
        &args!["--config", &cfg, "--authority", "authority"],
        &args!["env", "API_TOKEN"],
    )
    .current_dir(&fx.dir.0)
    .env("API_TOKEN", "the-real-token-of-the-caller")
    .output()
    .unwrap();
    expect(
        "the placeholder in the child",
        &stdout(&out),
        "mediator:api:authority",
    )
}
