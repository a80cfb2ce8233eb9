"""Fault injection with a ledger: crashes, restarts and bad input, and proof nothing is lost."""
