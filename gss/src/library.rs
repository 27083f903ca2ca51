//! Loading the GSSAPI library: once per process, on first need, never unloaded (MIT krb5
//! keeps thread-specific keys whose destructors live in the library), and checked before
//! its code runs when the configuration names the file.
//!
//! This is how Chromium (`GSSAPISharedLibrary`) and Firefox (`nsAuthGSSAPI`) do it: one
//! build for everyone, a clear error where the library is absent. A fully static binary
//! (no dynamic loader) cannot load it; every call then fails with [`Error::Load`].

use std::ffi::{CStr, c_void};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

use crate::Error;
use crate::ffi;

/// The soname of MIT krb5's GSSAPI library, found through the dynamic loader's search
/// path when no file is configured.
pub const DEFAULT_LIBRARY: &str = "libgssapi_krb5.so.2";

/// Where the library comes from, for the message that says it is missing.
pub const PACKAGES: &str = "libgssapi-krb5-2 on Debian/Ubuntu, krb5-libs on Fedora/RHEL";

/// The loaded library and the functions this crate calls.
pub struct Gssapi {
    /// What was asked for: `None` for [`DEFAULT_LIBRARY`].
    requested: Option<PathBuf>,
    /// The file the dynamic loader opened.
    path: PathBuf,
    pub(crate) f: Functions,
}

impl std::fmt::Debug for Gssapi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gssapi")
            .field("path", &self.path)
            .field("credential_store", &self.has_credential_store())
            .finish_non_exhaustive()
    }
}

/// The resolved entry points (RFC 2744 names; `gss_acquire_cred_from` is MIT's extension).
pub(crate) struct Functions {
    pub(crate) import_name: ffi::ImportName,
    pub(crate) display_name: ffi::DisplayName,
    pub(crate) release_name: ffi::ReleaseName,
    pub(crate) acquire_cred: ffi::AcquireCred,
    pub(crate) acquire_cred_from: Option<ffi::AcquireCredFrom>,
    pub(crate) release_cred: ffi::ReleaseCred,
    pub(crate) init_sec_context: ffi::InitSecContext,
    pub(crate) accept_sec_context: ffi::AcceptSecContext,
    pub(crate) delete_sec_context: ffi::DeleteSecContext,
    pub(crate) release_buffer: ffi::ReleaseBuffer,
    pub(crate) display_status: ffi::DisplayStatus,
}

/// The library of this process, once loaded (leaked: it is never unloaded).
static LOADED: Mutex<Option<&'static Gssapi>> = Mutex::new(None);

impl Gssapi {
    /// The process's GSSAPI library: loaded on the first call (from `library`, else
    /// [`DEFAULT_LIBRARY`] through the loader's search path), the same one afterwards.
    ///
    /// A configured `library` must be an absolute path to a regular file that neither its
    /// group nor others may write, owned by root or by this process's user, in a directory
    /// others may not write: loading a library is running its code.
    ///
    /// # Errors
    /// [`Error::Refused`] for a configured file that fails those checks; [`Error::Load`]
    /// when the loader cannot open it (the message names the packages that ship it);
    /// [`Error::Symbol`] when a required function is missing; [`Error::AlreadyLoaded`]
    /// when another library was loaded earlier in this process.
    pub fn load(library: Option<&Path>) -> Result<&'static Self, Error> {
        let mut loaded = LOADED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(gss) = *loaded {
            if gss.requested.as_deref() != library {
                return Err(Error::AlreadyLoaded {
                    loaded: gss.path.clone(),
                    requested: library.map_or_else(|| DEFAULT_LIBRARY.into(), Path::to_path_buf),
                });
            }
            return Ok(gss);
        }
        let gss: &'static Self = Box::leak(Box::new(Self::open(library)?));
        *loaded = Some(gss);
        Ok(gss)
    }

    fn open(library: Option<&Path>) -> Result<Self, Error> {
        let name = match library {
            Some(path) => check_file(path)?,
            None => PathBuf::from(DEFAULT_LIBRARY),
        };
        // SAFETY: loading runs the library's initialisers. The file is MIT krb5's GSSAPI
        // library (the default soname, or a configured file checked above to be writable
        // only by root or by us), whose initialisers only set up its own state.
        let lib = unsafe { Library::open(Some(name.as_os_str()), RTLD_NOW | RTLD_LOCAL) }.map_err(
            |e| Error::Load {
                library: name.display().to_string(),
                reason: e.to_string(),
            },
        )?;
        let shown = name.display().to_string();
        let f = Functions {
            import_name: symbol(&lib, &shown, "gss_import_name")?,
            display_name: symbol(&lib, &shown, "gss_display_name")?,
            release_name: symbol(&lib, &shown, "gss_release_name")?,
            acquire_cred: symbol(&lib, &shown, "gss_acquire_cred")?,
            acquire_cred_from: symbol(&lib, &shown, "gss_acquire_cred_from").ok(),
            release_cred: symbol(&lib, &shown, "gss_release_cred")?,
            init_sec_context: symbol(&lib, &shown, "gss_init_sec_context")?,
            accept_sec_context: symbol(&lib, &shown, "gss_accept_sec_context")?,
            delete_sec_context: symbol(&lib, &shown, "gss_delete_sec_context")?,
            release_buffer: symbol(&lib, &shown, "gss_release_buffer")?,
            display_status: symbol(&lib, &shown, "gss_display_status")?,
        };
        let path = file_of(f.import_name as *const c_void).unwrap_or(name);
        // Never unloaded: the functions above point into it for the rest of the process.
        std::mem::forget(lib);
        Ok(Self {
            requested: library.map(Path::to_path_buf),
            path,
            f,
        })
    }

    /// The file the dynamic loader opened (`/usr/lib/x86_64-linux-gnu/libgssapi_krb5.so.2`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the library has `gss_acquire_cred_from` (MIT krb5 1.11 and later), which a
    /// credential store (a ccache or keytab of our own) needs.
    pub fn has_credential_store(&self) -> bool {
        self.f.acquire_cred_from.is_some()
    }
}

