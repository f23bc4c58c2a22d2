"""The attention explorer: a local web page and a notebook widget over any attnlab model.

``attnlab explore PATH`` serves the page (:func:`attnlab.explore.server.serve`); in Jupyter,
``attnlab.explore.widget.explore(model, tokenizer, text)`` shows the same views inline. All numbers
come from :class:`attnlab.explore.session.Session`; see docs/explorer.md.
"""

from attnlab.explore.loading import LoadOptions, load
from attnlab.explore.session import ExploreError, Session

__all__ = ["ExploreError", "LoadOptions", "Session", "load"]
