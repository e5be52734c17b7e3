"""The manager's HTTP API: FastAPI routers per resource, auth, problem-details errors."""
