"""bisectr: find where two implementations of the same neural network start to disagree."""
from importlib.metadata import version

from .errors import BisectrError
from .bisection import Result
from .run import Run, bisect, load, trace

__all__ = ["BisectrError", "Result", "Run", "bisect", "load", "trace"]
__version__ = version("bisectr")
