"""Who may write a run directory, and when an interruption may land.

`RunLock`: an exclusive `flock` on `.<name>.lock` beside a run directory, so a second bisectr
process writing the same run is refused with the holder's pid and command line.
`interrupts_deferred`: Ctrl-C held back while a run moves into place.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import sys
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import RunDirError, RunWriteError


@dataclass
class _Hold:
    fd: int  # the open, locked lock file
    count: int  # RunLocks of this process holding it


_holds: dict[Path, _Hold] = {}  # lock file -> this process's hold on it
_holds_guard = threading.Lock()


class RunLock:
    """Keeps other bisectr processes from writing a run directory while this one does.

    An exclusive `flock` on `.<name>.lock` beside the run directory, a file that names its
    holder (pid and command line) for the refusal; the kernel drops the lock however its process
    ends, and the file is removed on release. Holds are shared within a process: `RunWriter` and
    `save_result` take the lock themselves, and inside a longer hold (`with RunLock(run_dir):`
    around a trace, a search and saving the result) they join it.
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir).resolve()
        self.path = self.run_dir.parent / f".{self.run_dir.name}.lock"
        self.held = False

    def acquire(self) -> RunLock:
        """Take the lock (creating the run's parent directory). Raises `RunDirError` naming the
        holder where another process holds it, `RunWriteError` where the lock file cannot be made."""
        if self.held:
            return self
        with _holds_guard:
            hold = _holds.get(self.path)
            if hold is None:
                hold = _holds[self.path] = _Hold(_lock_file(self.path, self.run_dir), 0)
            hold.count += 1
        self.held = True
        return self

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        with _holds_guard:
            hold = _holds[self.path]
            hold.count -= 1
            if hold.count == 0:
                del _holds[self.path]
                with suppress(OSError):
                    os.unlink(self.path)  # while still locked, so that no other process holds this file
                os.close(hold.fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _lock_file(path: Path, run_dir: Path) -> int:
    """The lock file `path`, created, opened and locked, with this process's pid and command line in it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _open_locked(path, run_dir)
    except OSError as exc:
        raise RunWriteError(
            f"{path}: cannot create the run's lock file ({exc.strerror or exc}); nothing was saved; "
            f"{run_dir} is unchanged"
        ) from None
    with suppress(OSError):  # only for messages: on a full disk, the writes that matter report it
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "command": shlex.join(sys.orig_argv)}).encode())
    return fd


def _open_locked(path: Path, run_dir: Path) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunDirError(
                f"{run_dir}: another bisectr process ({holder}) is writing this run; wait for it or choose another -o"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        if _is_file_at(fd, path):
            return fd
        os.close(fd)  # its holder removed it on release after we opened it: lock the one there now


HOLDER_WAIT = 0.5  # seconds a refused writer waits for the holder, which locks first and writes its name after


def _holder(fd: int) -> str:
    """ "pid N: command line", as the holder of a lock file wrote it (on one line, at most 300 characters)."""
    deadline = time.monotonic() + HOLDER_WAIT
    while True:
        try:
            holder = json.loads(os.pread(fd, 1 << 16, 0))
            pid, command = holder["pid"], str(holder["command"])
            break
        except (OSError, ValueError, TypeError, KeyError):  # not written yet, or by something else
            if time.monotonic() >= deadline:
                return "pid unknown"
            time.sleep(0.01)
    command = command.replace("\n", "\\n")
    return f"pid {pid}: {command if len(command) <= 300 else command[:297] + '...'}"


def _is_file_at(fd: int, path: Path) -> bool:
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (opened.st_dev, opened.st_ino)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT back while a run moves into place, so that Ctrl-C comes before the move or after
    it, never between the renames: what the directory holds is then known and said truly. The
    Python-level handler is swapped, not the main thread's signal mask: the kernel hands a signal
    the main thread blocks to another thread (torch's and paddle's workers), and Python then runs
    the handler in the main thread all the same."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(signal.SIGINT, None)
        elif caught and previous == signal.SIG_DFL:
            raise KeyboardInterrupt
