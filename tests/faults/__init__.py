"""Fault suites run as real processes: the crash matrix (`python -m tests.faults`) and
the database outage (`python -m tests.faults outage`)."""
