"""The manager daemon: the store, the buses, the coordinators and the API in one process."""
