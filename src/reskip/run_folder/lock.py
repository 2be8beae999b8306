"""One writer per run folder: a process that writes into a run holds `RUN/.lock` (an advisory `flock`) for the
length of the write, and a second process that would write into the same folder is refused in one line instead
of logging every step twice or replacing files under the first. The lock is released when the process ends,
however it ends (a killed process leaves no stale lock). Re-entrant within one process: the pipeline holds it
across its stages, which take it again. In a distributed job (torchrun, accelerate launch) the first of its processes
holds it for the job, and the others, children of the same launcher, go on without it (only rank 0 writes). What
says "the same job" is the launcher itself (the holder's parent process, a Python launcher), never a variable of the
environment: `RANK` or `WORLD_SIZE` left in a shell after a distributed job turn no second command into a writer
beside the first."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from ..errors import ReskipError

LOCK_NAME = ".lock"
_held: dict[Path, list] = {}  # resolved run folder -> [open lock file, depth]


def _open_lock(path: Path):
    """The lock file, opened without following a link: a `.lock` that is a symlink (a shared run planted one) would
    otherwise have reskip write into whatever file it points to."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError:
        if path.is_symlink():
            raise ReskipError(f"{path} is a link: a run folder's own files are never links; remove it (reskip does not "
                              "write through it)") from None
        raise
    return os.fdopen(fd, "r+")  # held open for the body's length


def launched_job() -> str | None:
    """This process's distributed job ("job <the launcher's pid>"), when a Python launcher (torchrun, accelerate
    launch) started it as one of several processes; None otherwise (a shell is no launcher, whatever its variables)."""
    try:
        world = int(os.environ.get("WORLD_SIZE") or 1)
    except ValueError:
        return None
    if world <= 1:
        return None
    try:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return f"job {os.getppid()}" if "python" in parent.split(" ")[0] else None


JOB_WAIT_S = 10.0  # how long a process of a distributed job waits to read that its job's first process holds it


def _of_job(holder: str, job: str | None) -> bool:
    """The lock's holder is a process of this distributed job: it holds the folder for the whole job."""
    return job is not None and holder.endswith(f" {job}")


def _take(f, job: str | None) -> str | None:
    """Take the lock (None), or say who holds it. A process of a distributed job reads the holder again for a few
    seconds: the job's first process may hold the lock and not yet have written its name (or the file may still
    name an earlier run's holder), and reading then would refuse a process of the very job that holds it."""
    deadline = time.monotonic() + (JOB_WAIT_S if job is not None else 0.0)
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip()
        if job is None or _of_job(holder, job) or time.monotonic() > deadline:
            return holder
        time.sleep(0.05)


@contextlib.contextmanager
def writing(root: Path):
    """Hold `root`'s lock while the body writes into it (the folder is created if needed)."""
    root = Path(root).resolve()
    if root in _held:
        _held[root][1] += 1
        try:
            yield
        finally:
            _held[root][1] -= 1
        return
    created = [p for p in (root, *root.parents) if not p.exists()]  # what taking the lock makes
    lock_was_there = (root / LOCK_NAME).exists()
    root.mkdir(parents=True, exist_ok=True)
    f = _open_lock(root / LOCK_NAME)
    job = launched_job()
    holder = _take(f, job)
    if holder is not None:
        f.close()
        if _of_job(holder, job):
            yield
            return
        raise ReskipError(f"{root} is being written by another reskip process ({holder or 'another process'}); wait "
                          "for it to finish, or write into another --out") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}" + (f" {job}" if job else ""))
    f.flush()
    _held[root] = [f, 1]
    try:
        yield
    except BaseException:
        # a refusal leaves nothing of the lock's behind: not a lock file it made (in a folder of the user's, or the
        # working folder), not the folders it made when nothing else was written into them
        if not lock_was_there:
            with contextlib.suppress(OSError):
                (root / LOCK_NAME).unlink()
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only an empty folder goes
        raise
    finally:
        _held.pop(root)
        f.close()
