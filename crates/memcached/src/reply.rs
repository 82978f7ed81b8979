//! The answers of combined steps (sliding-window hits in [`crate::combine`],
//! compare-and-swap updates in [`crate::cas`]): the caller that runs a batch takes its own
//! step's answer back directly, with no channel (a lone step, the common case, allocates
//! none); callers whose steps joined another's batch wait on a channel.

use smallvec::SmallVec;
use tokio::sync::oneshot;

use crate::MemcachedError;
use crate::key::Keys;
use crate::pool::Deadline;

pub(crate) type Outcome<T> = Result<T, MemcachedError>;

/// Where a step's answer goes: `None` while its own caller runs the batch.
pub(crate) type ReplyTo<T> = Option<oneshot::Sender<Outcome<T>>>;

/// Sends `answer` to the step's caller, or hands it back if that caller runs the batch.
pub(crate) fn deliver<T>(reply: ReplyTo<T>, answer: Outcome<T>) -> Option<Outcome<T>> {
    match reply {
        Some(reply) => {
            let _ = reply.send(answer);
            None
        }
        None => Some(answer),
    }
}

/// A joined step's answer from the batch that took it, within its deadline; `what` names
/// the step if the batch dropped it.
pub(crate) async fn wait<T>(
    answer: oneshot::Receiver<Outcome<T>>,
    keys: &Keys,
    deadline: Deadline,
    what: &str,
) -> Outcome<T> {
    match tokio::time::timeout_at(deadline.at, answer).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(MemcachedError::Io {
            server: keys.route().to_owned(),
            message: format!("the {what} was dropped"),
        }),
        Err(_) => Err(MemcachedError::Timeout(deadline.budget)),
    }
}

/// A step waiting in a batch.
pub(crate) trait Step: Sized {
    type Answer;
    fn deadline(&self) -> Deadline;
    /// Sends `answer` to the step's caller, or hands it back if that caller runs the batch.
    fn answer(self, answer: Outcome<Self::Answer>) -> Option<Outcome<Self::Answer>>;
}

/// A batch's steps, in order: inline when alone.
pub(crate) type Batch<S> = SmallVec<[S; 1]>;

/// Fails every step; the answer of the caller's own, if it runs the batch.
pub(crate) fn fail<S: Step>(steps: Batch<S>, error: &MemcachedError) -> Option<Outcome<S::Answer>> {
    let mut own = None;
    for step in steps {
        own = own.or(step.answer(Err(error.clone())));
    }
    own
}

/// Takes out the steps whose callers stopped waiting (their deadline passed), in place and
/// in order (late steps are rare), answering each with a timeout; the answer of the
/// caller's own, if it runs the batch and is among them.
pub(crate) fn take_late<S: Step>(steps: &mut Batch<S>) -> Option<Outcome<S::Answer>> {
    let now = tokio::time::Instant::now();
    let mut own = None;
    let mut i = 0;
    while i < steps.len() {
        let deadline = steps[i].deadline();
        if deadline.at > now {
            i += 1;
            continue;
        }
        let step = steps.remove(i);
        own = own.or(step.answer(Err(MemcachedError::Timeout(deadline.budget))));
    }
    own
}
