"""The versions a bug report needs: bisectr's, Python's and those of the libraries found beside it."""

from __future__ import annotations

import platform
import sys
from importlib.metadata import PackageNotFoundError, version

# What is shown -> the distributions that install it, first found wins (paddle's CPU and GPU builds).
LIBRARIES = {
    "numpy": ("numpy",),
    "torch": ("torch",),
    "paddle": ("paddlepaddle", "paddlepaddle-gpu"),
    "transformers": ("transformers",),
    "paddleformers": ("paddleformers",),
}


def versions() -> dict[str, str | None]:
    """bisectr, python and each of `LIBRARIES` -> its installed version (None: not installed). Read
    from the installed packages' metadata: nothing is imported."""
    found: dict[str, str | None] = {"bisectr": version("bisectr"), "python": platform.python_version()}
    for name, distributions in LIBRARIES.items():
        found[name] = next((v for v in map(_installed, distributions) if v is not None), None)
    return found


def _installed(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def version_text() -> str:
    """`bisectr --version`: bisectr's version, then one line per library."""
    found = versions()
    lines = [f"bisectr {found.pop('bisectr')}"]
    lines += [f"  {name:<14}{found_version or 'not installed'}" for name, found_version in found.items()]
    return "\n".join(lines)


def describe() -> dict[str, str | None]:
    """`versions()`, and the machine: its CPU's model, and the GPU torch uses where torch is loaded and has one."""
    found = versions()
    found["cpu"] = _cpu_model()
    torch = sys.modules.get("torch")
    found["gpu"] = torch.cuda.get_device_name(0) if torch is not None and torch.cuda.is_available() else None
    return found


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(
                (line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), platform.processor()
            )
    except OSError:
        return platform.processor() or platform.machine()
