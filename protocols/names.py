"""Machine names carry the job, seed, attempt, owner and deadline, so a sweep can decide from a
provider's list alone: `ar-<job>-<seed>-a<attempt>-<owner>-d<unix deadline>`."""

from __future__ import annotations

import re

import msgspec

PREFIX = "ar-"
_NAME = re.compile(
    r"^ar-(?P<job>[a-z0-9-]{1,40})-(?P<seed>n?\d+)-a(?P<attempt>\d+)-(?P<owner>[0-9a-f]{8})-d(?P<deadline>\d+)$"
)


class MachineName(msgspec.Struct, frozen=True, kw_only=True):
    job: str
    seed: int
    attempt: int
    owner: str  # the controller's short id: 8 hex digits
    deadline: int

    def __str__(self) -> str:
        seed = f"n{-self.seed}" if self.seed < 0 else str(self.seed)
        return f"{PREFIX}{self.job}-{seed}-a{self.attempt}-{self.owner}-d{self.deadline}"


def encode_name(job: str, seed: int, attempt: int, owner: str, deadline: float) -> str:
    return str(MachineName(job=job, seed=seed, attempt=attempt, owner=owner[:8], deadline=int(deadline)))


def parse_name(name: str) -> MachineName | None:
    """The parts of one of our names, or None for a name that is not ours."""
    m = _NAME.match(name)
    if m is None:
        return None
    seed = m.group("seed")
    return MachineName(
        job=m.group("job"), seed=-int(seed[1:]) if seed.startswith("n") else int(seed),
        attempt=int(m.group("attempt")), owner=m.group("owner"), deadline=int(m.group("deadline")),
    )
