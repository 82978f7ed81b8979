//! How a call names its policy: by name, or by a handle taken once.

use std::sync::Arc;

use crate::policy::CompiledPolicy;

/// A handle on a compiled policy: cheap to clone and to hold, and decided on without a
/// lookup. It keeps its definition: a reload that replaces or removes the policy leaves a
/// handle taken before it deciding as it did (on the same counters, when the leaves are
/// unchanged). Take a new one with [`Limiter::policy`](crate::Limiter::policy) to follow a
/// reload.
pub type PolicyRef = Arc<CompiledPolicy>;

/// The policy a call is about: `"login"` (looked up when the call is made) or `&handle`.
#[derive(Debug, Clone, Copy)]
pub enum PolicyArg<'a> {
    Name(&'a str),
    Ref(&'a PolicyRef),
}

impl<'a> From<&'a str> for PolicyArg<'a> {
    fn from(name: &'a str) -> Self {
        PolicyArg::Name(name)
    }
}

impl<'a> From<&'a String> for PolicyArg<'a> {
    fn from(name: &'a String) -> Self {
        PolicyArg::Name(name)
    }
}

impl<'a> From<&'a PolicyRef> for PolicyArg<'a> {
    fn from(policy: &'a PolicyRef) -> Self {
        PolicyArg::Ref(policy)
    }
}
