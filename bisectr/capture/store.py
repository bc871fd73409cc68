"""The run directory: both traces and their tensors, on disk.

Layout of a run directory::

    manifest.json            written last; a directory without it is not a run
    reference/trace.json     the trace (ops, tensor table, outputs) and where each value sits
    reference/tensors.bin    every stored tensor, appended as it is produced
    candidate/...            the same for the other side
    pairing.json             the output pairs and the op alignment
    result.json              the search's result, when one was run

Every JSON file carries the run id of the manifest; a file with another id belongs
to another run and is refused.

A run is written into a hidden sibling directory and renamed into place by
`RunWriter.commit`, so an interrupted trace never leaves a directory that loads.
Values are read back lazily through one memory map per side.

Integrity: each stored tensor's entry in trace.json's "storage" holds the crc32 of its
bytes, checked the first time the tensor is read; every entry is validated on load.
A run is written under a `RunLock` (`.<name>.lock` beside it), so a second writer is
refused; partial directories and temporaries left by writers that died are removed by
the next writer. A failed write (disk full, I/O error) removes what it had written and
raises `RunWriteError`: the run directory is then as it was.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import threading
import time
import zlib
from contextlib import suppress
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import RunDirError, RunWriteError
from .locks import RunLock
from .trace import Trace

FORMAT = "bisectr-run"
FORMAT_VERSION = 2  # 2: storage entries carry a crc32
SIDES = ("reference", "candidate")
_ALIGNMENT = 64
_WRITE_BUFFER = 1 << 18  # small tensors are gathered into 256 KB writes (a write call each costs more than the copy)
_MAX_DIMS = 32  # numpy 1.x's limit; no framework tensor has more

# Where a stored tensor sits in tensors.bin: byte offset, numpy dtype string, shape, crc32 of its bytes.
IndexEntry = tuple[int, str, tuple[int, ...], int]


class TensorWriter:
    """Appends arrays to one side's `tensors.bin` and remembers where each went, with its crc32.

    A failed write (disk full, I/O error) deletes `tensors.bin` and raises `RunWriteError`, and
    so does every later call, `close` included: values are written from inside the user's
    model, which may catch the first one. The partial run around it is removed by its
    `RunWriter` (on `abort`, or by `commit`, which fails too).
    """

    def __init__(self, directory: Path):
        self.path = directory / "tensors.bin"
        self.index: dict[int, IndexEntry] = {}
        self.failure: RunWriteError | None = None
        self._offset = 0
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._file: BinaryIO = open(self.path, "wb", buffering=_WRITE_BUFFER)
        except OSError as exc:
            raise _write_error(self.path, exc, _run_of_partial(directory.parent)) from None

    def reopen(self) -> None:
        """Open the closed file again to append to it."""
        self.raise_failure()
        try:
            self._file = open(self.path, "ab", buffering=_WRITE_BUFFER)
        except OSError as exc:
            raise self._failed(exc) from None

    def write(self, tid: int, values: np.ndarray) -> None:
        self.raise_failure()
        values = np.ascontiguousarray(values).reshape(np.shape(values))  # ascontiguousarray makes a 0-d array 1-d
        data = values.reshape(-1).view(np.uint8)  # its bytes (a memoryview cannot cast an empty array)
        padding = -self._offset % _ALIGNMENT
        try:
            if padding:
                self._file.write(b"\0" * padding)
            self._file.write(data)
        except OSError as exc:
            raise self._failed(exc) from None
        self._offset += padding
        self.index[tid] = (self._offset, values.dtype.str, tuple(values.shape), _checksum(data))
        self._offset += values.nbytes

    def close(self) -> None:
        """Write out what is buffered and close the file; raises the writer's failure, if any."""
        self.raise_failure()
        try:
            self._file.close()
        except OSError as exc:
            raise self._failed(exc) from None

    def raise_failure(self) -> None:
        """Raise the writer's failure, if a write failed (the user's model may have caught it)."""
        if self.failure is not None:
            raise RunWriteError(str(self.failure))  # a new one: raising one instance again piles up its tracebacks

    def _failed(self, exc: OSError) -> RunWriteError:
        with suppress(OSError):
            self._file.close()  # its buffered bytes cannot be written either
        with suppress(OSError):
            self.path.unlink()  # give the space back now: the user's model may run on for a while
        self.failure = _write_error(self.path, exc, _run_of_partial(self.path.parent.parent))
        return self.failure


