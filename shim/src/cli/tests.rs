//! Unit tests of `cli`.

use super::*;

fn parse(args: &[&str]) -> Result<Settings> {
    Settings::from_cli(Cli::try_parse_from(args).unwrap())
}

/// `shim --config CONFIG --authority NAME -- true`.
fn as_authority(config: &str, name: &str) -> Result<Settings> {
    parse(&[
        "shim",
        "--config",
        config,
        "--authority",
        name,
        "--",
        "true",
    ])
}

/// A fresh directory of this test process for the test `name`.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shim-{name}-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn command_must_follow_double_dash() {
    assert!(Cli::try_parse_from(["shim", "--mediator-socket", "/s", "true"]).is_err());
    assert!(Cli::try_parse_from(["shim", "--mediator-socket", "/s"]).is_err());
}

#[test]
fn socket_mode_parses_repeated_flags() {
    let s = parse(&[
        "shim",
        "--mediator-socket",
        "/s",
        "--allow-write",
        "/a",
        "--allow-write",
        "/b",
        "--report",
        "--",
        "ls",
        "-l",
    ])
    .unwrap();
    assert_eq!(s.channel, ChannelSpec::Socket("/s".into()));
    assert_eq!(
        s.allow_write,
        vec![PathBuf::from("/a"), PathBuf::from("/b")]
    );
    assert_eq!(s.report, Some(None));
    assert_eq!(s.command, vec![OsString::from("ls"), OsString::from("-l")]);
    assert!(!s.allow_unix_sockets);
}

#[test]
fn capture_flags_and_their_default() {
    let mode = |extra: &[&str]| {
        let mut a = vec!["shim", "--mediator-socket", "/s"];
        a.extend_from_slice(extra);
        a.extend(["--", "true"]);
        parse(&a).map(|s| (s.capture, s.live_denials))
    };
    assert_eq!(mode(&[]).unwrap(), (CaptureMode::Auto, true));
    assert_eq!(mode(&["--capture"]).unwrap().0, CaptureMode::Required);
    assert_eq!(mode(&["--no-capture"]).unwrap().0, CaptureMode::Off);
    assert!(!mode(&["--quiet-denials"]).unwrap().1);
    assert!(Cli::try_parse_from(["shim", "--capture", "--no-capture", "--", "true"]).is_err());
    // --resolve belongs to embedded mode.
    assert!(matches!(
        mode(&["--resolve", "origin.test=127.0.0.1"]),
        Err(Error::Usage(_))
    ));
}

#[test]
fn no_channel_is_an_error() {
    assert!(matches!(
        parse(&["shim", "--", "true"]),
        Err(Error::Usage(_))
    ));
}

#[test]
fn socket_and_embedded_rules_conflict() {
    assert!(matches!(
        parse(&[
            "shim",
            "--mediator-socket",
            "/s",
            "--allow",
            "a.example",
            "--",
            "true"
        ]),
        Err(Error::Usage(_))
    ));
}

#[test]
fn embedded_mode_from_allow_flags() {
    let s = parse(&[
        "shim",
        "--allow",
        "example.com",
        "--allow-private",
        "127.0.0.1/32",
        "--",
        "true",
    ])
    .unwrap();
    assert!(matches!(s.channel, ChannelSpec::Embedded { .. }));
}

