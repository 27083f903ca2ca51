//! A real Squid on loopback as a parent that demands Negotiate, checked by Squid's own
//! `negotiate_kerberos_auth` helper with a service keytab of a [`Kdc`] realm. Squid runs in
//! the foreground (`-N`) with a configuration, logs and pid file in a temp dir of its own;
//! started as root it runs as the user `proxy`, so that dir is made readable for it. It
//! resolves absolute-form hosts from a `hosts_file` naming only loopback. Killed when the
//! [`Squid`] is dropped.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::process::Child;

use crate::kerberos::{Kdc, REALM};
use crate::tool::Tool;
use crate::wait::wait_for;

/// A running Squid.
#[derive(Debug)]
pub struct Squid {
    dir: tempfile::TempDir,
    addr: SocketAddr,
    _child: Child,
}

impl Squid {
    /// Starts Squid on a free loopback port, demanding Negotiate for the service
    /// `HTTP/<host>` whose keys are in `keytab`, with `names` (e.g. `origin.test`)
    /// resolving to 127.0.0.1 for it.
    ///
    /// # Errors
    /// Squid is not installed (`apt-get install squid`), or does not listen in time.
    pub async fn start_negotiate(
        kdc: &Kdc,
        host: &str,
        keytab: &Path,
        names: &[&str],
    ) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("e2e-squid-").tempdir()?;
        let d = dir.path();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let keytab_copy = d.join("service.keytab");
        std::fs::copy(keytab, &keytab_copy)?;
        std::fs::set_permissions(&keytab_copy, std::fs::Permissions::from_mode(0o644))?;
        let krb5_conf = d.join("krb5.conf");
        std::fs::copy(kdc.krb5_conf(), &krb5_conf)?;
        std::fs::set_permissions(&krb5_conf, std::fs::Permissions::from_mode(0o644))?;
        let hosts: String = names.iter().map(|n| format!("127.0.0.1 {n}\n")).collect();
        std::fs::write(d.join("hosts"), hosts)?;
        let dd = d.display();
        std::fs::write(
            d.join("squid.conf"),
            format!(
                "http_port 127.0.0.1:{port}\n\
                 pid_filename {dd}/squid.pid\n\
                 access_log stdio:{dd}/access.log\n\
                 cache_log {dd}/cache.log\n\
                 cache deny all\n\
                 pinger_enable off\n\
                 shutdown_lifetime 0 seconds\n\
                 hosts_file {dd}/hosts\n\
                 dns_nameservers 127.0.0.1\n\
                 auth_param negotiate program /usr/lib/squid/negotiate_kerberos_auth -k {dd}/service.keytab -s HTTP/{host}@{REALM} -c {dd} -t none\n\
                 auth_param negotiate children 2\n\
                 acl auth proxy_auth REQUIRED\n\
                 http_access allow auth\n\
                 http_access deny all\n"
            ),
        )?;
        let child = Tool::Squid
            .command("squid")?
            .args(["-N", "-f"])
            .arg(d.join("squid.conf"))
            .env("KRB5_CONFIG", &krb5_conf)
            .env_remove("KRB5_KTNAME")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting squid (apt-get install squid)")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        wait_for(
            Duration::from_secs(30),
            || Ok(std::net::TcpStream::connect(addr).is_ok().then_some(())),
            || {
                format!(
                    "squid did not listen on {addr}; cache.log:\n{}",
                    std::fs::read_to_string(d.join("cache.log")).unwrap_or_default()
                )
            },
        )
        .await?;
        Ok(Self {
            dir,
            addr,
            _child: child,
        })
    }

    /// Squid's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until Squid's access log has a line containing every one of `needles`;
    /// returns the whole log.
    ///
    /// # Errors
    /// No such line within 10 s.
    pub async fn wait_access(&self, needles: &[&str]) -> Result<String> {
        let path = self.dir.path().join("access.log");
        wait_for(
            Duration::from_secs(10),
            || {
                let log = std::fs::read_to_string(&path).unwrap_or_default();
                Ok(log
                    .lines()
                    .any(|l| needles.iter().all(|n| l.contains(n)))
                    .then_some(log.clone()))
            },
            || {
                format!(
                    "no access.log line with {needles:?}:\n{}",
                    std::fs::read_to_string(&path).unwrap_or_default()
                )
            },
        )
        .await
    }
}
