"""`corral chaos`: real managers and simulated agents under injected faults, checked end to end."""
