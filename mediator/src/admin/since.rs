//! `GET /v1/authorities/<name>/denials?since=`: a decision id (denials after it) or an
//! RFC 3339 instant (at or after it).

use crate::authorities::Since;

/// A `since=` that is neither a decision id nor an RFC 3339 instant.
#[derive(Debug, thiserror::Error)]
#[error("since={value:?}: give a decision id or an RFC 3339 UTC time ({error})")]
pub(super) struct SinceError {
    value: String,
    error: humantime::TimestampError,
}

/// `since=` is a decision id (denials after it) or an RFC 3339 instant (at or after it).
pub(super) fn parse_since(query: Option<&str>) -> Result<Since, SinceError> {
    let Some(query) = query else {
        return Ok(Since::All);
    };
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != "since" {
            continue;
        }
        if v.is_empty() {
            return Ok(Since::All);
        }
        if let Ok(id) = v.parse::<u64>() {
            return Ok(Since::Id(id));
        }
        let v = v.replace("%3A", ":").replace("%3a", ":");
        return humantime::parse_rfc3339(&v)
            .map(Since::Time)
            .map_err(|error| SinceError { value: v, error });
    }
    Ok(Since::All)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_forms() {
        assert_eq!(parse_since(None).ok(), Some(Since::All));
        assert_eq!(parse_since(Some("since=17")).ok(), Some(Since::Id(17)));
        assert_eq!(parse_since(Some("x=1&since=")).ok(), Some(Since::All));
        assert!(matches!(
            parse_since(Some("since=2026-01-02T03:04:05Z")),
            Ok(Since::Time(_))
        ));
        assert!(matches!(
            parse_since(Some("since=2026-01-02T03%3A04%3A05Z")),
            Ok(Since::Time(_))
        ));
        assert!(parse_since(Some("since=yesterday")).is_err());
    }
}
