//! The CA: create, persist, load, issue leaves.

use std::fs::{DirBuilder, OpenOptions};
use std::io::Write as _;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SignatureAlgorithm,
};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use time::OffsetDateTime;

use crate::error::Error;

/// File name of the CA certificate (PEM) inside the CA directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// File name of the CA private key (PKCS#8 PEM, mode 0600) inside the CA directory.
pub const CA_KEY_FILE: &str = "ca-key.pem";

/// How long an issued leaf is valid (from one hour before issue, for clock skew). Short:
/// a leaf leaked from memory is useless a day later.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(24 * 3600);

/// Backdating of `notBefore`, for clients whose clock runs a little behind ours.
const SKEW: Duration = Duration::from_secs(3600);

/// The key algorithm of a CA created by [`Ca::create`].
///
/// RSA CAs can be *loaded* (place `ca.pem` and `ca-key.pem` in the CA directory) but not
/// generated: the `ring` provider this build uses cannot generate RSA keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyAlgorithm {
    /// ECDSA on P-256 with SHA-256 (the default).
    #[default]
    EcdsaP256,
    /// ECDSA on P-384 with SHA-384.
    EcdsaP384,
}

impl KeyAlgorithm {
    fn rcgen(self) -> &'static SignatureAlgorithm {
        match self {
            Self::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            Self::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
        }
    }
}

/// How to create a CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaOptions {
    /// The CA key's algorithm.
    pub algorithm: KeyAlgorithm,
    /// How long the CA certificate is valid from creation (default 5 years).
    pub validity: Duration,
    /// The common name; a short hex id of the key is appended so that two CAs are told
    /// apart in trust stores (default `"egress-mediator CA"`).
    pub common_name: String,
}

impl Default for CaOptions {
    fn default() -> Self {
        Self {
            algorithm: KeyAlgorithm::EcdsaP256,
            validity: Duration::from_secs(5 * 365 * 24 * 3600),
            common_name: "egress-mediator CA".into(),
        }
    }
}

/// Exactly one name a leaf is issued for: one DNS name or one IP address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LeafName {
    /// A DNS name (lowercase, no trailing dot, no wildcard).
    Dns(String),
    /// An IP address.
    Ip(IpAddr),
}

impl LeafName {
    /// Parses `name`: an IP address (IPv6 without brackets), else a DNS name as RFC 5280
    /// section 4.2.1.6 allows in a `dNSName` SAN. Uppercase is folded; one trailing dot is
    /// dropped.
    ///
    /// # Errors
    /// [`Error::BadName`] for an empty name, a wildcard, or anything that is not a valid
    /// DNS name.
    pub fn parse(name: &str) -> Result<Self, Error> {
        if let Ok(ip) = name.parse::<IpAddr>() {
            return Ok(Self::Ip(ip));
        }
        let bad = |why| Error::BadName {
            name: name.to_owned(),
            why,
        };
        let dns = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        if dns.is_empty() {
            return Err(bad("the name is empty"));
        }
        if dns.contains('*') {
            return Err(bad("a leaf names exactly one host, never a wildcard"));
        }
        match ServerName::try_from(dns.as_str()) {
            Ok(ServerName::DnsName(_)) => Ok(Self::Dns(dns)),
            _ => Err(bad("not a valid DNS name")),
        }
    }

    fn san(&self) -> Result<SanType, Error> {
        Ok(match self {
            Self::Dns(d) => SanType::DnsName(d.as_str().try_into()?),
            Self::Ip(ip) => SanType::IpAddress(*ip),
        })
    }
}

impl std::fmt::Display for LeafName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dns(d) => f.write_str(d),
            Self::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// An issued leaf: its chain (leaf, then the CA) and its private key.
#[derive(Debug)]
pub struct Leaf {
    /// The leaf certificate followed by the CA certificate (DER).
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key (PKCS#8).
    pub key: PrivateKeyDer<'static>,
    /// When the leaf stops being valid.
    pub not_after: SystemTime,
}

/// A certificate authority ready to issue leaves.
pub struct Ca {
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
    not_before: SystemTime,
    not_after: SystemTime,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Ca")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// Creates a new CA in memory (nothing is written). `notBefore` is an hour ago.
    ///
    /// # Errors
    /// [`Error::Generate`] when key generation or signing fails.
    pub fn create(opts: &CaOptions) -> Result<Self, Error> {
        let key = KeyPair::generate_for(opts.algorithm.rcgen())?;
        let now = SystemTime::now();
        let mut params = CertificateParams::default();
        let id = params.key_identifier(&key);
        let id: String = id.iter().take(4).map(|b| format!("{b:02x}")).collect();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("{} {id}", opts.common_name));
        dn.push(DnType::OrganizationName, "egress mediator");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = OffsetDateTime::from(now - SKEW);
        params.not_after = OffsetDateTime::from(now + opts.validity);
        let cert = params.self_signed(&key)?;
        let not_before = now - SKEW;
        let not_after = now + opts.validity;
        Ok(Self {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
            not_before: truncate_to_secs(not_before),
            not_after: truncate_to_secs(not_after),
        })
    }

