//! The policy crate's one error type. Its messages are read by people (operators at
//! load, agents in a denial's detail), so each names the input and what would fix it; they
//! never carry a secret the input did not already show.

use thiserror::Error;

/// What a target is, for the messages about near misses.
const TARGET_FORM: &str = "a target is host:port (authority-form, RFC 9112 section 3.2.3)";

/// Everything that can go wrong in the policy crate. Each message names the offending
/// input and, where it helps, what would fix it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PolicyError {
    /// A host (destination or pattern) could not be canonicalised.
    #[error("invalid host {input:?}: {why}")]
    Host {
        /// The input as given (control characters escaped by `{:?}`).
        input: String,
        /// What is wrong with it.
        why: HostError,
    },
    /// A grant entry (allow, deny, allow_private, tls_terminate) is not acceptable.
    #[error("invalid {field} entry {entry:?}: {why}")]
    Pattern {
        /// The field: `allow`, `deny`, `allow_private`, `tls_terminate`.
        field: &'static str,
        /// The entry as written.
        entry: String,
        /// What is wrong with it and, where possible, what to write instead.
        why: PatternError,
    },
    /// The configuration is invalid; every problem is listed with its location.
    #[error("{}", .0.join("\n"))]
    Config(Vec<String>),
}

/// Why a host (a destination or a pattern's host part) or an authority-form target is
/// refused: the `why` of [`PolicyError::Host`]. Each message says what is wrong and,
/// where it helps, what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HostError {
    /// Nothing, or only a trailing dot.
    #[error("empty host")]
    Empty,
    /// Longer than any host can be (the bound, in bytes).
    #[error("longer than {0} bytes")]
    TooLong(usize),
    /// `[` without `]`.
    #[error("'[' without a closing ']'")]
    UnclosedBracket,
    /// Brackets around something that is no IPv6 literal.
    #[error("brackets are only allowed around an IPv6 literal")]
    BracketsNotIpv6,
    /// A bracket inside a host.
    #[error("brackets are only allowed around a whole IPv6 literal")]
    StrayBracket,
    /// One `:` in a host: a port where none is allowed.
    #[error("':' is not part of a host (a port is not allowed here)")]
    PortNotAllowed,
    /// `example.com..`.
    #[error("more than one trailing dot")]
    TrailingDots,
    /// `1.2.3.4.`.
    #[error("an IPv4 literal must not end with a dot")]
    Ipv4TrailingDot,
    /// `user@host`.
    #[error("userinfo ('@') is not allowed")]
    Userinfo,
    /// `/`, `\`, `?` or `#`.
    #[error("{0:?} is not allowed (paths, queries and fragments are not part of a host)")]
    PathChar(char),
    /// `%`.
    #[error("'%' is not allowed (no percent-encoding, no IPv6 zone IDs)")]
    Percent,
    /// A control character or a space.
    #[error("contains the control or space character {0:?}")]
    ControlChar(char),
    /// Another character no host holds.
    #[error("contains {0:?}, which is not allowed in a host")]
    BadChar(char),
    /// `fe80::1%eth0`.
    #[error("IPv6 zone IDs are not allowed")]
    ZoneId,
    /// Not an IPv6 address though it has colons.
    #[error("{0:?} is not a valid IPv6 address")]
    BadIpv6(String),
    /// A name whose last label is numeric but which is no IPv4 literal.
    #[error(
        "the last label of {0:?} is numeric, so URL parsers would read it as an IPv4 address; names must not end in a numeric label"
    )]
    NumericLastLabel(String),
    /// Numeric, but not four canonical decimal octets (`127.1`, `0x7f.0.0.1`, `01.2.3.4`).
    #[error(
        "{input:?} looks numeric but is not a canonical dotted-quad IPv4 address ({what}); write four decimal octets like 192.0.2.1"
    )]
    NotDottedQuad {
        /// The input.
        input: String,
        /// What is wrong with it.
        what: &'static str,
    },
    /// A name that maps (IDNA) to one ending in a numeric label.
    #[error(
        "maps to {0:?}, whose last label is numeric (an IPv4 literal must be written as an ASCII dotted quad)"
    )]
    MapsToNumeric(String),
    /// UTS-46 processing failed.
    #[error("not a valid internationalised name (UTS-46 processing failed)")]
    Idna,
    /// More than 253 bytes after mapping.
    #[error("name is {0} bytes long; at most 253 are allowed")]
    NameTooLong(usize),
    /// `a..b`.
    #[error("empty label")]
    EmptyLabel,
    /// A label over 63 bytes.
    #[error("label of {0} bytes; at most 63 are allowed")]
    LabelTooLong(usize),
    /// A character outside `[a-z0-9_-]` after mapping.
    #[error("contains {0:?} after IDNA mapping; only letters, digits, '-' and '_' are allowed")]
    MappedChar(char),
    /// A target without its port.
    #[error("a port is required (host:port)")]
    PortRequired,
    /// A URL, a path, query or fragment, or userinfo where a target was expected, with
    /// the target probably meant when that one is valid.
    #[error("{problem}; {}{}", TARGET_FORM, meant.as_ref().map(|t| format!(", e.g. \"{t}\"")).unwrap_or_default())]
    NotATarget {
        /// What the input is instead.
        problem: &'static str,
        /// The canonical target probably meant.
        meant: Option<String>,
    },
    /// Something after `]` that is no `:port`.
    #[error("unexpected {0:?} after ']'")]
    AfterBracket(String),
    /// `2001:db8::1:443`.
    #[error("an IPv6 literal with a port must be bracketed: \"{0}\"")]
    Ipv6NeedsBrackets(String),
    /// A bare IPv6 literal where a target was expected.
    #[error(
        "a port is required (host:port), and an IPv6 literal goes in brackets before it, e.g. \"[{0}]:443\""
    )]
    Ipv6WithoutPort(std::net::Ipv6Addr),
    /// Two or more `:` outside brackets that make no IPv6 literal.
    #[error(
        "more than one ':' outside brackets; {}, with an IPv6 host in brackets, e.g. \"[2001:db8::1]:443\"",
        TARGET_FORM
    )]
    ManyColons,
    /// `host:`.
    #[error("empty port")]
    EmptyPort,
    /// `host:https`, `host:+1`.
    #[error("port {0:?} is not a decimal number")]
    PortNotDecimal(String),
    /// `host:0443`.
    #[error("port {0:?} has leading zeros")]
    PortLeadingZeros(String),
    /// `host:0`.
    #[error("port 0 is not allowed")]
    PortZero,
    /// `host:65536`.
    #[error("port {0} is out of range 1..=65535")]
    PortRange(String),
    /// An absolute-form URI without a host (`http:///x`).
    #[error("absolute-form URI without a host")]
    UriWithoutHost,
    /// An absolute-form URI with userinfo (`http://user@host/`).
    #[error("userinfo is not allowed in a proxy target")]
    UriUserinfo,
}

