//! The private temporary directory and the tools' caches: `/tmp` and `/var/tmp` are one
//! writable tmpfs of the run (bounded, gone at exit, the host's own `/tmp` hidden but for
//! the working directory), `TMPDIR` and the caches' variables point there unless the
//! caller's value is writable, `--cache DIR` keeps the caches across runs, `--no-tmp` turns
//! it all off.

use std::path::Path;

use crate::support::{Fixture, expect, stdout, succeeded};
use crate::{Test, TestResult};

pub(crate) fn tests() -> Vec<(&'static str, Test)> {
    cases![
        tmp_and_var_tmp_are_private_writable_and_gone_at_exit,
        the_private_tmp_is_bounded_by_its_size,
        the_caches_point_into_the_private_tmp_unless_the_caller_can_write_theirs,
        a_cache_directory_keeps_the_caches_across_runs,
        no_tmp_leaves_the_hosts_tmp_read_only_and_the_variables_alone,
        allow_write_tmp_gives_the_hosts_tmp,
        a_program_named_by_its_path_in_the_hosts_tmp_still_runs,
        an_allow_read_in_the_hosts_tmp_is_shown_read_only,
        the_callers_cargo_tokens_are_neither_linked_nor_readable,
    ]
}

/// The command's output, or why the shim failed.
fn run(fx: &Fixture, flags: &[std::ffi::OsString], script: &str) -> Result<String, String> {
    fx.shim(flags, &["sh", "-c", script])
        .env_remove("TMPDIR")
        .output()
        .map_err(|e| e.to_string())
        .and_then(succeeded)
        .map(|o| stdout(&o))
}

fn tmp_and_var_tmp_are_private_writable_and_gone_at_exit() -> TestResult {
    let fx = Fixture::new("tmp");
    std::fs::write(fx.path("here"), "cwd\n").unwrap();
    // A file in the host's /tmp beside the working directory: hidden inside.
    let beside = Path::new("/tmp").join(format!("shim-e2e-beside-{}", std::process::id()));
    std::fs::write(&beside, "host").unwrap();
    let script = format!(
        "echo $TMPDIR; \
         for d in /tmp /var/tmp; do echo x > $d/shim-e2e-private && cat $d/shim-e2e-private; done; \
         mkdir -p /tmp/a/b && echo deep > /tmp/a/b/c && cat /tmp/a/b/c; \
         test -e {beside} && echo host-tmp-visible || echo host-tmp-hidden; \
         cat here; echo y > here 2>/dev/null || echo cwd-read-only; \
         stat -c %a /tmp /var/tmp",
        beside = beside.display()
    );
    let out = run(&fx, &[], &script);
    let _ = std::fs::remove_file(&beside);
    expect(
        "the run",
        &out?,
        "/tmp\nx\nx\ndeep\nhost-tmp-hidden\ncwd\ncwd-read-only\n1777\n1777",
    )?;
    for p in [
        "/tmp/shim-e2e-private",
        "/var/tmp/shim-e2e-private",
        "/tmp/a/b/c",
    ] {
        if Path::new(p).exists() {
            return Err(format!("{p} reached the host"));
        }
    }
    Ok(())
}

fn the_private_tmp_is_bounded_by_its_size() -> TestResult {
    let fx = Fixture::new("tmp-size");
    let out = run(
        &fx,
        &args!["--tmp-size", "4m"],
        "dd if=/dev/zero of=/var/tmp/fill bs=1M count=8 2>/dev/null || echo full; \
         dd if=/dev/zero of=/tmp/more bs=1k count=8 2>/dev/null || echo still-full",
    )?;
    // /tmp and /var/tmp share the one bound.
    expect("writing 8 MiB into 4 MiB", &out, "full\nstill-full")
}

