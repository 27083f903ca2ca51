//! Where the command's temporary files and its tools' caches go: the variables the
//! everyday clients read, pointed at the run's private temporary directory (or at
//! `--cache DIR`), so that `pip`, `npm`, `cargo` and `go` work in a read-only tree
//! without the caller setting anything.
//!
//! Which variable each tool reads, from the tools themselves (docs/shim.md has the table):
//!
//! - `TMPDIR`: Python's `tempfile`, Go's `os.TempDir`, Node's `os.tmpdir()`, `mktemp`;
//! - `XDG_CACHE_HOME`: pip (through `platformdirs`), Go's `os.UserCacheDir` (so `GOCACHE`),
//!   Deno, uv, corepack; set so that tools we do not name find a writable cache too;
//! - `PIP_CACHE_DIR`: pip's `cache-dir` option, in case the caller's config names one;
//! - `npm_config_cache`: npm's `cache` option (default `~/.npm`, which also holds its logs
//!   and `npx`'s packages);
//! - `GOCACHE`, `GOMODCACHE`: Go's build cache and module cache (the latter defaults to
//!   `$GOPATH/pkg/mod`, `~/go/pkg/mod`, not to a cache directory);
//! - `CARGO_HOME`: cargo keeps its registry index, downloaded crates and git checkouts
//!   there, beside its configuration; the run's own cargo home links the caller's
//!   `config.toml` (and its older name), read-only as it is, never its registry tokens
//!   (`credentials.toml`, which every run masks: [`cargo_credentials`]);
//! - `APT_CONFIG`: a file apt reads before its own, setting `APT::Sandbox::User "root"`
//!   (apt drops to the `_apt` user for downloads, which needs `setgroups` and a second
//!   uid the sandbox does not have), and, with a CA, `Acquire::https::CaInfo`.
//!
//! A variable the caller set is kept when it names a place beneath a writable root
//! (`--allow-write`, `--cache`); otherwise it would name a read-only or missing place,
//! and it is replaced.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::env::CaFiles;

/// What the run's temporary directory and caches need, planned by the outer shim and made
/// by the sandbox before the command starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Scratch {
    /// Variables set in the command's environment (a caller's value of the same name, in
    /// any case, is dropped).
    pub(crate) vars: Vec<(OsString, OsString)>,
    /// Directories made (with their parents) before the command starts.
    pub(crate) dirs: Vec<PathBuf>,
    /// Symbolic links made then, `(link, target)`; a link already there is replaced,
    /// anything else left alone.
    pub(crate) links: Vec<(PathBuf, PathBuf)>,
    /// Files written then, `(path, content)`.
    pub(crate) files: Vec<(PathBuf, String)>,
}

/// The cargo home entries the run's own cargo home links to the caller's: its
/// configuration (cargo reads both names).
const CARGO_LINKED: &[&str] = &["config.toml", "config"];

/// The cargo home entries that hold registry tokens (cargo reads both names): never
/// linked, and masked in every run ([`cargo_credentials`]).
const CARGO_CREDENTIALS: &[&str] = &["credentials.toml", "credentials"];

/// Where the shim's own files for the command go, in the private temporary directory.
const SHIM_DIR: &str = ".shim";

/// What the run's temporary directory and caches are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Places<'a> {
    /// The private temporary directory (`/tmp`), if the run has one.
    pub(crate) tmp: Option<&'a Path>,
    /// `--cache DIR` (canonical), if given.
    pub(crate) cache: Option<&'a Path>,
    /// The caller's home directory, where the caller's cargo home is by default.
    pub(crate) home: Option<&'a Path>,
}