#[test]
fn profile_rejects_unknown_keys_and_merges() {
    let dir = scratch("profile");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "allow_writes = [\"/x\"]\n").unwrap();
    let err = Options::load(&bad).unwrap_err().to_string();
    assert!(err.contains("allow_writes"), "{err}");
    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        "mediator_socket = \"/s\"\nallow_write = [\"work\"]\nallow_degraded = [\"landlock\"]\n",
    )
    .unwrap();
    let s = parse(&[
        "shim",
        "--profile",
        good.to_str().unwrap(),
        "--allow-write",
        "/b",
        "--",
        "true",
    ])
    .unwrap();
    assert_eq!(s.allow_write, vec![dir.join("work"), PathBuf::from("/b")]);
    assert_eq!(s.allow_degraded, vec![Degradation::Landlock]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn example_profile_parses() {
    let p: Options = toml::from_str(include_str!("../../examples/profile.toml")).unwrap();
    assert!(p.mediator_socket.is_some() && p.report && !p.allow_unix_sockets);
}

#[test]
fn config_and_authority_give_the_socket() {
    let dir = scratch("config");
    let cfg = dir.join("mediator.toml");
    std::fs::write(
        &cfg,
        "[listen]\nsocket_dir = \"/run/egress\"\n[[authority]]\nname = \"agent-a\"\n",
    )
    .unwrap();
    let s = as_authority(cfg.to_str().unwrap(), "agent-a").unwrap();
    assert_eq!(
        s.channel,
        ChannelSpec::Socket("/run/egress/agent-a.sock".into())
    );
    assert!(as_authority(cfg.to_str().unwrap(), "../x").is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn credential_placeholders_of_the_authority_become_child_variables() {
    let dir = scratch("cred");
    let cfg = dir.join("mediator.toml");
    std::fs::write(
        &cfg,
        r#"[listen]
socket_dir = "/run/egress"
[tls]
ca_dir = "/nonexistent/ca"
[[authority]]
name = "agent-a"
allow = ["api.test"]
tls_terminate = ["api.test"]
[[authority.credential]]
host = "api.test"
header = "Authorization"
secret_file = "/nonexistent/never-read"
placeholder = "mediator:api:agent-a"
child_env = "API_TOKEN"
[[authority.credential]]
host = "api.test"
header = "X-Key"
secret_env = "K"
[[authority]]
name = "agent-b"
allow = ["api.test"]
tls_terminate = ["api.test"]
[[authority.credential]]
host = "api.test"
header = "Authorization"
secret_env = "B"
placeholder = "mediator:api:agent-b"
child_env = "B_TOKEN"
"#,
    )
    .unwrap();
    let s = as_authority(cfg.to_str().unwrap(), "agent-a").unwrap();
    assert_eq!(
        s.child_env,
        [("API_TOKEN".to_owned(), "mediator:api:agent-a".to_owned())]
    );
    // Every authority's secret_env, not only agent-a's.
    assert_eq!(s.hidden_env, ["K", "B"]);
    // A config the mediator would refuse is refused here too, with its reasons.
    std::fs::write(&cfg, "[listen]\nsocket_dir = \"/run/egress\"\n[[authority]]\nname = \"agent-a\"\nallow = [\"*\"]\n").unwrap();
    let e = as_authority(cfg.to_str().unwrap(), "agent-a")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("invalid mediator config") && e.contains("would allow every host"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_authority_the_config_lacks_is_named_with_the_ones_it_has() {
    let dir = scratch("config-zed");
    let cfg = dir.join("mediator.toml");
    let write = |authorities: &str| {
        std::fs::write(
            &cfg,
            format!("[listen]\nsocket_dir = {dir:?}\n{authorities}"),
        )
        .unwrap();
    };
    write("[[authority]]\nname = \"agent-a\"\n[[authority]]\nname = \"agent-b\"\n");
    let c = cfg.to_str().unwrap();
    let e = as_authority(c, "zed").unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "authority \"zed\" is not in {c} (its authorities: agent-a, agent-b), and no \
             socket {} exists, as one added through the admin API would have",
            dir.join("zed.sock").display()
        )
    );
    write("");
    let e = as_authority(c, "zed").unwrap_err().to_string();
    assert!(e.contains(&format!("{c} (it lists none)")), "{e}");
    // Added through the admin API: not in the file, but its socket exists.
    let _l = std::os::unix::net::UnixListener::bind(dir.join("zed.sock")).unwrap();
    let s = as_authority(c, "zed").unwrap();
    assert_eq!(s.channel, ChannelSpec::Socket(dir.join("zed.sock")));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn config_with_tls_terminate_implies_its_ca_and_ca_cert_wins() {
    let dir = scratch("config-ca");
    let cfg = dir.join("mediator.toml");
    // `other` is not in the file: it has a socket, as if added through the admin API.
    let _other = std::os::unix::net::UnixListener::bind(dir.join("other.sock")).unwrap();
    std::fs::write(
        &cfg,
        format!(
            "[listen]\nsocket_dir = {dir:?}\n[tls]\nca_dir = \"/var/lib/ca\"\n\
             [[authority]]\nname = \"plain\"\nallow = [\"a.example\"]\n\
             [[authority]]\nname = \"mitm\"\nallow = [\"a.example\"]\ntls_terminate = [\"a.example\"]\n"
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let s = as_authority(c, "mitm").unwrap();
    assert_eq!(
        s.ca_cert,
        Some(CaCert {
            path: "/var/lib/ca/ca.pem".into(),
            origin: CaOrigin::Config {
                config: cfg.clone(),
                authority: "mitm".into()
            }
        })
    );
    let s = as_authority(c, "plain").unwrap();
    assert_eq!(s.ca_cert, None);
    // Not in the file (added through the admin API): no CA unless given.
    let s = as_authority(c, "other").unwrap();
    assert_eq!(s.ca_cert, None);
    let s = parse(&[
        "shim",
        "--config",
        c,
        "--authority",
        "mitm",
        "--ca-cert",
        "/x/ca.pem",
        "--",
        "true",
    ])
    .unwrap();
    assert_eq!(
        s.ca_cert,
        Some(CaCert {
            path: "/x/ca.pem".into(),
            origin: CaOrigin::Flag
        })
    );
    // tls_terminate without ca_dir: a usage error, before anything runs.
    std::fs::write(
        &cfg,
        "[listen]\nsocket_dir = \"/run/egress\"\n\
         [[authority]]\nname = \"mitm\"\ntls_terminate = [\"a.example\"]\n",
    )
    .unwrap();
    let e = as_authority(c, "mitm").unwrap_err();
    assert!(e.to_string().contains("ca_dir"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn profile_ca_cert_is_relative_to_the_profile() {
    let dir = scratch("profile-ca");
    let p = dir.join("p.toml");
    std::fs::write(&p, "allow = [\"a.example\"]\nca_cert = \"ca.pem\"\n").unwrap();
    let s = parse(&["shim", "--profile", p.to_str().unwrap(), "--", "true"]).unwrap();
    assert_eq!(s.ca_cert.map(|c| c.path), Some(dir.join("ca.pem")));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_private_tmp_is_on_by_default_sized_or_off() {
    let tmp = |extra: &[&str]| {
        let mut a = vec!["shim", "--mediator-socket", "/s"];
        a.extend_from_slice(extra);
        a.extend(["--", "true"]);
        parse(&a).map(|s| (s.tmp.map(|t| t.as_str().to_owned()), s.cache))
    };
    assert_eq!(tmp(&[]).unwrap(), (Some("50%".into()), None));
    assert_eq!(tmp(&["--tmp-size", "2G"]).unwrap().0.as_deref(), Some("2g"));
    assert_eq!(
        tmp(&["--tmp-size", "512m"]).unwrap().0.as_deref(),
        Some("512m")
    );
    assert_eq!(
        tmp(&["--tmp-size", "25%"]).unwrap().0.as_deref(),
        Some("25%")
    );
    assert_eq!(tmp(&["--no-tmp"]).unwrap().0, None);
    assert!(matches!(tmp(&["--tmp-size", "0"]), Err(Error::Usage(_))));
    for bad in [
        "0", "0m", "101%", "1kk", "x", "", "-1g", "+5", "1.5g", "10 m", "%",
    ] {
        assert!(
            matches!(TmpSize::parse(bad), Err(Error::Usage(_))),
            "{bad:?}"
        );
    }
    assert!(Cli::try_parse_from(["shim", "--no-tmp", "--tmp-size", "1g", "--", "true"]).is_err());
    assert_eq!(
        tmp(&["--cache", "/c"]).unwrap().1,
        Some(PathBuf::from("/c"))
    );
}

#[test]
fn a_profile_turns_the_private_tmp_off_and_keeps_a_cache() {
    let dir = std::env::temp_dir().join(format!("shim-cli-tmp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = dir.join("p.toml");
    std::fs::write(
        &profile,
        "mediator_socket = \"/s\"\ntmp = false\ncache = \"c\"\n",
    )
    .unwrap();
    let s = parse(&["shim", "--profile", profile.to_str().unwrap(), "--", "true"]).unwrap();
    assert_eq!(s.tmp, None);
    assert_eq!(s.cache, Some(dir.join("c")));
    std::fs::write(
        &profile,
        "mediator_socket = \"/s\"\ntmp = false\ntmp_size = \"1g\"\n",
    )
    .unwrap();
    assert!(matches!(
        parse(&["shim", "--profile", profile.to_str().unwrap(), "--", "true"]),
        Err(Error::Usage(_))
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_path_keys_are_the_path_fields() {
    let mut keys = Options::path_keys();
    keys.sort();
    assert_eq!(
        keys,
        [
            "allow_read",
            "allow_write",
            "ca_cert",
            "cache",
            "config",
            "decision_log",
            "deny_read",
            "mediator_socket",
            "report_file",
        ]
    );
}
