"""bisectr: find where two implementations of the same neural network start to disagree."""

from importlib.metadata import version

from .errors import BisectrError
from .generation import generate
from .measure.result import Result
from .present.notebook import compare
from .run import Run, bisect, load, trace
from .training import train

__all__ = ["BisectrError", "Result", "Run", "bisect", "compare", "generate", "load", "trace", "train"]
__version__ = version("bisectr")
