"""The run directory: both traces and their tensors, on disk.

Layout of a run directory::

    manifest.json            written last; a directory without it is not a run
    reference/trace.json     the trace (ops, tensor table, outputs) and where each value sits
    reference/tensors.bin    every stored tensor, appended as it is produced
    candidate/...            the same for the other side
    result.json              the search's result, when one was run

A run is written into a hidden sibling directory and renamed into place by
`RunWriter.commit`, so an interrupted trace never leaves a directory that loads.
Values are read back lazily through one memory map per side.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .errors import RunDirError
from .trace import Trace

FORMAT = "bisectr-run"
FORMAT_VERSION = 1
SIDES = ("reference", "candidate")
_ALIGNMENT = 64
_WRITE_BUFFER = 1 << 18  # small tensors are gathered into 256 KB writes (a write call each costs more than the copy)


class TensorWriter:
    """Appends arrays to one side's `tensors.bin` and remembers where each went."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "tensors.bin"
        self._file: BinaryIO = open(self.path, "wb", buffering=_WRITE_BUFFER)
        self._offset = 0
        self.index: dict[int, tuple[int, str, tuple[int, ...]]] = {}

    def write(self, tid: int, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values)
        padding = -self._offset % _ALIGNMENT
        if padding:
            self._file.write(b"\0" * padding)
            self._offset += padding
        self.index[tid] = (self._offset, values.dtype.str, tuple(values.shape))
        self._file.write(memoryview(values).cast("B"))
        self._offset += values.nbytes

    def read(self, tid: int) -> np.ndarray:
        """Values written earlier in this same recording (used while the run is live)."""
        self._file.flush()
        return _read_array(self.path, self.index[tid])

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def _read_array(path: Path, entry: tuple[int, str, tuple[int, ...]], mapped: np.ndarray | None = None) -> np.ndarray:
    offset, dtype, shape = entry
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
    """Lazy, memory-mapped reader for one side's tensors."""

    def __init__(self, path: Path, index: dict[int, tuple[int, str, tuple[int, ...]]]):
        self.path = path
        self.index = index
        self._mapped: np.ndarray | None = None

    def __call__(self, tid: int) -> np.ndarray:
        if self._mapped is None and self.path.stat().st_size > 0:
            self._mapped = _map(self.path)
        return _read_array(self.path, self.index[tid], self._mapped)


class RunWriter:
    """Builds a run directory next to its final place and renames it in on commit."""

    def __init__(self, final_dir: Path):
        self.final_dir = Path(final_dir).resolve()
        if self.final_dir.exists() and not is_run_dir(self.final_dir):
            raise RunDirError(f"{self.final_dir}: exists and is not a bisectr run directory; choose another -o")
        self.final_dir.parent.mkdir(parents=True, exist_ok=True)
        self.work_dir = self.final_dir.parent / f".{self.final_dir.name}.partial-{os.getpid()}"
        shutil.rmtree(self.work_dir, ignore_errors=True)
        self.work_dir.mkdir()
        self.writers: dict[str, TensorWriter] = {}

    def tensor_writer(self, side: str) -> TensorWriter:
        self.writers[side] = TensorWriter(self.work_dir / side)
        return self.writers[side]

    def commit(self, traces: dict[str, Trace], manifest: dict[str, Any], result: dict | None = None) -> Path:
        """Write the traces and the manifest, move the run into place, and point each trace's
        values at their final place."""
        indexes = {}
        for side, trace in traces.items():
            writer = self.writers.get(side)
            if writer is not None:
                writer.close()
            side_dir = self.work_dir / side
            side_dir.mkdir(exist_ok=True)
            index = indexes[side] = writer.index if writer else {}
            body = {**trace.to_json(), "storage": {str(tid): list(entry) for tid, entry in index.items()}}
            _write_json(side_dir / "trace.json", body)
        if result is not None:
            _write_json(self.work_dir / "result.json", result)
        _write_json(self.work_dir / "manifest.json", {"format": FORMAT, "version": FORMAT_VERSION, "created": time.time(), **manifest})
        if self.final_dir.exists():
            retired = self.final_dir.parent / f".{self.final_dir.name}.old-{os.getpid()}"
            self.final_dir.rename(retired)
            self.work_dir.rename(self.final_dir)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            self.work_dir.rename(self.final_dir)
        for side, trace in traces.items():
            trace.value_reader = StoredValues(self.final_dir / side / "tensors.bin", indexes[side])
        return self.final_dir

    def abort(self) -> None:
        for writer in self.writers.values():
            writer.close()
        shutil.rmtree(self.work_dir, ignore_errors=True)


def save_result(run_dir: Path, result: dict) -> None:
    """Add (or replace) a run's result.json atomically."""
    temporary = Path(run_dir) / f".result.json.{os.getpid()}"
    _write_json(temporary, result)
    os.replace(temporary, Path(run_dir) / "result.json")


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, allow_nan=True))


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "manifest.json").is_file()


def read_manifest(run_dir: Path) -> dict[str, Any]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory")
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.is_file():
        raise RunDirError(f"{run_dir}: not a complete bisectr run (manifest.json is missing; was the trace interrupted?)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{manifest_path}: unreadable manifest ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise RunDirError(f"{manifest_path}: not a bisectr run manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise RunDirError(f"{manifest_path}: run format version {manifest.get('version')} is not supported (expected {FORMAT_VERSION})")
    return manifest


def read_trace(run_dir: Path, side: str) -> Trace:
    side_dir = Path(run_dir) / side
    trace_path = side_dir / "trace.json"
    try:
        data = json.loads(trace_path.read_text())
        trace = Trace.from_json(data)
        index = {int(tid): (entry[0], entry[1], tuple(entry[2])) for tid, entry in data["storage"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunDirError(f"{trace_path}: corrupt trace ({exc.__class__.__name__}: {exc})") from None
    blob = side_dir / "tensors.bin"
    if index:
        blob_size = blob.stat().st_size if blob.is_file() else -1
        needed = max(offset + math.prod(shape) * np.dtype(dtype).itemsize for offset, dtype, shape in index.values())
        if blob_size < needed:
            raise RunDirError(f"{blob}: truncated or missing ({blob_size} bytes, the trace needs {needed})")
    trace.value_reader = StoredValues(blob, index)
    return trace