    /// Loads the CA in `dir` ([`CA_CERT_FILE`], [`CA_KEY_FILE`]), or creates one there with
    /// `opts` if neither file exists. New directories are created with mode 0700; the key
    /// is written with mode 0600 and both files are written atomically (temporary file,
    /// then rename).
    ///
    /// # Errors
    /// [`Error::Incomplete`] when only one of the two files exists; otherwise as
    /// [`Ca::load`], [`Ca::create`] and [`Ca::persist`].
    pub fn load_or_create(dir: &Path, opts: &CaOptions) -> Result<Self, Error> {
        let cert = dir.join(CA_CERT_FILE);
        let key = dir.join(CA_KEY_FILE);
        match (exists(&cert)?, exists(&key)?) {
            (true, true) => Self::load(&cert, &key),
            (false, false) => {
                let ca = Self::create(opts)?;
                ca.persist(dir)?;
                Ok(ca)
            }
            (true, false) => Err(Error::Incomplete {
                dir: dir.to_path_buf(),
                present: CA_CERT_FILE,
                missing: CA_KEY_FILE,
            }),
            (false, true) => Err(Error::Incomplete {
                dir: dir.to_path_buf(),
                present: CA_KEY_FILE,
                missing: CA_CERT_FILE,
            }),
        }
    }

