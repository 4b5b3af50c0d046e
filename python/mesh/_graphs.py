"""Dask graphs on the mesh: each task of a graph a call (``Client.get``, ``compute``, ``persist``).

A graph (``dask.delayed``, ``dask.bag``, a dict of tasks) is read with
Dask's own reader of graphs (``dask._task_spec``), in the order its
dependencies ask. A task that calls a function on its arguments becomes
``submit(func, *args, **kwargs)`` with the futures of the tasks it names
in their places (in lists, tuples and dicts too: containers are built
here, they run no user code); a literal is its value; an alias is the
future it names. A task whose arguments hold further tasks that call
functions is sent whole and run on the node by Dask's own code (its
Python needs Dask then, as a Dask worker's does). So a graph's data
moves node to node as any futures' do, and the keys of the graph name
the calls: a key still held by a future of this client is that future,
as Dask's scheduler keeps a key while a future holds it.
"""

import hashlib
import os
import re
import sys

from ._errors import MeshError

_KEY_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def _dask():
    try:
        from dask import _task_spec as ts
    except ImportError:
        raise MeshError("Dask graphs need dask: pip install dask") from None
    return ts


def _key(k):
    """A call's key for the graph's key ``k`` (a string, or a tuple such
    as ``('inc-1a2b', 3)``): its words, and a hash of it whole (two keys
    of the same words stay two)."""
    words = "-".join(str(p) for p in k) if isinstance(k, tuple) else str(k)
    words = _KEY_CHARS.sub("_", words).strip("_.-")[:80] or "task"
    if not re.match(r"[A-Za-z0-9_]", words):
        words = "k" + words
    digest = hashlib.blake2b(repr(k).encode(), digest_size=6).hexdigest()
    return "%s-%s" % (words, digest)


def _order(graph, ts):
    """The graph's keys, each after the keys it depends on."""
    deps = {k: [d for d in node.dependencies if d in graph] for k, node in graph.items()}
    done, out = set(), []
    for root in graph:
        stack = [(root, iter(deps[root]))]
        if root in done:
            continue
        seen = {root}
        while stack:
            k, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                if k not in done:
                    done.add(k)
                    out.append(k)
                continue
            if nxt in done:
                continue
            if nxt in seen:
                raise MeshError("the graph has a cycle through %r" % (nxt,))
            seen.add(nxt)
            stack.append((nxt, iter(deps[nxt])))
    return out


def _calls_functions(a, ts):
    """Whether ``a`` holds a task that calls a function (not a container)."""
    if isinstance(a, ts.NestedContainer):
        return any(_calls_functions(x, ts) for x in a.args)
    if isinstance(a, ts.Task):
        return True
    return False


def _exec(node, values):
    """A task with further function calls in its arguments, run by Dask's
    own code where the call runs (``values``: its dependencies' values)."""
    return node(values)


def _by_value():
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def futures_of(client, dsk, resources=None, retries=None):
    """The graph ``dsk``'s tasks as calls of ``client``: its key -> the
    future (or the value, for literals)."""
    ts = _dask()
    if hasattr(dsk, "__dask_graph__"):
        # What `dask.compute` hands a scheduler: an expression.
        dsk = dsk.__dask_graph__()
    graph = ts.convert_legacy_graph(dict(dsk))
    fns = client._functions()
    got = {}
    pickled = {}
    cwd = os.getcwd()

    def value_of(key):
        if key in got:
            return got[key]
        raise MeshError("the graph names %r, which it does not have" % (key,))

    def arg(a):
        if isinstance(a, ts.TaskRef):
            return value_of(a.key)
        if isinstance(a, ts.DataNode):
            return a.value
        if isinstance(a, ts.Alias):
            return value_of(a.target)
        if isinstance(a, ts.NestedContainer):
            # Built here with the futures in place: a container runs no
            # user code, and a future anywhere in a call is a dependency.
            return a({k: value_of(k) for k in a.dependencies})
        return a

    with fns.hold():
        for key in _order(graph, ts):
            node = graph[key]
            if isinstance(node, ts.DataNode):
                got[key] = node.value
                continue
            if isinstance(node, ts.Alias):
                got[key] = value_of(node.target)
                continue
            if not isinstance(node, ts.Task):
                raise MeshError("the graph's %r is a %s, not a task" % (key, type(node).__name__))
            nested = any(_calls_functions(a, ts) for a in node.args) or any(_calls_functions(a, ts) for a in node.kwargs.values())
            if nested or isinstance(node, ts.NestedContainer):
                # Sent by value: a node has Dask (for the task), not mesh.
                _by_value()
                fn, args, kwargs = _exec, (node, {k: value_of(k) for k in node.dependencies}), {}
            else:
                fn, args, kwargs = node.func, tuple(arg(a) for a in node.args), {k: arg(v) for k, v in node.kwargs.items()}
            p = pickled.get(id(fn))
            if p is None:
                p = pickled[id(fn)] = fns.pickled_function(fn)
            got[key] = fns.call(fn, args, kwargs, key=_key(key), resources=resources, retries=retries, pickled=p, cwd=cwd)
    return got


def nested(keys, got):
    """``keys`` (a key, or lists of them, as Dask's ``get`` takes them)
    with each key's future or value in its place."""
    if isinstance(keys, list):
        return [nested(k, got) for k in keys]
    return got[keys]


def _flat(keys):
    if isinstance(keys, list):
        for k in keys:
            yield from _flat(k)
    else:
        yield keys


def computed(client, c, optimize_graph=True, resources=None, retries=None):
    """The future of a collection's result, as ``dask.compute`` makes it:
    its expression optimized and finalized, each task a call."""
    _dask()
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr

    expr = FinalizeCompute(collections_to_expr([c], optimize_graph)).optimize()
    keys = list(_flat(expr.__dask_keys__()))
    got = futures_of(client, expr.__dask_graph__(), resources=resources, retries=retries)
    value = got[keys[0]]
    from ._functions import Future

    return value if isinstance(value, Future) else client.scatter(value)


def persisted(client, cs, optimize_graph=True, resources=None, retries=None):
    """The collections ``cs`` rebuilt on the futures of their keys, as
    ``dask.persist`` rebuilds them on values."""
    _dask()
    from dask.base import collections_to_expr

    expr = collections_to_expr(cs, optimize_graph).optimize()
    got = futures_of(client, expr.__dask_graph__(), resources=resources, retries=retries)
    out = []
    for c, ckeys in zip(cs, expr.__dask_keys__()):
        rebuild, state = c.__dask_postpersist__()
        out.append(rebuild({k: got[k] for k in _flat(ckeys)}, *state))
    return out
