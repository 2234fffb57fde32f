"""The sync driver: echomq over redis-py with threads, file for file as ``echomq/asyncio/``.

``client.py``, ``worker.py``, ``lease.py``, ``reaper.py``, ``context.py``,
``_attempt.py``, ``_finisher.py``, ``_pushes.py``, ``_sweeper.py``,
``_schedules.py``, ``_reach.py`` and ``_operator.py`` have their twins of the
same names there; ``_turns.py`` (the threads' turns) has none: an asyncio
worker has tasks and the loop instead.  The public names are ``echomq``'s
(``echomq.Client``, ``echomq.Worker``, ...) and the public modules at the top
(``echomq.client``, ``echomq.worker``, ``echomq.lease``, ``echomq.context``,
``echomq.reaper``) re-export them.
"""
