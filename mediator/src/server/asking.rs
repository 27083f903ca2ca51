//! What an embedding host (the shim's `--control`, design section 20) asks of a running
//! mediator about its questions: the pending ones, the new ones as they come, and the
//! way to answer one, applied and audited as the admin API's answers are
//! (`crate::control::asks`).

use std::sync::Arc;

use tokio::sync::broadcast;

use super::Running;
use crate::ask::Question;
use crate::ask::reply::Reply;
use crate::audit::Actor;
use crate::control::asks::Refused;

impl Running {
    /// Every pending question, oldest first.
    pub fn pending_questions(&self) -> Vec<Arc<Question>> {
        self.shared.asks.list()
    }

    /// New questions from now on. A receiver that falls behind gets
    /// [`broadcast::error::RecvError::Lagged`] and should read
    /// [`Self::pending_questions`] again.
    pub fn questions(&self) -> broadcast::Receiver<Arc<Question>> {
        self.shared.asks.subscribe()
    }

    /// Says there is nobody to ask about question `id` (the embedding host has no
    /// connection open to ask on): its grant miss stands, at once, with `asked.outcome:
    /// "no_host"`. Not an answer: no audit record. `false` when it is not pending.
    pub fn decline(&self, id: &str, why: &str) -> bool {
        let answered = crate::ask::Answered {
            answer: crate::ask::Answer::Decline,
            by: why.to_owned(),
        };
        self.shared.asks.answer(id, answered).is_ok()
    }

    /// Answers question `id` with `reply` for `actor`; the `ask_answer` audit record is
    /// written before this returns. Must run inside the mediator's runtime.
    ///
    /// # Errors
    /// [`Refused`]: an `allow_via` grant (make the authority with
    /// [`Self::add_authority`] first and answer with its name), an unknown id, or a
    /// question that has ended.
    pub async fn answer(
        &self,
        id: &str,
        reply: Reply,
        actor: Actor,
    ) -> Result<Arc<Question>, Refused> {
        self.control.answer_audited(id, reply, actor).await
    }
}
