"""sluice: distributed rate limiting, in process.

The limiter of the Rust workspace (the same rules, stores and counters as `sluice serve`):

    >>> import sluice
    >>> limiter = sluice.Limiter(policies={"api": "user:2/m"})
    >>> limiter.check("api", {"user": "alice"}).allowed
    True

Concurrency leases (`acquire`) and reservations whose cost is known afterwards (`reserve`):

    >>> limiter = sluice.Limiter(policies={"exports": "user:3 concurrent"})
    >>> with limiter.acquire("exports", {"user": "alice"}) as lease:
    ...     lease.allowed
    True

Framework integrations live in `sluice.django`, `sluice.flask`, `sluice.asgi` and
`sluice.tornado`; each is imported only when used.
"""

from ._errors import (
    ConfigError,
    MissingSelector,
    PolicyError,
    RuleError,
    SluiceError,
    StoreError,
    UnknownPolicy,
)
from ._sluice import (
    ClientIp,
    Decision,
    Lease,
    Limiter,
    Reservation,
    __version__,
    hashed,
    parse_rule,
)

__all__ = [
    "ClientIp",
    "ConfigError",
    "Decision",
    "Lease",
    "Limiter",
    "MissingSelector",
    "PolicyError",
    "Reservation",
    "RuleError",
    "SluiceError",
    "StoreError",
    "UnknownPolicy",
    "__version__",
    "hashed",
    "parse_rule",
]
