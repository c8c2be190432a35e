"""Multi-site gateways and async event queues (SPEC §6, §7).

- :mod:`gateways.enqueue`: the cache server's side, queueing events per sender / queue;
- :mod:`gateways.sender`: the gateway sender's processor (batches, acks, retries);
- :mod:`gateways.receiver`: the gateway receiver (apply, dedup, conflict resolution, ack);
- :mod:`gateways.async_event_queue`: async event queues and their listeners;
- :mod:`gateways.write_behind`: a write-behind listener to a SQL database.

Import from the submodules: this package's root imports nothing, because the cache server
imports :mod:`gateways.enqueue` and the workers import the cache server's helpers.
"""
