#!/usr/bin/env python
"""What the store's crc32 checksums cost: writing and reading tensors with and without them.

    python benchmarks/store_checksums.py [--tensors 2000] [--total-mb 200] [--repeats 5] [--dir DIR]

Writes `--tensors` arrays of mixed dtypes and sizes (log-uniform, scaled to `--total-mb` in all)
through `bisectr.capture.store.TensorWriter` into `tensors.bin` (closed, so everything reached the page
cache; no fsync), then reads each back once through `StoredValues` (memory-mapped) and takes its
maximum, as a view computing statistics or errors would; then a second time (checked tensors are
not checked again). "Without" replaces the store's checksum function with one returning 0, so both
variants run the same code otherwise. Variants alternate, `--repeats` times; medians are printed,
with the ratio with/without. No assertions: the figures depend on the machine and the disk.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bisectr.capture import store  # noqa: E402

DTYPES = (np.float32, np.float16, np.int64, np.float64)


def make_tensors(count: int, total_bytes: int, seed: int = 0) -> list[np.ndarray]:
    """`count` arrays of mixed dtypes whose sizes are log-uniform, scaled to about `total_bytes` in all."""
    rng = np.random.default_rng(seed)
    weights = np.exp(rng.uniform(np.log(64), np.log(4 << 20), count))
    sizes = np.maximum(64, weights * total_bytes / weights.sum()).astype(np.int64)
    tensors = []
    for i, size in enumerate(sizes):
        dtype = np.dtype(DTYPES[i % len(DTYPES)])
        tensors.append(rng.standard_normal(max(1, int(size) // dtype.itemsize)).astype(dtype))
    return tensors


def write(directory: Path, tensors: list[np.ndarray]) -> store.TensorWriter:
    writer = store.TensorWriter(directory)
    for tid, values in enumerate(tensors):
        writer.write(tid, values)
    writer.close()
    return writer


def read_all(reader: store.StoredValues, count: int) -> None:
    for tid in range(count):
        reader(tid).max()


def timed(action: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def measure(directory: Path, tensors: list[np.ndarray], checksums: bool) -> dict[str, float]:
    """Seconds to write all tensors, then to read them a first and a second time."""
    real_checksum = store._checksum
    if not checksums:
        store._checksum = lambda data: 0
    try:
        shutil.rmtree(directory, ignore_errors=True)
        write_s, writer = timed(lambda: write(directory, tensors))
        reader = store.StoredValues(writer.path, writer.index)
        first_s, _ = timed(lambda: read_all(reader, len(tensors)))
        again_s, _ = timed(lambda: read_all(reader, len(tensors)))
    finally:
        store._checksum = real_checksum
    return {"write": write_s, "first read": first_s, "second read": again_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=2000)
    parser.add_argument("--total-mb", type=float, default=200.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()

    tensors = make_tensors(args.tensors, int(args.total_mb * 1e6))
    total = sum(t.nbytes for t in tensors)
    scratch = Path(tempfile.mkdtemp(prefix="bisectr-checksums-", dir=args.dir))
    try:
        write(scratch / "warm-up", tensors)
        times: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for repeat in range(args.repeats):
            for checksums in (False, True) if repeat % 2 == 0 else (True, False):
                times[checksums].append(measure(scratch / f"crc-{checksums}", tensors, checksums))
        blob = np.concatenate([t.view(np.uint8) for t in tensors])
        crc_s = min(timed(lambda: zlib.crc32(blob))[0] for _ in range(3))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    sizes = sorted(t.nbytes for t in tensors)
    print(
        f"store checksums: {len(tensors)} tensors, {total / 1e6:.1f} MB "
        f"(from {sizes[0]} B to {sizes[-1] / 1e6:.1f} MB, "
        f"median {sizes[len(sizes) // 2] / 1e3:.1f} KB), in {scratch.parent}; medians of {args.repeats} runs"
    )
    print(f"{'':38}{'without crc32':>15}{'with crc32':>13}{'ratio':>9}")
    rows = {
        "write": "write (TensorWriter, closed)",
        "first read": "first read of each + max (checked)",
        "second read": "second read of each + max",
    }
    for key, title in rows.items():
        without = statistics.median(t[key] for t in times[False])
        with_crc = statistics.median(t[key] for t in times[True])
        print(f"{title:38}{without:>13.3f} s{with_crc:>11.3f} s{with_crc / without:>8.2f}x")
    print(
        f"crc32 alone on the {total / 1e6:.0f} MB: {crc_s:.3f} s = {total / crc_s / 1e9:.2f} GB/s "
        f"(zlib {zlib.ZLIB_RUNTIME_VERSION})"
    )


if __name__ == "__main__":
    main()