fn the_caches_point_into_the_private_tmp_unless_the_caller_can_write_theirs() -> TestResult {
    let fx = Fixture::new("tmp-caches");
    let w = fx.mkdir("work");
    let vars = "TMPDIR XDG_CACHE_HOME PIP_CACHE_DIR npm_config_cache GOCACHE GOMODCACHE CARGO_HOME APT_CONFIG";
    let script = format!(
        "for v in {vars}; do eval echo $v=\\$$v; done; \
         for d in $XDG_CACHE_HOME $CARGO_HOME; do test -d $d && test -w $d || echo $d not-writable; done; \
         grep -c 'APT::Sandbox::User \"root\"' $APT_CONFIG"
    );
    let out = fx
        .shim(&args!["--allow-write", &w], &["sh", "-c", &script])
        .env("TMPDIR", w.join("t"))
        .env("XDG_CACHE_HOME", "/nonexistent-shim-cache")
        .env("NPM_CONFIG_CACHE", w.join("npm"))
        .output()
        .unwrap();
    let w = w.display();
    expect(
        "the variables",
        &stdout(&succeeded(out)?),
        &format!(
            "TMPDIR={w}/t\nXDG_CACHE_HOME=/tmp/cache\nPIP_CACHE_DIR=/tmp/cache/pip\n\
             npm_config_cache=\nGOCACHE=/tmp/cache/go-build\nGOMODCACHE=/tmp/cache/go-mod\n\
             CARGO_HOME=/tmp/cache/cargo\nAPT_CONFIG=/tmp/.shim/apt.conf\n1"
        ),
    )
}

fn a_cache_directory_keeps_the_caches_across_runs() -> TestResult {
    let fx = Fixture::new("tmp-cache-dir");
    let home = fx.mkdir("home");
    std::fs::create_dir_all(home.join(".cargo")).unwrap();
    std::fs::write(home.join(".cargo/config.toml"), "[net]\nretry = 1\n").unwrap();
    let cache = fx.path("keep/cache");
    let flags = args!["--cache", &cache];
    let first = fx
        .shim(
            &flags,
            &[
                "sh",
                "-c",
                "mkdir -p $PIP_CACHE_DIR && echo kept > $PIP_CACHE_DIR/f && cat $CARGO_HOME/config.toml && echo $XDG_CACHE_HOME",
            ],
        )
        .env("HOME", &home)
        .env_remove("CARGO_HOME")
        .output()
        .unwrap();
    expect(
        "the first run",
        &stdout(&succeeded(first)?),
        &format!("[net]\nretry = 1\n{}", cache.display()),
    )?;
    let second = run(&fx, &flags, "cat $PIP_CACHE_DIR/f")?;
    expect("the second run", &second, "kept")?;
    expect(
        "on the host",
        &std::fs::read_to_string(cache.join("pip/f")).unwrap_or_default(),
        "kept\n",
    )
}

fn no_tmp_leaves_the_hosts_tmp_read_only_and_the_variables_alone() -> TestResult {
    let fx = Fixture::new("no-tmp");
    let out = fx
        .shim(
            &args!["--no-tmp"],
            &[
                "sh",
                "-c",
                "echo x > /tmp/shim-e2e-no-tmp 2>/dev/null || echo read-only; echo \"$TMPDIR|$XDG_CACHE_HOME|$CARGO_HOME\"",
            ],
        )
        .env("TMPDIR", "/caller/tmp")
        .env_remove("XDG_CACHE_HOME")
        .env_remove("CARGO_HOME")
        .output()
        .unwrap();
    expect(
        "with --no-tmp",
        &stdout(&succeeded(out)?),
        "read-only\n/caller/tmp||",
    )
}

fn allow_write_tmp_gives_the_hosts_tmp() -> TestResult {
    let fx = Fixture::new("tmp-allow");
    let name = format!("shim-e2e-host-tmp-{}", std::process::id());
    let host = Path::new("/tmp").join(&name);
    let out = run(
        &fx,
        &args!["--allow-write", "/tmp"],
        &format!("echo x > /tmp/{name} && echo wrote"),
    );
    let landed = host.exists();
    let _ = std::fs::remove_file(&host);
    expect("with --allow-write /tmp", &out?, "wrote")?;
    if landed {
        Ok(())
    } else {
        Err("the write did not reach the host's /tmp".into())
    }
}

