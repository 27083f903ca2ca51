//! GNOME's proxy settings (the GSettings schema `org.gnome.system.proxy`, dconf path
//! `/system/proxy/`), read from dconf databases as files (GVDB, through the `gvdb` crate):
//! no session bus, no dconf service. Databases are read highest priority first; the first
//! that holds a key gives its value, except that a key locked in a later (system) database
//! takes that database's value, as dconf does. A key no database holds has its schema
//! default.
//!
//! `mode`: `none` (direct), `manual` (`http`, `https`, `socks` host and port;
//! `ignore-hosts`), `auto` (`autoconfig-url`: a PAC; empty means WPAD, which is refused).
//! Tunnels use the HTTPS proxy, else the HTTP proxy, else SOCKS; plain HTTP uses the HTTP
//! proxy, else SOCKS (as GLib's GNOME proxy resolver does). The HTTP proxy's
//! `use-authentication` credentials become Basic credentials.

use std::path::{Path, PathBuf};

use gvdb::read::File;
use policy::upstream::Credentials;

use super::{Reading, Setting, bypass, pac_source, parent};
use crate::error::{Error, ErrorCause};

/// The dconf profile a user session reads by default.
pub(crate) const PROFILE: &str = "/etc/dconf/profile/user";

/// Largest database read, in bytes.
const MAX_DB: u64 = 16 << 20;

/// The schema default of `ignore-hosts`.
const DEFAULT_IGNORE: [&str; 3] = ["localhost", "127.0.0.0/8", "::1"];

/// The databases a dconf profile names, in order: `user-db:NAME` is
/// `<home>/.config/dconf/NAME` (skipped without a user), `system-db:NAME` is
/// `/etc/dconf/db/NAME`, `file-db:PATH` is PATH. A missing profile means `user-db:user`
/// alone (dconf's default).
pub(crate) fn profile_databases(profile: &Path, home: Option<&Path>) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(profile).unwrap_or_else(|_| "user-db:user\n".into());
    text.lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(kind, name)| match kind {
            "user-db" => home.map(|h| h.join(".config/dconf").join(name)),
            "system-db" => Some(Path::new("/etc/dconf/db").join(name)),
            "file-db" => Some(PathBuf::from(name)),
            _ => None,
        })
        .collect()
}

/// One opened database.
struct Db {
    path: PathBuf,
    bytes: Vec<u8>,
}

/// A value of the schema's keys.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Str(String),
    Int(i32),
    Bool(bool),
    List(Vec<String>),
}

/// The databases, queried as dconf does.
struct Settings {
    dbs: Vec<Db>,
}

impl Settings {
    fn open(paths: &[PathBuf]) -> Result<Self, Error> {
        let mut dbs = Vec::new();
        for path in paths {
            match std::fs::metadata(path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(bad(path, e)),
                Ok(m) if m.len() > MAX_DB => {
                    return Err(bad(path, format!("larger than {MAX_DB} bytes")));
                }
                Ok(_) => {}
            }
            let bytes = std::fs::read(path).map_err(|e| bad(path, e))?;
            // Checked once here, so that every later lookup can rely on the format.
            File::from_bytes(std::borrow::Cow::Borrowed(&bytes))
                .and_then(|f| f.hash_table().map(drop))
                .map_err(|e| bad(path, format!("not a dconf database: {e}")))?;
            dbs.push(Db {
                path: path.clone(),
                bytes,
            });
        }
        Ok(Self { dbs })
    }