def _checksum(data: memoryview | np.ndarray) -> int:
    """crc32 of a contiguous buffer's bytes."""
    return zlib.crc32(data)


def _read_array(path: Path, entry: IndexEntry, mapped: np.ndarray | None = None) -> np.ndarray:
    offset, dtype, shape, _ = entry
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    if count == 0:
        return np.zeros(shape, dtype)
    if mapped is None:
        mapped = _map(path)
    return mapped[offset : offset + count * dtype.itemsize].view(dtype).reshape(shape)


def _map(path: Path) -> np.ndarray:
    """The file's bytes, memory-mapped, as a plain array (slicing a `np.memmap` costs more)."""
    return np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)


class StoredValues:
    """Lazy, memory-mapped reader for one side's tensors; checks a tensor's crc32 on its first read."""

    def __init__(self, path: Path, index: dict[int, IndexEntry]):
        self.path = path
        self.index = index
        self._mapped: np.ndarray | None = None
        self._verified: set[int] = set()

    def __call__(self, tid: int) -> np.ndarray:
        entry = self.index[tid]
        try:
            if self._mapped is None and self.path.stat().st_size > 0:
                self._mapped = _map(self.path)
        except OSError as exc:
            raise RunDirError(f"{self.path}: unreadable ({exc.strerror or exc})") from None
        values = _read_array(self.path, entry, self._mapped)
        if tid not in self._verified:
            if _checksum(values) != entry[3]:
                raise RunDirError(f"{self.path}: tensor {tid}: checksum mismatch (the file was modified or damaged)")
            self._verified.add(tid)
        return values


_writing: set[Path] = set()  # the run directories this process's unfinished RunWriters write
_writing_guard = threading.Lock()


