"""`python -m llada_lsp` is the `llada-lsp` command."""

from .cli import main

raise SystemExit(main())
