"""`python -m kiln` runs the same command as `kiln`."""

from kiln.cli import main

raise SystemExit(main())
