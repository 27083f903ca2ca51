//! An npm registry stand-in: packuments on one origin, tarballs on another (the real
//! registry serves both from registry.npmjs.org; two hosts let a test leave one out).

use anyhow::Result;
use base64::Engine;
use sha2::Digest;

use super::{StaticOrigin, tar_gz};

/// One package: its name, version and dependencies (`name`, `^version`).
#[derive(Debug, Clone, Copy)]
pub struct Package<'a> {
    /// The package's name (`shimtest-alpha`).
    pub name: &'a str,
    /// Its one version.
    pub version: &'a str,
    /// Its dependencies, `(name, range)`.
    pub dependencies: &'a [(&'a str, &'a str)],
}

/// Serves `packages`: each one's packument at `/<name>` on `registry` (every version
/// with `dist.tarball`, `dist.shasum` and `dist.integrity`, which npm checks), its
/// tarball at `/<name>/-/<name>-<version>.tgz` on `files`.
///
/// # Errors
/// A tarball cannot be built.
pub fn serve(
    registry: &StaticOrigin,
    files: &StaticOrigin,
    packages: &[Package<'_>],
) -> Result<()> {
    for p in packages {
        let deps: serde_json::Map<String, serde_json::Value> = p
            .dependencies
            .iter()
            .map(|(n, r)| ((*n).to_owned(), serde_json::Value::from(*r)))
            .collect();
        let manifest = serde_json::json!({
            "name": p.name, "version": p.version, "main": "index.js", "dependencies": deps,
        });
        let tarball = tar_gz(&[
            ("package/package.json", manifest.to_string().as_bytes()),
            (
                "package/index.js",
                format!("module.exports = {:?};\n", p.name).as_bytes(),
            ),
        ])?;
        let path = format!("/{0}/-/{0}-{1}.tgz", p.name, p.version);
        let mut version = manifest.clone();
        version["dist"] = serde_json::json!({
            "tarball": format!("{}{path}", files.url()),
            "shasum": hex::encode(sha1::Sha1::digest(&tarball)),
            "integrity": format!(
                "sha512-{}",
                base64::engine::general_purpose::STANDARD.encode(sha2::Sha512::digest(&tarball))
            ),
        });
        let packument = serde_json::json!({
            "name": p.name,
            "dist-tags": { "latest": p.version },
            "versions": { p.version: version },
        });
        registry.serve(
            &format!("/{}", p.name),
            "application/json",
            packument.to_string(),
        );
        files.serve(&path, "application/octet-stream", tarball);
    }
    Ok(())
}
