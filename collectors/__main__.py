"""``python -m collectors`` = ``pagestats-collect``."""

from collectors.cli import main

raise SystemExit(main())
