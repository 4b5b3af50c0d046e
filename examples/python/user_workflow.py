#!/usr/bin/env python3
"""Seed 004's user_workflow.py (a Dask task farm on Shaheen III), rewritten for mesh.

The same steps: the parameters from foo.txt, a folder per task
(experiment/1, experiment/2, ...), the inputs staged into it (the FreeFem
script, the mesh, the wrapper), the application run through wrapper.sh,
and each result printed as it completes. What Dask's ``func`` did by hand
(make the folder, rsync the inputs in, open out.log and err.log, copy the
output back) is what the stage says: ``workdir``, ``inputs``, the task's
own logs (``t.stdout()``), ``outputs``. The inputs come from the farm's
folder, so no node needs a shared file system.

    python3 examples/python/user_workflow.py     # a node running here, or a throwaway one

FreeFem++-nw is used where it is installed; elsewhere freefem-standin.sh
stands in for it.
"""

import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))  # run from the repository, or pip install ./python

import mesh  # noqa: E402


def params(filename="foo.txt"):
    with open(filename) as f:
        return f.read().splitlines()  # list with stripped line-breaks


def client():
    """The node of this machine (or of $MESH_ADDR), else a throwaway one."""
    try:
        return mesh.connect(mesh=os.environ.get("MESH_ADDR"))
    except mesh.MeshError as e:
        print("(%s: starting a node for this run)" % str(e).split(":")[0])
        return mesh.local()


EXE = "FreeFem++-nw" if shutil.which("FreeFem++-nw") else "./freefem-standin.sh"

base_dir = os.environ.get("EXP_NAME", "experiment")

# the logic of parameter setting is encapsulated in the params function:
x = params(os.path.join(HERE, "foo.txt"))

outdirs = [os.path.join(base_dir, str(i + 1)) for i in range(len(x))]
print("outdirs[%d]:: " % len(outdirs), outdirs)

with client() as c:
    # Dask: futures = client.map(func, x, outdirs)
    run = c.map(
        ["./wrapper.sh", EXE, "user_case/pv_LIR_etau_IVCurve_SF.edp", "{0}"],
        x,
        outdirs,
        name="freefem",
        root=HERE,  # the folder the inputs and task folders are relative to
        workdir="{1}",  # a folder per task: experiment/<i+1>
        inputs=[
            "user_case/pv_LIR_etau_IVCurve_SF.edp",
            "user_case/BF_RefMeshLIR_100x100x95x100.msh",
            "wrapper.sh",
        ]
        + ([] if EXE == "FreeFem++-nw" else ["freefem-standin.sh"]),
        outputs=["iv.dat"],  # collected into mesh-out/freefem/map/<index>/
        resources={"cpu": 1},
        retries=1,
    )

    # Dask: for future in as_completed(futures): print('result: ', future.result())
    for t in run.as_completed():
        if t.ok:
            with open(t.output) as f:
                print("result: ", outdirs[t.index], f.read().strip(), "|", t.stdout().splitlines()[-1])
        else:
            print("failed: ", outdirs[t.index], t.reason, t.stderr().strip())

    p = run.wait(raise_on_error=False)
    print("%d of %d done, %d failed; outputs in %s" % (p.done, p.total, p.failed, p.out))
