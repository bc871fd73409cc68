"""bisectr: find where two implementations of the same neural network start to disagree."""
from .errors import BisectrError
from .run import Run, load, trace

__all__ = ["BisectrError", "Run", "load", "trace"]
__version__ = "0.1.0"