class RunWriter:
    """Builds a run directory next to its final place and renames it in on commit.

    Holds the run's `RunLock` from its creation to `commit` or `abort` (a longer hold of this
    process around it stays), and is the only writer of its run in this process too. An exception
    between creation and `commit` must be followed by `abort`, which removes the partial run; a
    failed write raises `RunWriteError`, and leaves the final directory as it was.
    """

    def __init__(self, final_dir: Path):
        self.final_dir = Path(final_dir).resolve()
        self.lock = RunLock(self.final_dir).acquire()
        with _writing_guard:
            already_writing = self.final_dir in _writing
            _writing.add(self.final_dir)
        if already_writing:
            self.lock.release()
            raise RunDirError(
                f"{self.final_dir}: this process is already writing this run (one neither saved nor "
                "discarded yet); finish that one first or choose another -o"
            )
        self.work_dir = _partial_dir(self.final_dir, os.getpid())
        self.writers: dict[str, TensorWriter] = {}
        self._finished = False
        try:
            if self.final_dir.exists() and not is_run_dir(self.final_dir):
                raise RunDirError(f"{self.final_dir}: exists and is not a bisectr run directory; choose another -o")
            _remove_leftovers(self.final_dir)
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir.mkdir()
        except BaseException as exc:
            self.abort()
            if isinstance(exc, OSError):
                raise _write_error(Path(exc.filename or self.work_dir), exc, self.final_dir) from None
            raise

    def tensor_writer(self, side: str) -> TensorWriter:
        self.writers[side] = TensorWriter(self.work_dir / side)
        return self.writers[side]

    def recorded(self, side: str, trace: Trace) -> None:
        """Close `side`'s tensor file; the trace reads its values there until `commit` moves them."""
        writer = self.writers[side]
        writer.close()
        trace.value_reader = StoredValues(writer.path, writer.index)

    def commit(
        self, traces: dict[str, Trace], manifest: dict[str, Any], documents: dict[str, Any] | None = None
    ) -> Path:
        """Write the traces and the manifest, move the run into place, point each trace's values
        at their final place and release the lock. Where this fails, the partial run is removed
        and the lock released; a failed write raises `RunWriteError`."""
        try:
            indexes = self._write_and_move(traces, manifest, documents)
        except BaseException as exc:
            self.abort()
            if isinstance(exc, OSError):
                raise _write_error(Path(exc.filename or self.work_dir), exc, self.final_dir) from None
            raise
        self._finish()
        for side, trace in traces.items():
            trace.value_reader = StoredValues(self.final_dir / side / "tensors.bin", indexes[side])
            trace.fetched.clear()  # stored now
        return self.final_dir

    def _write_and_move(
        self, traces: dict[str, Trace], manifest: dict[str, Any], documents: dict[str, Any] | None
    ) -> dict[str, dict[int, IndexEntry]]:
        indexes = {}
        for side, trace in traces.items():
            writer = self.writers.get(side)
            if writer is not None and trace.fetched:
                writer.reopen()
                for tid in sorted(trace.fetched):
                    writer.write(tid, trace.fetched[tid])
                    trace.tensors[tid].stored = True
            if writer is not None:
                writer.close()
            side_dir = self.work_dir / side
            side_dir.mkdir(exist_ok=True)
            index = indexes[side] = writer.index if writer else {}
            body = {
                **trace.to_json(),
                "run_id": manifest["run_id"],
                "storage": {str(tid): list(entry) for tid, entry in index.items()},
            }
            _write_json(side_dir / "trace.json", body)
        for name, document in (documents or {}).items():
            _write_json(self.work_dir / f"{name}.json", {"run_id": manifest["run_id"], **document})
        _write_json(
            self.work_dir / "manifest.json",
            {"format": FORMAT, "version": FORMAT_VERSION, "created": time.time(), **manifest},
        )
        if self.final_dir.exists():
            retired = self.final_dir.parent / f".{self.final_dir.name}.old-{os.getpid()}"
            self.final_dir.rename(retired)
            try:
                self.work_dir.rename(self.final_dir)
            except BaseException:
                retired.rename(self.final_dir)
                raise
            shutil.rmtree(retired, ignore_errors=True)
        else:
            self.work_dir.rename(self.final_dir)
        return indexes

    def abort(self) -> None:
        """Remove the partial run and release the lock (nothing to do once committed or aborted)."""
        if self._finished:
            return
        for writer in self.writers.values():
            with suppress(RunWriteError):
                writer.close()
        shutil.rmtree(self.work_dir, ignore_errors=True)
        self._finish()

    def _finish(self) -> None:
        self._finished = True
        with _writing_guard:
            _writing.discard(self.final_dir)
        self.lock.release()


def save_result(run_dir: Path, run_id: str, result: dict) -> None:
    """Add (or replace) a run's result.json atomically, holding the run's lock, when the directory
    still holds run `run_id` (`RunDirError` if another trace replaced it). A failed write raises
    `RunWriteError` and leaves the run as it was."""
    run_dir = Path(run_dir)
    temporary = run_dir / f".result.json.{os.getpid()}"
    with RunLock(run_dir):
        current = read_manifest(run_dir).get("run_id")
        if current != run_id:
            raise RunDirError(
                f"{run_dir}: another trace replaced this run (run id {current!r}); its result was not saved there"
            )
        try:
            _write_json(temporary, {"run_id": run_id, **result})
            os.replace(temporary, run_dir / "result.json")
        except OSError as exc:
            with suppress(OSError):
                temporary.unlink(missing_ok=True)
            raise _write_error(Path(exc.filename or temporary), exc, run_dir) from None