    /// Writes the CA into `dir` (created with mode 0700 if absent): the certificate with
    /// mode 0644, the key (PKCS#8 PEM) with mode 0600. Existing files are replaced.
    ///
    /// # Errors
    /// [`Error::Io`] naming the file or directory.
    pub fn persist(&self, dir: &Path) -> Result<(), Error> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_at(dir))?;
        let key_pem = self.issuer.key().serialize_pem();
        write_atomic(&dir.join(CA_KEY_FILE), key_pem.as_bytes(), 0o600)?;
        write_atomic(&dir.join(CA_CERT_FILE), self.cert_pem.as_bytes(), 0o644)?;
        Ok(())
    }

    /// Loads a CA from a PEM certificate file and a PEM private key file (PKCS#8, or
    /// SEC1/PKCS#1 as rcgen reads them), and checks it: the key file is not accessible to
    /// group or others, the certificate is a CA certificate (basicConstraints cA) valid
    /// now, its key is the given key, and a leaf it issues verifies against it (webpki).
    ///
    /// # Errors
    /// [`Error::Io`], [`Error::KeyPermissions`], [`Error::Parse`], [`Error::NotUsable`],
    /// [`Error::Expired`].
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, Error> {
        let meta = std::fs::metadata(key_path).map_err(io_at(key_path))?;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(Error::KeyPermissions {
                path: key_path.to_path_buf(),
                mode,
            });
        }
        let key_pem = std::fs::read_to_string(key_path).map_err(io_at(key_path))?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| Error::Parse {
            what: key_path.display().to_string(),
            why: format!("not a private key rcgen can use: {e}"),
        })?;
        let cert_bytes = std::fs::read(cert_path).map_err(io_at(cert_path))?;
        let cert_der = CertificateDer::from_pem_slice(&cert_bytes).map_err(|e| Error::Parse {
            what: cert_path.display().to_string(),
            why: format!("no PEM certificate: {e}"),
        })?;
        let not_usable = |why: String| Error::NotUsable {
            path: cert_path.to_path_buf(),
            why,
        };
        let (_, x509) =
            x509_parser::parse_x509_certificate(&cert_der).map_err(|e| Error::Parse {
                what: cert_path.display().to_string(),
                why: format!("not an X.509 certificate: {e}"),
            })?;
        let is_ca = x509
            .basic_constraints()
            .ok()
            .flatten()
            .is_some_and(|bc| bc.value.ca);
        if !is_ca {
            return Err(not_usable(
                "not a CA certificate (basicConstraints cA is not set)".into(),
            ));
        }
        if x509.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(not_usable(format!(
                "the key in {} is not this certificate's key",
                key_path.display()
            )));
        }
        let validity = x509.validity();
        let not_before = unix_secs(validity.not_before.timestamp());
        let not_after = unix_secs(validity.not_after.timestamp());
        let now = SystemTime::now();
        if now < not_before || now >= not_after {
            return Err(Error::Expired {
                what: cert_path.display().to_string(),
                not_before: validity.not_before.to_string(),
                not_after: validity.not_after.to_string(),
            });
        }
        let issuer = Issuer::from_ca_cert_der(&cert_der, key).map_err(|e| Error::Parse {
            what: cert_path.display().to_string(),
            why: format!("cannot issue with this CA: {e}"),
        })?;
        let cert_pem = pem_of(&cert_der);
        let ca = Self {
            cert_der: cert_der.into_owned(),
            cert_pem,
            issuer,
            not_before,
            not_after,
        };
        // Self-test: whatever the certificate's extensions say, a leaf must verify.
        let probe = LeafName::Dns("probe.invalid".into());
        let leaf = ca.issue(&probe)?;
        ca.verify_leaf(&leaf, &probe)
            .map_err(|why| not_usable(format!("a leaf it issues does not verify: {why}")))?;
        Ok(ca)
    }

    /// The CA certificate, PEM (for `SSL_CERT_FILE` and friends in children).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// When the CA certificate stops being valid.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Issues a leaf for exactly `name`: a fresh ECDSA P-256 key, SAN = that one name,
    /// serverAuth only, not a CA, valid from an hour ago for [`LEAF_VALIDITY`] (never past
    /// the CA's own expiry).
    ///
    /// # Errors
    /// [`Error::Expired`] when the CA is not valid now; [`Error::Generate`] when key
    /// generation or signing fails.
    pub fn issue(&self, name: &LeafName) -> Result<Leaf, Error> {
        let now = SystemTime::now();
        if now < self.not_before || now >= self.not_after {
            return Err(Error::Expired {
                what: "the CA".into(),
                not_before: OffsetDateTime::from(self.not_before).to_string(),
                not_after: OffsetDateTime::from(self.not_after).to_string(),
            });
        }
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![name.san()?];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name.to_string());
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let not_before = (now - SKEW).max(self.not_before);
        let not_after = (now + LEAF_VALIDITY).min(self.not_after);
        params.not_before = OffsetDateTime::from(not_before);
        params.not_after = OffsetDateTime::from(not_after);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Leaf {
            chain: vec![cert.der().clone(), self.cert_der.clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            not_after: truncate_to_secs(not_after),
        })
    }

    /// Verifies `leaf` with webpki: its chain ends at this CA, it is valid now for TLS
    /// server authentication, and it is valid for `name`.
    ///
    /// # Errors
    /// webpki's reason, as text.
    // A `String` error: the finding goes verbatim into `mediator check`'s output and the
    // tests' messages; no caller branches on it.
    pub fn verify_leaf(&self, leaf: &Leaf, name: &LeafName) -> Result<(), String> {
        let anchor = webpki::anchor_from_trusted_cert(&self.cert_der).map_err(|e| e.to_string())?;
        let Some(first) = leaf.chain.first() else {
            return Err("empty chain".into());
        };
        let ee = webpki::EndEntityCert::try_from(first).map_err(|e| e.to_string())?;
        ee.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &[anchor],
            leaf.chain.get(1..).unwrap_or_default(),
            UnixTime::now(),
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .map_err(|e| e.to_string())?;
        let server_name = match name {
            LeafName::Dns(d) => ServerName::try_from(d.as_str())
                .map_err(|e| e.to_string())?
                .to_owned(),
            LeafName::Ip(ip) => ServerName::IpAddress((*ip).into()),
        };
        ee.verify_is_valid_for_subject_name(&server_name)
            .map_err(|e| e.to_string())
    }
}

fn exists(path: &Path) -> Result<bool, Error> {
    path.try_exists().map_err(io_at(path))
}

fn io_at(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `bytes` to a fresh temporary file beside `path` with `mode`, syncs it, and
/// renames it over `path`: a reader never sees a partial file, and the key is never
/// readable by others, not even for a moment.
fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), Error> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp: PathBuf = path.with_file_name(format!(".{file_name}.tmp"));
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_at(&tmp)(e)),
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io_at(&tmp))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(io_at(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io_at(path))
}

fn pem_of(der: &CertificateDer<'_>) -> String {
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    pem::encode_config(&pem::Pem::new("CERTIFICATE", der.to_vec()), config)
}

fn unix_secs(ts: i64) -> SystemTime {
    match u64::try_from(ts) {
        Ok(s) => UNIX_EPOCH + Duration::from_secs(s),
        Err(_) => UNIX_EPOCH,
    }
}

/// Certificates carry whole seconds.
fn truncate_to_secs(t: SystemTime) -> SystemTime {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    UNIX_EPOCH + Duration::from_secs(secs)
}

#[cfg(test)]
#[path = "ca_tests.rs"]
mod tests;