/// Why a grant entry (`allow`, `deny`, `allow_private`, `tls_terminate`) is refused: the
/// `why` of [`PolicyError::Pattern`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PatternError {
    /// `""`.
    #[error("empty entry")]
    Empty,
    /// `user@host`.
    #[error("userinfo ('@') is not allowed; write only the host")]
    Userinfo,
    /// `https://host/`.
    #[error("write a host pattern, not a URL (no scheme, no path)")]
    Url,
    /// `*` in an allow list.
    #[error("'*' would allow every host; list the hosts (or \"*.example.com\" for one domain)")]
    AllowAll,
    /// The host part.
    #[error(transparent)]
    Host(#[from] HostError),
    /// A `/` that makes no CIDR.
    #[error(
        "{0:?} is not a CIDR (paths are not allowed; a CIDR is like 10.0.0.0/8 or 2001:db8::/32)"
    )]
    NotCidr(String),
    /// `10.0.0.1/8`.
    #[error("CIDR has host bits set; write \"{0}\"")]
    HostBits(ipnet::IpNet),
    /// `*x.example.com`, `a.*.com`.
    #[error("a wildcard must be a whole first label followed by a domain, like \"*.example.com\"")]
    WildcardShape,
    /// `*.`.
    #[error("a wildcard needs a domain after \"*.\", like \"*.example.com\"")]
    WildcardNoDomain,
    /// `*.*.example.com`.
    #[error("only one wildcard, as the whole first label, is allowed")]
    TwoWildcards,
    /// `*.1.2.3.4`.
    #[error("a wildcard cannot cover an IP address; use a CIDR like 192.0.2.0/24")]
    WildcardIp,
    /// `*.com`, `*.co.uk`.
    #[error("wildcard over public suffix {0:?}; write \"*.example.{0}\" for one domain")]
    PublicSuffix(String),
    /// An `allow_private` entry with a `/` that is no CIDR.
    #[error("not a CIDR; write e.g. \"10.1.0.0/16\" or \"fd00::/8\"")]
    PrivateNotCidr,
    /// An `allow_private` entry that is neither an address nor a CIDR.
    #[error("not an IP address or CIDR; write e.g. \"127.0.0.1\" or \"10.1.0.0/16\"")]
    PrivateNotAddress,
    /// `0.0.0.0/0`, `::/0`.
    #[error("a /0 exception would switch the address check off; list the ranges needed")]
    PrivateEverything,
    /// A range holding `0.0.0.0/8` or `::`.
    #[error(
        "0.0.0.0/8 and :: mean \"this host\" (connecting there reaches local listeners); they can never be an exception"
    )]
    PrivateThisHost,
}

