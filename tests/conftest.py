from pathlib import Path

import pytest

MODELS = Path(__file__).parent / "models"
EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.fixture
def models() -> Path:
    return MODELS


def line_of(path: Path, marker: str) -> int:
    """1-based line number of the first line containing `marker`."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if marker in line:
            return number
    raise AssertionError(f"{marker!r} not in {path}")
