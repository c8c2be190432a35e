"""Multi-site gateways and async event queues (docs/behaviour.md §6, §7).

- :mod:`regionbus.gateways.sender`: the gateway sender's processor (batches, acks, retries);
- :mod:`regionbus.gateways.receiver`: the gateway receiver (apply, dedup, conflict resolution, ack);
- :mod:`regionbus.gateways.async_event_queue`: async event queues and their listeners;
- :mod:`regionbus.gateways.write_behind`: a write-behind listener to a SQL database.

The cache server's side, queueing events per sender and queue, is
:mod:`regionbus.broker.gateway_queues`; the event filter interface it runs is
:class:`regionbus.schemas.hooks.GatewayEventFilter`. Import from the submodules.
"""
