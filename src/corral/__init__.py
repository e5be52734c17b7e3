"""corral: a session orchestrator for AI compute clusters."""

__version__ = "0.1.0"
