//! Safe handles over the library's objects: a [`Name`], a [`Credential`], an initiator's
//! and an acceptor's security context. Each owns its handle and releases it on drop;
//! every token the library returns is copied out and its buffer released at once.

use std::ffi::CString;
use std::ptr;

use crate::Error;
use crate::ffi::{self, BufferDesc, Handle, KeyValueElement, KeyValueSet, OidDesc, OmUint32};
use crate::library::Gssapi;

/// An imported name (`gss_name_t`), released on drop.
#[derive(Debug)]
pub struct Name {
    gss: &'static Gssapi,
    handle: Handle,
}

// SAFETY: MIT krb5's GSSAPI is thread-safe for distinct objects; a `Name` is used through
// `&self`/`&mut self` only, never by two threads at once without the borrow checker's say.
unsafe impl Send for Name {}

impl Gssapi {
    /// Imports a host-based service name, `service@host` (`GSS_C_NT_HOSTBASED_SERVICE`,
    /// RFC 2743 section 4.1): `HTTP@proxy.corp.example` for a Negotiate parent.
    ///
    /// # Errors
    /// [`Error::Nul`] for a name holding a NUL byte; [`Error::Call`] when the library
    /// refuses it.
    pub fn host_service(&'static self, name: &str) -> Result<Name, Error> {
        if name.contains('\0') {
            return Err(Error::Nul("the service name"));
        }
        let mut buffer = BufferDesc::borrowing(name.as_bytes());
        let mut kind = OidDesc::of(ffi::NT_HOSTBASED_SERVICE);
        let mut minor: OmUint32 = 0;
        let mut handle: Handle = ptr::null_mut();
        // SAFETY: `buffer` points into `name` and `kind` into a static, both alive for the
        // call; `handle` receives a new name that the returned `Name` owns.
        let major =
            unsafe { (self.f.import_name)(&mut minor, &mut buffer, &mut kind, &mut handle) };
        self.check("gss_import_name", major, minor)?;
        Ok(Name { gss: self, handle })
    }

    /// Acquires credentials for `usage`: the library's defaults (`KRB5CCNAME`,
    /// `KRB5_CLIENT_KTNAME`, `KRB5_KTNAME`, the default ccache) when `store` is empty,
    /// else from those MIT credential-store entries (`ccache`, `client_keytab`, `keytab`)
    /// through `gss_acquire_cred_from`, default name and mechanisms, no time limit.
    ///
    /// # Errors
    /// [`Error::NoCredentialStore`] for a store on a library without
    /// `gss_acquire_cred_from`; [`Error::Nul`] for an entry holding a NUL byte;
    /// [`Error::Call`] when there are no usable credentials (in the library's words).
    pub fn credential(
        &'static self,
        usage: Usage,
        store: &[(&str, &str)],
    ) -> Result<Credential, Error> {
        let mut minor: OmUint32 = 0;
        let mut handle: Handle = ptr::null_mut();
        let usage = match usage {
            Usage::Initiate => ffi::C_INITIATE,
            Usage::Accept => ffi::C_ACCEPT,
        };
        let major = if store.is_empty() {
            // SAFETY: the desired name and mechanism set are null (defaults), as are the
            // optional outputs; `handle` receives a new credential that the returned
            // `Credential` owns.
            unsafe {
                (self.f.acquire_cred)(
                    &mut minor,
                    ptr::null_mut(),
                    ffi::INDEFINITE,
                    ptr::null_mut(),
                    usage,
                    &mut handle,
                    ptr::null_mut(),
                    ptr::null_mut(),
                )
            }
        } else {
            let Some(acquire_from) = self.f.acquire_cred_from else {
                return Err(Error::NoCredentialStore {
                    library: self.path().to_path_buf(),
                });
            };
            let owned = store
                .iter()
                .map(|(k, v)| Ok((CString::new(*k)?, CString::new(*v)?)))
                .collect::<Result<Vec<_>, std::ffi::NulError>>()
                .map_err(|_| Error::Nul("a credential store entry"))?;
            let mut elements: Vec<KeyValueElement> = owned
                .iter()
                .map(|(k, v)| KeyValueElement {
                    key: k.as_ptr(),
                    value: v.as_ptr(),
                })
                .collect();
            let set = KeyValueSet {
                count: OmUint32::try_from(elements.len())
                    .map_err(|_| Error::Nul("a credential store of that size"))?,
                elements: elements.as_mut_ptr(),
            };
            // SAFETY: `set`, `elements` and the C strings they point into (`owned`) outlive
            // the call; the name, mechanism set and optional outputs are null; `handle`
            // receives a new credential that the returned `Credential` owns.
            unsafe {
                acquire_from(
                    &mut minor,
                    ptr::null_mut(),
                    ffi::INDEFINITE,
                    ptr::null_mut(),
                    usage,
                    &set,
                    &mut handle,
                    ptr::null_mut(),
                    ptr::null_mut(),
                )
            }
        };
        let call = if store.is_empty() {
            "gss_acquire_cred"
        } else {
            "gss_acquire_cred_from"
        };
        self.check(call, major, minor)?;
        Ok(Credential { gss: self, handle })
    }

