//! An answer to a question (design section 20) as the host writes it, read strictly
//! (`crate::control::body`: a key given twice is refused) into a [`Reply`]. The same
//! words everywhere: the body of `POST /v1/asks/<id>`, the body of an `ask` endpoint's
//! `200`, and a line on the shim's control socket (which names the question:
//! `{"answer": "<id>", ...}`, [`parse_line`]).
//!
//! | JSON | reply |
//! |---|---|
//! | `{"allow_via": "<authority>"}` | judge the request again, in full, under that authority |
//! | `{"allow_via": {"allow": [...], "deny": [...], "allow_private": [...]}}` | the shim's embedded mode only: a new in-process authority with that grant |
//! | `{"deny": "<text>"}` | deny, `ask_denied`, the text (printable ASCII, at most 400 bytes) as `message` |
//!
//! Anything else is refused with what is wrong; a refused answer changes nothing (the
//! question stays pending).

use serde_json::{Map, Value};

/// The longest authority name an `allow_via` may give, in bytes.
const MAX_NAME: usize = 128;

/// The most entries of one list of an `allow_via` grant.
const MAX_ENTRIES: usize = 256;

/// An answer, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `{"allow_via": "<authority>"}`.
    AllowVia(String),
    /// `{"allow_via": {"allow": [...], ...}}`: a wider grant, made in process by the
    /// shim's embedded mode (the admin API refuses it: create the authority first).
    AllowGrant(GrantLists),
    /// `{"deny": "<text>"}`: `None` for an empty text.
    Deny(Option<String>),
}

/// The lists of an `allow_via` grant, as the shim's flags take them (checked when the
/// authority is made).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantLists {
    /// Host patterns it allows (`--allow`).
    pub allow: Vec<String>,
    /// Host patterns it denies (`--deny`).
    pub deny: Vec<String>,
    /// CIDR exceptions to the address rules (`--allow-private`).
    pub allow_private: Vec<String>,
}

/// Why an answer is refused (`400`; the question stays pending).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// Not one strict JSON object.
    #[error("{0}")]
    Json(String),
    /// The object is not one of the answers.
    #[error("{0}")]
    Shape(String),
}

/// Reads the answer of an admin API or endpoint body.
///
/// # Errors
/// [`ReplyError`] naming what is wrong.
pub fn parse(body: &[u8]) -> Result<Reply, ReplyError> {
    let object = object(body)?;
    reply(&object, &[])
}

/// Reads one line of the shim's control socket that answers a question: `{"answer":
/// "<id>", ...the answer...}`; returns the id and the answer.
///
/// # Errors
/// [`ReplyError`] naming what is wrong.
pub fn parse_line(line: &[u8]) -> Result<(String, Reply), ReplyError> {
    let object = object(line)?;
    let id = match object.get("answer") {
        Some(Value::String(id)) if !id.is_empty() && id.len() <= 32 => id.clone(),
        _ => {
            return Err(shape(
                "\"answer\" must name the question: its id, as a string",
            ));
        }
    };
    Ok((id, reply(&object, &["answer"])?))
}

fn object(body: &[u8]) -> Result<Map<String, Value>, ReplyError> {
    match crate::control::body::parse(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(shape(ANSWERS)),
        Err(e) => Err(ReplyError::Json(e.to_string())),
    }
}

/// What an answer may be, for the errors.
const ANSWERS: &str =
    "an answer is one JSON object: {\"allow_via\": \"<authority>\"} or {\"deny\": \"<text>\"}";

fn shape(why: &str) -> ReplyError {
    ReplyError::Shape(why.to_owned())
}

