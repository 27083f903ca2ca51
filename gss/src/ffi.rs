//! The C ABI of the GSSAPI items this crate calls, as RFC 2744 (the C bindings of GSS-API
//! v2) and MIT krb5's `gssapi.h`/`gssapi_ext.h` declare them on Linux. Types and
//! constants only: every call goes through a function pointer that `library.rs` resolved.
//!
//! The layouts are MIT's on every Linux ABI (its `#pragma pack(2)` applies to macOS only).

use std::ffi::{c_char, c_int, c_void};

/// `OM_uint32` (RFC 2744 section 3.1): major and minor status codes, flags, lifetimes.
pub(crate) type OmUint32 = u32;

/// `gss_name_t`, `gss_cred_id_t`, `gss_ctx_id_t`: opaque handles the library allocates.
pub(crate) type Handle = *mut c_void;

/// `gss_buffer_desc` (RFC 2744 section 3.2): a length and a pointer.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct BufferDesc {
    /// `length`, in bytes.
    pub(crate) length: usize,
    /// `value`.
    pub(crate) value: *mut c_void,
}

impl BufferDesc {
    /// `GSS_C_EMPTY_BUFFER`: what an output buffer starts as.
    pub(crate) fn empty() -> Self {
        Self {
            length: 0,
            value: std::ptr::null_mut(),
        }
    }

    /// A buffer the library only reads: `bytes` must outlive the call it is passed to.
    pub(crate) fn borrowing(bytes: &[u8]) -> Self {
        Self {
            length: bytes.len(),
            value: bytes.as_ptr().cast_mut().cast(),
        }
    }
}

/// `gss_OID_desc` (RFC 2744 section 3.3): the DER contents octets of an object identifier.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct OidDesc {
    /// `length`, in bytes.
    pub(crate) length: OmUint32,
    /// `elements`.
    pub(crate) elements: *mut c_void,
}

impl OidDesc {
    /// An OID over `bytes` (static DER contents), for one call.
    pub(crate) fn of(bytes: &'static [u8]) -> Self {
        Self {
            // The OIDs of this crate are a few bytes long.
            length: OmUint32::try_from(bytes.len()).unwrap_or(0),
            elements: bytes.as_ptr().cast_mut().cast(),
        }
    }
}

/// `GSS_C_NT_HOSTBASED_SERVICE`, {iso(1) member-body(2) us(840) mit(113554) infosys(1)
/// gssapi(2) generic(1) service_name(4)} (RFC 2744 section 4.1): a `service@host` name.
pub(crate) const NT_HOSTBASED_SERVICE: &[u8] =
    &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x12, 0x01, 0x02, 0x01, 0x04];

/// SPNEGO, {iso(1) org(3) dod(6) internet(1) security(5) mechanisms(5) snego(2)}
/// (RFC 4178 section 3): the mechanism of HTTP Negotiate (RFC 4559).
pub(crate) const MECH_SPNEGO: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x02];

/// `gss_key_value_element_desc` (MIT `gssapi_ext.h`): one credential-store entry.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct KeyValueElement {
    /// `key`, NUL-terminated (`ccache`, `client_keytab`, `keytab`).
    pub(crate) key: *const c_char,
    /// `value`, NUL-terminated.
    pub(crate) value: *const c_char,
}

/// `gss_key_value_set_desc` (MIT `gssapi_ext.h`): a credential store.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct KeyValueSet {
    /// `count`.
    pub(crate) count: OmUint32,
    /// `elements`.
    pub(crate) elements: *mut KeyValueElement,
}

/// `GSS_S_CONTINUE_NEEDED` (a supplementary-information bit).
pub(crate) const S_CONTINUE_NEEDED: OmUint32 = 1;
/// `GSS_C_CALLING_ERROR_MASK << GSS_C_CALLING_ERROR_OFFSET |
/// GSS_C_ROUTINE_ERROR_MASK << GSS_C_ROUTINE_ERROR_OFFSET`: the bits `GSS_ERROR()` tests.
pub(crate) const ERROR_MASK: OmUint32 = 0xffff_0000;
/// `GSS_C_INDEFINITE`: no lifetime asked for.
pub(crate) const INDEFINITE: OmUint32 = 0xffff_ffff;
/// `GSS_C_INITIATE` (`gss_cred_usage_t`).
pub(crate) const C_INITIATE: c_int = 1;
/// `GSS_C_ACCEPT` (`gss_cred_usage_t`).
pub(crate) const C_ACCEPT: c_int = 2;
/// `GSS_C_MUTUAL_FLAG`: the acceptor proves itself too.
pub(crate) const C_MUTUAL_FLAG: OmUint32 = 2;
/// `GSS_C_GSS_CODE` (`gss_display_status` status type).
pub(crate) const C_GSS_CODE: c_int = 1;
/// `GSS_C_MECH_CODE` (`gss_display_status` status type).
pub(crate) const C_MECH_CODE: c_int = 2;

