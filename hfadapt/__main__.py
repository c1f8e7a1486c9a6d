"""``python -m hfadapt``: the ``hfadapt`` command, for an environment whose scripts folder is
not on PATH."""

from hfadapt.cli import entry

if __name__ == "__main__":
    entry()
