"""Snippets shown on the pages; one sub-package per post.

Importing it starts recording which snippet module opens which repository file, so that a
result's sources can be derived (snippets/common/results.py).
"""

from snippets.common import results as _results

_results.track_opens()