    /// The value of `key` (a full dconf path) and the database it came from.
    fn get(&self, key: &str) -> Result<Option<(Value, &Path)>, Error> {
        // A lock in a later database wins over the earlier ones.
        let mut order: Vec<&Db> = Vec::new();
        for db in self.dbs.iter().skip(1) {
            if locked(db, key) {
                order.push(db);
            }
        }
        order.extend(self.dbs.iter());
        for db in order {
            let file = File::from_bytes(std::borrow::Cow::Borrowed(&db.bytes))
                .map_err(|e| bad(&db.path, ErrorCause::inner(e)))?;
            let table = file
                .hash_table()
                .map_err(|e| bad(&db.path, ErrorCause::inner(e)))?;
            if !table.keys().any(|k| k.is_ok_and(|k| k == key)) {
                continue;
            }
            let value = if let Ok(s) = table.get::<String>(key) {
                Value::Str(s)
            } else if let Ok(n) = table.get::<i32>(key) {
                Value::Int(n)
            } else if let Ok(b) = table.get::<bool>(key) {
                Value::Bool(b)
            } else if let Ok(l) = table.get::<Vec<String>>(key) {
                Value::List(l)
            } else {
                return Err(bad(
                    &db.path,
                    format!("{key} has a value of an unexpected type"),
                ));
            };
            return Ok(Some((value, &db.path)));
        }
        Ok(None)
    }

    fn string(&self, key: &str) -> Result<String, Error> {
        match self.get(key)? {
            None => Ok(String::new()),
            Some((Value::Str(s), _)) => Ok(s),
            Some((_, path)) => Err(bad(path, format!("{key} is not a string"))),
        }
    }

    fn int(&self, key: &str) -> Result<i32, Error> {
        match self.get(key)? {
            None => Ok(0),
            Some((Value::Int(n), _)) => Ok(n),
            Some((_, path)) => Err(bad(path, format!("{key} is not an integer"))),
        }
    }

    fn boolean(&self, key: &str) -> Result<bool, Error> {
        match self.get(key)? {
            None => Ok(false),
            Some((Value::Bool(b), _)) => Ok(b),
            Some((_, path)) => Err(bad(path, format!("{key} is not a boolean"))),
        }
    }

    fn list(&self, key: &str) -> Result<Option<Vec<String>>, Error> {
        match self.get(key)? {
            None => Ok(None),
            Some((Value::List(l), _)) => Ok(Some(l)),
            Some((_, path)) => Err(bad(path, format!("{key} is not a list of strings"))),
        }
    }
}

fn locked(db: &Db, key: &str) -> bool {
    let Ok(file) = File::from_bytes(std::borrow::Cow::Borrowed(&db.bytes)) else {
        return false;
    };
    let Ok(table) = file.hash_table() else {
        return false;
    };
    let Ok(locks) = table.get_hash_table(".locks") else {
        return false;
    };
    locks.keys().any(|k| k.is_ok_and(|k| k == key))
}

fn bad(path: &Path, why: impl Into<ErrorCause>) -> Error {
    Error::upstream_by(
        format!("GNOME proxy settings: dconf database {}", path.display()),
        why,
    )
}

/// Reads `org.gnome.system.proxy` from `dbs`; `None` when no database sets `mode`.
///
/// # Errors
/// [`Error::Upstream`]: an unreadable or malformed database, `mode = 'auto'` without an
/// `autoconfig-url` (WPAD), an unknown mode, a bad host or port.
pub(crate) fn read(dbs: &[PathBuf]) -> Result<Option<Reading>, Error> {
    let settings = Settings::open(dbs)?;
    let Some((mode, from)) = settings.get("/system/proxy/mode")? else {
        return Ok(None);
    };
    let source = format!("GNOME (dconf {})", from.display());
    let Value::Str(mode) = mode else {
        return Err(bad(from, "/system/proxy/mode is not a string"));
    };
    let refuse = |why: String| Error::upstream(format!("{source}: {why}"));
    match mode.as_str() {
        "none" => Ok(Some(Reading {
            source,
            said: "mode 'none'".into(),
            setting: Setting::Direct,
            files: String::new(),
        })),
        "auto" => {
            let url = settings.string("/system/proxy/autoconfig-url")?;
            if url.trim().is_empty() {
                return Err(refuse(
                    "mode 'auto' without an autoconfig-url means WPAD (automatic discovery), which the mediator never uses; set autoconfig-url or use mode = \"pac\"".into(),
                ));
            }
            let pac =
                pac_source(&url).map_err(|e| refuse(format!("autoconfig-url {url:?}: {e}")))?;
            Ok(Some(Reading {
                source,
                said: format!("mode 'auto', autoconfig-url '{url}'"),
                setting: Setting::Pac(pac),
                files: String::new(),
            }))
        }
        "manual" => manual(&settings, source).map(Some),
        other => Err(refuse(format!(
            "unknown mode '{other}' (expected 'none', 'manual' or 'auto')"
        ))),
    }
}

