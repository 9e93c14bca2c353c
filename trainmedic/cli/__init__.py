"""The on-call command line: one module per command group (see main.py)."""