def _write_json(path: Path, data: Any) -> None:
    text = json.dumps(data, allow_nan=False)
    try:
        path.write_text(text)
    except OSError as exc:  # a failed write() names no file: name it
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def _write_error(path: Path, exc: OSError, run_dir: Path | None) -> RunWriteError:
    """A failed write of `path`: the OS's reason and, for a run being written, that it is as it was."""
    unchanged = f"; nothing was saved; {run_dir} is unchanged" if run_dir is not None else ""
    return RunWriteError(f"{path}: cannot write ({exc.strerror or exc}){unchanged}")


# Siblings of a run directory `<name>`: `.<name>.partial-<pid>`, the run process pid is writing, and
# `.<name>.old-<pid>`, the previous run it moves aside while it renames the new one in.
_SIBLING = re.compile(r"\.(?P<run>.+)\.(?P<kind>partial|old)-(?P<pid>[0-9]+)")
_RESULT_TEMPORARY = re.compile(r"\.result\.json\.(?P<pid>[0-9]+)")


def _partial_dir(final_dir: Path, pid: int) -> Path:
    return final_dir.parent / f".{final_dir.name}.partial-{pid}"


def _run_of_partial(path: Path) -> Path | None:
    """The run directory that `path` is the partial directory of, if it is one."""
    found = _SIBLING.fullmatch(path.name)
    return path.parent / found["run"] if found and found["kind"] == "partial" else None


def _remove_leftovers(final_dir: Path) -> None:
    """Remove what writers of `final_dir` that no longer run left behind: partial runs, result
    temporaries, and a previous run moved aside (put back instead when no run took its place)."""
    for path in final_dir.parent.iterdir():
        found = _SIBLING.fullmatch(path.name)
        if found is None or found["run"] != final_dir.name or _is_running(int(found["pid"])):
            continue
        if found["kind"] == "old" and not final_dir.exists() and is_run_dir(path):
            path.rename(final_dir)
        else:
            shutil.rmtree(path, ignore_errors=True)
    if final_dir.is_dir():
        for path in final_dir.iterdir():
            found = _RESULT_TEMPORARY.fullmatch(path.name)
            if found is not None and not _is_running(int(found["pid"])):
                path.unlink(missing_ok=True)


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's process
        return True
    return True


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "manifest.json").is_file()


