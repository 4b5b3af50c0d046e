"""What the package reads from the mesh binary: its state folder and a stage's field order equal the binary's, under each environment, and no binary is an error naming where it looked."""

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

import nodes
from nodes import mesh
from mesh import _binary, _proto

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None


def binary_says(env, cwd=None):
    """``mesh describe --json`` as the binary prints it, in ``env``."""
    r = subprocess.run(
        [nodes.mesh_bin(), "describe", "--json"], env=env, cwd=cwd, capture_output=True, text=True, check=True
    )
    return json.loads(r.stdout)


class StateFolder(unittest.TestCase):
    def setUp(self):
        self.bin = nodes.mesh_bin()
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.root = os.path.realpath(self.tmp.name)
        # Every case starts with none of the rule's variables of the
        # developer's shell, and the tests' binary found by $MESH_BIN.
        env = {k: v for k, v in os.environ.items() if k not in ("MESH_STATE_DIR", "XDG_DATA_HOME")}
        env["MESH_BIN"] = self.bin
        env["HOME"] = os.path.join(self.root, "home")
        patcher = mock.patch.dict(os.environ, env, clear=True)
        patcher.start()
        self.addCleanup(patcher.stop)

    def agree(self, expected):
        got = mesh.default_state_dir()
        self.assertEqual(got, binary_says(dict(os.environ))["state_dir"])
        self.assertEqual(got, expected)
        return got

    def test_the_state_folder_is_the_binarys_under_each_environment(self):
        os.environ["MESH_STATE_DIR"] = os.path.join(self.root, "state")
        self.agree(os.path.join(self.root, "state"))
        del os.environ["MESH_STATE_DIR"]
        if sys.platform == "darwin":
            self.agree(os.path.join(self.root, "home", "Library", "Application Support", "mesh"))
            return
        os.environ["XDG_DATA_HOME"] = os.path.join(self.root, "data")
        self.agree(os.path.join(self.root, "data", "mesh"))
        # A relative XDG_DATA_HOME is none (the XDG spec).
        os.environ["XDG_DATA_HOME"] = "data"
        self.agree(os.path.join(self.root, "home", ".local", "share", "mesh"))
        del os.environ["XDG_DATA_HOME"]
        self.agree(os.path.join(self.root, "home", ".local", "share", "mesh"))

    def test_a_relative_state_folder_is_the_binarys_of_this_folder(self):
        os.environ["MESH_STATE_DIR"] = "rel"
        here = os.getcwd()
        os.chdir(self.root)
        self.addCleanup(os.chdir, here)
        self.agree(os.path.join(self.root, "rel"))

    def test_connect_looks_for_the_node_in_the_binarys_folder(self):
        os.environ["MESH_STATE_DIR"] = os.path.join(self.root, "nowhere")
        with self.assertRaises(mesh.NoNode) as e:
            mesh.connect()
        self.assertIn(os.path.join(self.root, "nowhere"), str(e.exception))

    def test_a_node_process_is_found_in_the_folder_its_binary_says(self):
        """A `mesh node` process with no --state-dir: its folder is the one
        the binary says in its environment (read from /proc)."""
        if not os.path.isdir("/proc/self"):
            raise unittest.SkipTest("no /proc")
        env = dict(os.environ, XDG_DATA_HOME=os.path.join(self.root, "theirs"))
        # Named `mesh` with the command `node`, as /proc shows a node.
        p = subprocess.Popen(["mesh", "-cimport time; time.sleep(60)", "node"], executable=sys.executable, env=env)
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        theirs = binary_says(env)["state_dir"]
        self.assertTrue(
            nodes.wait_until(lambda: _proto._node_state("/proc/%d" % p.pid) == theirs, limit=10),
            _proto._node_state("/proc/%d" % p.pid),
        )
        self.assertEqual(_proto._node_process_on(theirs), "node")
        self.assertNotEqual(_proto._node_process_on(os.path.join(self.root, "ours")), "node")

    def test_no_binary_is_an_error_naming_where_it_looked(self):
        del os.environ["MESH_BIN"]
        os.environ["PATH"] = self.root
        with mock.patch.object(sys, "executable", os.path.join(self.root, "bin", "python")):
            with self.assertRaises(mesh.MeshError) as e:
                mesh.default_state_dir()
            with self.assertRaises(mesh.MeshError):
                f = mesh.Farm("f")
                f.stage("s", command=["true"])
                f.to_toml()
        words = str(e.exception)
        self.assertIn("$MESH_BIN", words)
        self.assertIn("`mesh` on PATH", words)
        self.assertIn(os.path.join(self.root, "bin", "mesh"), words)

    def test_a_binary_that_cannot_say_is_an_error_with_its_words(self):
        fake = os.path.join(self.root, "mesh")
        with open(fake, "w") as f:
            f.write("#!/bin/sh\necho \"error: unrecognized subcommand '$1'\" >&2\nexit 2\n")
        os.chmod(fake, 0o755)
        with self.assertRaises(mesh.MeshError) as e:
            mesh.default_state_dir(binary=fake)
        self.assertIn("unrecognized subcommand 'describe'", str(e.exception))

    def test_asked_once_per_binary_environment_and_folder(self):
        os.environ["MESH_STATE_DIR"] = os.path.join(self.root, "a")
        calls = []
        real = subprocess.run

        def counted(*a, **k):
            calls.append(a[0])
            return real(*a, **k)

        with mock.patch.object(_binary.subprocess, "run", counted):
            mesh.default_state_dir()
            mesh.default_state_dir()
            self.assertEqual(len(calls), 1)
            os.environ["MESH_STATE_DIR"] = os.path.join(self.root, "b")
            self.assertEqual(mesh.default_state_dir(), os.path.join(self.root, "b"))
            self.assertEqual(len(calls), 2)
        # A binary rebuilt in place is asked again.
        fake = os.path.join(self.root, "mesh")

        def build(state):
            with open(fake + ".new", "w") as f:
                f.write("#!/bin/sh\necho '{\"state_dir\": \"%s\", \"stage_fields\": []}'\n" % state)
            os.chmod(fake + ".new", 0o755)
            os.replace(fake + ".new", fake)

        build("/one")
        self.assertEqual(mesh.default_state_dir(binary=fake), "/one")
        build("/two")
        self.assertEqual(mesh.default_state_dir(binary=fake), "/two")


