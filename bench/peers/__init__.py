"""Peers: the systems a user would pick instead of regionbus, run on this machine in the
same ``python -m bench.all`` run and compared figure by figure.

- :mod:`bench.peers.geode`: Apache Geode 1.15 (a Java harness, ``bench/peers/geode/``)
  against ``bench.core`` (client subscriptions) and ``bench.failover`` (a killed primary).
- :mod:`bench.peers.mirror_maker`: MirrorMaker 2, run by ``bench.gateway`` beside the
  gateway sender and the raw mirror.
"""
