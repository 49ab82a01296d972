"""Capture: hooks that record every op of the user's run (see debugger.py for the API)."""