fn a_program_named_by_its_path_in_the_hosts_tmp_still_runs() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let fx = Fixture::new("tmp-program");
    let work = fx.mkdir("work");
    let bin = fx.mkdir("bin");
    let tool = bin.join("tool.sh");
    std::fs::write(
        &tool,
        "#!/bin/sh\necho ran $(cat \"$(dirname \"$0\")/data\")\n",
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(bin.join("data"), "beside").unwrap();
    let out = std::process::Command::new(crate::support::SHIM)
        .args(["--mediator-socket"])
        .arg(&fx.socket)
        .arg("--")
        .arg(&tool)
        .current_dir(&work)
        .output()
        .unwrap();
    expect("the program", &stdout(&succeeded(out)?), "ran beside")
}

/// A file and a directory of the host's `/tmp` that `--allow-read` names are shown,
/// read-only, in the private one; what is beside them stays hidden.
fn an_allow_read_in_the_hosts_tmp_is_shown_read_only() -> TestResult {
    let fx = Fixture::new("tmp-allow-read");
    let work = fx.mkdir("work");
    let host = Path::new("/tmp").join(format!("shim-e2e-read-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&host);
    std::fs::create_dir_all(host.join("dir")).unwrap();
    std::fs::write(host.join("dir/f"), "in dir\n").unwrap();
    std::fs::write(host.join("file"), "a file\n").unwrap();
    std::fs::write(host.join("beside"), "x").unwrap();
    let script = format!(
        "cat {h}/dir/f {h}/file; echo y > {h}/file 2>/dev/null || echo read-only; \
         test -e {h}/beside && echo beside-visible || echo beside-hidden",
        h = host.display()
    );
    let out = std::process::Command::new(crate::support::SHIM)
        .arg("--mediator-socket")
        .arg(&fx.socket)
        .args(args![
            "--allow-read",
            host.join("dir"),
            "--allow-read",
            host.join("file")
        ])
        .args(["--", "sh", "-c", &script])
        .current_dir(&work)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&host);
    expect(
        "the named paths",
        &stdout(&succeeded(out)?),
        "in dir\na file\nread-only\nbeside-hidden",
    )
}

/// The run's cargo home links the caller's cargo configuration, never its registry tokens
/// (`credentials.toml`, `credentials`), and the caller's own token files are masked: the
/// command cannot read them where they are either (design section 14).
fn the_callers_cargo_tokens_are_neither_linked_nor_readable() -> TestResult {
    let fx = Fixture::new("tmp-cargo-tokens");
    let home = fx.mkdir("home");
    std::fs::create_dir_all(home.join(".cargo")).unwrap();
    std::fs::write(home.join(".cargo/config.toml"), "[net]\nretry = 1\n").unwrap();
    for f in ["credentials.toml", "credentials"] {
        std::fs::write(home.join(".cargo").join(f), "[registry]\ntoken = \"t\"\n").unwrap();
    }
    let script = "cat $CARGO_HOME/config.toml; \
         ls -A $CARGO_HOME; \
         for f in credentials.toml credentials; do \
           grep -q token $HOME/.cargo/$f 2>/dev/null && echo $f readable || echo $f unreadable; \
         done";
    let out = fx
        .shim(&[], &["sh", "-c", script])
        .env("HOME", &home)
        .env_remove("CARGO_HOME")
        .output()
        .unwrap();
    expect(
        "the run's cargo home, the caller's tokens",
        &stdout(&succeeded(out)?),
        "[net]\nretry = 1\nconfig.toml\ncredentials.toml unreadable\ncredentials unreadable",
    )
}
