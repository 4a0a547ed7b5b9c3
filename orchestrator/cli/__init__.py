"""The `orch` commands: argument parsing and output only; the work is below."""
