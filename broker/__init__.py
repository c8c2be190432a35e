"""The regionbus cache server: region store, interest registry, routing, CLI, local stack."""
