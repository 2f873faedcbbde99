"""What actors say to each other, what the ledger records and what `--json` prints: one schema.

Every message is a frozen, keyword-only, tagged `msgspec.Struct` on `Message`. Commands are in the
imperative (`Acquire`, `Upload`), events in the past tense (`Leased`, `Uploaded`). Events carry the
attempt they belong to (`job`, `seed`, `attempt`) and the wall-clock time `t` they happened at; a
failed step carries its failure code as the plain string field `failure` (`"job_failed"`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any, ClassVar, TypedDict

import msgspec

from actor_run.protocols.failures import Code


class Message(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Base of every message. `urgent` (a class's, not a field): the actor that gets one is put at
    the front of the actor pool's queue of turns (actors/pool.py), ahead of routine turns: the
    commands on the way to deleting a machine (`Cancel`, `Release`)."""

    urgent: ClassVar[bool] = False


class JobHead(TypedDict):
    """The fields that name a job, spread into an event's constructor: `Retrying(**head, ...)`."""

    job: str
    seed: int


class AttemptHead(JobHead):
    """The fields that name an attempt, spread into an event's constructor: `Exited(**head, ...)`."""

    attempt: int


# --- data carried by messages -------------------------------------------------------------------


class CacheSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A persistent volume that outlives an attempt (a candidate's `cache = { name = "weights",
    size_gb = 200, mount = "/cache" }`): found or made per region before
    the launch (named `ar-cache-<name>`, recorded in the ledger before it is made), attached to the
    machine at `mount`, its path in `$ACTOR_RUN_CACHE`. A place that cannot host it starts cold (said
    in the events) unless `required`, which skips it. A run never deletes it: `actor-run sweep
    --caches` does."""

    name: str
    size_gb: int = 100
    mount: str = "/cache"
    required: bool = False

    @property
    def volume_name(self) -> str:
        """The provider's name for it (ours: `ar-cache-<name>`; not a machine name, so no machine sweep takes it)."""
        return f"{CACHE_PREFIX}{self.name}"


CACHE_PREFIX = "ar-cache-"


class CacheVolume(msgspec.Struct, frozen=True, kw_only=True):
    """A cache volume as its provider holds it, in our words."""

    cloud: str
    id: str
    name: str
    region: str = ""
    size_gb: int = 0
    path: str = ""  # where a machine sees it
    created: bool = False  # made by this call (False: found)
    created_at: float = 0.0


class Offer(msgspec.Struct, frozen=True, kw_only=True):
    """A place with stock now, at its actual price (the whole machine's, per hour); `candidate` is
    its index in the walk. `gpu` is a shape: `A100` one GPU, `A100:8` a machine with eight."""

    cloud: str
    region: str = ""
    gpu: str = ""
    hourly_usd: float = 0.0
    candidate: int = 0
    host: str = ""  # for the ssh cloud: which configured host
    account: str = ""  # which of the cloud's accounts ("" is the cloud's own settings)
    kind: str = ""  # the vendor's id of what is rented (a RunPod GPU type, a Lambda instance type, a flavor)
    stock: str = ""  # what the provider says of its stock: a count ("3"), its word ("high", "low"), or "" (silent)
    image: str = ""  # what the machine boots (its CUDA meets the GPU class's floor); "" where the cloud takes none
    cache: str = ""  # the cache volume's id at the provider, found before the launch ("" : none, a cold start)
    cache_path: str = ""  # where the machine is to see it
    interruptible: bool = False  # rented as interruptible capacity (a Vast bid, a Shadeform spot instance)
    interruptible_usd: float = 0.0  # the place's interruptible price beside its on-demand one (0: none sold)
    # the attempt's reserved dollars where a budget caps the batch (the job sets it before the lease): a
    # provider that enforces a spend limit of its own (Shadeform's auto_delete.spend_threshold) gets it (0: none)
    spend_cap_usd: float = 0.0


class Machine(msgspec.Struct, frozen=True, kw_only=True):
    """What a lease holds."""

    cloud: str
    id: str
    name: str
    region: str = ""
    gpu: str = ""
    hourly_usd: float = 0.0
    deadline: float = 0.0  # unix time the machine must be gone by
    created_at: float = 0.0
    address: str = ""
    root: str = ""  # the private folder on the machine everything goes into
    account: str = ""  # the cloud account it is billed to ("" is the cloud's own settings)
    taken_at: float = 0.0  # in a provider's listing: when it took the machine away (preempted); 0: it did not
    port: int = 0  # SSH port on `address` (0: the default, 22)
    user: str = ""  # SSH login (empty: the default of the cloud's host)
    cache: str = ""  # where the candidate's cache volume is mounted on it ("" : none attached)


class InputRef(msgspec.Struct, frozen=True, kw_only=True):
    """An input published on a machine: the job sees it as $ACTOR_RUN_IN/<name>/<basename>."""

    name: str
    sha256: str
    basename: str


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """What an attempt's machine cost: `usd` for `seconds` leased (`at_least`: deletion unconfirmed,
    billed up to the machine's deadline)."""

    usd: float = 0.0
    seconds: float = 0.0
    at_least: bool = False  # deletion unconfirmed: billed up to the deadline


class BudgetCount(msgspec.Struct, frozen=True, kw_only=True):
    """One retry budget's count against its limit (supervisors/tree/policy.py `counts`): `failures`
    against max_attempts, or a kind of failure against its own (`max_preemptions`, ...)."""

    used: int
    limit: int


def now() -> float:
    return time.time()


class Event(Message, frozen=True, kw_only=True):
    """Something that happened to one attempt of one job."""

    job: str
    seed: int
    attempt: int = 0
    t: float = msgspec.field(default_factory=now)


# --- the attempt's lifecycle (events, in order) --------------------------------------------------


class AttemptStarted(Event, frozen=True, kw_only=True):
    """An attempt began: `offer` is the place it will try to lease (attempt numbers count from 0)."""

    offer: Offer


class LeaseRequested(Event, frozen=True, kw_only=True):
    """The intent is in the ledger; the create call goes out next."""

    name: str
    cloud: str
    deadline: float


class LeaseStage(Event, frozen=True, kw_only=True):
    """Where the lease's machine is on its way up: `booting` (the create went out; the provider
    has not said ready) or `waiting for ssh` (the provider says ready; its SSH does not answer
    yet: the lease keeps connecting, with backoff, until `launch_timeout_s` from the create)."""

    name: str
    stage: str


class CacheOpened(Event, frozen=True, kw_only=True):
    """The attempt's cache before its launch: the volume found or made (`created`) in the place's
    region, to be attached at `path`; or `cold` (the region cannot host it: the job starts without,
    `detail` says why)."""

    cache: str  # the volume's name (ar-cache-<name>)
    cloud: str = ""
    region: str = ""
    volume: str = ""  # the provider's id
    path: str = ""
    created: bool = False
    cold: bool = False
    detail: str = ""


class Leased(Event, frozen=True, kw_only=True):
    """The provider made the machine and the ledger holds it: from here it is deleted, whatever happens."""

    machine: Machine


class LeaseFailed(Event, frozen=True, kw_only=True):
    """No machine was leased for this attempt (`failure` says why: `no_capacity`, `launch_failed`, ...)."""

    failure: Code
    detail: str = ""
    machine: Machine | None = None  # made, then it failed (it never answered): it bills until deleted
    taken_at: float | None = None  # the provider took it away meanwhile (preempted): its bill stopped then


class Uploaded(Event, frozen=True, kw_only=True):
    """The code and inputs are on the machine (content-addressed: unchanged files were not sent again)."""

    bytes_sent: int = 0
    seconds: float = 0.0
    code: str | None = None  # the code snapshot's hash
    inputs: list[InputRef] = msgspec.field(default_factory=list)
    resume: InputRef | None = None  # an earlier attempt's checkpoint, published like an input


class CheckpointSaved(Event, frozen=True, kw_only=True):
    """A checkpoint the job named in its progress is safe on this computer for the next attempt."""

    path: str
    line: dict[str, Any] = msgspec.field(default_factory=dict)
    bytes_received: int = 0


class TransferFailed(Event, frozen=True, kw_only=True):
    """An upload or a fetch failed; the attempt ends with `failure`."""

    failure: Code
    detail: str = ""
    taken_at: float | None = None  # preempted: when the provider took the machine, if it says


class JobStarted(Event, frozen=True, kw_only=True):
    """The command is running on the machine as process `pid`."""

    pid: int


class Progress(Event, frozen=True, kw_only=True):
    """A line the job appended to `$ACTOR_RUN_PROGRESS` (`line`, its JSON; `stage` from it)."""

    stage: str = ""
    line: dict[str, Any] = msgspec.field(default_factory=dict)


class Exited(Event, frozen=True, kw_only=True):
    """The command ended with `exit_code` (0: success; anything else is the job's failure:
    `job_failed`, or, by the job's own verdict (protocols/verdict.py), `retriable` or `oom`)."""

    exit_code: int
    billed_s: float = -1.0  # a provider that bills the run by the second (serverless): its seconds; -1 not so
    retriable: bool = False  # the job's last progress line saying "retriable" said true
    reason: str = ""  # the reason that line gave
    oom: str = ""  # the evidence that the job ran out of memory (its log's line, or its own flag)
    log_cut: int = 0  # bytes of the job's log cut from log.txt (the middle of a log longer than log_max_mb)
    progress_dropped: int = 0  # progress lines never emitted (a job writing them faster than a report holds)


class Stalled(Event, frozen=True, kw_only=True):
    """The job wrote no progress within its window (or its machine went silent): the attempt ends."""

    failure: Code = Code.STALLED
    detail: str = ""
    taken_at: float | None = None  # preempted: when the provider took the machine, if it says (its bill stops there)
    progress_dropped: int = 0  # progress lines never emitted (a job writing them faster than a report holds)


class Fetched(Event, frozen=True, kw_only=True):
    """`out/`, the log and the progress file are back on this computer, under the job's out folder."""

    bytes_received: int = 0
    seconds: float = 0.0


class Metered(Event, frozen=True, kw_only=True):
    """The attempt's cost so far (`usd`), sent every few seconds while its machine is leased."""

    usd: float
    reserved_usd: float = 0.0  # this attempt's reservation (0: none was made)


class Reserved(Event, frozen=True, kw_only=True):
    """Money set aside before the lease: the offer's price x the longest the attempt may hold the
    machine. The totals are the batch's, after this change (the live view shows them)."""

    usd: float
    offer: Offer
    hold_s: float
    spent_usd: float = 0.0
    reserved_usd: float = 0.0
    budget_usd: float | None = None


class Charged(Event, frozen=True, kw_only=True):
    """The machine is gone: its reservation (`reserved`) is replaced by what it cost (`usd`)."""

    usd: float
    reserved: float
    at_least: bool = False
    spent_usd: float = 0.0
    reserved_usd: float = 0.0
    budget_usd: float | None = None


class Released(Event, frozen=True, kw_only=True):
    """The lease ended: `confirmed` once the provider says the machine is gone."""

    machine: str
    confirmed: bool
    detail: str = ""


class AttemptEnded(Event, frozen=True, kw_only=True):
    """The attempt is over and its machine is released: outcome, failure code, cost (`usage`) and
    the seconds of each phase (`phases`)."""

    outcome: str  # "succeeded" | "failed"
    failure: Code | None = None
    detail: str = ""
    usage: Usage = msgspec.field(default_factory=Usage)
    phases: dict[str, float] = msgspec.field(default_factory=dict)
    offer: Offer | None = None
    exit_code: int | None = None
    reason: str = ""  # the job's own words on its failure (a retriable flag's reason, an out-of-memory line)


class Retrying(Event, frozen=True, kw_only=True):
    """The job tries again (attempt `attempt`, on `offer`), `delay_s` after its last attempt failed
    with `failure`. Said as that attempt starts: never for an attempt that does not run. `counts`:
    each retry budget's count against its limit, that failure counted (the live view shows them)."""

    failure: Code
    delay_s: float
    offer: Offer
    counts: dict[str, BudgetCount] = msgspec.field(default_factory=dict)  # each retry budget, this failure counted


class WaitingForCapacity(Event, frozen=True, kw_only=True):
    """No candidate place has stock: the job waits for some (asking again with backoff, and at
    once when a machine of its batch is let go) until `until` (unix time), then ends
    `no_capacity`. `wanted` says what it waits for (each candidate's cloud, GPU and regions).

    With `budget` set, the places have stock but the team budget of that name is too full for the
    reservation (`on_budget_full = "wait"`): the job waits for room in it (asking again with
    backoff, and at once when a reservation of its run is released), then ends `budget`."""

    wanted: str
    until: float
    budget: str = ""  # "" : it waits for stock; else the team budget it waits for room in

    @property
    def what(self) -> str:
        """What the job waits for, as views say it: `waiting for capacity` or `waiting for team budget 'x'`."""
        return waiting_words({"budget": self.budget})


def waiting_words(body: Mapping[str, Any]) -> str:
    """What a `WaitingForCapacity` (as its JSON body) says a job waits for, as views say it."""
    budget = body.get("budget")
    return f"waiting for team budget {budget!r}" if isinstance(budget, str) and budget else "waiting for capacity"


def is_waiting(words: str) -> bool:
    """Whether a job's stage (`waiting_words`, a lease's stage) is a wait for a machine it may rent."""
    return words == "waiting for capacity" or words.startswith("waiting for team budget ")


class JobEnded(Event, frozen=True, kw_only=True):
    """The job is over, exactly once per submitted job: `outcome` "succeeded", "failed" (with its
    `failure` code and `detail`) or "canceled" (failure `canceled`: stopped on purpose, by a cancel,
    a Ctrl-C or another controller taking it over), how many attempts it took (walk steps to a place
    without stock left out), what it cost in all, where its outputs are, and each retry budget's
    count against its limit (`counts`, as response.json has them)."""

    outcome: str
    failure: Code | None = None
    detail: str = ""
    attempts: int = 0
    usd: float = 0.0
    out_dir: str = ""
    counts: dict[str, BudgetCount] = msgspec.field(default_factory=dict)  # each retry budget against its limit


def ended_outcome(failure: Code | None) -> str:
    """A job's outcome from how it ended: "succeeded" without a failure, "canceled" when it was
    stopped on purpose (`Code.CANCELED`), else "failed"."""
    return "succeeded" if failure is None else "canceled" if failure is Code.CANCELED else "failed"


# --- commands ------------------------------------------------------------------------------------


class Acquire(Message, frozen=True, kw_only=True):
    offer: Offer
    name: str
    deadline: float
    cache: CacheSpec | None = None  # the candidate's cache: found or made before the create


class Upload(Message, frozen=True, kw_only=True):
    machine: str
    resume_dir: str | None = None  # a checkpoint folder to publish as the next attempt's in/resume


class Adopt(Message, frozen=True, kw_only=True):
    """Take over a machine an earlier controller leased (resume): no create, the same deletion."""

    machine: Machine


class FetchCheckpoint(Message, frozen=True, kw_only=True):
    machine: str
    work: str
    path: str  # under out/, as the job's progress line named it
    line: dict[str, Any]
    into: str  # the seed's checkpoint folder on this computer


class Fetch(Message, frozen=True, kw_only=True):
    machine: str
    work: str
    into: str  # local folder
    replace: bool = True  # an earlier fetch may have brought out/ and progress.jsonl there: remove them first


class Release(Message, frozen=True, kw_only=True):
    """Delete the machine now and say `Released` when the provider confirms it is gone."""

    urgent: ClassVar[bool] = True


class Watch(Message, frozen=True, kw_only=True):
    machine: str
    work: str
    pid: int
    launched_at: float  # stall windows are measured from here, even after a reattach
    reattached: bool = False  # what the first poll reads was written before: it is not fresh life


class StartMeter(Message, frozen=True, kw_only=True):
    machine: Machine
    at: float
    reserved_usd: float | None = None  # the guard: the attempt is stopped (`budget`) before its spend crosses it


class StopMeter(Message, frozen=True, kw_only=True):
    at: float
    confirmed: bool


class Cancel(Message, frozen=True, kw_only=True):
    urgent: ClassVar[bool] = True
    failure: Code = Code.CANCELED
    detail: str = ""


class ChildFailed(Message, frozen=True, kw_only=True):
    """A child actor raised: its parent ends the attempt with `internal`."""

    child: str
    detail: str


EVENTS = (
    AttemptStarted | LeaseRequested | LeaseStage | CacheOpened | Leased | LeaseFailed | Uploaded | CheckpointSaved
    | TransferFailed | JobStarted | Progress | Exited
    | Stalled | Fetched | Metered | Released | AttemptEnded | Retrying | WaitingForCapacity | JobEnded | Reserved
    | Charged
)

_encoder = msgspec.json.Encoder()


@functools.cache
def _event_decoder() -> msgspec.json.Decoder[Event]:
    """The one decoder of events, built at its first use (about 5 ms of CPU: msgspec reads every
    event's fields): only the report reads events back, and every process imports this module."""
    return msgspec.json.Decoder(EVENTS)


def encode(msg: Message) -> bytes:
    """A message as one line of JSON (its `type` tag first), as `--json` prints events."""
    return _encoder.encode(msg)


def run_line(run: str, body: bytes) -> str:
    """An event's JSON (`encode`'s, or as the ledger keeps it) with its run first: a `--json` line."""
    return '{"run":' + _encoder.encode(run).decode() + "," + body.decode()[1:]


def decode_event(data: bytes | str) -> Event:
    """An event back from its JSON (a line of `--json` output); msgspec.ValidationError if it is not one."""
    result: Event = _event_decoder().decode(data)
    return result
