//! A throwaway MIT Kerberos realm on loopback for the Negotiate tests: `kdb5_util` creates
//! the database in a temp dir, `kadmin.local` adds principals and writes keytabs, `krb5kdc`
//! runs in the foreground on a free loopback port, and `kinit` fills credential caches.
//! Every tool gets `KRB5_CONFIG` / `KRB5_KDC_PROFILE` pointing at files in the temp dir:
//! nothing system-wide is read or changed. The KDC is killed when the [`Kdc`] is dropped.
//!
//! Also the acceptor side of a Negotiate parent ([`Acceptor`]): GSSAPI (MIT krb5's
//! library loaded by the `gss` crate, as the mediator loads it) with a service keytab.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use gss::{Gssapi, Usage};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use crate::tool::Tool;
use crate::wait::wait_for;

/// The test realm.
pub const REALM: &str = "E2E.TEST";

/// The KDC, its realm files and the tools' environment.
#[derive(Debug)]
pub struct Kdc {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
}

impl Kdc {
    /// Creates the realm [`REALM`] in a temp dir and starts its KDC on loopback.
    ///
    /// # Errors
    /// A tool is missing (install `krb5-kdc`, `krb5-admin-server`, `krb5-user`) or fails.
    pub async fn start() -> Result<Self> {
        let dir = tempfile::tempdir().context("creating the realm dir")?;
        let port = crate::port::unclaimed_port()?.port();
        let d = dir.path().display();
        std::fs::write(
            dir.path().join("krb5.conf"),
            format!(
                "[libdefaults]\n default_realm = {REALM}\n dns_lookup_kdc = false\n dns_lookup_realm = false\n dns_canonicalize_hostname = false\n rdns = false\n udp_preference_limit = 1\n clockskew = 1\n\
                 [realms]\n {REALM} = {{\n  kdc = 127.0.0.1:{port}\n }}\n\
                 [logging]\n kdc = FILE:{d}/kdc.log\n"
            ),
        )?;
        std::fs::write(
            dir.path().join("kdc.conf"),
            format!(
                "[kdcdefaults]\n kdc_listen = 127.0.0.1:{port}\n kdc_tcp_listen = 127.0.0.1:{port}\n\
                 [realms]\n {REALM} = {{\n  database_name = {d}/principal\n  key_stash_file = {d}/stash\n  acl_file = {d}/kadm5.acl\n  max_life = 1h\n  kdc_listen = 127.0.0.1:{port}\n  kdc_tcp_listen = 127.0.0.1:{port}\n }}\n"
            ),
        )?;
        std::fs::write(dir.path().join("kadm5.acl"), "")?;
        let mut kdc = Self {
            child: Command::new("true").spawn()?,
            dir,
            port,
        };
        kdc.run(
            "kdb5_util",
            &["create", "-s", "-r", REALM, "-P", "master-password-e2e"],
            None,
        )
        .await?;
        kdc.child = kdc
            .command("krb5kdc")?
            .args(["-n", "-r", REALM])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting krb5kdc (install krb5-kdc)")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        wait_for(
            Duration::from_secs(20),
            || Ok(std::net::TcpStream::connect(addr).is_ok().then_some(())),
            || format!("the KDC did not listen on {addr}"),
        )
        .await?;
        Ok(kdc)
    }

    fn command(&self, name: &str) -> Result<Command> {
        let mut c = Tool::Kerberos.command(name)?;
        c.env("KRB5_CONFIG", self.krb5_conf())
            .env("KRB5_KDC_PROFILE", self.dir.path().join("kdc.conf"))
            .env_remove("KRB5CCNAME")
            .env_remove("KRB5_KTNAME")
            .env_remove("KRB5_CLIENT_KTNAME")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Ok(c)
    }

    async fn run(&self, name: &str, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let mut child = self.command(name)?.args(args).spawn().with_context(|| {
            format!("running {name} (install krb5-kdc, krb5-admin-server, krb5-user)")
        })?;
        if let Some(input) = stdin {
            if let Some(mut pipe) = child.stdin.take() {
                pipe.write_all(input.as_bytes()).await?;
            }
        } else {
            drop(child.stdin.take());
        }
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .with_context(|| format!("{name} did not finish"))??;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ensure!(out.status.success(), "{name} {args:?} failed: {text}");
        Ok(text)
    }

    /// The `krb5.conf` the mediator must be given (`KRB5_CONFIG`).
    pub fn krb5_conf(&self) -> PathBuf {
        self.dir.path().join("krb5.conf")
    }

    /// A path in the realm's temp dir.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The KDC's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Adds a user principal `name@REALM` with `password`.
    ///
    /// # Errors
    /// `kadmin.local` fails.
    pub async fn add_user(&self, name: &str, password: &str) -> Result<()> {
        self.run(
            "kadmin.local",
            &["-q", &format!("addprinc -pw {password} {name}@{REALM}")],
            None,
        )
        .await
        .map(drop)
    }

    /// Adds the service principal `HTTP/host@REALM` with a random key.
    ///
    /// # Errors
    /// `kadmin.local` fails.
    pub async fn add_service(&self, host: &str) -> Result<()> {
        self.run(
            "kadmin.local",
            &["-q", &format!("addprinc -randkey HTTP/{host}@{REALM}")],
            None,
        )
        .await
        .map(drop)
    }

    /// Writes `principal`'s key into the keytab `file` (in the realm dir). Like `kadmin
    /// ktadd`, this gives the principal a new random key (a new kvno): keytabs written
    /// earlier no longer match what the KDC issues.
    ///
    /// # Errors
    /// `kadmin.local` fails.
    pub async fn keytab(&self, principal: &str, file: &str) -> Result<PathBuf> {
        let path = self.path(file);
        self.run(
            "kadmin.local",
            &[
                "-q",
                &format!("ktadd -k {} {principal}@{REALM}", path.display()),
            ],
            None,
        )
        .await?;
        Ok(path)
    }

    /// `kinit` for `user` with `password` into the ccache file `file` (in the realm dir),
    /// with ticket lifetime `lifetime` (kinit's `-l`, e.g. `"1h"`, `"5s"`); returns the
    /// ccache name `FILE:/...`.
    ///
    /// # Errors
    /// `kinit` fails.
    pub async fn kinit(
        &self,
        user: &str,
        password: &str,
        file: &str,
        lifetime: &str,
    ) -> Result<String> {
        let ccache = format!("FILE:{}", self.path(file).display());
        self.run(
            "kinit",
            &["-l", lifetime, "-c", &ccache, &format!("{user}@{REALM}")],
            Some(&format!("{password}\n")),
        )
        .await?;
        Ok(ccache)
    }

    /// Waits until the ccache's ticket has expired for the KDC too: `kvno` for `service`
    /// (`HTTP/host`) with it fails (the realm's clock skew allowance is 1 s).
    ///
    /// # Errors
    /// Still accepted after `within`.
    pub async fn wait_expired(&self, ccache: &str, service: &str, within: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        let principal = format!("{service}@{REALM}");
        loop {
            let out = self
                .command("kvno")?
                .args(["-c", ccache, &principal])
                .output()
                .await?;
            let text = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() {
                ensure!(
                    text.contains("expired"),
                    "kvno failed for another reason than expiry: {text}"
                );
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("{ccache} still held a valid ticket after {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The acceptor side of Negotiate: a service keytab, one GSSAPI context per token.
#[derive(Debug, Clone)]
pub struct Acceptor {
    keytab: PathBuf,
}

/// What one accepted token gave.
#[derive(Debug, Clone)]
pub struct Accepted {
    /// The client principal (`alice@E2E.TEST`).
    pub principal: String,
    /// The mutual-authentication token to return, base64, if any.
    pub reply: Option<String>,
}

impl Acceptor {
    /// An acceptor with the service keys of `keytab`.
    pub fn new(keytab: &Path) -> Self {
        Self {
            keytab: keytab.to_path_buf(),
        }
    }

    /// Accepts one `Negotiate <base64>` token.
    ///
    /// # Errors
    /// The token does not verify (wrong key, expired, replayed, not base64), in GSSAPI's
    /// words.
    pub async fn accept(&self, token_b64: &str) -> Result<Accepted> {
        let token = base64::engine::general_purpose::STANDARD
            .decode(token_b64.trim())
            .context("the Negotiate token is not base64")?;
        let keytab = self.keytab.clone();
        tokio::task::spawn_blocking(move || {
            let gss = Gssapi::load(None)?;
            let store = format!("FILE:{}", keytab.display());
            // The service keys from the keytab (`gss_acquire_cred_from`, store key
            // `keytab`), so that no process-wide `KRB5_KTNAME` is needed.
            let cred = gss
                .credential(Usage::Accept, &[("keytab", &store)])
                .with_context(|| format!("acceptor credentials from {}", keytab.display()))?;
            let mut ctx = gss.acceptor(cred);
            let reply = ctx
                .step(&token)
                .map_err(|e| anyhow::anyhow!("gss_accept_sec_context: {e}"))?;
            ensure!(ctx.is_complete(), "the context needs more than one token");
            let principal = ctx.source_name().context("source name")?;
            Ok(Accepted {
                principal,
                reply: reply.map(|b| base64::engine::general_purpose::STANDARD.encode(&b)),
            })
        })
        .await?
    }
}