def read_manifest(run_dir: Path) -> dict[str, Any]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory")
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.is_file():
        raise RunDirError(
            f"{run_dir}: not a complete bisectr run (manifest.json is missing; was the trace interrupted?)"
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise RunDirError(f"{manifest_path}: unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict):
        raise RunDirError(
            f"{manifest_path}: not a bisectr run manifest (a JSON {type(manifest).__name__}, not an object)"
        )
    if manifest.get("format") != FORMAT:
        raise RunDirError(f"{manifest_path}: not a bisectr run manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise RunDirError(
            f"{manifest_path}: run format version {manifest.get('version')} is not supported "
            f"(expected {FORMAT_VERSION})"
        )
    return manifest


def read_trace(run_dir: Path, side: str, run_id: str | None = None) -> Trace:
    side_dir = Path(run_dir) / side
    trace_path = side_dir / "trace.json"
    try:
        data = json.loads(trace_path.read_text())
        _check_run_id(trace_path, data, run_id)
        trace = Trace.from_json(data)
        trace.check()
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError, RecursionError) as exc:
        raise RunDirError(f"{trace_path}: corrupt trace ({exc.__class__.__name__}: {exc})") from None
    blob = side_dir / "tensors.bin"
    trace.value_reader = StoredValues(blob, _storage_index(trace_path, trace, data.get("storage"), blob))
    return trace


def _storage_index(trace_path: Path, trace: Trace, storage: Any, blob: Path) -> dict[int, IndexEntry]:
    """trace.json's "storage" table, each entry checked, with one for every stored tensor, all within `blob`."""
    if not isinstance(storage, dict):
        raise RunDirError(f'{trace_path}: corrupt trace (its "storage" is not an object)')
    index = {}
    end, last = 0, None  # the byte the entries reach in `blob`, and the entry reaching it
    for key, entry in storage.items():
        problem = _entry_problem(key, entry)
        if problem:
            raise RunDirError(f"{trace_path}: corrupt storage entry {key!r}: {entry!r} ({problem})")
        tid, (offset, dtype, shape, crc) = int(key), entry
        index[tid] = (offset, dtype, tuple(shape), crc)
        entry_end = offset + math.prod(shape) * _itemsize(dtype)
        if entry_end > end:
            end, last = entry_end, tid
    for tid, info in trace.tensors.items():
        if info.stored and (tid not in index or math.prod(index[tid][2]) != info.size):
            raise RunDirError(
                f"{trace_path}: corrupt trace (tensor {tid} is stored, but its storage entry "
                f"{'is missing' if tid not in index else 'holds another number of values'})"
            )
    blob_size = blob.stat().st_size if blob.is_file() else -1
    if index and blob_size < end:
        raise RunDirError(
            f"{blob}: truncated or missing ({blob_size} bytes; {trace_path} places tensor {last} up to byte {end})"
        )
    return index


_INT_TYPE = frozenset((int,))


def _entry_problem(key: str, entry: Any) -> str:
    """What is wrong with one "storage" entry (`tid: [offset, dtype, shape, crc32]`), or ''.
    Written for speed (type() rather than isinstance, bools excluded): a run may hold 100k entries."""
    if not (key.isascii() and key.isdigit()):
        return "its key is not a tensor id"
    if not (type(entry) is list and len(entry) == 4):
        return "expected [offset, dtype, shape, crc32]"
    offset, dtype, shape, crc = entry
    if not (type(offset) is int and offset >= 0):
        return "the offset is not a non-negative integer"
    if type(dtype) is not str:
        return "the dtype is not a string"
    if problem := _dtype_problem(dtype):
        return problem
    if not (
        type(shape) is list
        and len(shape) <= _MAX_DIMS
        and _INT_TYPE.issuperset(map(type, shape))
        and min(shape, default=0) >= 0
    ):
        return f"the shape is not a list of at most {_MAX_DIMS} non-negative integers"
    if not (type(crc) is int and 0 <= crc < 1 << 32):
        return "the checksum is not a crc32"
    return ""


@functools.lru_cache(maxsize=64)  # a run holds a handful of dtypes, in many entries
def _dtype_problem(dtype: str) -> str:
    try:
        kind = np.dtype(dtype).kind
    except (TypeError, ValueError, SyntaxError):  # numpy's parser raises all three
        return "numpy does not know the dtype"
    return "" if kind in "biufc" else "the dtype is not a plain numeric or bool dtype"


@functools.lru_cache(maxsize=64)
def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def read_document(run_dir: Path, name: str, run_id: str) -> dict[str, Any] | None:
    """`<name>.json` of a run (None when the run has none), checked to belong to run `run_id`."""
    path = Path(run_dir) / f"{name}.json"
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path}: unreadable ({exc})") from None
    _check_run_id(path, document, run_id)
    return {key: value for key, value in document.items() if key != "run_id"}


def _check_run_id(path: Path, document: Any, run_id: str | None) -> None:
    if not isinstance(document, dict):
        raise RunDirError(f"{path}: expected a JSON object, got {type(document).__name__}")
    if run_id is not None and "run_id" not in document:
        raise RunDirError(f"{path}: no run id (damaged, or not written by this version of bisectr)")
    if run_id is not None and document.get("run_id") != run_id:
        raise RunDirError(
            f"{path}: belongs to another run (run id {document.get('run_id')!r}, the manifest's is "
            f"{run_id!r}); it was written by another process: trace again"
        )
