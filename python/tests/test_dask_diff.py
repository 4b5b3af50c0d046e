"""Mesh against Dask, session by session (issue 61): seeded client sessions
(dask_diff.py) run as users' scripts under Dask's LocalCluster and under
mesh, and their records compared.

    MESH_BIN=target/debug/mesh python -m unittest discover -s python/tests -p test_dask_diff.py

MESH_DIFF_SESSIONS (default 200: a share of them per mode, a script of 25
in each mode in turn), MESH_DIFF_SEED (default 61), MESH_DIFF_KINDS (the
step kinds, comma-separated; default all), MESH_DIFF_MODES (local,
connect, resume, apart, killed, killed_resume), MESH_DIFF_BATCH (sessions per script, default
25), MESH_DIFF_ONLY (session indices: 17,42 or 25-49), MESH_DIFF_KEEP (a
folder to keep the scripts and their folders in), MESH_DIFF_CACHE (where
Dask's records are kept by script, default target/dask-diff-cache; off:
Dask runs every time), MESH_DIFF_VERBOSE=1 (each script's run as it ends).

200 sessions: about 6 minutes with Dask run (two cores, others busy), 4
with Dask's records cached; mesh's scripts are most of it.

Each mode's test writes its table (per step kind: sessions compared,
equal, differing, with the first difference) to stderr, then each kind's
first difference with its own script, and fails on any difference.
"""

import os
import shutil
import sys
import tempfile
import unittest

import nodes  # noqa: F401  (mesh of this repository on sys.path)
import dask_diff

try:
    import dask.distributed  # noqa: F401
    import numpy  # noqa: F401  (the sessions draw their random numbers with it)

    NO_DASK = None
except ImportError as e:
    NO_DASK = "needs dask[distributed] and numpy (pip install -r python/requirements-ci.txt): %s" % e

SETTINGS = dask_diff.settings_from_env()


class _Diff(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if NO_DASK:
            raise unittest.SkipTest(NO_DASK)
        os.environ["MESH_BIN"] = nodes.mesh_bin()
        if SETTINGS["keep"]:
            os.makedirs(SETTINGS["keep"], exist_ok=True)
        cls.root = tempfile.mkdtemp(prefix="mesh-diff-", dir=SETTINGS["keep"])
        cls.meshes = dask_diff.Meshes(cls.root)

    @classmethod
    def tearDownClass(cls):
        cls.meshes.stop()
        if not SETTINGS["keep"]:
            shutil.rmtree(cls.root, ignore_errors=True)

    def compare_mode(self, mode):
        if mode not in SETTINGS["modes"]:
            self.skipTest("mode %s not in MESH_DIFF_MODES" % mode)
        skipped = {}
        tally, _ = dask_diff.run_all(
            SETTINGS,
            self.meshes,
            log=lambda s: print(s, file=sys.stderr, flush=True) if os.environ.get("MESH_DIFF_VERBOSE") else None,
            skip=lambda m, why: skipped.setdefault(m, why),
            modes=[mode],
        )
        if mode in skipped:
            self.skipTest(skipped[mode])
        if not tally.sessions[mode]:
            self.skipTest("no session of seed %s falls to mode %s (MESH_DIFF_SESSIONS=%d, MESH_DIFF_BATCH=%d)" % (SETTINGS["seed"], mode, SETTINGS["sessions"], SETTINGS["batch"]))
        text = dask_diff.report(tally, SETTINGS)
        # The table first, whatever comes after.
        print("\n" + text, file=sys.stderr, flush=True)
        reference = dask_diff.check_reference(tally)
        self.assertEqual(reference, [], "Dask itself gave no record: the harness's fault, not mesh's")
        if tally.diffs:
            rows = ["%s: %d of %d sessions differ; first: s%d %s" % (k, r["differ"], r["compared"], r["first"].session.index, r["first"].words(200))
                    for (m, k), r in tally.rows.items() if r["differ"]]
            self.fail("mode %s: mesh differs from Dask in %d labels (seed %s; table and scripts on stderr):\n  %s" % (mode, len(tally.diffs), SETTINGS["seed"], "\n  ".join(rows)))


class Local(_Diff):
    def test_sessions_on_mesh_local_give_what_dask_gives(self):
        self.compare_mode("local")


class Connect(_Diff):
    """One node for both: each script run twice against it."""

    def test_sessions_run_twice_on_a_running_node_give_what_dask_gives(self):
        self.compare_mode("connect")

    def test_sessions_run_twice_with_resume_reuse_what_depends_on_arguments_alone(self):
        self.compare_mode("resume")


class Apart(_Diff):
    def test_sessions_on_three_nodes_two_of_which_do_not_see_the_folder_give_what_dask_gives(self):
        self.compare_mode("apart")


class Killed(_Diff):
    """A client SIGKILLed mid-script, the script run again whole."""

    def test_a_script_killed_and_run_again_gives_what_dask_gives(self):
        self.compare_mode("killed")

    def test_a_script_killed_and_run_again_with_resume_gives_what_dask_gives(self):
        self.compare_mode("killed_resume")


if __name__ == "__main__":
    unittest.main()
