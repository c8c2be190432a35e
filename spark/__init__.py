"""Spark for regionbus (SPEC §8): the topics as Kafka sources, decoding, bulk load, jobs.

- :mod:`spark.session`: a local session with Spark's Kafka connector and spark-avro (from
  ``jvm/lib/spark``) on its classpath, whose Python workers use this interpreter;
- :mod:`spark.format`: ``kafka_format(spark)`` (the JVM connector; the Python source only
  for a session without the jars), ``kafka_reader`` / ``kafka_writer``;
- :mod:`spark.jvm_config`: librdkafka settings as the connector's Java client takes them;
- :mod:`spark.decode`: records into typed columns in the JVM (``from_avro``),
  ``read_messages`` from a topic in one call;
- :mod:`spark.source`: the Python data source (Spark's Kafka schema, options and sink);
- :mod:`spark.options`, :mod:`spark.kafka`: option parsing; confluent-kafka access;
- :mod:`spark.bulkload`: a DataFrame of entries into a region, through the servers;
- :mod:`spark.analytics`, :mod:`spark.delays`, :mod:`spark.cli`: the jobs and their CLI.

Importing this package imports nothing heavy; each module imports pyspark itself.
"""
