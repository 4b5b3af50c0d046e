"""Farms written as TOML: every value as given, strings escaped, fields the package does not know passed on."""

import datetime
import os
import sys
import tempfile
import unittest

import nodes  # noqa: F401 (puts the package on the path)
from nodes import mesh
from mesh._farm import toml_string, toml_value

try:
    import tomllib
except ImportError:  # Python < 3.11: the text is checked as written
    tomllib = None


def setUpModule():
    # A farm's text has its stage fields in the order the binary says.
    os.environ.setdefault("MESH_BIN", nodes.mesh_bin())


def parsed(text):
    if tomllib is None:
        raise unittest.SkipTest("tomllib is Python 3.11+")
    return tomllib.loads(text)


class Strings(unittest.TestCase):
    def test_escapes(self):
        self.assertEqual(toml_string('a"b\\c'), '"a\\"b\\\\c"')
        self.assertEqual(toml_string("l1\nl2\tx\r"), '"l1\\nl2\\tx\\r"')
        self.assertEqual(toml_string("\x00\x1f\x7f"), '"\\u0000\\u001F\\u007F"')
        self.assertEqual(toml_string("é ✓ {x}"), '"é ✓ {x}"')
        with self.assertRaises(ValueError):
            toml_string("\udcff")

    def test_every_string_reads_back_as_itself(self):
        tricky = ["", "'", '"', "\\", "\\n", "a\nb", "\x01\x7f", "$(rm -rf /)", "{{x}}", "über", "tab\there", "#", "= x"]
        doc = parsed("v = %s\n" % toml_value(tricky))
        self.assertEqual(doc["v"], tricky)

    def test_values(self):
        self.assertEqual(toml_value(True), "true")
        self.assertEqual(toml_value(3), "3")
        self.assertEqual(toml_value(0.5), "0.5")
        self.assertEqual(toml_value(1e20), "1e+20")
        self.assertEqual(toml_value(float("inf")), "inf")
        self.assertEqual(toml_value({"cpu": 1, "mem": "1GiB"}), '{ cpu = 1, mem = "1GiB" }')
        self.assertEqual(toml_value({"a b": 1}), '{ "a b" = 1 }')
        self.assertEqual(toml_value(datetime.timedelta(minutes=90)), '"5400s"')
        with self.assertRaises(TypeError):
            toml_value(None)
        with self.assertRaises(TypeError):
            toml_value(object())


class Farms(unittest.TestCase):
    def test_a_farm_reads_back_as_built(self):
        f = mesh.Farm("sweep", out="/tmp/o", root="/tmp", defaults={"retries": 1, "resources": {"mem": "512MiB"}})
        solve = f.stage(
            "solve",
            command=["./wrapper.sh", "{x}", "{seed}"],
            sweep={"x": mesh.lines("params.txt"), "seed": range(1, 4), "y": [0.5, "a b", 2]},
            workdir="runs/{stage}/{index}",
            inputs=["wrapper.sh"],
            outputs=["result.dat"],
            env={"OMP_NUM_THREADS": "1"},
            timeout="10m",
        )
        f.stage("collect", shell='cat {out}/solve/*/result.dat > "table.txt"', after=solve, outputs=["table.txt"])
        doc = parsed(f.to_toml())
        self.assertEqual(doc["farm"], {"name": "sweep"})
        self.assertEqual(doc["defaults"], {"retries": 1, "resources": {"mem": "512MiB"}})
        s, c = doc["stage"]
        self.assertEqual(s["command"], ["./wrapper.sh", "{x}", "{seed}"])
        self.assertEqual(s["sweep"], {"x": {"lines": "params.txt"}, "seed": {"range": "1..3:1"}, "y": {"list": [0.5, "a b", 2]}})
        self.assertEqual(list(s["sweep"]), ["x", "seed", "y"], "variables keep their order")
        self.assertEqual(c["after"], ["solve"])
        self.assertEqual(c["shell"], 'cat {out}/solve/*/result.dat > "table.txt"')

    def test_fields_the_package_does_not_know_are_written_as_given(self):
        f = mesh.Farm("k")
        a = f.stage("a", command=["true"], sweep={"x": [1, 2]})
        f.stage("b", command=["true"], sweep={"x": [1, 2]}, after_key={"a": "x"}, after_tasks=a)
        b = parsed(f.to_toml())["stage"][1]
        self.assertEqual(b["after_key"], {"a": "x"})
        self.assertEqual(b["after_tasks"], ["a"])

    def test_ranges_lists_and_mistakes(self):
        f = mesh.Farm("r")
        f.stage("s", command=["true"], sweep={"a": range(0, 10, 3), "b": range(5, 0, -1), "c": ("p", "q")})
        sw = parsed(f.to_toml())["stage"][0]["sweep"]
        self.assertEqual(sw["a"], {"range": "0..9:3"})
        self.assertEqual(sw["b"], {"list": [5, 4, 3, 2, 1]})
        self.assertEqual(sw["c"], {"list": ["p", "q"]})
        with self.assertRaises(ValueError):
            f.stage("t", command=["true"], shell="true")
        with self.assertRaises(TypeError):
            f.stage("t", command="echo hi")
        with self.assertRaises(TypeError):
            mesh.Farm("x").stage("t", command=["true"], sweep={"v": "abc"}).toml()

    def test_a_file_is_sent_as_it_is(self):
        d = tempfile.mkdtemp()
        p = os.path.join(d, "my-farm.toml")
        text = '# a comment\n[farm]\nname = "named"\n\n[[stage]]\nname = "s"\ncommand = ["true"]\n'
        with open(p, "w") as fh:
            fh.write(text)
        f = mesh.Farm.from_toml(p)
        self.assertEqual((f.name, f.root, f.file, f.to_toml()), ("named", d, p, text))
        with self.assertRaises(ValueError):
            f.stage("more", command=["true"])


if __name__ == "__main__":
    unittest.main(verbosity=2 if "-v" in sys.argv else 1)
