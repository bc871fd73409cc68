"""Damaged and crafted run directories: a fault and fuzz suite for everything that opens a run.

One real run is traced once (torch's `nn.MultiheadAttention` against a hand port: verdict `noise`,
exit 0, a saved result with a culprit). Its model file is a copy of tests/models/torch_mha.py that,
when imported while the suite is watching, leaves a marker file: a viewer importing the model file
named in the manifest is caught even on an undamaged run.

Variants are made generically from whatever the run directory holds (walked, not listed): every
file missing, empty, garbage, truncated, replaced by a directory; bytes flipped; every JSON file
not an object; keys found by walking each JSON document deleted or set to another type; ids
replaced by unknown ids; path-like fields (`model_file`, `*_python`, sources, ...) pointed at
/etc/passwd, at ../../outside.py, at a crafted Python file inside the run and at an executable
script, each of which leaves a marker when run.

The contract checked for every variant: `bisectr view RUN --no-tui` exits 0 or 2 (2 with a message
naming the run), never 1, 3 or a traceback; `bisectr.load` and what a viewer touches raise only
`BisectrError`, and a value whose bytes changed is never returned silently; the TUI (a subset)
lets no exception escape; no marker ever appears. Run with `-s` to see the tallies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import bisectr
from bisectr.errors import BisectrError
from conftest import MODELS, sampled

BASE_MODEL = MODELS / "torch_mha.py"
CLI_TIMEOUT_S = 60
CLI_WORKERS = 4
TUI_VARIANTS = 15
COLLAPSE_AFTER = 5  # a problem shared by more variants is listed on one line
NESTED_KEY_BUDGET = 80  # nested key mutations kept (evenly spaced) out of all the walk finds
MAX_VARIANTS = 300
MARKERS_ENV, VARIANT_ENV = "BISECTR_FAULTS_MARKERS", "BISECTR_FAULTS_VARIANT"
NOT_JSON = object()
UNKNOWN_ID = 987654
VALUE_KINDS: dict[str, Any] = {
    "None": None,
    "a string": "crafted",
    "a negative int": -7,
    "a huge int": 2**63,
    "a list": [],
    "a dict": {"crafted": 1},
}
MUTATIONS = ["deleted", *VALUE_KINDS]
ID_KEY = re.compile(r"^(tid|index|producer|entry|reference|candidate|id|.+_id)$")
ID_LIST_KEY = re.compile(r"^(inputs|outputs)$")
PATH_KEY = re.compile(r"(_file|_python|python|path|dir|source)$", re.IGNORECASE)

# Appended to the base model's copy: importing the model file while a viewer runs leaves a marker.
MODEL_FILE_TRIPWIRE = f"""

import os as _os
if _os.environ.get({MARKERS_ENV!r}):
    open(
        _os.path.join(
            _os.environ[{MARKERS_ENV!r}], _os.environ.get({VARIANT_ENV!r}, "unknown") + "-model-file-imported"
        ),
        "w",
    ).close()
"""
CRAFTED_MODULE = '''"""Crafted into a run directory: importing it proves that a viewer executed a run's code."""
open({marker!r}, "w").close()


def reference():
    raise SystemExit("crafted")