fn reply(object: &Map<String, Value>, also: &[&str]) -> Result<Reply, ReplyError> {
    if let Some(k) = object
        .keys()
        .find(|k| !matches!(k.as_str(), "allow_via" | "deny") && !also.contains(&k.as_str()))
    {
        return Err(shape(&format!("unknown key {k:?}; {ANSWERS}")));
    }
    match (object.get("allow_via"), object.get("deny")) {
        (Some(_), Some(_)) => Err(shape(&format!(
            "give allow_via or deny, not both; {ANSWERS}"
        ))),
        (Some(Value::String(name)), None) => {
            let ok = !name.is_empty()
                && name.len() <= MAX_NAME
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if ok {
                Ok(Reply::AllowVia(name.clone()))
            } else {
                Err(shape(
                    "allow_via must name an authority: 1 to 128 letters, digits, '.', '_' or '-'",
                ))
            }
        }
        (Some(Value::Object(grant)), None) => grant_lists(grant).map(Reply::AllowGrant),
        (Some(_), None) => Err(shape(
            "allow_via is an authority's name, or (embedded mode) {\"allow\": [...]}",
        )),
        (None, Some(Value::String(text))) => {
            if text.is_empty() {
                return Ok(Reply::Deny(None));
            }
            policy::check_operator_reason(text)
                .map(|()| Reply::Deny(Some(text.clone())))
                .map_err(|why| shape(&format!("deny: {why}")))
        }
        (None, Some(_)) => Err(shape("deny is the text the client is told (a string)")),
        (None, None) => Err(shape(ANSWERS)),
    }
}

fn grant_lists(grant: &Map<String, Value>) -> Result<GrantLists, ReplyError> {
    let mut out = GrantLists::default();
    for (key, value) in grant {
        let list = match key.as_str() {
            "allow" => &mut out.allow,
            "deny" => &mut out.deny,
            "allow_private" => &mut out.allow_private,
            other => {
                return Err(shape(&format!(
                    "allow_via: unknown key {other:?} (allow, deny, allow_private)"
                )));
            }
        };
        let Value::Array(items) = value else {
            return Err(shape(&format!("allow_via: {key} is a list of strings")));
        };
        if items.len() > MAX_ENTRIES {
            return Err(shape(&format!(
                "allow_via: {key} has {} entries; at most {MAX_ENTRIES}",
                items.len()
            )));
        }
        for item in items {
            let Value::String(s) = item else {
                return Err(shape(&format!("allow_via: {key} is a list of strings")));
            };
            list.push(s.clone());
        }
    }
    if out.allow.is_empty() {
        return Err(shape("allow_via: a grant needs at least one allow entry"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read() {
        assert_eq!(
            parse(br#"{"allow_via":"agent-wide"}"#),
            Ok(Reply::AllowVia("agent-wide".into()))
        );
        assert_eq!(parse(br#"{"deny":""}"#), Ok(Reply::Deny(None)));
        assert_eq!(
            parse(br#"{"deny":"not during the build"}"#),
            Ok(Reply::Deny(Some("not during the build".into())))
        );
        assert_eq!(
            parse(br#"{"allow_via":{"allow":["a.test","*.b.test"],"allow_private":["127.0.0.1/32"]}}"#),
            Ok(Reply::AllowGrant(GrantLists {
                allow: vec!["a.test".into(), "*.b.test".into()],
                deny: vec![],
                allow_private: vec!["127.0.0.1/32".into()],
            }))
        );
        assert_eq!(
            parse_line(br#"{"answer":"17","deny":"no"}"#),
            Ok(("17".into(), Reply::Deny(Some("no".into()))))
        );
    }

    #[test]
    fn anything_else_is_refused_saying_what() {
        for (body, expected) in [
            (&br#"{"allow":"x"}"#[..], "unknown key \"allow\""),
            (br#"{"allow_via":"a","deny":"b"}"#, "not both"),
            (br#"{"allow_via":"a","allow_via":"b"}"#, "twice"),
            (br#"{"allow_via":""}"#, "must name an authority"),
            (br#"{"allow_via":"a b"}"#, "must name an authority"),
            (br#"{"allow_via":7}"#, "authority's name"),
            (br#"{"allow_via":{"allow":[]}}"#, "at least one allow"),
            (br#"{"allow_via":{"allow":[1]}}"#, "list of strings"),
            (br#"{"allow_via":{"nope":[]}}"#, "unknown key"),
            (br#"{"deny":7}"#, "a string"),
            (b"{\"deny\":\"a\\nb\"}", "deny:"),
            (br#"{}"#, "one JSON object"),
            (br#"[]"#, "one JSON object"),
            (br#"{"answer":"1","deny":"x"}"#, "unknown key \"answer\""),
            (b"not json", "not JSON"),
        ] {
            let e = parse(body).unwrap_err().to_string();
            assert!(
                e.contains(expected),
                "{}: {e}",
                String::from_utf8_lossy(body)
            );
        }
        let e = parse_line(br#"{"deny":"x"}"#).unwrap_err().to_string();
        assert!(e.contains("must name the question"), "{e}");
    }
}
