"""The few helpers shared by all posts."""
