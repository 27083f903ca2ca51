//! Unit tests of `secrets`.

use super::*;

use crate::testing::TempDir;

fn parse(text: &str) -> policy::config::Config {
    policy::config::parse(text, "m.toml").unwrap()
}

fn whats(paths: &[MediatorPath]) -> Vec<(String, bool)> {
    paths
        .iter()
        .map(|m| (m.path.display().to_string(), m.mask))
        .collect()
}

#[test]
fn every_secret_the_config_names_is_found() {
    let config = parse(
        r#"
[listen]
socket_dir = "/run/m"
admin_socket = "/run/m-admin/admin.sock"
[tls]
ca_dir = "/srv/ca"
[upstream]
mode = "parent"
parents = ["http://user:pass@127.0.0.1:3128"]
parent_credentials_file = "/srv/parents.cred"
kerberos_ccache = "FILE:/srv/krb5cc"
kerberos_keytab = "/srv/m.keytab"
[registry]
state_dir = "/srv/state"
[[authority]]
name = "a"
allow = ["api.example"]
tls_terminate = ["api.example"]
[[authority.credential]]
host = "api.example"
header = "Authorization"
secret_file = "/srv/secrets/a"
[[authority]]
name = "b"
allow = ["api.example"]
tls_terminate = ["api.example"]
[[authority.credential]]
host = "api.example"
header = "Authorization"
secret_file = "/srv/secrets/b"
[[authority.credential]]
host = "api.example"
header = "X-Key"
secret_env = "B_KEY"
"#,
    );
    let found = from_config(&config, Path::new("/etc/m.toml"));
    assert_eq!(
        whats(&found),
        [
            "/srv/secrets/a",
            "/srv/secrets/b",
            "/srv/ca",
            "/srv/state",
            "/srv/parents.cred",
            "/srv/krb5cc",
            "/srv/m.keytab",
            "/run/m-admin/admin.sock",
            "/etc/m.toml",
        ]
        .map(|p| (p.to_owned(), true))
    );
    assert!(
        found[0].what.ends_with("credential[1]: secret_file"),
        "{}",
        found[0].what
    );
    assert_eq!(
        found[2].keep_readable.as_deref(),
        Some(Path::new("/srv/ca/ca.pem"))
    );
    assert_eq!(
        found[7].origin,
        Origin::Default,
        "the admin socket exists once the mediator runs"
    );
    assert!(found[8].what.contains("password"));
}

#[test]
fn a_config_without_a_password_is_guarded_not_masked_and_etcd_keys_count() {
    let config = parse(
        r#"
[listen]
socket_dir = "/run/m"
[upstream]
mode = "pac"
pac = "/srv/proxy.pac"
kerberos_ccache = "KEYRING:persistent:0"
[registry]
backend = "etcd"
endpoints = ["https://127.0.0.1:2379"]
ca_file = "/srv/etcd-ca.pem"
cert_file = "/srv/etcd.pem"
key_file = "/srv/etcd.key"
"#,
    );
    assert_eq!(
        whats(&from_config(&config, Path::new("m.toml"))),
        [
            ("/srv/etcd.key".to_owned(), true),
            ("/srv/proxy.pac".to_owned(), true),
            ("m.toml".to_owned(), false),
        ]
    );
}

#[test]
fn kerberos_names_are_files_only_when_they_say_so() {
    assert_eq!(kerberos_path("FILE:/tmp/cc"), Some(Path::new("/tmp/cc")));
    assert_eq!(kerberos_path("DIR:/run/cc"), Some(Path::new("/run/cc")));
    assert_eq!(
        kerberos_path("/etc/k.keytab"),
        Some(Path::new("/etc/k.keytab"))
    );
    assert_eq!(kerberos_path("KEYRING:persistent:0"), None);
    assert_eq!(kerberos_path("FILE:relative"), None);
}

