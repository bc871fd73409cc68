"""PaddlePaddle adapter (placeholder until written)."""
from __future__ import annotations

import sys
from typing import Any

from .base import Adapter


class PaddleAdapter:
    name = "paddle"

    def owns(self, obj: Any) -> bool:
        return False
