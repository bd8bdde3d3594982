"""``python -m pagestats``: the ``pagestats`` command line (:func:`pagestats.cli.main`)."""

from pagestats.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
