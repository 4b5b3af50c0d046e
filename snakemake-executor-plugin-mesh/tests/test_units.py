"""The plugin's policies without nodes: a job's asks fitted to the mesh (_fit), thin jobs packed (_pack)."""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from snakemake_executor_plugin_mesh import _fit, _pack  # noqa: E402


class Job:
    def __init__(self, threads=1, group=False, rule="r", **resources):
        self.threads = threads
        self.resources = resources
        self._group = group
        self.rule = type("Rule", (), {"name": rule})()
        self.name = rule

    def is_group(self):
        return self._group


STATUS = {
    "nodes": [
        {"id": "12D3KooWAAAAAAAAAAAAAAAA", "resources": {"total": "cpu=2,mem=7.5GiB,token=1"}},
        {"id": "12D3KooWBBBBBBBBBBBBBBBB", "resources": {"total": "cpu=4,mem=512MiB"}},
    ]
}


class Fit(unittest.TestCase):
    def setUp(self):
        self.cap = _fit.Capacity.of_status(STATUS)
        self.warned = []

    def fit(self, job):
        return _fit.fit(job, self.cap, lambda name, words: self.warned.append((name, words)))

    def test_threads_above_the_largest_node_run_with_its_cores(self):
        self.assertEqual(self.fit(Job(threads=8)), ({"cpu": 4}, 4))
        self.assertEqual(self.fit(Job(threads=3)), ({"cpu": 3}, 3))

    def test_memory_no_node_has_fails_naming_the_ask_and_the_largest_node(self):
        with self.assertRaises(_fit.Unfit) as e:
            self.fit(Job(mem_mb=93000))
        self.assertIn("it asks mem_mb=93000, more than any node of the mesh has: 8.1 GB on the node with the most (12D3KooWAAAA...)", str(e.exception))
        self.assertIn("the largest node: 12D3KooWBBBB... (cpu=4, mem=537 MB)", str(e.exception))
        res, _ = self.fit(Job(mem_mb=1000))
        self.assertEqual(res["mem"], 1000 * 1000**2)

    def test_a_gpu_no_node_has_fails(self):
        with self.assertRaises(_fit.Unfit) as e:
            self.fit(Job(gpu=1))
        self.assertIn("it asks gpu=1, more than any node of the mesh has: no node has any", str(e.exception))

    def test_a_resource_no_node_offers_is_ignored_said_once_and_one_offered_capped(self):
        res, _ = self.fit(Job(io=1))
        self.assertNotIn("io", res)
        self.assertEqual([n for n, _ in self.warned], ["io"])
        res, _ = self.fit(Job(token=3))
        self.assertEqual(res["token"], 1)

    def test_snakemakes_own_and_non_numeric_resources_are_not_asked(self):
        res, _ = self.fit(Job(tmpdir="/tmp", runtime=5, disk_mb=100, shouldfail=True, _cores=2))
        self.assertEqual(res, {"cpu": 1})

    def test_an_allocation_queue_brings_bigger_nodes(self):
        cap = _fit.Capacity.of_status(STATUS, {"queues": [{"def": {"name": "big", "cores": 16, "mem_bytes": None, "gpus": 2}}]})
        res, cores = _fit.fit(Job(threads=8, gpu=1, mem_mb=93000), cap, lambda *a: None)
        self.assertEqual((res["cpu"], cores, res["gpu"]), (8, 8, 1))

    def test_slots(self):
        self.assertEqual(self.cap.slots({"cpu": 1}), 6)
        self.assertEqual(self.cap.slots({"cpu": 2}), 3)


class Pack(unittest.TestCase):
    def test_a_rule_not_seen_is_not_packed(self):
        self.assertEqual(_pack.Costs().size("r", 100, 2), 1)

    def test_thin_jobs_go_several_to_a_task_and_every_slot_gets_work(self):
        c = _pack.Costs()
        c.seen("r", _pack.OVERHEAD_S + 0.05, 1)
        self.assertEqual(c.size("r", 1000, 2), 60)
        self.assertEqual(c.size("r", 40, 2), 20)
        self.assertEqual(c.size("r", 1000, 100), 10)

    def test_long_jobs_go_alone(self):
        c = _pack.Costs()
        c.seen("r", 30.0, 1)
        self.assertEqual(c.size("r", 1000, 2), 1)

    def test_a_task_of_several_says_the_cost_of_one(self):
        c = _pack.Costs()
        c.seen("r", _pack.OVERHEAD_S + 2.0, 40)
        self.assertAlmostEqual(c.per_job["r"], 0.05)

    def test_chunks_are_even(self):
        self.assertEqual([len(x) for x in _pack.chunks(list(range(10)), 4)], [4, 3, 3])
        self.assertEqual(_pack.chunks([], 3), [])

    def test_deferred_jobs_go_once_their_rule_is_known_or_they_waited(self):
        d = _pack.Deferred()
        c = _pack.Costs()
        d.add("r", 1, now=0.0)
        d.add("s", 2, now=0.0)
        self.assertEqual(d.ready(c, now=1.0), {})
        c.seen("r", 0.2, 1)
        self.assertEqual(d.ready(c, now=1.0), {"r": [1]})
        self.assertEqual(d.ready(c, now=_pack.DEFER_S + 1), {"s": [2]})
        self.assertEqual(len(d), 0)


if __name__ == "__main__":
    unittest.main()