/// Plan the temporary directory and caches for a command whose inherited environment is
/// `env`: `writable` says whether a path is beneath a writable root; `ca` the CA files,
/// if any (for apt). Nothing is planned without a private temporary directory or a cache
/// directory.
pub(crate) fn plan(
    env: &[(OsString, OsString)],
    places: Places<'_>,
    writable: impl Fn(&Path) -> bool,
    ca: Option<&CaFiles>,
) -> Scratch {
    let get = |name: &str| {
        env.iter()
            .find(|(k, _)| k.as_bytes().eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v.as_os_str())
            .filter(|v| !v.is_empty())
    };
    let kept = |name: &str| get(name).is_some_and(|v| writable(Path::new(v)));
    let mut s = Scratch::default();
    let set = |s: &mut Scratch, name: &str, value: &Path| {
        s.vars.push((name.into(), value.as_os_str().to_owned()));
    };
    if let Some(tmp) = places.tmp
        && !kept("TMPDIR")
    {
        set(&mut s, "TMPDIR", tmp);
    }
    let base = match (places.cache, places.tmp) {
        (Some(c), _) => c.to_owned(),
        (None, Some(t)) => t.join("cache"),
        (None, None) => return s,
    };
    s.dirs.push(base.clone());
    for (name, sub) in [
        ("XDG_CACHE_HOME", None),
        ("PIP_CACHE_DIR", Some("pip")),
        ("npm_config_cache", Some("npm")),
        ("GOCACHE", Some("go-build")),
    ] {
        if !kept(name) {
            set(
                &mut s,
                name,
                &sub.map_or_else(|| base.clone(), |d| base.join(d)),
            );
        }
    }
    // Go's module cache follows GOPATH when only that is set.
    let follows_gopath = get("GOMODCACHE").is_none() && kept("GOPATH");
    if !kept("GOMODCACHE") && !follows_gopath {
        set(&mut s, "GOMODCACHE", &base.join("go-mod"));
    }
    if !kept("CARGO_HOME") {
        let home = base.join("cargo");
        let theirs = get("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| places.home.map(|h| h.join(".cargo")));
        s.dirs.push(home.clone());
        for name in CARGO_LINKED {
            if let Some(target) = theirs.as_ref().map(|t| t.join(name))
                && std::fs::symlink_metadata(&target).is_ok()
            {
                s.links.push((home.join(name), target));
            }
        }
        set(&mut s, "CARGO_HOME", &home);
    }
    if let Some(tmp) = places.tmp
        && get("APT_CONFIG").is_none()
    {
        let dir = tmp.join(SHIM_DIR);
        let file = dir.join("apt.conf");
        s.dirs.push(dir);
        s.files.push((file.clone(), apt_conf(ca)));
        set(&mut s, "APT_CONFIG", &file);
    }
    s
}

/// The caller's cargo registry tokens that exist (`credentials.toml`, `credentials` in
/// `cargo_home`, the caller's `CARGO_HOME`, and in `~/.cargo` of `home`): the run masks
/// them, as it masks the mediator's secrets (design section 14: a token the command
/// holds can go wherever it may talk; a registry credential belongs in the mediator's
/// `[[authority.credential]]`).
pub(crate) fn cargo_credentials(cargo_home: Option<&Path>, home: Option<&Path>) -> Vec<PathBuf> {
    let dirs = cargo_home
        .map(Path::to_owned)
        .into_iter()
        .chain(home.map(|h| h.join(".cargo")));
    let mut out: Vec<PathBuf> = Vec::new();
    for file in dirs.flat_map(|d| CARGO_CREDENTIALS.iter().map(move |n| d.join(n))) {
        if std::fs::symlink_metadata(&file).is_ok() && !out.contains(&file) {
            out.push(file);
        }
    }
    out
}

/// The apt configuration the command's apt reads first (`APT_CONFIG`).
fn apt_conf(ca: Option<&CaFiles>) -> String {
    let mut conf = String::from(
        "// Written by the shim for this run (docs/shim.md): downloads run as the calling\n\
         // user, since the sandbox has no _apt user to drop to.\n\
         APT::Sandbox::User \"root\";\n",
    );
    if let Some(ca) = ca {
        // apt's https method (GnuTLS) reads no CA variable; the bundle holds the system's
        // certificates and the mediator's CA.
        conf.push_str(&format!(
            "Acquire::https::CaInfo \"{}\";\n",
            ca.bundle.display()
        ));
    }
    conf
}

impl Scratch {
    /// Make the directories, links and files, in the sandbox, before the command starts.
    /// What cannot be made is said on stderr: the command still runs (a tool then says
    /// what it misses).
    pub(crate) fn prepare(&self) {
        for d in &self.dirs {
            if let Err(e) = std::fs::create_dir_all(d) {
                eprintln!("shim: warning: cannot make {}: {e}", d.display());
            }
        }
        for (link, target) in &self.links {
            if std::fs::symlink_metadata(link).is_ok_and(|m| m.file_type().is_symlink()) {
                let _ = std::fs::remove_file(link);
            }
            match std::os::unix::fs::symlink(target, link) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => eprintln!("shim: warning: cannot link {}: {e}", link.display()),
            }
        }
        for (path, content) in &self.files {
            if let Err(e) = std::fs::write(path, content) {
                eprintln!("shim: warning: cannot write {}: {e}", path.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var<'a>(s: &'a Scratch, name: &str) -> Option<&'a str> {
        s.vars
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.to_str())
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    fn tmp() -> Places<'static> {
        Places {
            tmp: Some(Path::new("/tmp")),
            cache: None,
            home: None,
        }
    }

    #[test]
    fn the_private_tmp_holds_every_cache_by_default() {
        let s = plan(&[], tmp(), |_| false, None);
        assert_eq!(var(&s, "TMPDIR"), Some("/tmp"));
        assert_eq!(var(&s, "XDG_CACHE_HOME"), Some("/tmp/cache"));
        assert_eq!(var(&s, "PIP_CACHE_DIR"), Some("/tmp/cache/pip"));
        assert_eq!(var(&s, "npm_config_cache"), Some("/tmp/cache/npm"));
        assert_eq!(var(&s, "GOCACHE"), Some("/tmp/cache/go-build"));
        assert_eq!(var(&s, "GOMODCACHE"), Some("/tmp/cache/go-mod"));
        assert_eq!(var(&s, "CARGO_HOME"), Some("/tmp/cache/cargo"));
        assert_eq!(var(&s, "APT_CONFIG"), Some("/tmp/.shim/apt.conf"));
        assert!(s.dirs.contains(&PathBuf::from("/tmp/cache/cargo")));
        let (path, conf) = &s.files[0];
        assert_eq!(path, Path::new("/tmp/.shim/apt.conf"));
        assert!(conf.contains("APT::Sandbox::User \"root\";"), "{conf}");
        assert!(!conf.contains("CaInfo"), "{conf}");
    }

    #[test]
    fn a_callers_variable_stays_only_where_the_command_can_write() {
        let inherited = env(&[
            ("TMPDIR", "/work/tmp"),
            ("XDG_CACHE_HOME", "/root/.cache"),
            ("NPM_CONFIG_CACHE", "/work/npm"),
            ("GOPATH", "/work/go"),
        ]);
        let s = plan(&inherited, tmp(), |p| p.starts_with("/work"), None);
        assert_eq!(var(&s, "TMPDIR"), None, "kept: writable");
        assert_eq!(var(&s, "XDG_CACHE_HOME"), Some("/tmp/cache"), "replaced");
        assert_eq!(var(&s, "npm_config_cache"), None, "kept, in any case");
        assert_eq!(var(&s, "GOMODCACHE"), None, "follows the writable GOPATH");
    }

    /// The config refuses a credential `child_env` naming one of the policy crate's lists.
    #[test]
    fn every_variable_it_sets_is_one_a_child_env_may_not_name() {
        let s = plan(&[], tmp(), |_| false, None);
        assert_eq!(s.vars.len(), policy::config::SHIM_SCRATCH_VARS.len());
        for (k, _) in &s.vars {
            let k = k.to_str().unwrap();
            assert!(
                policy::config::SHIM_SCRATCH_VARS
                    .iter()
                    .any(|v| v.eq_ignore_ascii_case(k)),
                "{k}"
            );
        }
    }

    #[test]
    fn a_cache_directory_holds_the_caches_and_the_apt_conf_names_the_ca() {
        let cache = Places {
            cache: Some(Path::new("/keep")),
            ..tmp()
        };
        let ca = CaFiles {
            bundle: "/t/bundle.pem".into(),
            ca_only: "/t/ca.pem".into(),
            java: "/t/truststore.jks".into(),
            wgetrc: "/t/wgetrc".into(),
        };
        let s = plan(&[], cache, |_| false, Some(&ca));
        assert_eq!(var(&s, "XDG_CACHE_HOME"), Some("/keep"));
        assert_eq!(var(&s, "CARGO_HOME"), Some("/keep/cargo"));
        assert_eq!(var(&s, "TMPDIR"), Some("/tmp"));
        assert!(
            s.files[0]
                .1
                .contains("Acquire::https::CaInfo \"/t/bundle.pem\";")
        );
        let none = Places {
            tmp: None,
            cache: None,
            home: None,
        };
        assert_eq!(plan(&[], none, |_| false, None), Scratch::default());
    }

    #[test]
    fn the_runs_cargo_home_links_the_callers_configuration_not_its_tokens() {
        let home = std::env::temp_dir().join(format!("shim-caches-{}", std::process::id()));
        std::fs::create_dir_all(home.join(".cargo/registry")).unwrap();
        for f in ["config.toml", "credentials.toml", "credentials"] {
            std::fs::write(home.join(".cargo").join(f), "").unwrap();
        }
        let places = Places {
            home: Some(&home),
            ..tmp()
        };
        let s = plan(&[], places, |_| false, None);
        assert_eq!(
            s.links,
            vec![(
                PathBuf::from("/tmp/cache/cargo/config.toml"),
                home.join(".cargo/config.toml")
            )]
        );
        // The tokens are masked instead, found in CARGO_HOME and in ~/.cargo.
        let theirs = home.join("theirs");
        std::fs::create_dir_all(&theirs).unwrap();
        std::fs::write(theirs.join("credentials.toml"), "").unwrap();
        assert_eq!(
            cargo_credentials(Some(&theirs), Some(&home)),
            [
                theirs.join("credentials.toml"),
                home.join(".cargo/credentials.toml"),
                home.join(".cargo/credentials")
            ]
        );
        std::fs::remove_dir_all(&home).unwrap();
    }
}
