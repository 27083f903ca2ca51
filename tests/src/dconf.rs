//! dconf databases for the `mode = "system"` tests, written with `gvdb`'s writer (the
//! GVDB format `dconf compile` produces: one key per full path, `/system/proxy/mode`,
//! under the parent tables `/`, `/system/`, `/system/proxy/`), so those tests need no
//! `dconf` program. One interoperability test compiles the same keyfile with the real
//! `dconf compile` and checks the mediator reads both alike.
//!
//! The keyfile is dconf's (`[system/proxy]` sections, `key=value` lines) with the few
//! GVariant text values the tests use: `'string'`, integers (`int32`), `true`/`false`
//! (optionally `@b false`), and arrays of strings (`['a', 'b']`, `@as []`).

use std::path::Path;

use anyhow::{Context, Result, bail};
use gvdb::write::{FileWriter, HashTableBuilder};

/// Writes the dconf database `path` holding `keyfile`'s keys.
///
/// # Errors
/// A line that is not `[section]`, `key=value` or blank, a value of another GVariant type
/// than those above, or the file cannot be written.
pub fn write_db(path: &Path, keyfile: &str) -> Result<()> {
    let mut table = HashTableBuilder::new();
    let mut section = None;
    for (n, line) in keyfile.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(name.trim_matches('/').to_owned());
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .with_context(|| format!("keyfile line {}: {line:?}", n + 1))?;
        let section = section
            .as_deref()
            .with_context(|| format!("keyfile line {}: a key before any section", n + 1))?;
        let path = format!("/{section}/{}", key.trim());
        insert(&mut table, &path, value.trim())
            .with_context(|| format!("keyfile line {}: {line:?}", n + 1))?;
    }
    let bytes = FileWriter::new()
        .write_to_vec_with_table(table)
        .context("writing the GVDB file")?;
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// Inserts one GVariant text `value` at `key`.
fn insert(table: &mut HashTableBuilder<'_>, key: &str, value: &str) -> Result<()> {
    let value = value.strip_prefix("@b ").unwrap_or(value);
    if let Some(text) = string(value) {
        table.insert(key, text)?;
    } else if value == "true" || value == "false" {
        table.insert(key, value == "true")?;
    } else if let Ok(n) = value.parse::<i32>() {
        table.insert(key, n)?;
    } else if value == "@as []" {
        table.insert(key, Vec::<String>::new())?;
    } else if let Some(items) = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
        let list = items
            .split(',')
            .map(str::trim)
            .filter(|i| !i.is_empty())
            .map(|i| string(i).with_context(|| format!("not a string: {i}")))
            .collect::<Result<Vec<String>>>()?;
        table.insert(key, list)?;
    } else {
        bail!("a GVariant value these tests do not write: {value}");
    }
    Ok(())
}

/// The text of a quoted GVariant string (`'x'` or `"x"`, no escapes).
fn string(value: &str) -> Option<String> {
    ['\'', '"'].into_iter().find_map(|q| {
        value
            .strip_prefix(q)
            .and_then(|v| v.strip_suffix(q))
            .filter(|v| !v.contains(q) && !v.contains('\\'))
            .map(str::to_owned)
    })
}