class StageFields(unittest.TestCase):
    def setUp(self):
        patcher = mock.patch.dict(os.environ, {"MESH_BIN": nodes.mesh_bin()})
        patcher.start()
        self.addCleanup(patcher.stop)

    def test_a_stage_is_written_in_the_binarys_order_of_its_fields(self):
        order = binary_says(dict(os.environ))["stage_fields"]
        self.assertEqual(order[0], "name")
        f = mesh.Farm("every")
        a = f.stage("a", command=["true"], sweep={"x": [1, 2]})
        # Every field the binary lists that a stage can hold at once, given
        # in an order of their own: backwards.
        given = {
            "after_each": a,
            "after": a,
            "success_codes": [0],
            "expected": 30,
            "timeout": 60,
            "max_fails": 0,
            "retries": 1,
            "resources": {"cpu": 1},
            "env": {"A": "1"},
            "outputs": ["o"],
            "inputs": ["i"],
            "workdir": "w",
            "sweep_mode": "zip",
            "key": "{x}",
            "newer_field": 1,
        }
        f.stage("b", shell="true", sweep={"x": [1, 2], "y": [3, 4]}, **given)
        text = f.to_toml().split("[[stage]]")[2]
        written = [l.split(" = ", 1)[0] for l in text.strip().splitlines()]
        written = [k.split(".", 1)[0] for k in written]
        # The sweep goes last, after any field the binary does not know.
        known = [k for k in written if k in order and k != "sweep"]
        self.assertEqual(known, [k for k in order if k in known], "the binary's order")
        self.assertEqual(
            set(order) - set(written), {"command", "python"}, "every field but the other commands is written"
        )
        self.assertEqual(written[-3:], ["newer_field", "sweep", "sweep"], "then the unknown, then the sweep")
        if tomllib is not None:
            self.assertEqual(tomllib.loads(f.to_toml())["stage"][1]["after_each"], ["a"])


if __name__ == "__main__":
    unittest.main()