candidate = reference
'''
CRAFTED_EXECUTABLE = "#!/bin/sh\n: > '{marker}'\n"


# -- variants -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """One way of damaging a copy of the base run."""

    number: int
    file: str  # the damaged file, relative to the run directory
    damage: str
    apply: Callable[["Place"], None]

    @property
    def label(self) -> str:
        return f"{self.file} | {self.damage}"


@dataclass(frozen=True)
class Place:
    """Where one variant lives: `root/x/run` (the run), `root/x/cwd` (the working directory of
    whatever opens it) and `root/outside.py` (what `../../outside.py` names from both)."""

    root: Path
    markers: Path
    name: str

    @property
    def run(self) -> Path:
        return self.root / "x" / "run"

    @property
    def cwd(self) -> Path:
        return self.root / "x" / "cwd"

    def marker(self, what: str) -> str:
        return str(self.markers / f"{self.name}-{what}")


def read_json(path: Path) -> Any:
    """The parsed document, or NOT_JSON for a file that is not JSON (a tensor blob)."""
    try:
        return json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        return NOT_JSON


def run_files(run_dir: Path) -> list[str]:
    """Every file in the run directory, relative, sorted."""
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())


def key_paths(doc: Any, prefix: tuple = (), depth: int = 0) -> Iterator[tuple]:
    """Paths of the keys of a JSON document: every key of every object; in lists, the first two
    elements; in objects keyed by ids (all keys digits), the first two keys; short lists of
    scalars (shapes, storage entries) element by element."""
    if depth > 5:
        return
    if isinstance(doc, dict):
        items = list(doc.items())
        if items and all(key.isdigit() for key in doc):
            items = items[:2]
        for key, value in items:
            yield prefix + (key,)
            yield from key_paths(value, prefix + (key,), depth + 1)
    elif isinstance(doc, list):
        if doc and len(doc) <= 4 and not any(isinstance(v, (dict, list)) for v in doc):
            for index in range(len(doc)):
                yield prefix + (index,)
        for index in range(min(2, len(doc))):
            if isinstance(doc[index], (dict, list)):
                yield from key_paths(doc[index], prefix + (index,), depth + 1)


def get_at(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def path_text(path: tuple) -> str:
    return "/".join(map(str, path))


def edit_json(file: str, edit: Callable[[Any, "Place"], Any]) -> Callable[["Place"], None]:
    """A damage that parses `file`, lets `edit(doc, place)` change it (returning the new document)
    and writes it back."""

    def apply(place: Place) -> None:
        path = place.run / file
        doc = edit(json.loads(path.read_bytes()), place)
        path.write_text(json.dumps(doc))

    return apply


def set_key(path: tuple, value: Any) -> Callable[[Any, Place], Any]:
    def edit(doc: Any, place: Place) -> Any:
        get_at(doc, path[:-1])[path[-1]] = value(place) if callable(value) else value
        return doc

    return edit


def delete_key(path: tuple) -> Callable[[Any, Place], Any]:
    def edit(doc: Any, place: Place) -> Any:
        container = get_at(doc, path[:-1])
        if isinstance(container, dict):
            del container[path[-1]]
        else:
            container.pop(path[-1])
        return doc

    return edit


def rename_first_key(path: tuple, new_key: str) -> Callable[[Any, Place], Any]:
    def edit(doc: Any, place: Place) -> Any:
        container = get_at(doc, path)
        first = next(iter(container))
        container[new_key] = container.pop(first)
        return doc

    return edit


def file_variants(run_dir: Path, file: str) -> Iterator[tuple[str, str, Callable[[Place], None]]]:
    """Damage to the file as bytes: missing, empty, garbage, truncated, a directory, flipped bytes."""
    size = (run_dir / file).stat().st_size
    garbage = random.Random(file).randbytes(97)

    def write(data: bytes) -> Callable[[Place], None]:
        return lambda place: (place.run / file).write_bytes(data)

    def replace_by_directory(place: Place) -> None:
        (place.run / file).unlink()
        (place.run / file).mkdir()

    yield file, "missing", lambda place: (place.run / file).unlink()
    yield file, "empty", write(b"")
    yield file, "garbage bytes", write(garbage)
    yield (
        file,
        "truncated to half",
        lambda place: (place.run / file).write_bytes((place.run / file).read_bytes()[: size // 2]),
    )
    yield file, "a directory instead", replace_by_directory
    is_json = read_json(run_dir / file) is not NOT_JSON
    offsets = [size // 2] if is_json else sorted({0, size // 4, size // 2, 3 * size // 4, size - 1})
    for offset in offsets:
        what = "a JSON byte" if is_json else f"byte {offset} of {size}"
        yield file, f"{what} flipped", flip_byte(file, offset, lambda byte: byte ^ 0xFF)
    if is_json:
        yield file, "a digit changed", flip_byte(file, size // 2, lambda byte: byte ^ 0x01, digits_only=True)


def flip_byte(
    file: str, offset: int, change: Callable[[int], int], digits_only: bool = False
) -> Callable[[Place], None]:
    """Change one byte at `offset` (with `digits_only`, the first ASCII digit from there on, so the
    JSON stays valid and only a number changes)."""

    def apply(place: Place) -> None:
        data = bytearray((place.run / file).read_bytes())
        at = offset
        if digits_only:
            at = next(i for i in [*range(offset, len(data)), *range(offset)] if chr(data[i]).isdigit())
        data[at] = change(data[at])
        (place.run / file).write_bytes(bytes(data))

    return apply


def document_variants(file: str) -> Iterator[tuple[str, str, Callable[[Place], None]]]:
    """A JSON file whose document is not an object."""
    for name, doc in (("a list", [1, 2]), ("a number", 3), ("null", None), ("a string", "run")):
        yield file, f"document is {name}", edit_json(file, lambda _doc, _place, doc=doc: doc)


def key_variants(doc: Any, file: str, counter: Iterator[int]) -> tuple[list, list]:
    """Mutations of the keys `key_paths` finds: (top-level ones, nested ones). Top-level keys are
    deleted and set to one other kind each; nested keys get one kind each, rotating."""
    top, nested = [], []
    for path in key_paths(doc):
        turn = next(counter)
        kinds = (
            ["deleted", MUTATIONS[1 + turn % (len(MUTATIONS) - 1)]]
            if len(path) == 1
            else [MUTATIONS[turn % len(MUTATIONS)]]
        )
        for kind in kinds:
            edit = delete_key(path) if kind == "deleted" else set_key(path, VALUE_KINDS[kind])
            (top if len(path) == 1 else nested).append(
                (file, f"key {path_text(path)} {kind if kind == 'deleted' else '-> ' + kind}", edit_json(file, edit))
            )
    return top, nested


def id_variants(doc: Any, file: str) -> Iterator[tuple[str, str, Callable[[Place], None]]]:
    """Ids replaced by one no table holds: int fields named like ids, lists of tensor ids,
    maps to ids, and maps keyed by ids."""
    for path in key_paths(doc):
        value, key = get_at(doc, path), str(path[-1])
        if ID_KEY.match(key) and isinstance(value, int) and not isinstance(value, bool):
            yield file, f"id {path_text(path)} -> unknown {UNKNOWN_ID}", edit_json(file, set_key(path, UNKNOWN_ID))
        elif ID_KEY.match(key) and isinstance(value, str):  # a run id: another run's
            yield file, f"id {path_text(path)} -> another run's", edit_json(file, set_key(path, "0" * len(value)))
        elif ID_LIST_KEY.match(key) and isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            yield file, f"ids {path_text(path)} -> [unknown]", edit_json(file, set_key(path, [UNKNOWN_ID]))
        elif isinstance(value, dict) and value and all(k.isdigit() for k in value):
            yield (
                file,
                f"first key of {path_text(path)} -> unknown id",
                edit_json(file, rename_first_key(path, str(UNKNOWN_ID))),
            )
        elif (
            isinstance(value, dict)
            and value
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value.values())
        ):
            yield (
                file,
                f"ids in {path_text(path)} -> unknown",
                edit_json(file, set_key(path, {k: UNKNOWN_ID for k in value})),
            )


def crafted_module(place: Place) -> str:
    """A Python file inside the run that leaves a marker when imported; its path."""
    path = place.run / "crafted_model.py"
    path.write_text(CRAFTED_MODULE.format(marker=place.marker("crafted-module-imported")))
    return str(path)


def crafted_executable(place: Place) -> str:
    """An executable script inside the run that leaves a marker when started; its path."""
    path = place.run / "crafted_python"
    path.write_text(CRAFTED_EXECUTABLE.format(marker=place.marker("crafted-executable-started")))
    path.chmod(0o755)
    return str(path)


def outside_module(place: Place) -> str:
    """`../../outside.py`, relative to the run and to the working directory: it leaves a marker."""
    (place.root / "outside.py").write_text(CRAFTED_MODULE.format(marker=place.marker("outside-module-imported")))
    return "../../outside.py"


def path_variants(doc: Any, file: str) -> Iterator[tuple[str, str, Callable[[Place], None]]]:
    """Path-like fields (by key name, or an absolute path as value) pointed outside the run or at
    crafted code inside it."""
    for path in key_paths(doc):
        value, key = get_at(doc, path), str(path[-1])
        if not (PATH_KEY.search(key) or (isinstance(value, str) and value.startswith("/"))):
            continue
        if isinstance(value, (dict, list)):
            continue
        targets: list[tuple[str, Any]] = [
            ("/etc/passwd", "/etc/passwd"),
            ("../../outside.py", outside_module),
            ("a crafted .py in the run", crafted_module),
        ]
        if key.lower().endswith("python"):
            targets.append(("a crafted executable in the run", crafted_executable))
        for name, target in targets:
            yield file, f"path {path_text(path)} -> {name}", edit_json(file, set_key(path, target))


def evenly(items: list, count: int) -> list:
    """`count` of `items` (all when fewer), evenly spaced, in order."""
    if len(items) <= count:
        return list(items)
    step = len(items) / count
    return [items[int(i * step)] for i in range(count)]


def build_variants(run_dir: Path) -> list[Variant]:
    """Every variant of the run, numbered. File damage, documents and paths in full; top-level
    keys and ids thinned evenly if they would pass `MAX_VARIANTS`; then up to `NESTED_KEY_BUDGET`
    nested key mutations, evenly spaced, within `MAX_VARIANTS`."""
    always: list[tuple[str, str, Callable[[Place], None]]] = []
    keyed: list = []
    nested: list = []
    counter = iter(range(10**6))
    for file in run_files(run_dir):
        always += file_variants(run_dir, file)
        doc = read_json(run_dir / file)
        if doc is NOT_JSON:
            continue
        always += document_variants(file)
        always += path_variants(doc, file)
        top, inner = key_variants(doc, file, counter)
        keyed += top
        keyed += id_variants(doc, file)
        nested += inner
    keyed = evenly(keyed, max(0, MAX_VARIANTS - len(always)))
    nested = evenly(nested, max(0, min(NESTED_KEY_BUDGET, MAX_VARIANTS - len(always) - len(keyed))))
    return [
        Variant(number, file, damage, apply) for number, (file, damage, apply) in enumerate(always + keyed + nested)
    ]


def make_place(base_run: Path, variant: Variant, root: Path, markers: Path) -> Place:
    """Copy the base run to a fresh place and damage it."""
    place = Place(root / f"{variant.number:03d}", markers, f"{variant.number:03d}")
    shutil.copytree(base_run, place.run)
    place.cwd.mkdir()
    variant.apply(place)
    return place


# -- the base run ---------------------------------------------------------------------------
@dataclass
class Suite:
    base_run: Path
    markers: Path
    variants: list[Variant]
    places: dict[int, Place]
    base_values: dict[tuple[str, int], tuple[str, tuple, bytes]]


def stored_values(run: "bisectr.Run") -> Iterator[tuple[tuple[str, int], np.ndarray]]:
    """((side, tid), values) of every tensor the run's traces say is stored."""
    for role, trace in (("reference", run.reference), ("candidate", run.candidate)):
        for tid, info in list(trace.tensors.items()):
            if info.stored:
                yield (role, tid), trace.value(tid)


def value_signature(values: np.ndarray) -> tuple[str, tuple, bytes]:
    """dtype, shape and bytes: what must not change unnoticed."""
    values = np.asarray(values)
    return values.dtype.str, tuple(values.shape), np.ascontiguousarray(values).tobytes()


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Suite:
    """The base run (traced by the CLI, with its result.json), its variants built on disk, and the
    values it stores."""
    root = tmp_path_factory.mktemp("faults")
    model = root / "model" / "watched_mha.py"
    model.parent.mkdir()
    model.write_text(BASE_MODEL.read_text() + MODEL_FILE_TRIPWIRE)
    base_run = root / "base" / "run"
    env = {k: v for k, v in os.environ.items() if k not in (MARKERS_ENV, VARIANT_ENV)}
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "trace", str(model), "-o", str(base_run), "--no-tui"],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert (base_run / "result.json").is_file()
    markers = root / "markers"
    markers.mkdir()
    variants = build_variants(base_run)
    places = {v.number: make_place(base_run, v, root / "v", markers) for v in variants}
    base = bisectr.load(base_run)
    base_values = {key: value_signature(values) for key, values in stored_values(base)}
    print(f"\n{len(variants)} variants of {len(run_files(base_run))} files: {', '.join(run_files(base_run))}")
    return Suite(base_run, markers, variants, places, base_values)


def test_the_base_run_views_cleanly(suite):
    done = view_cli(suite.base_run, suite.base_run.parent, {})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


# -- outcomes -------------------------------------------------------------------------------
@dataclass
class Outcome:
    stage: str
    variant: Variant
    problem: str | None  # None: behaved as the contract says
    refused: bool = False  # exit 2 / a BisectrError: the run was refused with a message


def watch_markers(markers: Path) -> Callable[[], list[str]]:
    """A function returning the markers that appeared since this call."""
    before = set(os.listdir(markers))
    return lambda: sorted(set(os.listdir(markers)) - before)


def marker_outcomes(stage: str, new_markers: list[str], suite: Suite) -> list[Outcome]:
    """A failure for each marker a stage left: code from a run was executed."""
    by_name = {f"{v.number:03d}": v for v in suite.variants}
    return [
        Outcome(
            stage,
            by_name.get(marker.split("-")[0], Variant(-1, "?", marker, lambda p: None)),
            f"ran code: {marker.split('-', 1)[1]}",
        )
        for marker in new_markers
    ]


def summarize(stage: str, outcomes: list[Outcome], root: Path) -> str:
    """Counts of the outcomes, then one line per failing variant: file | damage | problem."""
    tried = len({o.variant.number for o in outcomes})
    failures = [o for o in outcomes if o.problem]
    refused = sum(o.refused and not o.problem for o in outcomes)
    kinds = Counter(problem_class(o.problem) for o in failures)
    lines = [
        f"[{stage}] {tried} variants tried: {tried - len({o.variant.number for o in failures})} passed "
        f"({refused} refused with a message), {len(failures)} failures"
    ]
    lines += [f"    {count:4d} x {kind}" for kind, count in kinds.most_common()]
    by_problem: dict[str, list[Outcome]] = {}
    for o in failures:
        by_problem.setdefault(o.problem.replace(str(root), "<tmp>"), []).append(o)
    for problem, group in sorted(
        by_problem.items(), key=lambda item: (problem_class(item[0]), item[1][0].variant.number)
    ):
        if len(group) > COLLAPSE_AFTER:  # the same problem everywhere: one line, variant numbers only
            numbers = ", ".join(f"{o.variant.number:03d}" for o in group)
            lines.append(f"  {problem} | in {len(group)} variants: {numbers}")
        else:
            lines += [f"  {o.variant.label} | {problem}"[:220] for o in group]
    return "\n".join(lines)


def problem_class(problem: str) -> str:
    """The kind of a problem, for the tallies: 'exit 3', 'KeyError', 'ran code', ..."""
    head = problem.split(":")[0]
    if head.startswith(("exit 3", "traceback")):
        inner = re.search(r"([A-Za-z_]*(Error|Exception|Interrupt|Exit))\b", problem)
        return f"{head}: {inner.group(1)}" if inner else head
    return head


def report(stage: str, outcomes: list[Outcome], suite: Suite) -> None:
    text = summarize(stage, outcomes, suite.base_run.parent.parent)
    print("\n" + text)
    assert not any(o.problem for o in outcomes), text


# -- (a) the command line ---------------------------------------------------------------------
def view_cli(run_dir: Path, cwd: Path, extra_env: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**os.environ, **extra_env, "COLUMNS": "200", "TMPDIR": str(cwd)}  # bug logs stay in the variant
    return subprocess.run(
        [sys.executable, "-m", "bisectr", "view", str(run_dir), "--no-tui"],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=CLI_TIMEOUT_S,
    )


def judge_cli(variant: Variant, place: Place) -> Outcome:
    """`bisectr view RUN --no-tui`: 0, or 2 with a message naming the run; nothing else."""
    try:
        done = view_cli(place.run, place.cwd, {MARKERS_ENV: str(place.markers), VARIANT_ENV: place.name})
    except subprocess.TimeoutExpired:
        return Outcome("cli", variant, f"timeout after {CLI_TIMEOUT_S} s")
    stderr = done.stderr.strip()
    first = stderr.splitlines()[0] if stderr else ""
    if "Traceback" in stderr:
        return Outcome("cli", variant, f"traceback (exit {done.returncode}): {stderr.splitlines()[-1]}")
    if done.returncode == 3:
        return Outcome("cli", variant, f"exit 3: {first}")
    if done.returncode == 1:
        return Outcome("cli", variant, "exit 1: a crafted run read as divergent")
    if done.returncode not in (0, 2):
        return Outcome("cli", variant, f"exit {done.returncode}: {first}")
    if done.returncode == 2 and not any(str(p) in stderr for p in (place.run, place.run.resolve())):
        return Outcome("cli", variant, f"exit 2 without naming the run: {first}")
    return Outcome("cli", variant, None, refused=done.returncode == 2)


@pytest.fixture(scope="module")
def cli_outcomes(suite) -> list[Outcome]:
    """Every other variant through the command line (each a process of its own; all of them with
    BISECTR_FULL_SETS=1): the rest go through `bisectr.load` below, in this process."""
    new_markers = watch_markers(suite.markers)
    with ThreadPoolExecutor(CLI_WORKERS) as pool:
        outcomes = list(pool.map(lambda v: judge_cli(v, suite.places[v.number]), sampled(suite.variants, every=2)))
    return outcomes + marker_outcomes("cli", new_markers(), suite)


def test_view_cli_exits_0_or_2_with_a_message_for_every_variant(suite, cli_outcomes):
    report("cli", cli_outcomes, suite)


# -- (b) bisectr.load and what a viewer touches ---------------------------------------------------
@contextlib.contextmanager
def watched_as(place: Place) -> Iterator[None]:
    """Run in the variant's working directory with the tripwire variables set."""
    saved = {k: os.environ.get(k) for k in (MARKERS_ENV, VARIANT_ENV)}
    os.environ[MARKERS_ENV], os.environ[VARIANT_ENV] = str(place.markers), place.name
    try:
        with contextlib.chdir(place.cwd):
            yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def saved_result(run: bisectr.Run) -> dict | None:
    """The run's saved search result as a dict (None: the run was never searched)."""
    return None if run.result is None else run.result.to_dict()


def touch_like_a_viewer(run_dir: Path) -> dict[tuple[str, int], np.ndarray]:
    """Load the run and read what `bisectr view` and the TUI read: ops, outputs, graphs, every
    stored value, the output pairs, the saved result, the TUI's data (alignment, rows, tree)."""
    from bisectr.present.tui.data import RunData

    run = bisectr.load(run_dir)
    for trace in (run.reference, run.candidate):
        _ = [(op.index, op.op, op.module, op.source, op.inputs, op.outputs) for op in trace.ops]
        _ = dict(trace.outputs), trace.graph.number_of_nodes()
    values = {key: np.array(values, copy=True) for key, values in stored_values(run)}
    _ = run.output_pairs
    json.dumps(saved_result(run), default=str)
    data = RunData(run)
    data.counts()
    if data.culprit_index is not None:
        data.tensor_rows(data.culprit_index)
        data.heat_map(data.culprit_index)
    return values


def judge_load(variant: Variant, place: Place, suite: Suite) -> Outcome:
    """Only `BisectrError`, and no stored value that differs from what was recorded."""
    try:
        with watched_as(place):
            values = touch_like_a_viewer(place.run)
    except BisectrError:
        return Outcome("load", variant, None, refused=True)
    except Exception as exc:  # noqa: BLE001 - every other exception is the finding
        return Outcome("load", variant, f"{type(exc).__name__}: {exc}".replace("\n", " ")[:160])
    changed = [key for key, values in values.items() if suite.base_values.get(key) != value_signature(values)]
    if changed:
        return Outcome("load", variant, f"silently read changed values of {len(changed)} tensor(s), e.g. {changed[0]}")
    return Outcome("load", variant, None)


@pytest.fixture(scope="module")
def load_outcomes(suite) -> list[Outcome]:
    new_markers = watch_markers(suite.markers)
    outcomes = [judge_load(v, suite.places[v.number], suite) for v in suite.variants]
    return outcomes + marker_outcomes("load", new_markers(), suite)


def test_load_raises_only_run_dir_errors_and_never_returns_changed_values(suite, load_outcomes):
    report("load", load_outcomes, suite)


# -- (c) the TUI ------------------------------------------------------------------------------
TUI_KEYS = ("n", "enter", "n", "escape", "2", "slash", "escape", "b", "question_mark", "question_mark", "q")


def tui_sample(variants: list[Variant]) -> list[Variant]:
    """For each path-like manifest field, its first variant aimed at crafted code; a flipped byte
    of a tensor file (the op detail reads values); then evenly spaced others: `TUI_VARIANTS` in all."""
    chosen: dict[str, Variant] = {}
    for v in variants:
        aimed = re.match(r"path (\S+) -> a crafted", v.damage)
        if aimed and v.file == "manifest.json":
            wanted = "executable" if aimed.group(1).lower().endswith("python") else ".py"
            if wanted in v.damage:
                chosen.setdefault(aimed.group(1), v)
        elif v.damage.startswith("byte "):  # a binary (tensor) file
            chosen.setdefault("tensor bytes", v)
    rest = [v for v in variants if v not in chosen.values()]
    step = max(1, len(rest) // max(1, TUI_VARIANTS - len(chosen)))
    return (list(chosen.values()) + rest[step // 2 :: step])[:TUI_VARIANTS]


async def drive_tui(run_dir: Path) -> None:
    """Open the TUI on the saved run and press a few keys."""
    from bisectr.present.tui.app import BisectrApp
    from bisectr.present.tui.data import RunData

    try:
        data = RunData(bisectr.load(run_dir))
    except BisectrError:
        return  # refused before the TUI opens: `bisectr view` exits 2 with the message
    app = BisectrApp(data)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        for key in TUI_KEYS:
            await pilot.press(key)
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()


def judge_tui(variant: Variant, place: Place) -> Outcome:
    try:
        with watched_as(place):
            asyncio.run(drive_tui(place.run))
    except Exception as exc:  # noqa: BLE001 - any exception escaping the TUI is the finding
        return Outcome("tui", variant, f"{type(exc).__name__}: {exc}".replace("\n", " ")[:160])
    return Outcome("tui", variant, None)


@pytest.fixture(scope="module")
def tui_outcomes(suite) -> list[Outcome]:
    pytest.importorskip("textual")
    new_markers = watch_markers(suite.markers)
    outcomes = [judge_tui(v, suite.places[v.number]) for v in tui_sample(suite.variants)]
    return outcomes + marker_outcomes("tui", new_markers(), suite)


def test_tui_lets_no_exception_escape(suite, tui_outcomes):
    report("tui", tui_outcomes, suite)


# -- after everything --------------------------------------------------------------------------
def test_no_variant_ever_ran_code_named_in_a_run(suite, cli_outcomes, load_outcomes, tui_outcomes):
    markers = sorted(os.listdir(suite.markers))
    by_name = {f"{v.number:03d}": v for v in suite.variants}
    lines = [
        f"  {by_name[m.split('-')[0]].label if m.split('-')[0] in by_name else m} | {m.split('-', 1)[-1]}"
        for m in markers
    ]
    text = f"{len(markers)} marker(s) left by code a viewer executed:\n" + "\n".join(lines)
    print("\n" + text)
    assert not markers, text
