"""The agent: the daemon on every node that runs kernels for the manager."""