/// `gss_import_name`.
pub(crate) type ImportName = unsafe extern "C" fn(
    minor: *mut OmUint32,
    input_name: *mut BufferDesc,
    name_type: *mut OidDesc,
    output_name: *mut Handle,
) -> OmUint32;

/// `gss_display_name`.
pub(crate) type DisplayName = unsafe extern "C" fn(
    minor: *mut OmUint32,
    name: Handle,
    output: *mut BufferDesc,
    output_type: *mut *mut OidDesc,
) -> OmUint32;

/// `gss_release_name`.
pub(crate) type ReleaseName =
    unsafe extern "C" fn(minor: *mut OmUint32, name: *mut Handle) -> OmUint32;

/// `gss_acquire_cred`.
pub(crate) type AcquireCred = unsafe extern "C" fn(
    minor: *mut OmUint32,
    desired_name: Handle,
    time_req: OmUint32,
    desired_mechs: *mut c_void,
    usage: c_int,
    output_cred: *mut Handle,
    actual_mechs: *mut *mut c_void,
    time_rec: *mut OmUint32,
) -> OmUint32;

/// `gss_acquire_cred_from` (MIT krb5 1.11 and later).
pub(crate) type AcquireCredFrom = unsafe extern "C" fn(
    minor: *mut OmUint32,
    desired_name: Handle,
    time_req: OmUint32,
    desired_mechs: *mut c_void,
    usage: c_int,
    store: *const KeyValueSet,
    output_cred: *mut Handle,
    actual_mechs: *mut *mut c_void,
    time_rec: *mut OmUint32,
) -> OmUint32;

/// `gss_release_cred`.
pub(crate) type ReleaseCred =
    unsafe extern "C" fn(minor: *mut OmUint32, cred: *mut Handle) -> OmUint32;

/// `gss_init_sec_context`.
pub(crate) type InitSecContext = unsafe extern "C" fn(
    minor: *mut OmUint32,
    cred: Handle,
    context: *mut Handle,
    target: Handle,
    mech: *mut OidDesc,
    req_flags: OmUint32,
    time_req: OmUint32,
    bindings: *mut c_void,
    input: *mut BufferDesc,
    actual_mech: *mut *mut OidDesc,
    output: *mut BufferDesc,
    ret_flags: *mut OmUint32,
    time_rec: *mut OmUint32,
) -> OmUint32;

/// `gss_accept_sec_context`.
pub(crate) type AcceptSecContext = unsafe extern "C" fn(
    minor: *mut OmUint32,
    context: *mut Handle,
    cred: Handle,
    input: *mut BufferDesc,
    bindings: *mut c_void,
    source_name: *mut Handle,
    mech: *mut *mut OidDesc,
    output: *mut BufferDesc,
    ret_flags: *mut OmUint32,
    time_rec: *mut OmUint32,
    delegated: *mut Handle,
) -> OmUint32;

/// `gss_delete_sec_context`.
pub(crate) type DeleteSecContext = unsafe extern "C" fn(
    minor: *mut OmUint32,
    context: *mut Handle,
    output: *mut BufferDesc,
) -> OmUint32;

/// `gss_release_buffer`.
pub(crate) type ReleaseBuffer =
    unsafe extern "C" fn(minor: *mut OmUint32, buffer: *mut BufferDesc) -> OmUint32;

/// `gss_display_status`.
pub(crate) type DisplayStatus = unsafe extern "C" fn(
    minor: *mut OmUint32,
    status: OmUint32,
    status_type: c_int,
    mech: *mut OidDesc,
    message_context: *mut OmUint32,
    output: *mut BufferDesc,
) -> OmUint32;
