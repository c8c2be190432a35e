"""Spark for regionbus (SPEC §8): the topics as Kafka sources, decoding, bulk load, jobs.

- :mod:`spark.format`: ``kafka_format(spark)``, the JVM connector or the Python source;
- :mod:`spark.source`: the Python data source (Spark's Kafka schema, options and sink);
- :mod:`spark.options`, :mod:`spark.kafka`: option parsing; confluent-kafka access;
- :mod:`spark.decode`: records into typed columns;
- :mod:`spark.bulkload`: a DataFrame of entries into a region, through the servers;
- :mod:`spark.analytics`, :mod:`spark.delays`, :mod:`spark.cli`: the jobs and their CLI;
- :mod:`spark.session`: a local session whose Python workers use this interpreter.

Importing this package imports nothing heavy; each module imports pyspark itself.
"""
