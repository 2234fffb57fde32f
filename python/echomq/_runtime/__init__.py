"""The worker runtime's rules, without I/O: one core for the thread and asyncio drivers.

``lease.py``, ``reaper.py`` and ``worker.py`` (threads) and ``asyncio/``
(tasks) only wait, send commands and feed what came back to this package,
which decides: when a lease's next checkpoint is due, what a checkpoint's
reply or exception means, whether a sweep goes again, what a handler's end
does to its job, how a command is retried, how a shutdown proceeds, and
what the stats count.  Nothing here sends a command or sleeps; time comes
in as ``now``, seconds on the driver's monotonic clock.  Not thread-safe
unless said: the thread drivers call it under their own lock.

One module per concept (h11 style: feed events, ask what next):

- ``lease``: ``HeldJob``, one claimed job as its keeper sees it (the job and
  its token, the handler's CancelToken, the lease confirmed until when,
  lost or not); ``Leases``, the jobs one worker holds; ``checkpoint_round``,
  one batch of checkpoints; ``KeeperCore``, what both keepers share.
- ``claim``: ``ClaimStep``, one claim loop's REQ, sent again until a claim
  brings jobs back.
- ``finish``: ``Action`` and ``Finish``, what a handler's end decides, and
  ``Finishing``, how it is sent and counted.
- ``shutdown``: stop claiming, a grace, "shutdown" to every token, the
  jobs given back (``Shutdown``).
- ``sweep``: ``SweepTick``, one bounded tick of sweeps; ``ReaperCore``; and
  the sweep every worker runs itself (``ReapSchedule``, ``Reaping``).
- ``troubles``: ``Trouble``/``Troubles``, errors by kind, each logged once
  and all counted; ``Backoff``, one command sent again until it lands or
  a deadline passes.
- ``timeouts``: a handler's time limit (``JobTimeout``): "timeout" to its
  token, then, after a grace, its job failed without it (``Timing``).
- ``pushes``: ``SubscriptionHealth``, whether the pushed-cancel
  subscription still hears the server.
- ``context``: ``ContextCore`` (what a handler's ``JobContext`` shows) and
  ``Progress``.
- ``worker``: ``WorkerCore``, the settings and bookkeeping both ``Worker``
  classes share; each driver subclasses it and adds only its waiting and
  sending (``_init_driver`` makes its events).
- ``metrics``: ``Metrics``, what the runtime tells a worker's metrics (the
  interface ``echomq.metrics.Metrics`` implements).
- ``args``, ``logs``, ``stats``: checked arguments, loggers, ``WorkerStats``.

Every name is re-exported here: ``from echomq._runtime import HeldJob``.
"""

from __future__ import annotations

from .args import check_callable, check_client, check_int, check_seconds, takes_context
from .claim import IDLE_BLOCK_S, IDLE_POLL_MAX_S, MAX_CLAIM_BLOCK_S, ClaimStep, IdleWait, Slots, count_of
from .context import ContextCore, Progress, progress_bytes
from .finish import Action, Finish, Finishing, StoredResult, error_text, result_refused, traceback_text
from .lease import (
    CHECKPOINT_EARLY,
    CHECKPOINT_RETRY_S,
    LOST_DEADLINE,
    LOST_GONE,
    LOST_STALE,
    LOST_UNCONFIRMED,
    MAX_CHECKPOINT_BATCH,
    TIMEOUT,
    HeldJob,
    KeeperCore,
    LeaseEvent,
    Leases,
    checkpoint_round,
    lost_reason,
    state_refused,
)
from .logs import job_fields, lease_log, reaper_log, worker_log
from .metrics import Metrics
from .per_job import SETTINGS_HOOK, JobSettings, PerJob, settings_hook
from .pushes import HEALTH_EVERY_S, PONG_WITHIN_S, SubscriptionHealth
from .shutdown import FORCE_AFTER_S, FORCE_BUDGET_S, SHUTDOWN, Shutdown, forced_exit
from .stats import WorkerStats
from .sweep import (
    MAX_SWEEPS_PER_TICK,
    REAP_LIMIT,
    REAP_SWEEPS_PER_TURN,
    REAP_TIMEOUT_S,
    ReaperCore,
    Reaping,
    ReapSchedule,
    SweepTick,
)
from .timeouts import JobTimeout, Timing
from .troubles import (
    ATTEMPT_TIMEOUT_CAP_S,
    ATTEMPT_TIMEOUT_S,
    RETRY_CAP_S,
    RETRY_FIRST_S,
    TRY_FLOOR_S,
    TRY_SHARE,
    Backoff,
    Trouble,
    Troubles,
    reply_lost,
    trouble,
)
from .worker import WorkerCore

__all__ = [
    "ATTEMPT_TIMEOUT_CAP_S",
    "ATTEMPT_TIMEOUT_S",
    "CHECKPOINT_EARLY",
    "CHECKPOINT_RETRY_S",
    "FORCE_AFTER_S",
    "FORCE_BUDGET_S",
    "HEALTH_EVERY_S",
    "IDLE_BLOCK_S",
    "IDLE_POLL_MAX_S",
    "LOST_DEADLINE",
    "LOST_GONE",
    "LOST_STALE",
    "LOST_UNCONFIRMED",
    "MAX_CHECKPOINT_BATCH",
    "MAX_CLAIM_BLOCK_S",
    "MAX_SWEEPS_PER_TICK",
    "PONG_WITHIN_S",
    "REAP_LIMIT",
    "REAP_SWEEPS_PER_TURN",
    "REAP_TIMEOUT_S",
    "RETRY_CAP_S",
    "RETRY_FIRST_S",
    "SETTINGS_HOOK",
    "SHUTDOWN",
    "TIMEOUT",
    "TRY_FLOOR_S",
    "TRY_SHARE",
    "Action",
    "Backoff",
    "ClaimStep",
    "ContextCore",
    "Finish",
    "Finishing",
    "HeldJob",
    "IdleWait",
    "JobSettings",
    "JobTimeout",
    "KeeperCore",
    "LeaseEvent",
    "Leases",
    "Metrics",
    "PerJob",
    "Progress",
    "ReapSchedule",
    "ReaperCore",
    "Reaping",
    "Shutdown",
    "Slots",
    "StoredResult",
    "SubscriptionHealth",
    "SweepTick",
    "Timing",
    "Trouble",
    "Troubles",
    "WorkerCore",
    "WorkerStats",
    "check_callable",
    "check_client",
    "check_int",
    "check_seconds",
    "checkpoint_round",
    "count_of",
    "error_text",
    "forced_exit",
    "job_fields",
    "lease_log",
    "lost_reason",
    "progress_bytes",
    "reaper_log",
    "reply_lost",
    "result_refused",
    "settings_hook",
    "state_refused",
    "takes_context",
    "traceback_text",
    "trouble",
    "worker_log",
]
