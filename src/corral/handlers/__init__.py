"""Handlers: one per task, each only sorting its targets; the coordinator judges and applies."""
