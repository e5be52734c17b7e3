"""`python -m corral` runs the command line."""

from corral.cli import main

main()
