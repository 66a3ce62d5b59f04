"""AttnvizError, the one base of every error attnviz raises for its user: a message written for the person at the
screen (a page shows it as it is, the command line prints it), and, where one helps, a `detail` for the server's log
or a developer (a path, a library's own words) that pages never show. Pages catch this one class for user messages;
anything else surfaces as the bug it is.

Each module keeps its own subclass (ModelError, CorpusError, ...), also a ValueError (RuntimeError for a lab that is
busy) as before, so callers that caught those still do. CaptureError is defined here, beside the base, and named by
attnviz.capture: the notebook views raise it too, and they sit below the capture package (attnviz.capture imports
them for AttentionCapture's views), so they cannot import it from there.
"""

from __future__ import annotations


class AttnvizError(Exception):
    """An error with a message for the user; `detail` (may be None) is for logs only."""

    def __init__(self, message: str = "", *args, detail: str | None = None):
        super().__init__(message, *args)
        self.detail = detail


class CaptureError(AttnvizError, ValueError):
    """A capture cannot be done; the message says why and what to do."""