#[test]
fn defaults_follow_the_environment_and_skip_state_directory() {
    let env = |k: &str| match k {
        "XDG_STATE_HOME" => Some("/x".into()),
        "HOME" => Some("/h".into()),
        "STATE_DIRECTORY" => Some("/var/lib/runner".into()),
        _ => None,
    };
    let paths: Vec<PathBuf> = defaults(env).into_iter().map(|m| m.path).collect();
    assert_eq!(
        paths,
        [
            "/x/egress-mediator",
            "/h/.local/state/egress-mediator",
            "/var/lib/egress-mediator",
            "/etc/egress-mediator",
        ]
        .map(PathBuf::from)
    );
    assert!(defaults(|_| Some("relative".into())).len() == 2);
}

#[test]
fn settle_masks_what_exists_and_keeps_the_ca_certificate_readable() {
    let t = TempDir::new("secrets-settle");
    let ca = t.tree("ca", &[("ca.pem", "cert"), ("ca-key.pem", "key")]);
    let secret = t.0.join("secret");
    std::fs::write(&secret, "s").unwrap();
    let paths = vec![
        MediatorPath {
            keep_readable: Some(ca.join("ca.pem")),
            ..MediatorPath::named(&ca, "[tls] ca_dir")
        },
        MediatorPath::named(&secret, "secret_file"),
        MediatorPath::default_location(t.0.join("absent"), "default"),
        MediatorPath::named(&secret, "secret_file again"),
    ];
    let settled = settle(paths, &[t.0.join("work")], &[]).unwrap();
    assert_eq!(settled.masks, [ca.clone(), secret]);
    assert_eq!(settled.reopen, [ca.join("ca.pem")]);
    assert_eq!(
        settled.masked.len(),
        2,
        "a missing default and a repeat are not listed"
    );
}

#[test]
fn settle_refuses_a_missing_config_path_a_write_root_overlap_and_a_reopen() {
    let t = TempDir::new("secrets-refuse");
    let w = t.tree("w", &[("sub/", ""), ("secret", "s")]);
    std::os::unix::fs::symlink(w.join("secret"), t.0.join("link")).unwrap();
    let refused =
        |m: MediatorPath, write: &[PathBuf], read: &[PathBuf]| match settle(vec![m], write, read) {
            Err(Error::MediatorPath { detail, .. }) => detail,
            other => panic!("not refused: {other:?}"),
        };
    let roots = [w.clone()];
    assert!(
        refused(
            MediatorPath::named(t.0.join("missing"), "secret_file"),
            &roots,
            &[]
        )
        .starts_with("does not exist")
    );
    let sub = [w.join("sub")];
    for (path, roots, why) in [
        (
            MediatorPath::named(w.join("secret"), "secret_file"),
            &roots,
            "inside the writable root",
        ),
        // A link outside whose target is inside, and a path that holds the root.
        (
            MediatorPath::named(t.0.join("link"), "secret_file"),
            &roots,
            "inside the writable root",
        ),
        (
            MediatorPath::named(&t.0, "state_dir"),
            &sub,
            "holds the writable root",
        ),
        // A default location is refused there too, but only when it exists.
        (
            MediatorPath::default_location(w.join("secret"), "d"),
            &roots,
            "inside the writable root",
        ),
    ] {
        let detail = refused(path.clone(), roots, &[]);
        assert!(detail.contains(why), "{path:?}: {detail}");
    }
    assert!(
        settle(
            vec![MediatorPath::default_location(w.join("none"), "d")],
            &roots,
            &[]
        )
        .is_ok()
    );
    // A config without a password is not masked, but kept out of the roots all the same.
    let config = MediatorPath {
        mask: false,
        ..MediatorPath::named(w.join("secret"), "the config file")
    };
    assert!(refused(config.clone(), &roots, &[]).contains("inside the writable root"));
    assert!(settle(vec![config], &[], &[]).unwrap().masks.is_empty());
    assert!(
        refused(MediatorPath::named(&w, "ca_dir"), &[], &[w.join("sub")]).contains("--allow-read")
    );
}