    /// Starts an initiator's context for `target` with SPNEGO (RFC 4178, the mechanism of
    /// HTTP Negotiate) and mutual authentication; `credential` `None` means the
    /// library's defaults. No call is made until [`Initiator::step`].
    pub fn initiator(&'static self, credential: Option<Credential>, target: Name) -> Initiator {
        Initiator {
            gss: self,
            context: ptr::null_mut(),
            credential,
            target,
            complete: false,
        }
    }

    /// Starts an acceptor's context with `credential` (acceptor credentials, e.g. from a
    /// service keytab). No call is made until [`Acceptor::step`].
    pub fn acceptor(&'static self, credential: Credential) -> Acceptor {
        Acceptor {
            gss: self,
            context: ptr::null_mut(),
            credential,
            source: None,
            complete: false,
        }
    }
}

/// What credentials are for (`gss_cred_usage_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// `GSS_C_INITIATE`: a client's.
    Initiate,
    /// `GSS_C_ACCEPT`: a service's.
    Accept,
}

/// Credentials (`gss_cred_id_t`), released on drop.
#[derive(Debug)]
pub struct Credential {
    gss: &'static Gssapi,
    handle: Handle,
}

// SAFETY: as for `Name`: a distinct object of a thread-safe library, used by one thread
// at a time.
unsafe impl Send for Credential {}

/// The client side of a security context (`gss_init_sec_context`), deleted on drop.
#[derive(Debug)]
pub struct Initiator {
    gss: &'static Gssapi,
    context: Handle,
    credential: Option<Credential>,
    target: Name,
    complete: bool,
}

// SAFETY: as for `Name`; the context, its credential and its target move together and
// are used through `&mut self` only.
unsafe impl Send for Initiator {}

