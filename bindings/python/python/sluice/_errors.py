"""The exceptions sluice raises. Being limited is not one of them: it is a `Decision`."""

from __future__ import annotations


class SluiceError(Exception):
    """Base of every sluice exception."""


class PolicyError(SluiceError, ValueError):
    """A policy that cannot be used (bad name, a rule that cannot be enforced)."""


class RuleError(PolicyError):
    """Rule text that does not parse. `column` counts characters from 1."""

    def __init__(self, message: str, policy: str, column: int, expected: str, found: str):
        super().__init__(message)
        self.policy = policy
        self.column = column
        self.expected = expected
        self.found = found


class ConfigError(SluiceError, ValueError):
    """A config file (or a policy dict) that cannot be used, with where and why.

    `line` and `column` are None for a policy given as a dict."""

    def __init__(self, message: str, file: str, line: int | None, column: int | None, field: str):
        super().__init__(message)
        self.file = file
        self.line = line
        self.column = column
        self.field = field


class UnknownPolicy(SluiceError, KeyError):
    """No policy of that name is loaded."""

    def __init__(self, message: str, policy: str):
        super().__init__(message)
        self.policy = policy

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class MissingSelector(SluiceError, ValueError):
    """The policy's rule needs a selector the call did not give."""

    def __init__(self, message: str, policy: str, selector: str):
        super().__init__(message)
        self.policy = policy
        self.selector = selector


class StoreError(SluiceError):
    """The store could not be opened or answered with an error no failure mode covers.

    A store that is merely down does not raise: the policy's failure mode decides (see
    `Decision.without_store`). `transient` says whether the same call may succeed later."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient
