//! A Debian repository stand-in, for sources marked `[trusted=yes]` (no signature):
//! `dists/stable/Release` listing `main/binary-<arch>/Packages` (for amd64 and arm64),
//! and each package's `.deb` in `pool/`.

use anyhow::Result;

use super::{StaticOrigin, sha256_of, tar_gz};

/// The repository's path prefix on its origin (`https://host:port/debian`).
pub const ROOT: &str = "/debian";

/// The architectures whose `Packages` the repository lists (its packages are `all`).
const ARCHITECTURES: &[&str] = &["amd64", "arm64"];

/// One package (architecture `all`).
#[derive(Debug, Clone, Copy)]
pub struct Package<'a> {
    /// Its name (`shimtest-hello`).
    pub name: &'a str,
    /// Its version.
    pub version: &'a str,
}

impl Package<'_> {
    /// The `.deb`'s file name.
    pub fn file_name(&self) -> String {
        format!("{}_{}_all.deb", self.name, self.version)
    }

    /// The `.deb`: an `ar` archive of `debian-binary`, `control.tar.gz` and
    /// `data.tar.gz` (one document file).
    ///
    /// # Errors
    /// An archive cannot be written (to memory).
    pub fn deb(&self) -> Result<Vec<u8>> {
        let control = format!(
            "Package: {}\nVersion: {}\nArchitecture: all\nMaintainer: shim tests <tests@example.invalid>\nDescription: a stand-in package\n",
            self.name, self.version
        );
        let control = tar_gz(&[("./control", control.as_bytes())])?;
        let doc = format!("./usr/share/doc/{}/README", self.name);
        let data = tar_gz(&[(doc.as_str(), b"a stand-in package\n")])?;
        let mut out = ar::Builder::new(Vec::new());
        for (name, body) in [
            ("debian-binary", &b"2.0\n"[..]),
            ("control.tar.gz", &control[..]),
            ("data.tar.gz", &data[..]),
        ] {
            let header = ar::Header::new(name.as_bytes().to_vec(), body.len() as u64);
            out.append(&header, body)?;
        }
        Ok(out.into_inner()?)
    }
}

/// Serves `packages` as the suite `stable`, component `main`, under [`ROOT`] on
/// `origin`: `deb [trusted=yes] <url>/debian stable main` in a sources list reaches them.
///
/// # Errors
/// A package cannot be built.
pub fn serve(origin: &StaticOrigin, packages: &[Package<'_>]) -> Result<()> {
    let mut index = String::new();
    for p in packages {
        let deb = p.deb()?;
        let first = p.name.chars().next().unwrap_or('x');
        let file = format!("pool/main/{first}/{}/{}", p.name, p.file_name());
        index.push_str(&format!(
            "Package: {}\nVersion: {}\nArchitecture: all\nMaintainer: shim tests <tests@example.invalid>\nFilename: {file}\nSize: {}\nSHA256: {}\nDescription: a stand-in package\n\n",
            p.name,
            p.version,
            deb.len(),
            sha256_of(&deb)
        ));
        origin.serve(
            &format!("{ROOT}/{file}"),
            "application/vnd.debian.binary-package",
            deb,
        );
    }
    let mut release = String::from(
        "Origin: shim-tests\nLabel: shim-tests\nSuite: stable\nCodename: stable\nDate: Thu, 01 Jan 2026 00:00:00 UTC\nArchitectures: amd64 arm64\nComponents: main\nSHA256:\n",
    );
    for arch in ARCHITECTURES {
        let path = format!("main/binary-{arch}/Packages");
        release.push_str(&format!(
            " {} {} {path}\n",
            sha256_of(index.as_bytes()),
            index.len()
        ));
        origin.serve(
            &format!("{ROOT}/dists/stable/{path}"),
            "text/plain",
            index.clone(),
        );
    }
    origin.serve(
        &format!("{ROOT}/dists/stable/Release"),
        "text/plain",
        release,
    );
    Ok(())
}
