"""What libraries print on their own while a command runs: held back and counted by
:class:`hfadapt.noise.LibraryNoise`, and summarised in one line at the end. ``--verbose`` lets
all of it through as it comes."""

from __future__ import annotations

from hfadapt import noise

__all__ = ["LibraryNoise"]


class LibraryNoise(noise.LibraryNoise):
    """The library's holder around one command; its summary names the command line's flag."""

    hint = "hfadapt --verbose shows them"
