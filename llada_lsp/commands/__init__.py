"""The subcommands' entry points: each `<name>_main(argv)` parses its arguments, calls the packages
that do the work, and returns the process's exit status (llada_lsp/cli.py dispatches to them)."""
