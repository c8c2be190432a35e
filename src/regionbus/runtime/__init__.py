"""What every long-running regionbus worker shares: its lifecycle on a thread, Redis
connection and outage handling, leases and membership, metrics and logs, and the settings
for them. ``broker/`` and ``gateways/`` build on it; it imports neither."""
