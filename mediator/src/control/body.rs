//! The JSON of an admin API body (and of the shim's control commands), read strictly: a
//! key given twice in one object is an error naming it, never "the last one wins" (RFC
//! 8259 section 4 leaves duplicate names to the implementation; a reviewer reading the
//! body must see the grant that applies).

use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Why a body is refused by [`parse`] (re-exported as `mediator::StrictJsonError`).
#[derive(Debug)]
pub enum BodyError {
    /// Not JSON at all (serde_json's message, with line and column).
    NotJson(serde_json::Error),
    /// `key` appears twice in one object; `field` is the top-level key it is under (the
    /// key itself at the top level).
    DuplicateKey {
        /// The top-level key.
        field: String,
        /// The key given twice.
        key: String,
    },
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotJson(e) => write!(f, "the body is not JSON: {e}"),
            Self::DuplicateKey { field, key } if field == key => write!(
                f,
                "key {key:?} is given twice; give each key once (nothing was created)"
            ),
            Self::DuplicateKey { field, key } => write!(
                f,
                "key {key:?} is given twice in one object under {field:?}; give each key once (nothing was created)"
            ),
        }
    }
}

/// Parses `bytes` as one JSON value (RFC 8259), refusing a key given twice in any object
/// (re-exported as `mediator::parse_strict_json`).
///
/// # Errors
/// [`BodyError::NotJson`] for anything but one JSON value (trailing bytes included);
/// [`BodyError::DuplicateKey`] for a key given twice, at any depth.
pub fn parse(bytes: &[u8]) -> Result<Value, BodyError> {
    let found = RefCell::new(None);
    let seed = Strict {
        top: None,
        found: &found,
    };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = seed.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    match (value, found.into_inner()) {
        (_, Some((field, key))) => Err(BodyError::DuplicateKey { field, key }),
        (Ok(v), None) => Ok(v),
        (Err(e), None) => Err(BodyError::NotJson(e)),
    }
}

/// One value; `top` is the top-level key it is under (`None` at the root).
#[derive(Clone, Copy)]
struct Strict<'a> {
    top: Option<&'a str>,
    found: &'a RefCell<Option<(String, String)>>,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(self)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let top = self.top.unwrap_or(&key).to_owned();
            if out.contains_key(&key) {
                *self.found.borrow_mut() = Some((top, key.clone()));
                return Err(A::Error::custom(format!("duplicate key {key:?}")));
            }
            let value = map.next_value_seed(Strict {
                top: Some(&top),
                found: self.found,
            })?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_given_twice_is_named_at_any_depth() {
        let dup = |s: &str| match parse(s.as_bytes()) {
            Err(BodyError::DuplicateKey { field, key }) => (field, key),
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(
            dup(r#"{"name":"a","allow":["x.test"],"allow":["*"]}"#),
            ("allow".into(), "allow".into())
        );
        assert_eq!(
            dup(r#"{"deny":[{"host":"a.test","host":"b.test"}]}"#),
            ("deny".into(), "host".into())
        );
        let v = parse(br#"{"a":[1,-2,3.5,null,true,{"b":"c"}],"d":{"a":1}}"#).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a":[1,-2,3.5,null,true,{"b":"c"}],"d":{"a":1}})
        );
        assert!(matches!(parse(b"{} x"), Err(BodyError::NotJson(_))));
        assert!(matches!(parse(b"{\"a\":"), Err(BodyError::NotJson(_))));
    }
}
