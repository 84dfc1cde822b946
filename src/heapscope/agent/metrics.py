"""The agent's Prometheus metrics, served on ``/metrics`` by the official Python client.

Per process: live bytes (jemalloc's estimate at the last dump) and RSS. Per site, for the
top K sites of each process by the leak ranking: live bytes, growth per second over the
judged window, and 1/0 for a ``leak`` verdict (held while it reads ``growing``, see
:func:`heapscope.agent.watch.hold`); the other sites are summed in one series with
``function="other"``, so the number of series stays bounded whatever the program does.
Counters: dumps taken, failed and dropped per service; a histogram of the pause each dump
cost its target. A process in a container also has ``heapscope_process_container_info``,
labelled with its ``container`` and, under Kubernetes, ``pod_uid`` (only those known).

Sites are read fresh from the agent at each scrape (a custom collector): a site that left
the top K, or a process that exited, has no stale series left behind. Label values named
after a program (service, function, file) go through :func:`label_value`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from heapscope.agent.watch import Agent, Watched
from heapscope.terminal import clean

SITE_LABELS = ["service", "pid", "function", "file", "line"]
PROC_LABELS = ["service", "pid"]
PAUSE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def label_value(text: str) -> str:
    """A label value from a program, dump or config: control and direction characters (line
    breaks included) as visible escapes, and no undecodable byte, which would make the whole
    exposition fail to encode. The client escapes ``\\`` and ``"`` as the format requires."""
    return clean(text)


class AgentCollector(Collector):
    """Metrics from the agent's latest round."""

    def __init__(self, agent: Agent, top: Callable[[], int]) -> None:
        self.agent = agent
        self.top = top  # read at each scrape: a reload may change it

    def collect(self) -> Iterator[Metric]:
        """The metric families, built from a snapshot of what the agent watches."""
        watched = list(self.agent.watched.values())
        live = GaugeMetricFamily("heapscope_process_live_bytes",
                                 "Bytes live in the process at its last dump (jemalloc's "
                                 "unsampled estimate)", labels=PROC_LABELS)
        rss = GaugeMetricFamily("heapscope_process_rss_bytes",
                                "Resident set size of the process", labels=PROC_LABELS)
        site_live = GaugeMetricFamily("heapscope_site_live_bytes",
                                      "Bytes live at the site at the last dump",
                                      labels=SITE_LABELS)
        growth = GaugeMetricFamily("heapscope_site_growth_bytes_per_second",
                                   "Growth of the site over the judged window",
                                   labels=SITE_LABELS)
        leak = GaugeMetricFamily("heapscope_site_leak",
                                 "1 when the site's verdict over the window is leak, and "
                                 "while a leak's verdict stays growing; else 0",
                                 labels=SITE_LABELS)
        judged = GaugeMetricFamily("heapscope_process_window_dumps",
                                   "Dumps the process's verdicts rest on", labels=PROC_LABELS)
        dumps = CounterMetricFamily("heapscope_dumps", "Dumps taken", labels=PROC_LABELS)
        errors = CounterMetricFamily("heapscope_dump_errors", "Dumps that failed",
                                     labels=PROC_LABELS)
        dropped = CounterMetricFamily("heapscope_dumps_dropped",
                                      "Dumps deleted as the window moved or to keep to the "
                                      "disk budget", labels=PROC_LABELS)
        skipped = CounterMetricFamily("heapscope_dumps_skipped",
                                      "Dumps not taken: too little free disk",
                                      labels=PROC_LABELS)
        # A family of its own: the container's labels exist only for targets in one, and
        # the per-process families keep one label set.
        boxes = GaugeMetricFamily("heapscope_process_container_info",
                                  "1 for a process in a container: its container id (or "
                                  "cgroup name) and, under Kubernetes, its pod's uid")
        for w in watched:
            proc = [label_value(w.target.service), str(w.target.pid)]
            if w.target.container:
                boxes.add_sample("heapscope_process_container_info", {
                    **dict(zip(PROC_LABELS, proc, strict=True)),
                    **{k: label_value(v) for k, v in w.target.container}}, 1.0)
            rss.add_metric(proc, float(w.rss_bytes))
            dumps.add_metric(proc, float(w.dumps))
            errors.add_metric(proc, float(w.errors))
            dropped.add_metric(proc, float(w.dropped))
            skipped.add_metric(proc, float(w.skipped))
            if w.report is None:
                continue
            p = w.report.processes[0] if w.report.processes else None
            live.add_metric(proc, float(p.live_bytes if p else 0.0))
            judged.add_metric(proc, float(p.judged if p else 0))
            for labels, b, g, is_leak in _sites(w, self.top()):
                site_live.add_metric(labels, b)
                growth.add_metric(labels, g)
                leak.add_metric(labels, 1.0 if is_leak else 0.0)
        yield from (live, rss, site_live, growth, leak, judged, dumps, errors, dropped,
                    skipped)
        if boxes.samples:
            yield boxes
        if self.agent.pushers:
            pushed = CounterMetricFamily("heapscope_push_profiles",
                                         "Profiles sent to a profile backend, by outcome",
                                         labels=["backend", "outcome"])
            queue = GaugeMetricFamily("heapscope_push_queue_profiles",
                                      "Profiles waiting for the backend", labels=["backend"])
            for pusher in self.agent.pushers:
                for outcome, n in (("sent", pusher.sent), ("failed", pusher.failed),
                                   ("dropped", pusher.dropped)):
                    pushed.add_metric([label_value(pusher.backend), outcome], float(n))
                queue.add_metric([label_value(pusher.backend)], float(pusher.queued))
            yield pushed
            yield queue


def _sites(w: Watched, top: int) -> Iterable[tuple[list[str], float, float, bool]]:
    """(labels, live bytes, growth per second, leak) for the top sites and one "other"."""
    assert w.report is not None
    proc = [label_value(w.target.service), str(w.target.pid)]
    sites = [f for f in w.report.findings if not f.rollup and not f.suppressed_by]
    rest_bytes = rest_growth = 0.0
    rest_leak = False
    for i, f in enumerate(sites):
        per_s = f.trend.slope_per_s if f.trend is not None else None
        g = float(per_s or 0.0)
        if i < top:
            labels = [*proc, label_value(f.function), label_value(f.file), str(f.line)]
            yield labels, float(f.bytes), g, f.stack in w.held
        else:
            rest_bytes += f.bytes
            rest_growth += g
            rest_leak = rest_leak or f.stack in w.held
    if len(sites) > top:
        yield [*proc, "other", "", "0"], rest_bytes, rest_growth, rest_leak


def registry(agent: Agent, top: Callable[[], int]) -> tuple[CollectorRegistry, Histogram]:
    """A registry holding the agent's metrics, and the pause histogram to feed."""
    reg = CollectorRegistry()
    reg.register(AgentCollector(agent, top))
    pause = Histogram("heapscope_attach_pause_seconds",
                      "How long a dump stopped its target", buckets=PAUSE_BUCKETS,
                      registry=reg)
    return reg, pause