/// Why an upstream setting (a parent URL, its credentials, `parent_auth`, a PAC source) is
/// refused. Never holds a password.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UpstreamError {
    /// `parent_auth = "ntlm"`.
    #[error("NTLM is not supported; use \"negotiate\" (Kerberos) or \"basic\"")]
    Ntlm,
    /// Another `parent_auth` value.
    #[error("unknown parent_auth {0:?}; write \"basic\" or \"negotiate\"")]
    UnknownAuth(String),
    /// An empty or over-long user name.
    #[error("the parent user name must be 1..=255 bytes")]
    UserLength,
    /// An over-long password.
    #[error("the parent password must be at most 255 bytes")]
    PasswordLength,
    /// A `:` in the user name.
    #[error("the parent user name must not contain ':' (RFC 7617)")]
    UserColon,
    /// A control character in the user name or password.
    #[error("parent credentials must not contain control characters")]
    CredentialControl,
    /// A malformed `%` escape in the user name.
    #[error("bad percent-encoding in the parent user name")]
    UserEncoding,
    /// A malformed `%` escape in the password.
    #[error("bad percent-encoding in the parent password")]
    PasswordEncoding,
    /// A parent URL without a scheme.
    #[error(
        "write scheme://host:port, like \"http://proxy.corp.example:8080\" or \"socks5://127.0.0.1:1080\""
    )]
    NoScheme,
    /// `socks4://`.
    #[error("SOCKS4 is not supported; use socks5://")]
    Socks4,
    /// Another scheme.
    #[error("unknown scheme {0:?}; use http://, https:// or socks5://")]
    UnknownScheme(String),
    /// A path, query or fragment after a parent.
    #[error("a parent URL has no path, query or fragment: write scheme://host:port")]
    ParentPath,
    /// The parent's host or port.
    #[error(transparent)]
    Host(#[from] PolicyError),
    /// A PAC URL without a host, or with userinfo.
    #[error("a PAC URL needs a host and no userinfo: write \"https://host/proxy.pac\"")]
    PacHost,
    /// A PAC URL with a space or control character.
    #[error("a PAC URL must not contain spaces or control characters")]
    PacControl,
    /// A PAC URL with a character RFC 3986 does not allow where it stands: not ASCII (a
    /// host is written as its A-label), or in the path, query or fragment unescaped.
    #[error("a PAC URL may not contain {0:?} (RFC 3986: an A-label host, percent-encoded path)")]
    PacCharacter(char),
    /// A PAC URL whose host or port cannot be read.
    #[error("a PAC URL needs a valid host and, if any, a port from 1 to 65535: {0:?} is not")]
    PacAuthority(String),
    /// Another scheme for a PAC.
    #[error(
        "a PAC URL must be http:// or https:// (WPAD and file:// are not used); or give an absolute path"
    )]
    PacScheme,
    /// A relative PAC path.
    #[error("write an absolute path to the PAC file, or an http(s):// URL")]
    PacPath,
}

