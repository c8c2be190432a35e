"""Multi-site gateways and async event queues (SPEC §6, §7).

- :mod:`gateways.sender`: the gateway sender's processor (batches, acks, retries);
- :mod:`gateways.receiver`: the gateway receiver (apply, dedup, conflict resolution, ack);
- :mod:`gateways.async_event_queue`: async event queues and their listeners;
- :mod:`gateways.write_behind`: a write-behind listener to a SQL database.

The cache server's side, queueing events per sender and queue, is
:mod:`broker.gateway_queues`; the event filter interface it runs is
:class:`schemas.hooks.GatewayEventFilter`. Import from the submodules.
"""
