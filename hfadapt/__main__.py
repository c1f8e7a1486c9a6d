"""``python -m hfadapt``: the ``hfadapt`` command, for an environment whose scripts folder is
not on PATH."""

from hfadapt.cli import main

if __name__ == "__main__":
    main()
