"""The mark side: validate a request, write its intent in one transaction, drop a hint, return."""