/// Why a request rule (design section 9) or one of its parts is refused at load, or an
/// upgrade token cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RuleError {
    /// An empty upgrade token.
    #[error("an empty upgrade token")]
    EmptyUpgrade,
    /// An over-long upgrade token.
    #[error("upgrade token \"{shown}\" is longer than {max} bytes")]
    LongUpgrade {
        /// The token, escaped.
        shown: String,
        /// The bound, in bytes.
        max: usize,
    },
    /// An upgrade token that is no `name[/version]` of token characters.
    #[error(
        "upgrade token \"{0}\" is not protocol-name[/protocol-version] of HTTP token characters (RFC 9110 section 7.8)"
    )]
    BadUpgrade(String),
    /// A header name that is no token.
    #[error("header name {0:?} is not an HTTP token")]
    HeaderName(String),
    /// A header value pattern.
    #[error(
        "header {name:?}: value pattern {pattern:?} must be visible ASCII, with * only at its end"
    )]
    HeaderPattern {
        /// The header.
        name: String,
        /// The pattern.
        pattern: String,
    },
    /// A query parameter name.
    #[error("query parameter {0:?} must be letters, digits and - _ . ~ [ ] (as decoded)")]
    QueryName(String),
    /// A method of the wrong length.
    #[error("method {0:?} must be 1..=32 characters")]
    MethodLength(String),
    /// A method with lowercase letters.
    #[error("method {method:?} has lowercase letters; methods are case-sensitive: write {:?}", method.to_ascii_uppercase())]
    MethodCase {
        /// The method as written.
        method: String,
    },
    /// A method that is no token.
    #[error("method {0:?} is not an HTTP token")]
    MethodToken(String),
    /// A path prefix without a leading `/`.
    #[error("path prefix {0:?} must start with /")]
    PathStart(String),
    /// A path prefix with a character a literal path cannot hold.
    #[error(
        "path prefix {0:?} contains {1:?}; write a literal path (no query, fragment, percent-encoding or wildcard)"
    )]
    PathChar(String, char),
    /// A path prefix no normalised request path can have.
    #[error("path prefix {0:?} can never match a request: {1}")]
    PathNever(String, &'static str),
}

/// Why a configuration value (an authority's name, a socket mode, a watchdog endpoint, a
/// credential's secret) is refused. Never quotes a secret.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ValueError {
    /// An empty authority name.
    #[error("authority name is empty")]
    NameEmpty,
    /// An authority name over 64 bytes.
    #[error("authority name {0:?} is longer than 64 bytes")]
    NameLong(String),
    /// A character an authority name may not hold.
    #[error("authority name {0:?} contains {1:?}; use only ASCII letters, digits, '-' and '_'")]
    NameChar(String, char),
    /// A socket mode that is no 3 or 4 octal digits.
    #[error("write 3 or 4 octal digits, like \"0600\" or \"0660\"")]
    ModeDigits,
    /// setuid, setgid or sticky.
    #[error("setuid, setgid and sticky bits are not allowed")]
    ModeSpecial,
    /// Bits for others.
    #[error(
        "bits for others would let every local user act as this authority; use socket_gid and \"0660\" to share the socket with a group"
    )]
    ModeOthers,
    /// A watchdog endpoint that is not local.
    #[error(
        "watchdog {0:?} must be \"unix:/absolute/path\" or \"http://127.0.0.1:port/...\" (a loopback IP literal or localhost, no userinfo): the watchdog sees every allowed destination and must run on this host"
    )]
    Watchdog(String),
    /// An `ask` value that is not an endpoint on this host nor `admin`.
    #[error(
        "ask {0:?} must be \"unix:/absolute/path\", \"http://127.0.0.1:port/...\" (a loopback IP literal or localhost, no userinfo) or \"admin\": the questions name the hosts a child reaches for and must stay on this host"
    )]
    Ask(String),
    /// An empty secret (named by its source).
    #[error("{0}: the secret is empty")]
    SecretEmpty(String),
    /// A secret that is no header value: the 1-based position of the first bad byte.
    #[error(
        "{0}: the secret is not a valid header value (a control character, line break or non-ASCII byte at byte {1})"
    )]
    SecretByte(String, usize),
    /// A secret that begins or ends with a space.
    #[error("{0}: the secret begins or ends with a space")]
    SecretSpace(String),
}
