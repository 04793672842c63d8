"""`python -m llada_lab` is the `llada-lab` command."""

from .cli import main

raise SystemExit(main())
