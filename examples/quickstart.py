"""Two client caches of region flights: a desk that registers interest, and a writer.
The writer's put goes through Kafka to the cache servers, which apply it in Redis and push
the change to the desk's subscription queue.

No address: Kafka at 127.0.0.1:9092 and namespace "regionbus", where `docker compose up`
and `regionbus stack` put them (REGIONBUS_KAFKA_BOOTSTRAP_SERVERS says otherwise).
"""

import threading

from regionbus import CacheListener, ClientCache


class Desk(CacheListener):
    """Prints each change the servers push to this cache."""

    def __init__(self):
        self.heard = threading.Event()

    def after_create(self, event):
        print("desk heard: created", event.key, event.new_value)
        self.heard.set()

    def after_update(self, event):
        print("desk heard: updated", event.key, event.new_value, "was", event.old_value)
        self.heard.set()


with ClientCache() as desk_cache, ClientCache() as writer_cache:
    desk = Desk()
    desk_cache.create_region("flights", listeners=[desk]).register_interest_regex(r"UA-.*")
    flights = writer_cache.create_region("flights")
    flights.put("UA-1545-EWR-2013-01-01", {"dep_delay": 2})  # returns once a server applied it
    desk.heard.wait(10)  # the event comes through the desk's subscription queue
    print("writer reads", flights.get("UA-1545-EWR-2013-01-01"))
