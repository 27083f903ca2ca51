//! A cargo registry stand-in: a sparse index (RFC 2789) on one origin, the `.crate`
//! files on another, as index.crates.io and static.crates.io split them.

use anyhow::Result;

use super::{StaticOrigin, sha256_of, tar_gz};

/// The index's path prefix on its origin (`sparse+https://host:port/index/`).
pub const INDEX_PATH: &str = "/index/";

/// One crate of the index: its name and version, with no dependencies.
#[derive(Debug, Clone, Copy)]
pub struct Crate<'a> {
    /// The crate's name (lowercase, four characters or more).
    pub name: &'a str,
    /// Its one version.
    pub version: &'a str,
}

/// Where the index keeps the entries of `name` (four characters or more):
/// `sh/im/shimtest`.
fn index_file(name: &str) -> String {
    format!("{}/{}/{name}", &name[..2], &name[2..4])
}

/// Serves `crates`: the index's `config.json` and an entry per crate (with the
/// `.crate`'s SHA-256, which cargo checks) under [`INDEX_PATH`] on `index`, the `.crate`
/// files at `/crates/<name>/<version>/download` on `files`.
///
/// # Errors
/// A crate cannot be packaged.
pub fn serve(index: &StaticOrigin, files: &StaticOrigin, crates: &[Crate<'_>]) -> Result<()> {
    let config = serde_json::json!({
        "dl": format!("{}/crates/{{crate}}/{{version}}/download", files.url()),
        "api": index.url(),
    });
    index.serve(
        &format!("{INDEX_PATH}config.json"),
        "application/json",
        config.to_string(),
    );
    for c in crates {
        let root = format!("{}-{}", c.name, c.version);
        let manifest = format!(
            "[package]\nname = \"{}\"\nversion = \"{}\"\nedition = \"2021\"\n",
            c.name, c.version
        );
        let krate = tar_gz(&[
            (&format!("{root}/Cargo.toml"), manifest.as_bytes()),
            (
                &format!("{root}/src/lib.rs"),
                b"pub fn answer() -> u32 { 42 }\n",
            ),
        ])?;
        let entry = serde_json::json!({
            "name": c.name, "vers": c.version, "deps": [], "cksum": sha256_of(&krate),
            "features": {}, "yanked": false,
        });
        index.serve(
            &format!("{INDEX_PATH}{}", index_file(c.name)),
            "application/json",
            format!("{entry}\n"),
        );
        files.serve(
            &format!("/crates/{}/{}/download", c.name, c.version),
            "application/octet-stream",
            krate,
        );
    }
    Ok(())
}
