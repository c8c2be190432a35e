"""Spark for an installed regionbus: a session started as docs/spark.md shows, with the Kafka
connector and spark-avro named in ``spark.jars.packages``, gets them resolved by Spark (from
the local Maven repository here, no network) and reads and decodes a regionbus topic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from confluent_kafka.admin import NewTopic
from readme_commands import REPOSITORY, block_containing

from regionbus.schemas.codec import encode, encode_batches
from regionbus.schemas.eventid import EventID
from regionbus.schemas.kafka_clients import kafka_admin, kafka_producer
from regionbus.schemas.messages import Event, EventKind
from regionbus.schemas.naming import Topics

SPARK_DOC = REPOSITORY / "docs" / "spark.md"
_DRIVER = Path(__file__).with_name("spark_packages_driver.py")
_DRIVER_TIMEOUT_S = 600
_LOCAL_MAVEN = Path.home() / ".m2" / "repository"
_IVY_SETTINGS = """<ivysettings>
  <settings defaultResolver="local-m2"/>
  <resolvers>
    <ibiblio name="local-m2" m2compatible="true" root="{root}"/>
  </resolvers>
</ivysettings>
"""
"""The one resolver docs/spark.md names for a machine without Maven Central."""


def test_a_session_from_the_documented_packages_reads_and_decodes_a_topic(
    kafka_bootstrap_servers: str, namespace: str, tmp_path: Path
) -> None:
    topic = Topics(namespace).events
    admin = kafka_admin({"bootstrap.servers": kafka_bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(timeout=15)
    eid = EventID("m", 1, 0, 0)
    events = [
        Event(
            eid._replace(sequence=i), EventKind.CREATE, "r", 1, 0, "c", f"k{i}", b"%d" % i, "json"
        )
        for i in range(3)
    ]
    producer = kafka_producer({"bootstrap.servers": kafka_bootstrap_servers})
    producer.produce(topic, encode(events[0]), b"k0", partition=0)
    (batch,) = encode_batches([encode(e) for e in events[1:]])
    producer.produce(topic, batch, None, partition=0)
    assert producer.flush(30) == 0

    ivy = tmp_path / "ivy"
    conf = tmp_path / "conf"
    conf.mkdir()
    settings = tmp_path / "ivysettings.xml"
    settings.write_text(_IVY_SETTINGS.format(root=_LOCAL_MAVEN.as_uri()))
    (conf / "spark-defaults.conf").write_text(
        f"spark.master local[1]\nspark.ui.enabled false\n"
        f"spark.jars.ivySettings {settings}\nspark.jars.ivy {ivy}\n"
    )
    session = tmp_path / "session.py"
    session.write_text(block_containing(SPARK_DOC, "spark.jars.packages").text)
    env = {**os.environ, "SPARK_CONF_DIR": str(conf), "PYSPARK_PYTHON": sys.executable}
    env.pop("PYSPARK_SUBMIT_ARGS", None)

    result = subprocess.run(
        [sys.executable, str(_DRIVER), str(session), kafka_bootstrap_servers, topic],
        env=env,
        capture_output=True,
        text=True,
        timeout=_DRIVER_TIMEOUT_S,
    )

    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["format"] == "kafka", "the session has no JVM Kafka connector"
    jars = {Path(j.removeprefix("file:")).name: j for j in report["jars"].split(",") if j}
    assert all(str(ivy) in j for j in jars.values()), "a jar not resolved by Ivy"
    resolved = {name.split("_", 1)[1] for name in jars if name.startswith("org.apache.spark_")}
    assert {"spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-avro_2.13-4.1.1.jar"} <= resolved
    assert report["rows"] == [
        [0, 0, "k0", "r", "k0", "CREATE", "0", None],
        [1, 0, "", "r", "k1", "CREATE", "1", None],
        [1, 1, "", "r", "k2", "CREATE", "2", None],
    ]
