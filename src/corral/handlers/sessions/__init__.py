"""The session coordinator's handlers (spec document 1)."""
