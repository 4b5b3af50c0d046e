"""Farms built in Python, written as the farm file (TOML) the node checks.

The node reads the same text ``mesh check`` reads and answers with the same
located errors, so nothing here validates a farm: it only writes what it
was given, exactly. Fields it does not know (a dependency form newer than
this package) are written as given, and the node says whether it knows them.
"""

import datetime
import math
import os
import re

from ._binary import describe

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class lines:
    """A sweep variable's values from a file, one a line: ``{ lines = "params.txt" }``.

    The path is relative to the farm's folder.
    """

    def __init__(self, path):
        self.path = os.fspath(path)

    def __repr__(self):
        return "mesh.lines(%r)" % self.path


def toml_string(s):
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\f":
            out.append("\\f")
        elif o < 0x20 or o == 0x7F:
            out.append("\\u%04X" % o)
        elif 0xD800 <= o <= 0xDFFF:
            # A lone surrogate (from a file name read as bytes) is no character TOML can hold.
            raise ValueError("%r holds a lone surrogate, which TOML cannot write" % s)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_key(k):
    if not isinstance(k, str):
        raise TypeError("a TOML key must be a string, not %r" % (k,))
    return k if _BARE_KEY.match(k) else toml_string(k)


def toml_value(v):
    """A Python value as a TOML value on one line (arrays and inline tables nest)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        r = repr(v)
        # repr gives `1e+16` and `1.5`, both TOML; an integral float without
        # a point or exponent is none here, but be sure it stays a float.
        if not any(c in r for c in ".eE"):
            r += ".0"
        return r
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, os.PathLike):
        return toml_string(os.fspath(v))
    if isinstance(v, datetime.timedelta):
        return toml_string("%ds" % math.ceil(v.total_seconds()))
    if isinstance(v, dict):
        if not v:
            return "{}"
        return "{ %s }" % ", ".join("%s = %s" % (toml_key(k), toml_value(x)) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return "[%s]" % ", ".join(toml_value(x) for x in v)
    if isinstance(v, Stage):
        return toml_string(v.name)
    if v is None:
        raise TypeError("None has no TOML form: leave the field out instead")
    raise TypeError("%r (%s) has no TOML form" % (v, type(v).__name__))


def sweep_source(v):
    """A sweep variable's source: a list, a Python range, ``mesh.lines(...)``,
    or a table written as the farm file has it (``{"range": "0.0..1.0:0.25"}``)."""
    if isinstance(v, lines):
        return {"lines": v.path}
    if isinstance(v, range):
        if len(v) == 0:
            raise ValueError("an empty range sweeps nothing")
        if v.step > 0:
            return {"range": "%d..%d:%d" % (v.start, v[-1], v.step)}
        return {"list": list(v)}
    if isinstance(v, dict):
        return v
    if isinstance(v, (str, bytes)):
        raise TypeError(
            "a sweep variable takes a list of values, a range or mesh.lines(path), not the string %r" % (v,)
        )
    try:
        values = list(v)
    except TypeError:
        raise TypeError("a sweep variable takes a list of values, not %r" % (v,)) from None
    return {"list": [_sweep_value(x) for x in values]}


def _sweep_value(x):
    if isinstance(x, (str, int, float, bool)):
        return x
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    return str(x)


class Stage:
    """A stage of a :class:`Farm`; pass it as ``after=`` of a later stage."""

    def __init__(self, name, fields, sweep):
        self.name = name
        self.fields = fields
        self.sweep = sweep

    def __repr__(self):
        return "<mesh.Stage %s>" % self.name

    def toml(self, binary=None):
        """The stage as farm text: its fields in the order the docs list
        them, as the ``mesh`` program (``binary``, else :func:`mesh_binary`'s)
        says, then any it does not know (a newer node's, say), then the sweep."""
        return self._toml(describe(binary)["stage_fields"])

    def _toml(self, order):
        out = ["[[stage]]", "name = %s" % toml_string(self.name)]
        keys = [k for k in order if k in self.fields]
        keys += [k for k in self.fields if k not in order]
        for k in keys:
            out.append("%s = %s" % (toml_key(k), toml_value(self.fields[k])))
        for var, src in self.sweep.items():
            out.append("sweep.%s = %s" % (toml_key(var), toml_value(sweep_source(src))))
        return "\n".join(out)


def _names(v):
    if isinstance(v, (str, Stage)):
        v = [v]
    return [s.name if isinstance(s, Stage) else s for s in v]


class Farm:
    """A farm: stages of tasks, written as a farm file (docs/farm-file.md).

    ``name``: the farm's name. ``out``: where outputs are collected
    (default ``mesh-out/<name>`` in the current folder). ``root``: the
    farm's folder, where relative paths (inputs, workdirs, params files)
    start (default: the current folder). ``defaults``: fields every stage
    gets unless it sets its own (the file's ``[defaults]``).
    """

    def __init__(self, name, out=None, root=None, defaults=None):
        self.name = name
        self.out = None if out is None else os.path.abspath(os.fspath(out))
        self.root = os.path.abspath(os.fspath(root) if root is not None else os.getcwd())
        self.defaults = dict(defaults or {})
        self.stages = []
        self._text = None
        self._file = None

    @classmethod
    def from_toml(cls, path, out=None):
        """A farm file as it is on disk; the node reads and checks it."""
        path = os.path.abspath(os.fspath(path))
        with open(path, encoding="utf-8") as f:
            text = f.read()
        stem = os.path.splitext(os.path.basename(path))[0]
        farm = cls(_declared_name(text) or stem, out=out, root=os.path.dirname(path))
        farm._text = text
        farm._file = path
        return farm

    def stage(
        self,
        name,
        command=None,
        shell=None,
        sweep=None,
        sweep_mode=None,
        resources=None,
        inputs=None,
        outputs=None,
        workdir=None,
        env=None,
        after=None,
        after_each=None,
        retries=None,
        max_fails=None,
        timeout=None,
        expected=None,
        success_codes=None,
        **more,
    ):
        """Adds a stage; returns it (to name in a later stage's ``after``).

        ``command``: a list of arguments (no shell) or ``shell``: a line for
        ``/bin/sh -c``. ``sweep``: variable -> values (a list, a ``range``,
        ``mesh.lines(path)``, or a farm-file table). ``after``: stages that
        must finish first; ``after_each``: stages whose task *i* comes
        before this stage's task *i*. Any other keyword is written as a
        field of the stage as given (a newer dependency form, say); the
        node says whether it knows it.
        """
        if self._text is not None:
            raise ValueError(
                "farm %s was read from %s and is submitted as written: edit the file" % (self.name, self._file)
            )
        if (command is None) + (shell is None) + ("python" not in more) != 2:
            raise ValueError("stage %s: give command=[...], shell=\"...\" or python=[...] (one of them)" % name)
        fields = {}
        if command is not None:
            if isinstance(command, str):
                raise TypeError(
                    "stage %s: command is a list of arguments; for a line the shell reads, use shell=%r"
                    % (name, command)
                )
            fields["command"] = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in command]
        if shell is not None:
            fields["shell"] = shell
        given = {
            "sweep_mode": sweep_mode,
            "workdir": workdir,
            "inputs": inputs,
            "outputs": outputs,
            "env": env,
            "resources": resources,
            "retries": retries,
            "max_fails": max_fails,
            "timeout": timeout,
            "expected": expected,
            "success_codes": success_codes,
        }
        for k, v in given.items():
            if v is not None:
                fields[k] = v
        if after is not None:
            fields["after"] = _names(after)
        if after_each is not None:
            fields["after_each"] = _names(after_each)
        for k, v in more.items():
            if v is not None:
                fields[k] = _names(v) if isinstance(v, Stage) else v
        s = Stage(name, fields, dict(sweep or {}))
        self.stages.append(s)
        return s

    def to_toml(self, binary=None):
        """The farm file this farm is (``binary``: the ``mesh`` program that
        says the order of a stage's fields, see :meth:`Stage.toml`)."""
        if self._text is not None:
            return self._text
        order = describe(binary)["stage_fields"] if self.stages else ()
        out = ["[farm]", "name = %s" % toml_string(self.name), ""]
        if self.defaults:
            out.append("[defaults]")
            for k, v in self.defaults.items():
                out.append("%s = %s" % (toml_key(k), toml_value(v)))
            out.append("")
        for s in self.stages:
            out.append(s._toml(order))
            out.append("")
        return "\n".join(out)

    def save(self, path, binary=None):
        """Writes the farm file (to run it with ``mesh run`` or ``mesh submit``)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_toml(binary=binary))

    @property
    def file(self):
        """The file the node names in its messages; its folder is the farm's folder."""
        return self._file or os.path.join(self.root, "%s.toml" % self.name)

    def __repr__(self):
        return "<mesh.Farm %s: %d stages>" % (self.name, len(self.stages))


_FARM_NAME = re.compile(r"""^\s*name\s*=\s*(?:"([^"\\]*)"|'([^']*)')""")


def _declared_name(text):
    """``[farm] name``, read without a TOML parser (Python 3.9 has none): only
    to know the default output folder before the node reads the file."""
    in_farm = False
    for line in text.splitlines():
        t = line.strip()
        if t.startswith("["):
            in_farm = t.split("#")[0].strip() == "[farm]"
            continue
        if in_farm:
            m = _FARM_NAME.match(line)
            if m:
                return m.group(1) if m.group(1) is not None else m.group(2)
    return None
