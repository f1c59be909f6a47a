"""Models several posts share: defined once here, never inside one post's package."""
