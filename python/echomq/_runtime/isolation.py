"""Process isolation's rules that the core reads: the isolations a worker may ask for, and where a
child's traceback travels.  ``echomq.isolation`` runs the children; the core never imports it.
"""

from __future__ import annotations

__all__ = ["CHILD_TRACEBACK", "ISOLATIONS"]

ISOLATIONS = ("thread", "process")
# Where an exception raised in a child keeps its traceback there: what the worker stores as the job's.
CHILD_TRACEBACK = "_echomq_child_traceback"