/// Resolves `name` in `lib` as a function of type `T`.
fn symbol<T: Copy>(lib: &Library, library: &str, name: &'static str) -> Result<T, Error> {
    // SAFETY: each `T` this crate asks for is the function-pointer type `ffi.rs` declares
    // for that very name, as RFC 2744 and MIT's headers give it; the pointer stays valid
    // because the library is never unloaded.
    unsafe { lib.get::<T>(name) }
        .map(|s| *s)
        .map_err(|e| Error::Symbol {
            library: library.to_owned(),
            symbol: name,
            reason: e.to_string(),
        })
}

/// The file the loader mapped `address` from (`dladdr`), if it says.
fn file_of(address: *const c_void) -> Option<PathBuf> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: `info` is a valid out-parameter; `address` points into a loaded library.
    let found = unsafe { libc::dladdr(address, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returned a NUL-terminated name owned by the loader, valid while the
    // library stays loaded (for ever); it is copied at once.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(name.to_string_lossy().into_owned()))
}

/// Checks a configured library file before it is loaded; returns its resolved path.
fn check_file(path: &Path) -> Result<PathBuf, Error> {
    let refuse = |reason: String| Error::Refused {
        path: path.to_path_buf(),
        reason,
    };
    if !path.is_absolute() {
        return Err(refuse("not an absolute path".into()));
    }
    let real = std::fs::canonicalize(path).map_err(|e| refuse(e.to_string()))?;
    let meta = std::fs::metadata(&real).map_err(|e| refuse(e.to_string()))?;
    if !meta.is_file() {
        return Err(refuse(format!("{} is not a regular file", real.display())));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.mode() & 0o022 != 0 {
        return Err(refuse(format!(
            "{} is writable by its group or by others (mode {:o}); loading a library runs its code: chmod go-w it",
            real.display(),
            meta.mode() & 0o7777
        )));
    }
    if meta.uid() != 0 && meta.uid() != me {
        return Err(refuse(format!(
            "{} belongs to uid {}, neither root nor this process's user",
            real.display(),
            meta.uid()
        )));
    }
    if let Some(dir) = real.parent() {
        let d = std::fs::metadata(dir).map_err(|e| refuse(e.to_string()))?;
        if d.mode() & 0o002 != 0 {
            return Err(refuse(format!(
                "its directory {} is writable by others: anyone could replace the file",
                dir.display()
            )));
        }
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_configured_file_is_checked_before_it_is_loaded() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let lib = dir.join("libx.so");
        std::fs::write(&lib, b"not a library").unwrap();
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = check_file(&lib).unwrap_err().to_string();
        assert!(e.contains("writable by its group or by others"), "{e}");
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            check_file(&lib).unwrap(),
            std::fs::canonicalize(&lib).unwrap()
        );
        let e = check_file(Path::new("relative/libgssapi_krb5.so.2"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an absolute path"), "{e}");
        let e = check_file(&dir).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let e = check_file(&dir.join("absent.so")).unwrap_err().to_string();
        assert!(e.contains("absent.so"), "{e}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_file(&lib).unwrap_err().to_string();
        assert!(
            e.contains("writable by others: anyone could replace"),
            "{e}"
        );
    }

    #[test]
    fn a_file_that_is_no_library_is_a_load_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let lib = tmp.path().join("libnot.so");
        std::fs::write(&lib, b"not a library").unwrap();
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Gssapi::open(Some(&lib)).unwrap_err().to_string();
        assert!(e.contains("libnot.so"), "{e}");
        assert!(e.contains("libgssapi-krb5-2 on Debian/Ubuntu"), "{e}");
    }

    /// The system's library (a dependency of curl on Debian and Ubuntu, so present
    /// wherever the test suite can run) loads, imports a name and reports a failed call in
    /// its own words.
    #[test]
    fn the_system_library_loads_and_speaks() {
        let gss = Gssapi::load(None).unwrap();
        assert!(
            gss.path().to_string_lossy().contains("libgssapi_krb5"),
            "{:?}",
            gss.path()
        );
        assert!(
            std::ptr::eq(gss, Gssapi::load(None).unwrap()),
            "loaded once"
        );
        let e = Gssapi::load(Some(Path::new("/nonexistent/libgssapi_krb5.so.2")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("already loaded"), "{e}");
        assert!(gss.has_credential_store(), "MIT krb5 1.11 or later");
        gss.host_service("HTTP@proxy.e2e.test").unwrap();
        assert!(matches!(
            gss.host_service("HTTP@a\0b").unwrap_err(),
            Error::Nul(_)
        ));
        let e = gss
            .credential(
                crate::Usage::Initiate,
                &[("ccache", "FILE:/nonexistent/krb5cc")],
            )
            .unwrap_err();
        let Error::Call { call, message, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*call, "gss_acquire_cred_from");
        assert!(message.contains("No credentials"), "{message}");
    }
}
