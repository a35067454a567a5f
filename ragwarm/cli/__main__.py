"""`python -m ragwarm.cli`: the stack starts its services this way."""

from ragwarm.cli import main

main()
