"""Snippets shown on the pages; one sub-package per post."""
