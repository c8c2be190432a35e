"""Issue 41, without external processes: the probes a metrics endpoint serves, a worker's
liveness and readiness as its loop turns, stalls and stops, the figures every registry
holds (process, GC, build), and a server's readiness from the bucket election."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from regionbus.broker.buckets import BucketView, buckets_unready_reason
from regionbus.runtime.worker import BackgroundWorker
from regionbus.schemas.health import Probe
from regionbus.schemas.metrics_endpoint import MetricFamilies, MetricsEndpoint


def _wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {predicate}")


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class _Checks:
    def __init__(self) -> None:
        self.live = Probe(True, "ok")
        self.ready = Probe(False, "no bucket election yet")

    def liveness(self) -> Probe:
        return self.live

    def readiness(self) -> Probe:
        return self.ready


def test_the_endpoint_answers_the_probes_metrics_with_process_gc_and_build_and_404_elsewhere() -> (
    None
):
    checks = _Checks()
    families = MetricFamilies({"namespace": "ns", "member": "m1"})
    endpoint = MetricsEndpoint(
        0, lambda: [families.gauge("bucket_primaries", "p", 4)], health=checks
    )
    apply = endpoint.histogram(
        "operation_batch_apply_seconds", "apply", {"namespace": "ns", "member": "m1"}
    )
    endpoint.start()
    try:
        assert endpoint.url is not None
        base = endpoint.url.removesuffix("/metrics")
        assert _get(base + "/healthz") == (200, "ok\n")
        assert _get(base + "/readyz") == (503, "no bucket election yet\n")
        checks.ready = Probe(True, "ok")
        assert _get(base + "/readyz") == (200, "ok\n")
        assert _get(base + "/nowhere")[0] == 404
        apply.observe(0.003)
        apply.observe(0.2)
        status, text = _get(endpoint.url)
    finally:
        endpoint.stop()
    assert status == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    names = {name for name, _ in samples}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= names
    assert "python_gc_collections_total" in names
    [build] = [labels for name, labels in samples if name == "regionbus_build_info"]
    assert dict(build).keys() == {"version", "python"}
    labels = (("member", "m1"), ("namespace", "ns"))
    assert samples[("regionbus_operation_batch_apply_seconds_count", labels)] == 2
    assert (
        samples[("regionbus_operation_batch_apply_seconds_bucket", (("le", "0.005"), *labels))] == 1
    )


def test_a_failing_check_is_a_failed_probe_and_an_endpoint_without_checks_has_no_probes() -> None:
    class Broken(_Checks):
        def liveness(self) -> Probe:
            raise RuntimeError("lost")

    broken = MetricsEndpoint(0, list, health=Broken())
    plain = MetricsEndpoint(0, list)
    broken.start()
    plain.start()
    try:
        assert broken.url is not None and plain.url is not None
        assert _get(broken.url.replace("/metrics", "/healthz")) == (
            503,
            "probe failed: RuntimeError: lost\n",
        )
        assert _get(plain.url.replace("/metrics", "/healthz"))[0] == 404
        assert not MetricsEndpoint(None, list).enabled and plain.enabled
    finally:
        broken.stop()
        plain.stop()


class _Looping(BackgroundWorker):
    """A worker whose loop turns until told to stall (it then waits without turning) or to
    wait on purpose."""

    def __init__(self, liveness_timeout_s: float) -> None:
        super().__init__("looping", MetricsEndpoint(None, list), liveness_timeout_s)
        self.stall = threading.Event()
        self.resume = threading.Event()
        self.outage = threading.Event()
        self.unready: str | None = None

    def _serve(self) -> None:
        while not self.stopping.is_set():
            self.turned()
            if self.stall.is_set():
                self.resume.wait()
                self.stall.clear()
            if self.outage.is_set():
                with self.waiting("Redis unavailable"):
                    while self.outage.is_set() and not self.stopping.is_set():
                        self.stopping.wait(0.01)
            self.stopping.wait(0.01)

    def _unready_reason(self) -> str | None:
        return self.unready


def test_a_worker_is_live_while_its_loop_turns_or_waits_on_purpose_and_ready_only_then() -> None:
    worker = _Looping(liveness_timeout_s=0.3)
    assert worker.liveness() == Probe(False, "not started")
    worker.start()
    try:
        assert worker.liveness().ok and worker.readiness() == Probe(True, "ok")
        worker.unready = "3 of 16 buckets have no primary (1, 2, 3)"
        assert worker.readiness() == Probe(False, worker.unready)
        worker.unready = None

        worker.stall.set()  # a listener that does not return
        _wait_until(lambda: not worker.liveness().ok)
        assert "loop has not turned for" in worker.liveness().reason
        assert not worker.readiness().ok
        worker.resume.set()
        _wait_until(lambda: worker.readiness().ok)

        worker.outage.set()  # waited out on purpose: live, not ready, for longer than the bound
        _wait_until(lambda: worker.readiness() == Probe(False, "waiting: Redis unavailable"))
        stalled_since = time.monotonic()
        _wait_until(lambda: time.monotonic() - stalled_since > 0.6)
        assert worker.liveness() == Probe(True, "waiting: Redis unavailable")
        worker.outage.clear()
        _wait_until(lambda: worker.readiness().ok)
    finally:
        worker.stop()
    assert worker.liveness() == Probe(False, "stopped")


def test_a_server_is_ready_for_its_buckets_once_every_bucket_has_a_primary() -> None:
    views = [BucketView(b, "s1", 1, ()) for b in range(4)]
    assert buckets_unready_reason([], 4) == "no bucket election yet"
    assert buckets_unready_reason(views, 4) is None
    views[1] = BucketView(1, None, 0, ())
    views[3] = BucketView(3, None, 0, ())
    assert buckets_unready_reason(views, 4) == "2 of 4 buckets have no primary (1, 3)"