fn manual(settings: &Settings, source: String) -> Result<Reading, Error> {
    let refuse = |why: String| Error::upstream(format!("{source}: {why}"));
    let mut said = vec!["mode 'manual'".to_owned()];
    let mut proxy =
        |kind: &str, scheme: &str| -> Result<Option<policy::upstream::ParentUrl>, Error> {
            let host = settings.string(&format!("/system/proxy/{kind}/host"))?;
            let port = settings.int(&format!("/system/proxy/{kind}/port"))?;
            if host.trim().is_empty() || port <= 0 {
                return Ok(None);
            }
            said.push(format!("{kind} '{host}' port {port}"));
            let port = u16::try_from(port)
                .map_err(|_| refuse(format!("{kind} port {port} is out of range")))?;
            parent(scheme, &host, port)
                .map(Some)
                .map_err(|e| refuse(format!("{kind} proxy '{host}' port {port}: {e}")))
        };
    let mut http = proxy("http", "http")?;
    // GNOME's "https" and "socks" proxies are an HTTP proxy spoken to in plain text and a
    // SOCKS (5) server.
    let https = proxy("https", "http")?;
    let socks = proxy("socks", "socks5")?;
    if let Some(h) = &mut http
        && settings.boolean("/system/proxy/http/use-authentication")?
    {
        let user = settings.string("/system/proxy/http/authentication-user")?;
        let password = settings.string("/system/proxy/http/authentication-password")?;
        h.credentials = Some(
            Credentials::new(user.clone(), password)
                .map_err(|e| refuse(format!("http authentication-user '{user}': {e}")))?,
        );
        said.push(format!("http authentication-user '{user}'"));
    }
    let ignore = settings.list("/system/proxy/ignore-hosts")?;
    let ignore_text = match &ignore {
        Some(l) => l.clone(),
        None => DEFAULT_IGNORE.iter().map(|s| (*s).to_owned()).collect(),
    };
    said.push(format!("ignore-hosts {ignore_text:?}"));
    let no_proxy = bypass(ignore_text.iter().map(String::as_str));
    let setting = Setting::desktop(https, http, socks, no_proxy);
    Ok(Reading {
        source,
        said: said.join(", "),
        setting,
        files: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_name_databases() {
        let (dir, p) = crate::testing::file_in_temp_dir(
            "user",
            "user-db:user\nsystem-db:local # site\nservice-db:x\nfile-db:/opt/db\n",
        );
        let home = Path::new("/home/alice");
        assert_eq!(
            profile_databases(&p, Some(home)),
            vec![
                PathBuf::from("/home/alice/.config/dconf/user"),
                PathBuf::from("/etc/dconf/db/local"),
                PathBuf::from("/opt/db"),
            ]
        );
        assert_eq!(profile_databases(&p, None).len(), 2);
        assert_eq!(
            profile_databases(&dir.path().join("missing"), Some(home)),
            vec![PathBuf::from("/home/alice/.config/dconf/user")]
        );
    }

    #[test]
    fn a_missing_database_is_no_setting_and_garbage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(&[dir.path().join("none")]).unwrap().is_none());
        let junk = dir.path().join("junk");
        std::fs::write(&junk, b"not a gvdb file at all, certainly").unwrap();
        let e = crate::error::chain(&read(&[junk]).unwrap_err());
        assert!(e.contains("not a dconf database"), "{e}");
    }
}
