"""Errors that name the tensor, op or config key at fault.

Every error the library raises on bad input derives from `SpartaError`, so callers can
catch the whole family at once, and also from the matching built-in (`ValueError`,
`KeyError`, ...), so generic handlers keep working.
"""

from __future__ import annotations


class SpartaError(Exception):
    """Base class of every error sparta-explore raises on bad input."""


class TeSAShapeError(SpartaError, ValueError):
    """A TeSA's shape does not fit the tensor it describes.

    Example:
        TeSAShapeError: TeSA for 'fc1.weight' has shape (32, 8), tensor has (32, 64)
    """


class TeSABitsError(SpartaError, ValueError):
    """A bit width or number format is outside what a TeSA can hold."""


class TeSANameError(SpartaError, KeyError):
    """A tensor name is not in the table or graph it was looked up in."""

    def __str__(self) -> str:
        # KeyError.__str__ quotes its argument; a message reads better without quotes.
        return str(self.args[0]) if self.args else ""


class CaptureError(SpartaError, RuntimeError):
    """A model could not be traced or run on its example inputs."""


class InputDtypeError(SpartaError, TypeError):
    """A compiled model was called with a floating-point input of another dtype than it was compiled for.

    Example:
        InputDtypeError: argument 0 is float64, but this model was compiled for float32 (its example inputs'
        dtype), and an op it leaves to PyTorch takes no other: convert the input (e.g. x.float()) ...
    """


class ConfigError(SpartaError, ValueError):
    """A configuration value is invalid; the message names the key."""


class FileFormatError(SpartaError, ValueError):
    """A file could not be read as what it should be (a TeSA table, a results CSV, a grid, a config).

    The message names the file and what is wrong with it.

    Example:
        FileFormatError: results/t.npz is not a readable TeSA table: not a zip archive (truncated or not an .npz)
    """


class PackageError(SpartaError, ValueError):
    """A saved package could not be written or read; the message names the file (or the object) and what is wrong.

    Example:
        PackageError: bert.sparta: file 'tensors.safetensors' is corrupt (its SHA-256 differs from the manifest's)
    """
