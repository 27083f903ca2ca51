//! The CA the command trusts (`--ca-cert`, or the config's CA for an authority that
//! terminates TLS): the CA variables name read-only files holding it (after the system
//! bundle), nothing is left behind, and without a CA the caller's variables stay.

use std::path::Path;

use crate::support::{
    CA_VARS, Fixture, SYSTEM_BUNDLES, entries, expect, probe_command, stdout, succeeded, write_ca,
};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        ca_cert_exports_read_only_bundles_and_leaves_nothing_behind,
        without_a_ca_no_ca_variable_is_set_and_the_callers_are_kept,
        config_authority_with_tls_terminate_trusts_the_config_ca,
        the_jvm_and_wget_get_files_naming_the_ca,
    ]
}

/// What `probe ca-check` prints when every CA variable names a read-only file holding
/// the CA (and the bundles the system certificates before it). Writing fails on the
/// files' mode (0444) first; chmod and unlink, which the owner could otherwise do, show
/// the read-only mount.
fn ca_check_all_set() -> String {
    let system = if SYSTEM_BUNDLES.iter().any(|p| Path::new(p).exists()) {
        "system"
    } else {
        "no-system"
    };
    CA_VARS
        .iter()
        .map(|v| {
            let (ca, sys) = if *v == "NODE_EXTRA_CA_CERTS" {
                ("only", "no-system")
            } else {
                ("last", system)
            };
            format!("{v} read=ok write=err:EACCES chmod=err:EROFS remove=err:EROFS ca={ca} {sys}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `Err` naming what the shim left in `tmp` (its TMPDIR).
fn nothing_left_in(tmp: &Path) -> TestResult {
    let left = entries(tmp);
    if left.is_empty() {
        Ok(())
    } else {
        Err(format!("left in {}: {left:?}", tmp.display()))
    }
}

fn ca_cert_exports_read_only_bundles_and_leaves_nothing_behind() -> TestResult {
    let fx = Fixture::new("ca");
    let ca = fx.path("ca.pem");
    write_ca(&ca);
    let w = fx.path("work");
    let hidden = fx.path("hidden");
    // The shim's temporary directory inside a writable root, then inside a masked one:
    // the CA files stay read-only in the first and readable in the second.
    for (tmp, mut flags) in [
        (w.join("tmp"), Vec::from(args!["--allow-write", &w])),
        (hidden.join("tmp"), Vec::from(args!["--deny-read", &hidden])),
    ] {
        std::fs::create_dir_all(&tmp).unwrap();
        let what = format!("CA variables ({flags:?})");
        flags.extend(args!["--ca-cert", &ca]);
        let out = fx
            .probe_command(&flags, &args!["ca-check", &ca])
            .env("TMPDIR", &tmp)
            .env("SSL_CERT_FILE", "/caller/bundle.pem")
            .env("NODE_EXTRA_CA_CERTS", "/caller/extra.pem")
            .output()
            .unwrap();
        expect(&what, &stdout(&succeeded(out)?), &ca_check_all_set())?;
        nothing_left_in(&tmp)?;
    }
    Ok(())
}

fn without_a_ca_no_ca_variable_is_set_and_the_callers_are_kept() -> TestResult {
    let fx = Fixture::new("noca");
    let ca = fx.path("ca.pem");
    write_ca(&ca);
    let tmp = fx.mkdir("tmp");
    let mut cmd = fx.probe_command(&[], &args!["ca-check", &ca]);
    cmd.env("TMPDIR", &tmp);
    for v in CA_VARS {
        cmd.env_remove(v);
    }
    let want = CA_VARS
        .iter()
        .map(|v| format!("{v} unset"))
        .collect::<Vec<_>>()
        .join("\n");
    expect("no CA variable", &stdout(&cmd.output().unwrap()), &want)?;
    let out = fx
        .probe_command(&[], &args!["env", "SSL_CERT_FILE", "CURL_CA_BUNDLE"])
        .env("TMPDIR", &tmp)
        .env("SSL_CERT_FILE", "/caller/bundle.pem")
        .env_remove("CURL_CA_BUNDLE")
        .output()
        .unwrap();
    expect(
        "the caller's CA variable",
        &stdout(&out),
        "/caller/bundle.pem",
    )?;
    nothing_left_in(&tmp)
}

fn config_authority_with_tls_terminate_trusts_the_config_ca() -> TestResult {
    let fx = Fixture::new("cfgca"); // <socket_dir>/authority.sock
    let socket_dir = fx.socket.parent().unwrap().to_owned();
    let ca_dir = fx.path("ca");
    let cfg = fx.path("mediator.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\nsocket_dir = {:?}\n[tls]\nca_dir = {:?}\n\
             [[authority]]\nname = \"authority\"\nallow = [\"a.example\"]\n\
             tls_terminate = [\"a.example\"]\n",
            socket_dir.to_str().unwrap(),
            ca_dir.to_str().unwrap()
        ),
    )
    .unwrap();
    let ca_pem = ca_dir.join("ca.pem");
    let run = || {
        probe_command(
            &args!["--config", &cfg, "--authority", "authority"],
            &args!["ca-check", &ca_pem],
        )
        .current_dir(&fx.dir.0)
        .output()
        .unwrap()
    };
    // No CA yet: a clear error naming the file and the command that creates it; the
    // shim creates nothing.
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    let how = format!("mediator ca-cert --config {}", cfg.display());
    if out.status.code() != Some(125)
        || !err.contains(ca_pem.to_str().unwrap())
        || !err.contains(&how)
    {
        return Err(format!("missing CA: {:?} {err}", out.status));
    }
    if ca_dir.exists() {
        return Err("the shim created the CA directory".into());
    }
    certs::Ca::create(&certs::CaOptions::default())
        .unwrap()
        .persist(&ca_dir)
        .unwrap();
    expect(
        "CA variables from the config's CA",
        &stdout(&succeeded(run())?),
        &ca_check_all_set(),
    )
}

/// Java reads no CA variable: its options name a JKS trust store the shim wrote (after the
/// caller's own options); wget's startup file names the bundle.
fn the_jvm_and_wget_get_files_naming_the_ca() -> TestResult {
    let fx = Fixture::new("ca-jvm");
    let ca = fx.path("ca.pem");
    write_ca(&ca);
    let out = fx
        .shim(
            &args!["--ca-cert", &ca],
            &[
                "sh",
                "-c",
                "set -- $JAVA_TOOL_OPTIONS; echo $1; store=${2#-Djavax.net.ssl.trustStore=}; \
                 echo $3 $4; od -An -tx1 -N4 $store | tr -d ' '; \
                 test \"$(cat $WGETRC | grep ca_certificate)\" = \"ca_certificate = $SSL_CERT_FILE\" && echo wgetrc-names-the-bundle",
            ],
        )
        .env("JAVA_TOOL_OPTIONS", "-Xmx64m")
        .env_remove("WGETRC")
        .env("HOME", fx.path("home"))
        .output()
        .unwrap();
    expect(
        "the JVM's options and wget's file",
        &stdout(&succeeded(out)?),
        "-Xmx64m\n-Djavax.net.ssl.trustStoreType=JKS -Djavax.net.ssl.trustStorePassword=changeit\nfeedfeed\nwgetrc-names-the-bundle",
    )
}
