"""The API app (with the dashboard) over a fresh database, as in the API tests."""

from tests.integration.api.conftest import world

__all__ = ["world"]
