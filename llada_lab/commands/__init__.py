"""The lab's subcommands: each `<name>_main(argv)` parses its arguments, calls the training and
evaluation modules that do the work, and returns the process's exit status (llada_lab/cli.py
dispatches to them)."""
