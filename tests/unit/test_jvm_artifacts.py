"""The JVM artifacts: one pinned Kafka version everywhere, and how the jars are found."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from regionbus.devstack.jvm import (
    CHECKOUT_LIB,
    JVM_LIB_ENV_VAR,
    KAFKA_HOME_ENV_VAR,
    jvm_lib_dir,
    kafka_version,
)
from regionbus.devstack.kafka_broker import new_cluster_id
from regionbus.devstack.local import kafka_container_env
from regionbus.schemas.errors import StackError

ROOT = Path(__file__).resolve().parents[2]
_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def _pom_property(name: str) -> str:
    root = ElementTree.parse(ROOT / "jvm" / "pom.xml").getroot()
    value = root.find(f"m:properties/m:{name}", _POM_NS)
    assert value is not None and value.text, f"jvm/pom.xml has no <{name}>"
    return value.text


@pytest.mark.parametrize(
    "compose_file",
    ["docker-compose.yml", "docker-compose.two-sites.yml", "docker-compose.secured.yml"],
)
def test_docker_compose_runs_the_kafka_version_jvm_pom_pins(compose_file: str) -> None:
    pinned = _pom_property("kafka.version")
    compose = yaml.safe_load((ROOT / compose_file).read_text())
    images = {
        name: service["image"]
        for name, service in compose["services"].items()
        if str(service.get("image", "")).startswith("apache/kafka:")
    }
    assert images, f"{compose_file} runs no apache/kafka image"
    assert {name: f"apache/kafka:{pinned}" for name in images} == images


def test_the_spark_connector_is_the_installed_pysparks_and_the_extra_takes_the_4_line() -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["spark"]
    (pyspark,) = [Requirement(r) for r in extra if Requirement(r).name == "pyspark"]
    pinned = _pom_property("spark.version")
    assert pinned == importlib.metadata.version("pyspark"), "jvm/lib's connector must run here"
    # A fresh install takes the newest pyspark the extra allows unless the dev extra pins
    # the pom's: the two pins move together.
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "dev"
    ]
    assert [str(r.specifier) for r in map(Requirement, dev) if r.name == "pyspark"] == [
        f"=={pinned}"
    ]
    assert pinned in pyspark.specifier
    assert [v for v in ("4.1.1", "4.2.0", "4.2.1", "4.3.0", "5.0.0") if v in pyspark.specifier] == [
        "4.2.0",
        "4.2.1",
        "4.3.0",
    ]


def test_the_documented_spark_packages_are_the_jars_the_spark_pom_pins() -> None:
    """docs/spark.md's ``spark.jars.packages`` name the connector and spark-avro at the
    versions jvm/spark/pom.xml resolves (and the tests run with)."""
    text = (ROOT / "docs" / "spark.md").read_text()
    documented = re.findall(r"org\.apache\.spark:[\w.-]+:[\w.-]+", text)
    spark = ElementTree.parse(ROOT / "jvm" / "spark" / "pom.xml").getroot()
    avro = spark.find("m:properties/m:spark.avro.version", _POM_NS)
    assert avro is not None and avro.text
    assert documented == [
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{_pom_property('spark.version')}",
        f"org.apache.spark:spark-avro_2.13:{avro.text}",
    ]


def test_jars_are_taken_from_regionbus_jvm_lib_then_the_checkout_then_kafka_home(
    tmp_path: Path,
) -> None:
    def folder_with_kafka_jar(path: Path) -> Path:
        path.mkdir(parents=True)
        (path / "kafka_2.13-9.8.7.jar").write_bytes(b"")
        return path

    custom = folder_with_kafka_jar(tmp_path / "custom" / "kafka")
    checkout = folder_with_kafka_jar(tmp_path / "checkout" / "kafka")
    distribution = folder_with_kafka_jar(tmp_path / "kafka_2.13-9.8.7" / "libs")
    environ = {JVM_LIB_ENV_VAR: str(custom.parent), KAFKA_HOME_ENV_VAR: str(distribution.parent)}

    assert jvm_lib_dir("kafka", environ, checkout.parent) == custom
    assert (
        jvm_lib_dir("kafka", {KAFKA_HOME_ENV_VAR: environ[KAFKA_HOME_ENV_VAR]}, checkout.parent)
        == checkout
    )
    no_checkout = tmp_path / "none"
    assert (
        jvm_lib_dir("kafka", {KAFKA_HOME_ENV_VAR: environ[KAFKA_HOME_ENV_VAR]}, no_checkout)
        == distribution
    )
    assert kafka_version(custom) == "9.8.7"
    with pytest.raises(StackError, match=r"scripts/bootstrap\.sh"):
        jvm_lib_dir("spark", environ, no_checkout)


def test_a_folder_without_a_kafka_jar_has_no_version(tmp_path: Path) -> None:
    with pytest.raises(StackError, match=r"kafka_2\.13"):
        kafka_version(tmp_path)


def test_the_kafka_container_advertises_its_published_port_and_never_auto_creates() -> None:
    env = kafka_container_env(40123)
    assert env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://127.0.0.1:40123"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"


def test_a_new_kraft_cluster_id_is_22_url_safe_characters_without_a_dash() -> None:
    # One random id in 64 would start with "-", which kafka-storage reads as an option.
    ids = [new_cluster_id() for _ in range(5_000)]
    assert all(re.fullmatch(r"[A-Za-z0-9_]{22}", cluster_id) for cluster_id in ids)
    assert len(set(ids)) == len(ids)


def test_the_checkout_lib_is_the_repositorys_jvm_lib() -> None:
    assert CHECKOUT_LIB == ROOT / "jvm" / "lib"