impl Initiator {
    /// One step of the exchange: `input` is the acceptor's last token (`None` for the
    /// first step). Returns the token to send, if the library made one (it makes none
    /// once the context is complete and nothing is left to say).
    ///
    /// # Errors
    /// [`Error::Call`] in the library's words (no ticket, an expired ticket, no such
    /// service principal, the KDC unreachable, a token that does not verify).
    pub fn step(&mut self, input: Option<&[u8]>) -> Result<Option<Vec<u8>>, Error> {
        let mut minor: OmUint32 = 0;
        let mut mech = OidDesc::of(ffi::MECH_SPNEGO);
        let mut input = input.map(BufferDesc::borrowing);
        let input_ptr = input.as_mut().map_or(ptr::null_mut(), ptr::from_mut);
        let mut output = BufferDesc::empty();
        let credential = self
            .credential
            .as_ref()
            .map_or(ptr::null_mut(), |c| c.handle);
        // SAFETY: `context` is null (a new context) or the handle an earlier call returned;
        // the credential and target handles are owned by `self`; `mech` points into a
        // static and `input` into the caller's slice, both alive for the call; channel
        // bindings and the optional outputs are null; `output` is released below.
        let major = unsafe {
            (self.gss.f.init_sec_context)(
                &mut minor,
                credential,
                &mut self.context,
                self.target.handle,
                &mut mech,
                ffi::C_MUTUAL_FLAG,
                0,
                ptr::null_mut(),
                input_ptr,
                ptr::null_mut(),
                &mut output,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        let token = self.gss.take(&mut output);
        self.gss.check("gss_init_sec_context", major, minor)?;
        self.complete = major & ffi::S_CONTINUE_NEEDED == 0;
        Ok(token)
    }

    /// Whether the context is established (for mutual authentication: the acceptor's
    /// last token verified).
    pub fn is_complete(&self) -> bool {
        self.complete
    }
}

impl Drop for Initiator {
    fn drop(&mut self) {
        self.gss.delete(&mut self.context);
    }
}

/// The service side of a security context (`gss_accept_sec_context`), deleted on drop.
#[derive(Debug)]
pub struct Acceptor {
    gss: &'static Gssapi,
    context: Handle,
    credential: Credential,
    source: Option<Name>,
    complete: bool,
}

// SAFETY: as for `Initiator`.
unsafe impl Send for Acceptor {}

impl Acceptor {
    /// One step of the exchange with the initiator's token; returns the token to send
    /// back, if any (the mutual-authentication reply).
    ///
    /// # Errors
    /// [`Error::Call`] in the library's words (wrong key, expired, replayed).
    pub fn step(&mut self, input: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let mut minor: OmUint32 = 0;
        let mut input = BufferDesc::borrowing(input);
        let mut output = BufferDesc::empty();
        let mut source: Handle = ptr::null_mut();
        // SAFETY: `context` is null or the handle an earlier call returned; the credential
        // is owned by `self`; `input` borrows the caller's slice for the call; bindings,
        // mechanism, flags, times and delegated credentials are not asked for; `source`
        // receives a new name owned below; `output` is released below.
        let major = unsafe {
            (self.gss.f.accept_sec_context)(
                &mut minor,
                &mut self.context,
                self.credential.handle,
                &mut input,
                ptr::null_mut(),
                &mut source,
                ptr::null_mut(),
                &mut output,
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        if !source.is_null() {
            self.source = Some(Name {
                gss: self.gss,
                handle: source,
            });
        }
        let token = self.gss.take(&mut output);
        self.gss.check("gss_accept_sec_context", major, minor)?;
        self.complete = major & ffi::S_CONTINUE_NEEDED == 0;
        Ok(token)
    }

    /// Whether the context is established.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// The initiator's name as text (`alice@REALM`), once a step has named it.
    ///
    /// # Errors
    /// [`Error::Call`]: no step named it yet, or the library cannot display it.
    pub fn source_name(&self) -> Result<String, Error> {
        let Some(name) = &self.source else {
            return Err(Error::Call {
                call: "gss_display_name",
                major: 0,
                minor: 0,
                message: "no initiator name yet".into(),
            });
        };
        let mut minor: OmUint32 = 0;
        let mut output = BufferDesc::empty();
        // SAFETY: `name.handle` is a live name owned by `self`; `output` is released
        // below; the name type is not asked for.
        let major = unsafe {
            (self.gss.f.display_name)(&mut minor, name.handle, &mut output, ptr::null_mut())
        };
        let text = self.gss.take(&mut output).unwrap_or_default();
        self.gss.check("gss_display_name", major, minor)?;
        Ok(String::from_utf8_lossy(&text).into_owned())
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.gss.delete(&mut self.context);
    }
}

impl Drop for Name {
    fn drop(&mut self) {
        let mut minor: OmUint32 = 0;
        // SAFETY: `handle` is the name this value owns; the library nulls it.
        unsafe { (self.gss.f.release_name)(&mut minor, &mut self.handle) };
    }
}

impl Drop for Credential {
    fn drop(&mut self) {
        let mut minor: OmUint32 = 0;
        // SAFETY: `handle` is the credential this value owns; the library nulls it.
        unsafe { (self.gss.f.release_cred)(&mut minor, &mut self.handle) };
    }
}

impl Gssapi {
    /// Copies an output buffer's bytes and releases it; `None` when it is empty.
    fn take(&self, buffer: &mut BufferDesc) -> Option<Vec<u8>> {
        let bytes = (!buffer.value.is_null() && buffer.length > 0).then(|| {
            // SAFETY: the library filled `buffer` with `length` readable bytes at `value`.
            unsafe { std::slice::from_raw_parts(buffer.value.cast::<u8>(), buffer.length) }.to_vec()
        });
        if !buffer.value.is_null() {
            let mut minor: OmUint32 = 0;
            // SAFETY: `buffer` was allocated by the library and is released once.
            unsafe { (self.f.release_buffer)(&mut minor, buffer) };
        }
        bytes
    }

    /// Deletes a context handle if one was made.
    fn delete(&self, context: &mut Handle) {
        if context.is_null() {
            return;
        }
        let mut minor: OmUint32 = 0;
        // SAFETY: `context` is the live handle its owner holds; no output token is asked
        // for (`GSS_C_NO_BUFFER`); the library nulls the handle.
        unsafe { (self.f.delete_sec_context)(&mut minor, context, ptr::null_mut()) };
    }

    /// `Ok` unless `major` is an error (`GSS_ERROR()`), else the error in the library's
    /// words (`gss_display_status` of the major, then of the minor code).
    fn check(&self, call: &'static str, major: OmUint32, minor: OmUint32) -> Result<(), Error> {
        if major & ffi::ERROR_MASK == 0 {
            return Ok(());
        }
        let mut parts = self.status(major, ffi::C_GSS_CODE);
        if minor != 0 {
            parts.extend(self.status(minor, ffi::C_MECH_CODE));
        }
        let message = if parts.is_empty() {
            format!("GSSAPI error {major:#x}/{minor}")
        } else {
            parts.join(": ")
        };
        Err(Error::Call {
            call,
            major,
            minor,
            message,
        })
    }

    /// The messages of one status code, on one line each.
    fn status(&self, code: OmUint32, kind: std::ffi::c_int) -> Vec<String> {
        let mut out = Vec::new();
        let mut more: OmUint32 = 0;
        // A status has a few messages; the bound only guards against a library that
        // never clears the message context.
        for _ in 0..8 {
            let mut minor: OmUint32 = 0;
            let mut buffer = BufferDesc::empty();
            // SAFETY: the mechanism is null (the default); `more` and `buffer` are valid
            // out-parameters; the buffer is released by `take`.
            let major = unsafe {
                (self.f.display_status)(
                    &mut minor,
                    code,
                    kind,
                    ptr::null_mut::<OidDesc>(),
                    &mut more,
                    &mut buffer,
                )
            };
            let text = self.take(&mut buffer);
            if major & ffi::ERROR_MASK != 0 {
                break;
            }
            if let Some(text) = text {
                let line = String::from_utf8_lossy(&text)
                    .split(['\n', '\r'])
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .collect::<Vec<_>>()
                    .join("; ");
                if !line.is_empty() {
                    out.push(line.trim_end_matches('.').to_owned());
                }
            }
            if more == 0 {
                break;
            }
        }
        out
    }
}
