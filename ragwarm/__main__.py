"""`python -m ragwarm`: the same command as `ragwarm`."""

from ragwarm.cli import main

main()
