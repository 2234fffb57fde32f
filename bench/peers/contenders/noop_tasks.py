"""The no-op job, importable by name (RQ stores a job's function as "module.name")."""


def noop() -> None:
    return None
