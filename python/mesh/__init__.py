"""mesh for Python: build a farm, submit it to a mesh node, read each task's result as it lands.

    import mesh

    with mesh.local(cpus=4) as client:          # or mesh.connect(), mesh.connect(mesh=ADDR, key=...)
        run = client.map("./solve.sh {}", [0.1, 0.2, 0.3], outputs=["result.txt"],
                         workdir="runs/{index}", inputs=["solve.sh"])
        for t in run.as_completed():
            print(t.params, open(t.output).read())

The protocol under it and every call are in docs/api.md.
"""

from ._client import Client, LocalNode, connect, default_state_dir, farms, local
from ._errors import FarmClosed, FarmError, FarmFailed, MeshError, ProtocolError, TaskFailed, UnknownFarm
from ._farm import Farm, Stage, lines
from ._functions import DoneAndNotDone, Executor, Future, RemoteTraceback, as_completed, progress, wait
from ._proto import API, Lost, NoNode
from ._run import FarmInfo, Progress, Run, Task, Usage

__version__ = "0.1.0"

__all__ = [
    "API",
    "Client",
    "DoneAndNotDone",
    "Executor",
    "Future",
    "RemoteTraceback",
    "as_completed",
    "progress",
    "wait",
    "Farm",
    "FarmClosed",
    "FarmError",
    "FarmFailed",
    "FarmInfo",
    "LocalNode",
    "Lost",
    "MeshError",
    "NoNode",
    "Progress",
    "ProtocolError",
    "Run",
    "Stage",
    "Task",
    "TaskFailed",
    "UnknownFarm",
    "Usage",
    "connect",
    "default_state_dir",
    "farms",
    "lines",
    "local",
]
