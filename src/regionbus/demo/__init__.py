"""Demonstrations of regionbus on real data."""
