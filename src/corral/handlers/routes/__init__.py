"""The route handlers of spec document 1, one per file."""
