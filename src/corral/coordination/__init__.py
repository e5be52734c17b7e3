"""The coordinators: judging handler results, applying them, and the loops that drive them."""
