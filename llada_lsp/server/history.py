"""The server's edit history is completion/history.py (the lab's training replays cases through it
too, and may not import the server): this module keeps the server's import of it where it was."""

from ..completion.history import MAX_CHARS, MAX_EDITS, PAUSE_SECONDS, Edit, History

__all__ = ["MAX_CHARS", "MAX_EDITS", "PAUSE_SECONDS", "Edit", "History"]
