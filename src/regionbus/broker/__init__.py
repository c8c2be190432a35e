"""The regionbus cache server: region store, interest registry, routing to subscription
queues, bucket ownership, security, status and the CLI."""
