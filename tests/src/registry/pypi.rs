//! A PyPI stand-in: a simple index (PEP 503, HTML) on one origin, its wheels on another,
//! as pypi.org and files.pythonhosted.org split them.

use std::io::Write;

use anyhow::Result;
use base64::Engine;
use sha2::Digest;

use super::{StaticOrigin, sha256_of};

/// One project of the index: its name, version and the names it requires (`Requires-Dist`).
#[derive(Debug, Clone, Copy)]
pub struct Project<'a> {
    /// The project's name (`shimtest-alpha`).
    pub name: &'a str,
    /// Its one version.
    pub version: &'a str,
    /// What it requires.
    pub requires: &'a [&'a str],
}

impl Project<'_> {
    /// The name as a wheel's file names and its import package spell it.
    fn dist(&self) -> String {
        self.name.replace('-', "_")
    }

    /// The wheel's file name.
    pub fn wheel_name(&self) -> String {
        format!("{}-{}-py3-none-any.whl", self.dist(), self.version)
    }

    /// A pure-Python wheel: the package (its `__init__.py`), `METADATA`, `WHEEL` and
    /// `RECORD` (with each file's hash, which pip checks).
    ///
    /// # Errors
    /// The archive cannot be written (to memory).
    pub fn wheel(&self) -> Result<Vec<u8>> {
        let dist = self.dist();
        let info = format!("{dist}-{}.dist-info", self.version);
        let mut metadata = format!(
            "Metadata-Version: 2.1\nName: {}\nVersion: {}\n",
            self.name, self.version
        );
        for r in self.requires {
            metadata.push_str(&format!("Requires-Dist: {r}\n"));
        }
        let files = [
            (
                format!("{dist}/__init__.py"),
                format!("NAME = {:?}\n", self.name),
            ),
            (format!("{info}/METADATA"), metadata),
            (
                format!("{info}/WHEEL"),
                "Wheel-Version: 1.0\nGenerator: shim-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                    .to_owned(),
            ),
        ];
        let mut record = String::new();
        for (path, body) in &files {
            let hash = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(sha2::Sha256::digest(body.as_bytes()));
            record.push_str(&format!("{path},sha256={hash},{}\n", body.len()));
        }
        record.push_str(&format!("{info}/RECORD,,\n"));
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        for (path, body) in files
            .iter()
            .chain(std::iter::once(&(format!("{info}/RECORD"), record)))
        {
            zip.start_file(path.as_str(), options)?;
            zip.write_all(body.as_bytes())?;
        }
        Ok(zip.finish()?.into_inner())
    }
}

/// Serves `projects`: each one's page of the simple index at `/simple/<name>/` on
/// `index`, linking its wheel at `/packages/<wheel>` on `files` (with its SHA-256, which
/// pip checks).
///
/// # Errors
/// A wheel cannot be built.
pub fn serve(index: &StaticOrigin, files: &StaticOrigin, projects: &[Project<'_>]) -> Result<()> {
    for p in projects {
        let wheel = p.wheel()?;
        let file = p.wheel_name();
        let page = format!(
            "<!DOCTYPE html>\n<html><body>\n<a href=\"{}/packages/{file}#sha256={}\">{file}</a>\n</body></html>\n",
            files.url(),
            sha256_of(&wheel)
        );
        index.serve(&format!("/simple/{}/", p.name), "text/html", page);
        files.serve(
            &format!("/packages/{file}"),
            "application/octet-stream",
            wheel,
        );
    }
    Ok(())
}
