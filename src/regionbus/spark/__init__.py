"""Spark for regionbus (docs/behaviour.md §8): the topics as Kafka sources, decoding, bulk load,
jobs.

- :mod:`regionbus.spark.session`: a local session with Spark's Kafka connector and spark-avro (from
  ``jvm/lib/spark``) on its classpath, whose Python workers use this interpreter;
- :mod:`regionbus.spark.format`: ``kafka_format(spark)`` (the JVM connector; the Python source only
  for a session without the jars), ``kafka_reader`` / ``kafka_writer``;
- :mod:`regionbus.spark.jvm_config`: librdkafka settings as the connector's Java client takes them;
- :mod:`regionbus.spark.decode`: records into typed columns in the JVM (``from_avro``),
  ``read_messages`` from a topic in one call;
- :mod:`regionbus.spark.source`: the Python data source (Spark's Kafka schema, options and sink);
- :mod:`regionbus.spark.options`, :mod:`regionbus.spark.kafka`: option parsing; confluent-kafka
access;
- :mod:`regionbus.spark.bulkload`: a DataFrame of entries into a region, through the servers;
- :mod:`regionbus.spark.analytics`, :mod:`regionbus.spark.delays`, :mod:`regionbus.spark.cli`: the
jobs and their CLI.

Importing this package imports nothing heavy; each module imports pyspark itself.
"""
