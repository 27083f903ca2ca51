//! Credentials held by the mediator (design section 14): with `--config F --authority A`
//! the child's `child_env` variables hold their placeholders, whatever the caller's
//! environment had under those names, and the secret's file is masked (see `secrets`);
//! no credential's `secret_env` (of any authority) reaches the child.

use crate::support::{Fixture, expect, probe_command, stdout};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        config_credentials_give_the_child_its_placeholders,
        the_child_never_inherits_a_secret_env,
    ]
}

fn config_credentials_give_the_child_its_placeholders() -> TestResult {
    let fx = Fixture::new("cred"); // <socket_dir>/authority.sock
    let socket_dir = fx.socket.parent().unwrap().to_owned();
    let cfg = fx.path("mediator.toml");
    let secret = fx.path("secret");
    std::fs::write(&secret, "the-real-token\n").unwrap();
    std::fs::write(
        &cfg,
        format!(
            "[listen]\nsocket_dir = {:?}\n[tls]\nca_dir = {:?}\n\
             [[authority]]\nname = \"authority\"\nallow = [\"api.example\"]\n\
             tls_terminate = [\"api.example\"]\n\
             [[authority.credential]]\nhost = \"api.example\"\nheader = \"Authorization\"\n\
             secret_file = {:?}\nplaceholder = \"mediator:api:authority\"\n\
             child_env = \"API_TOKEN\"\n",
            socket_dir.to_str().unwrap(),
            ca_dir(&fx).to_str().unwrap(),
            secret.to_str().unwrap(),
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

/// The caller's environment holds the secrets the config names as `secret_env` (as it
/// does where the shim and the mediator are started from one shell): the child sees none
/// of them, neither its own authority's nor another's; a `secret_env` that is also the
/// authority's `child_env` holds the placeholder.
fn the_child_never_inherits_a_secret_env() -> TestResult {
    let fx = Fixture::new("cred-env");
    let socket_dir = fx.socket.parent().unwrap().to_owned();
    let cfg = fx.path("mediator.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\nsocket_dir = {:?}\n[tls]\nca_dir = {:?}\n\
             [[authority]]\nname = \"authority\"\nallow = [\"api.example\"]\n\
             tls_terminate = [\"api.example\"]\n\
             [[authority.credential]]\nhost = \"api.example\"\nheader = \"Authorization\"\n\
             secret_env = \"T15_SECRET_ENV\"\n\
             [[authority.credential]]\nhost = \"api.example\"\nheader = \"X-Key\"\n\
             secret_env = \"API_TOKEN\"\nplaceholder = \"mediator:api:authority\"\n\
             child_env = \"API_TOKEN\"\n\
             [[authority]]\nname = \"other\"\nallow = [\"api.example\"]\n\
             tls_terminate = [\"api.example\"]\n\
             [[authority.credential]]\nhost = \"api.example\"\nheader = \"Authorization\"\n\
             secret_env = \"OTHER_SECRET\"\n",
            socket_dir.to_str().unwrap(),
            ca_dir(&fx).to_str().unwrap(),
        ),
    )
    .unwrap();
    let out = probe_command(
        &args!["--config", &cfg, "--authority", "authority"],
        &args!["env", "KEPT", "T15_SECRET_ENV", "OTHER_SECRET", "API_TOKEN"],
    )
    .current_dir(&fx.dir.0)
    .env("T15_SECRET_ENV", "envsecret")
    .env("OTHER_SECRET", "othersecret")
    .env("API_TOKEN", "apisecret")
    .env("KEPT", "kept")
    .output()
    .unwrap();
    expect(
        "the child's KEPT, T15_SECRET_ENV, OTHER_SECRET and API_TOKEN (unset: empty)",
        &stdout(&out),
        "kept   mediator:api:authority",
    )
}

/// A CA for the fixture (a credential needs TLS termination, which needs a CA): made in
/// `<fixture>/ca` once, its directory returned.
fn ca_dir(fx: &Fixture) -> std::path::PathBuf {
    let dir = fx.path("ca");
    if !dir.join(certs::CA_CERT_FILE).exists() {
        certs::Ca::create(&certs::CaOptions::default())
            .unwrap()
            .persist(&dir)
            .unwrap();
    }
    dir
}
