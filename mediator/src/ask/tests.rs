use std::collections::BTreeMap;
use std::time::Duration;

use super::*;

fn question(authority: &str) -> Question {
    Question {
        id: String::new(),
        authority: authority.to_owned(),
        invocation: None,
        tags: BTreeMap::new(),
        host: "h.test".into(),
        port: 443,
        protocol: Protocol::Connect,
        peer: Peer::Embedded,
        message: "not in the grant".into(),
        reason: policy::Reason::NotInAllowlist,
        ts: String::new(),
        timeout_s: 30,
        method: None,
        path: None,
    }
}

fn asks() -> (Asks, Metrics) {
    let metrics = Metrics::new().unwrap();
    for a in ["a", "b"] {
        metrics.prime(a);
        let (families, label) = metrics.asks(a);
        families.prime(label);
    }
    (Asks::new(metrics.clone()), metrics)
}

fn deny(by: &str) -> Answered {
    Answered {
        answer: Answer::Deny(None),
        by: by.to_owned(),
    }
}

#[tokio::test]
async fn an_answer_reaches_its_request_once() {
    let (asks, metrics) = asks();
    let mut news = asks.subscribe();
    let mut held = asks.raise(7, question("a"), 2).unwrap();
    assert_eq!(news.recv().await.unwrap().authority, "a");
    assert_eq!(asks.list().len(), 1);
    assert!(asks.get("7").is_some());
    asks.answer("7", deny("test")).unwrap();
    assert_eq!(held.answered().await, deny("test"));
    assert_eq!(
        asks.answer("7", deny("again")),
        Err(AnswerError::AlreadyAnswered)
    );
    assert_eq!(asks.answer("8", deny("x")), Err(AnswerError::Unknown));
    assert_eq!(asks.answer("x", deny("x")), Err(AnswerError::Unknown));
    held.finish(AskOutcome::Deny);
    let text = metrics.render();
    for line in [
        "mediator_asks_total{authority=\"a\",outcome=\"deny\"} 1",
        "mediator_asks_pending{authority=\"a\"} 0",
        "mediator_ask_answer_duration_seconds_count 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
    }
}

#[tokio::test]
async fn each_authority_holds_its_own_maximum() {
    let (asks, metrics) = asks();
    let _one = asks.raise(1, question("a"), 1).unwrap();
    assert_eq!(
        asks.raise(2, question("a"), 1).unwrap_err(),
        Overloaded { max: 1 }
    );
    // Another authority is not affected.
    let _other = asks.raise(3, question("b"), 1).unwrap();
    let text = metrics.render();
    assert!(text.contains("mediator_asks_total{authority=\"a\",outcome=\"overloaded\"} 1"));
    assert!(text.contains("mediator_asks_pending{authority=\"a\"} 1"));
}

#[tokio::test]
async fn a_dropped_request_frees_its_place_and_counts_hung_up() {
    let (asks, metrics) = asks();
    let held = asks.raise(1, question("a"), 1).unwrap();
    drop(held);
    assert!(asks.list().is_empty());
    assert_eq!(
        asks.answer("1", deny("late")),
        Err(AnswerError::AlreadyAnswered)
    );
    let _again = asks.raise(2, question("a"), 1).unwrap();
    assert!(
        metrics
            .render()
            .contains("mediator_asks_total{authority=\"a\",outcome=\"hung_up\"} 1")
    );
}

#[tokio::test]
async fn an_answer_racing_the_end_is_the_answer() {
    let (asks, _) = asks();
    let mut held = asks.raise(1, question("a"), 1).unwrap();
    asks.answer("1", deny("host")).unwrap();
    // The timeout fired at the same moment: close finds the answer given.
    assert_eq!(held.close(), Some(deny("host")));
    let mut unanswered = asks.raise(2, question("a"), 1).unwrap();
    assert_eq!(unanswered.close(), None);
    assert_eq!(
        asks.answer("2", deny("late")),
        Err(AnswerError::AlreadyAnswered)
    );
    let waited = tokio::time::timeout(Duration::from_millis(20), unanswered.answered()).await;
    assert!(
        waited.is_err(),
        "a closed question has no answer to wait for"
    );
}

#[test]
fn ended_ids_are_remembered_within_a_bound() {
    let (asks, _) = asks();
    for id in 0..(ENDED_KEPT as u64 + 10) {
        let mut held = asks.raise(id, question("a"), 1).unwrap();
        held.finish(AskOutcome::Timeout);
    }
    let state = asks.lock();
    assert_eq!(state.ended.len(), ENDED_KEPT);
    assert_eq!(state.ended_set.len(), ENDED_KEPT);
    assert!(!state.ended_set.contains(&0));
}
